"""KV-cache measurements: PagedAttention internal fragmentation, pool capacity, prefix caching.

PagedAttention hands out KV memory in blocks of ``block_size`` token slots; a request's last block
is only partly filled, and that tail is the internal fragmentation the kvcache stage bounds. Two
views measure it (definitions in docs/metrics.md, ``## KV cache``):

* **exact** (in-process engine): after every engine step, the scheduler's own block tables
  (``req_to_blocks``) against each request's ``num_computed_tokens`` (tokens whose KV is
  written); blocks shared through the prefix cache are counted once;
* **black box** (server or external engine): ``vllm:kv_cache_usage_perc`` x the pool's block
  count from ``/metrics`` gives the blocks in use; the harness knows its own requests' prompt
  lengths and how many tokens each has streamed, hence the tokens stored. Only samples where that
  knowledge is exact (every request decoding, none at a boundary) are kept.

Everything here is plain functions and dataclasses so it can be tested without pytest; the suite
(``suites/test_kvcache.py``) turns results into checks with :func:`exact_checks` and friends.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import secrets
import time
import urllib.error
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from day0.core.record import Check, measured

# --------------------------------------------------------------------------- errors


class KvCacheError(RuntimeError):
    """A kvcache measurement that could not be made; the message is one actionable line."""


class WorkloadRejected(KvCacheError):
    """A workload request longer than the engine's ``max_model_len``: a configuration failure."""

    def __init__(self, context: int, max_model_len: int, detail: str = "",
                 keys: str = "kvcache.context_lengths / kvcache.target_context") -> None:
        self.context = context
        self.max_model_len = max_model_len
        self.detail = detail
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"a request needs {context} tokens of context but the engine's max_model_len is {max_model_len}: "
            f"lower {keys} or raise engine.args.max_model_len{extra}")


# --------------------------------------------------------------------------- the formula


def fragmentation(stored_tokens: int, allocated_tokens: int) -> float:
    """Internal fragmentation = 1 - stored / allocated (0 for an empty pool: nothing is wasted)."""
    if stored_tokens < 0 or allocated_tokens < 0:
        raise ValueError(f"fragmentation: negative counts (stored={stored_tokens}, allocated={allocated_tokens})")
    if stored_tokens > allocated_tokens:
        raise ValueError(f"fragmentation: {stored_tokens} tokens stored in {allocated_tokens} slots")
    return 0.0 if allocated_tokens == 0 else 1.0 - stored_tokens / allocated_tokens


@dataclass(frozen=True)
class Holding:
    """One request's hold on the pool: its block table and the tokens whose KV is written.

    ``shareable`` is how many leading blocks may be shared with other requests (prefix-cache
    hits are always a leading run of full blocks); ``None`` means any block may be, which is the
    general (slower) count. ``None`` entries in ``block_ids`` are placeholders (vLLM's null
    block for tokens outside a sliding window): they hold no memory and store nothing.
    """

    block_ids: Sequence[int | None]
    stored_tokens: int
    shareable: int | None = None


@dataclass(frozen=True)
class BlockCount:
    blocks: int  # distinct blocks held
    stored_tokens: int  # distinct tokens whose KV sits in them
    block_size: int

    @property
    def allocated_tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def fragmentation(self) -> float:
        return fragmentation(self.stored_tokens, self.allocated_tokens)


def count_blocks(holdings: Iterable[Holding], block_size: int) -> BlockCount:
    """Distinct blocks and distinct stored tokens over every request's block table.

    A block held by several requests (a shared prefix) counts once, with the fill of its fullest
    holder. Block ``i`` of a request holding ``s`` tokens is filled with
    ``clamp(s - i * block_size, 0, block_size)`` tokens: tables are filled front to back, so a
    table's first ``s // block_size`` blocks are full and go into a set in one C-level call; only
    the block at the boundary and empty ones after it are looked at one by one. The part of a
    table past ``shareable`` is counted in O(1).
    """
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    full: set[int | None] = set()
    partial: dict[int, int] = {}
    blocks = 0
    stored = 0
    for h in holdings:
        ids = h.block_ids
        n = len(ids)
        s = h.stored_tokens
        if s > n * block_size:
            raise ValueError(f"a request stores {s} tokens in {n} blocks of {block_size}")
        k = n if h.shareable is None else min(max(h.shareable, 0), n)
        if k:
            head = ids.head if isinstance(ids, _Table) and len(ids.head) == k else ids[:k]
            n_full = min(k, s // block_size)
            full.update(head if n_full == k else head[:n_full])
            for i in range(n_full, k):
                bid = head[i]
                if bid is not None:
                    fill = min(block_size, max(0, s - i * block_size))
                    if partial.get(bid, -1) < fill:
                        partial[bid] = fill
        rest = n - k
        if rest:
            blocks += rest
            stored += min(rest * block_size, max(0, s - k * block_size))
    full.discard(None)  # placeholders: no memory, nothing stored
    extra = [f for b, f in partial.items() if b not in full]
    return BlockCount(blocks + len(full) + len(extra), stored + len(full) * block_size + sum(extra), block_size)


# --------------------------------------------------------------------------- samples and summaries


@dataclass
class KvSample:
    """The pool at one instant: one engine step (exact) or one /metrics scrape (black box)."""

    t: float  # seconds since the workload started
    allocated_tokens: int  # distinct blocks held x block size
    stored_tokens: int  # distinct tokens whose KV is written
    usage: float  # pool usage 0..1 (vLLM's kv_cache_usage)
    running: int  # requests holding blocks
    waiting: int = 0
    steady: bool = False  # every workload request is finished or mid-decode: comparable across views
    step: int | None = None

    @property
    def fragmentation(self) -> float:
        return fragmentation(self.stored_tokens, self.allocated_tokens)


@dataclass(frozen=True)
class FragSummary:
    samples: int  # samples with blocks held
    mean: float | None  # token-weighted: 1 - sum(stored) / sum(allocated)
    peak: float | None  # max per-sample fragmentation among samples at long context
    peak_t: float | None
    peak_samples: int  # samples at long context
    stored_tokens: int
    allocated_tokens: int


def summarize(samples: Sequence[KvSample], *, long_context_tokens: int = 0, steady_only: bool = False) -> FragSummary:
    """Token-weighted mean over samples with blocks held; peak over those holding >= long_context_tokens.

    Weighting each sample by its allocated slots (``1 - sum S / sum A``) makes steps that hold
    long contexts count for what they hold, so an instant with one short request left cannot
    dominate the figure the way an unweighted mean of per-step ratios lets it.
    """
    held = [s for s in samples if s.allocated_tokens > 0 and (s.steady or not steady_only)]
    total_s = sum(s.stored_tokens for s in held)
    total_a = sum(s.allocated_tokens for s in held)
    long = [s for s in held if s.stored_tokens >= long_context_tokens]
    worst = max(long, key=lambda s: s.fragmentation, default=None)
    return FragSummary(
        samples=len(held),
        mean=fragmentation(total_s, total_a) if held else None,
        peak=worst.fragmentation if worst else None,
        peak_t=worst.t if worst else None,
        peak_samples=len(long),
        stored_tokens=total_s,
        allocated_tokens=total_a,
    )


def is_steady(outputs: Iterable[tuple[int, int, bool]]) -> bool:
    """(output tokens so far, max_tokens, finished) per request -> every one finished or mid-decode.

    Mid-decode means 1 <= out <= max_tokens - 2: the prefill is over (the stored count is exactly
    prompt + out - 1) and the request is not about to be freed, so a view that lags the engine
    by one step still counts the same blocks.
    """
    return all(done or 1 <= out <= max_tokens - 2 for out, max_tokens, done in outputs)


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class KvRequest:
    """One request of the long-context workload (token ids inside the vocabulary)."""

    index: int
    kind: str  # long | short | shared
    prompt: list[int]
    max_tokens: int
    prefix_group: int | None = None
    prefix_len: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def context(self) -> int:
        return len(self.prompt) + self.max_tokens


def default_context_lengths(target_context: int, output_tokens: int) -> list[int]:
    """target_context, /2, /4, /8 (those longer than the output), when the profile names none."""
    out = [target_context // d for d in (1, 2, 4, 8)]
    return [n for n in out if n > output_tokens] or [target_context]


def build_workload(settings: Any, vocab_size: int, special_ids: Iterable[int] = (), *, salt: str = "") -> list[KvRequest]:
    """The stage's request mix from ``[kvcache]`` settings, reproducible from ``settings.seed``.

    Order is the FCFS order the engine sees: long requests, longest first, then the shared-prefix
    group (the second member hits the first's cached blocks), then short requests. Longest first
    keeps the requests' decode phases overlapping: the request that starts decoding first is the
    one whose prefill took longest, so every request is decoding at once for about
    ``output_tokens`` minus the remaining prefill steps; those steady steps are the ones both views
    can measure. ``salt`` gives a different, equally shaped set (benchmarks run it twice).
    """
    specials = {i for i in special_ids if 0 <= i < vocab_size}
    usable = [i for i in range(vocab_size) if i not in specials]
    if not usable:
        raise KvCacheError(f"vocab_size {vocab_size}: every id is special; no prompt can be built")
    out_n = int(settings.output_tokens)
    lengths = list(settings.context_lengths) or default_context_lengths(settings.target_context, out_n)
    lo, hi = settings.short_lengths

    def rng(kind: str, k: int) -> random.Random:
        return random.Random(f"day0-kvcache:{settings.seed}:{salt}:{kind}:{k}")

    reqs: list[KvRequest] = []
    for k, ctx in enumerate(sorted(lengths, reverse=True)):
        reqs.append(KvRequest(len(reqs), "long", rng("long", k).choices(usable, k=ctx - out_n), out_n))
    if settings.shared_prefix_tokens and settings.shared_prefix_requests:
        prefix = rng("prefix", 0).choices(usable, k=settings.shared_prefix_tokens)
        for k in range(settings.shared_prefix_requests):
            r = rng("shared", k)
            n = r.randint(lo, hi) - out_n
            reqs.append(KvRequest(len(reqs), "shared", prefix + r.choices(usable, k=n), out_n,
                                  prefix_group=0, prefix_len=len(prefix)))
    for k in range(settings.short_requests):
        r = rng("short", k)
        n = r.randint(lo, hi) - out_n
        reqs.append(KvRequest(len(reqs), "short", r.choices(usable, k=n), out_n))
    return reqs


def check_fits(workload: Sequence[KvRequest], max_model_len: int, **keys: str) -> None:
    """Raise WorkloadRejected for the longest request that exceeds the engine's max_model_len."""
    worst = max(workload, key=lambda r: r.context, default=None)
    if worst is not None and worst.context > max_model_len:
        raise WorkloadRejected(worst.context, max_model_len,
                               f"prompt {worst.prompt_len} + output {worst.max_tokens} tokens", **keys)


_ENGINE_LEN = re.compile(r"(?:maximum (?:model|context) length (?:of |is )?)(\d+)")
_ASKED_LEN = re.compile(r"(?:\(length |requested |contains (?:at least )?)(\d+)")


def rejection_from_message(message: str, asked: int, **keys: str) -> WorkloadRejected | None:
    """An engine's "longer than the maximum model length" refusal as a WorkloadRejected (else None)."""
    m = _ENGINE_LEN.search(message)
    if not m:
        return None
    a = _ASKED_LEN.search(message)
    return WorkloadRejected(int(a.group(1)) if a else asked, int(m.group(1)),
                            "engine said: " + " ".join(message.split())[:300], **keys)


# --------------------------------------------------------------------------- exact view (scheduler)


@dataclass
class RequestRecord:
    """What one workload request did, from the engine's side."""

    index: int
    kind: str
    prompt_len: int
    max_tokens: int
    output_tokens: int = 0
    cached_tokens: int = 0  # prefix-cache hit tokens
    preemptions: int = 0
    finished: bool = False


@dataclass
class ExactRun:
    samples: list[KvSample]
    requests: list[RequestRecord] = field(default_factory=list)
    block_size: int = 0
    num_blocks: int = 0
    wall_s: float = 0.0
    sampling_s: float = 0.0  # time spent inside the sampler
    steps: int = 0
    error: str | None = None  # root-cause line when the engine died or the run timed out
    rejected: WorkloadRejected | None = None

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.requests)

    @property
    def prefix_hit_rate(self) -> float | None:
        queried = sum(r.prompt_len for r in self.requests if r.finished)
        return sum(r.cached_tokens for r in self.requests if r.finished) / queried if queried else None


class SchedulerSampler:
    """Reads block accounting from a live V1 scheduler after each step.

    Cost per step: O(requests) plus a set insert per shared block. Blocks are shared only through
    prefix-cache hits, so a table's shared blocks are a leading run; the run found for a request
    is kept between steps and re-scanned only when its ends change or the block after it became
    shared (a later request hit it). Keeping a run longer than the blocks still shared is safe:
    count_blocks counts a head block once whether or not another table holds it.
    """

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        kvm = scheduler.kv_cache_manager
        self.managers = list(kvm.coordinator.single_type_managers)
        self.pool = kvm.block_pool
        self.null = getattr(self.pool, "null_block", None)
        self._heads: dict[tuple[int, str], tuple[Any, Any, list[int | None]]] = {}

    @property
    def block_size(self) -> int:
        return int(self.managers[0].block_size)

    @property
    def num_blocks(self) -> int:
        return int(self.pool.num_gpu_blocks)

    def _shared(self, b: Any) -> bool:
        return b is self.null or b.is_null or b.ref_cnt > 1  # the null block's ref_cnt is not maintained

    def _head(self, key: tuple[int, str], blocks: list[Any]) -> list[int | None]:
        cached = self._heads.get(key)
        if cached is not None:
            first, last, head = cached
            k = len(head)
            if (k <= len(blocks) and blocks[0] is first and blocks[k - 1] is last
                    and (k == len(blocks) or not self._shared(blocks[k]))):
                return head
        head = []
        append = head.append
        null = self.null
        for b in blocks:  # the leading run that may be shared (or is a placeholder)
            if b is null or b.is_null:
                append(None)
            elif b.ref_cnt > 1:
                append(b.block_id)
            else:
                break
        if head:
            self._heads[key] = (blocks[0], blocks[len(head) - 1], head)
        else:
            self._heads.pop(key, None)
        return head

    def sample(self, t: float, step: int | None = None, workload: Mapping[str, tuple[int, bool]] | None = None) -> KvSample:
        """``workload``: internal request id -> (max_tokens, finished) of the harness's requests."""
        requests = self.scheduler.requests
        allocated = stored = 0
        holders: set[str] = set()
        for g, mgr in enumerate(self.managers):
            bs = int(mgr.block_size)
            holdings = []
            for rid, blocks in mgr.req_to_blocks.items():
                if not blocks:
                    continue
                req = requests.get(rid)
                computed = req.num_computed_tokens if req is not None else 0
                holders.add(rid)
                head = self._head((g, rid), blocks)
                holdings.append(Holding(_Table(head, len(blocks)), min(computed, len(blocks) * bs), len(head)))
            c = count_blocks(holdings, bs)
            allocated += c.allocated_tokens
            stored += c.stored_tokens
        if len(self._heads) > 2 * len(holders) + 64:  # forget finished requests now and then
            self._heads = {k: v for k, v in self._heads.items() if k[1] in holders}
        steady = False
        if workload is not None:
            states = []
            for rid, (max_tokens, done) in workload.items():
                req = requests.get(rid)
                if req is None or done:
                    states.append((0, max_tokens, True))
                else:
                    states.append((req.num_output_tokens, max_tokens, False))
            steady = is_steady(states)
        waiting = len(getattr(self.scheduler, "waiting", ()))
        return KvSample(t=t, allocated_tokens=allocated, stored_tokens=stored, usage=float(self.pool.get_usage()),
                        running=len(holders), waiting=waiting, steady=steady, step=step)


class _Table(Sequence[Any]):
    """A block table as count_blocks needs it: the ids of its leading (shareable) run, and its length.

    Building the full id list every step would cost O(blocks) per request; the rest is counted in O(1).
    """

    __slots__ = ("head", "n")

    def __init__(self, head: list[int | None], n: int) -> None:
        self.head = head
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:  # only the head is ever read (indices < len(head))
        return self.head[i]


def engine_max_model_len(llm: Any) -> int:
    return int(llm.llm_engine.model_config.max_model_len)


def run_exact(llm: Any, workload: Sequence[KvRequest], *, sample: bool = True, samples: list[KvSample] | None = None,
              cache_salt: str | None = None, timeout_s: float = 600.0) -> ExactRun:
    """Drive the workload through an in-process ``vllm.LLM`` step by step, sampling after each step.

    Never raises for engine trouble: a rejection, a dead engine or a timeout comes back in the
    result with the samples taken so far (``samples`` may be passed in so a caller's ``finally``
    still has them if this is interrupted).
    """
    from vllm import SamplingParams

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    sampler = SchedulerSampler(scheduler)
    run = ExactRun(samples=samples if samples is not None else [], block_size=sampler.block_size,
                   num_blocks=sampler.num_blocks)
    run.requests = [RequestRecord(r.index, r.kind, r.prompt_len, r.max_tokens) for r in workload]
    try:
        check_fits(workload, engine_max_model_len(llm))
    except WorkloadRejected as exc:
        run.rejected = exc
        return run
    ids: dict[str, int] = {}  # the scheduler's request id -> workload index
    external: dict[str, str] = {}
    state: dict[str, tuple[int, bool]] = {}
    salt = cache_salt or secrets.token_hex(8)
    for r in workload:
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        try:
            rid = engine.add_request(f"day0-kv-{salt[:8]}-{r.index}", {"prompt_token_ids": r.prompt, "cache_salt": salt},
                                     params)
        except Exception as exc:  # vLLM's validation error names both lengths
            rejected = rejection_from_message(str(exc), r.context)
            if ids:
                engine.abort_request(list(ids), internal=True)
            if rejected is None:
                run.error = f"request {r.index} not accepted: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            run.rejected = rejected
            return run
        ids[rid] = r.index
        state[rid] = (r.max_tokens, False)
        external[f"day0-kv-{salt[:8]}-{r.index}"] = rid  # outputs carry the id we gave, the scheduler its own
    perf = time.perf_counter
    t0 = perf()
    try:
        while engine.has_unfinished_requests():
            if perf() - t0 > timeout_s:
                engine.abort_request([rid for rid, (_, done) in state.items() if not done], internal=True)
                run.error = (f"workload did not finish within kvcache.workload_timeout_s = {timeout_s:g} s "
                             f"({run.steps} steps)")
                break
            outputs = engine.step()
            run.steps += 1
            for out in outputs:
                rid = external.get(out.request_id, out.request_id)
                idx = ids.get(rid)
                if idx is None or not out.finished:
                    continue
                rec = run.requests[idx]
                rec.finished = True
                rec.output_tokens = len(out.outputs[0].token_ids) if out.outputs else 0
                rec.cached_tokens = int(out.num_cached_tokens or 0)
                state[rid] = (state[rid][0], True)
            if sample:
                ts = perf()
                for rid, idx in ids.items():  # preemptions are counted on the live request objects
                    req = scheduler.requests.get(rid)
                    if req is not None and req.num_preemptions > run.requests[idx].preemptions:
                        run.requests[idx].preemptions = int(req.num_preemptions)
                run.samples.append(sampler.sample(ts - t0, run.steps, state))
                run.sampling_s += perf() - ts
    except Exception as exc:  # the engine died mid-workload: keep what was sampled
        from day0.engine import exception_root_cause

        run.error = exception_root_cause(exc)
        try:  # leave a still-working engine clean for the next stage
            engine.abort_request([rid for rid, (_, done) in state.items() if not done], internal=True)
        except Exception:
            pass
    run.wall_s = perf() - t0
    return run


def engine_kv_bytes_per_token(llm: Any) -> int:
    """KV bytes one token costs on a rank, from the engine's own KV-cache spec (all groups)."""
    cfg = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    total = 0.0
    for group in cfg.kv_cache_groups:
        spec = group.kv_cache_spec
        total += spec.page_size_bytes * len(group.layer_names) / spec.block_size
    return int(round(total))


def engine_pool_bytes(llm: Any) -> int:
    cfg = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    return int(sum(t.size for t in cfg.kv_cache_tensors))


# --------------------------------------------------------------------------- black-box view (/metrics)


@dataclass(frozen=True)
class KvMetrics:
    """The KV-cache facts in one /metrics exposition, summed over engines (data-parallel ranks)."""

    used_blocks: int  # sum over engines of round(usage x (num_gpu_blocks - 1))
    usable_blocks: int  # sum of num_gpu_blocks - 1 (vLLM keeps one null block)
    block_size: int
    usage: float  # used / usable
    running: int | None
    waiting: int | None
    prefix_queries: float | None
    prefix_hits: float | None
    preemptions: float | None
    engines: int
    kv_cache_memory_bytes: int | None = None  # the pool's bytes per engine, when cache_config_info says


def _samples(text: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    from day0.client.prom import PromError

    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception as exc:  # the parser raises bare ValueErrors naming the line
        raise PromError(f"not a Prometheus exposition: {exc}") from None


def parse_kv_metrics(text: str) -> KvMetrics:
    """Read usage, block size/count, request gauges and counters; raise PromError when absent.

    Usage is a fraction of the pool without its null block (``1 - free / (num_gpu_blocks - 1)``),
    so used blocks are recovered exactly by rounding; engines are matched by their ``engine`` label.
    """
    from day0.client.prom import PromError

    usage: dict[str, float] = {}
    info: dict[str, tuple[int, int]] = {}
    pool_bytes: dict[str, int] = {}
    sums: dict[str, float] = {}
    for s in _samples(text):
        name = s.name[:-6] if s.name.endswith("_total") else s.name
        eng = s.labels.get("engine", "0")
        if name == "vllm:kv_cache_usage_perc":
            usage[eng] = float(s.value)
        elif name == "vllm:cache_config_info":
            try:
                info[eng] = (int(s.labels["block_size"]), int(s.labels["num_gpu_blocks"]))
            except (KeyError, ValueError):
                raise PromError("vllm:cache_config_info has no integer block_size / num_gpu_blocks labels "
                                "(the engine has not finished allocating its KV cache?)") from None
            if s.labels.get("kv_cache_memory_bytes", "").isdigit():
                pool_bytes[eng] = int(s.labels["kv_cache_memory_bytes"])
        elif name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_queries",
                      "vllm:prefix_cache_hits", "vllm:num_preemptions"):
            sums[name] = sums.get(name, 0.0) + float(s.value)
    if not usage:
        raise PromError("no vllm:kv_cache_usage_perc in /metrics (not a vLLM engine, or stats logging is off)")
    missing = sorted(set(usage) - set(info))
    if missing:
        raise PromError(f"no vllm:cache_config_info for engine(s) {missing}: block size and count unknown")
    sizes = {info[e][0] for e in usage}
    if len(sizes) != 1:
        raise PromError(f"engines report different block sizes {sorted(sizes)}")
    used = sum(round(usage[e] * (info[e][1] - 1)) for e in usage)
    usable = sum(info[e][1] - 1 for e in usage)

    def opt(key: str) -> float | None:
        return sums.get(key)

    running = opt("vllm:num_requests_running")
    waiting = opt("vllm:num_requests_waiting")
    return KvMetrics(used_blocks=int(used), usable_blocks=int(usable), block_size=sizes.pop(),
                     usage=used / usable if usable else 0.0,
                     running=None if running is None else int(running), waiting=None if waiting is None else int(waiting),
                     prefix_queries=opt("vllm:prefix_cache_queries"), prefix_hits=opt("vllm:prefix_cache_hits"),
                     preemptions=opt("vllm:num_preemptions"), engines=len(usage),
                     kv_cache_memory_bytes=pool_bytes.get(min(usage)) if pool_bytes else None)


@dataclass
class Flight:
    """What the client knows about one of its requests at an instant."""

    prompt_len: int
    max_tokens: int
    received: int = 0  # output tokens streamed so far (server usage.completion_tokens)
    done: bool = False
    prefix_group: int | None = None
    prefix_len: int = 0
    error: str | None = None

    def snapshot(self) -> tuple[int, bool]:
        return self.received, self.done


def estimate_stored(flights: Sequence[Flight], before: Sequence[tuple[int, bool]], after: Sequence[tuple[int, bool]],
                    block_size: int) -> tuple[int | None, int, str]:
    """(stored tokens or None, requests holding blocks, why not) from the client's own knowledge.

    ``before``/``after`` are (received, done) snapshots taken just before sending the scrape and
    just after its answer, so the engine state the gauge shows lies between them, give or take
    one step. A sample is resolved only when that uncertainty cannot change which blocks are
    held: every request finished before the scrape, or mid-decode (1 <= received <= max - 2)
    throughout it. A held request stores ``prompt + received - 1`` tokens (the newest token's KV
    is written by the next step); each prefix group's shared full blocks count once.
    """
    stored = 0
    held = 0
    groups: dict[int, tuple[int, int]] = {}  # group -> (held members, shared full-block tokens)
    for f, (r1, d1), (r2, d2) in zip(flights, before, after):
        if d1:
            continue
        if d2:
            return None, 0, "a request finished during the scrape"
        if r1 < 1:
            return None, 0, "a request is waiting or prefilling (its stored tokens are unknown to the client)"
        if r2 > f.max_tokens - 2:
            return None, 0, "a request is about to finish (the engine may already have freed it)"
        held += 1
        stored += f.prompt_len + r2 - 1
        if f.prefix_group is not None and f.prefix_len >= block_size:
            n, shared = groups.get(f.prefix_group, (0, (f.prefix_len // block_size) * block_size))
            groups[f.prefix_group] = (n + 1, shared)
    for n, shared in groups.values():
        stored -= (n - 1) * shared
    return stored, held, ""


@dataclass
class BlackBoxSample:
    t: float
    used_blocks: int
    block_size: int
    usage: float
    running: int | None
    stored_tokens: int | None  # None: not resolvable from the client's knowledge
    held: int
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.stored_tokens is not None and self.used_blocks > 0

    def as_sample(self) -> KvSample:
        assert self.stored_tokens is not None
        return KvSample(t=self.t, allocated_tokens=self.used_blocks * self.block_size,
                        stored_tokens=min(self.stored_tokens, self.used_blocks * self.block_size),
                        usage=self.usage, running=self.held, steady=True)


def blackbox_sample(t: float, metrics: KvMetrics, flights: Sequence[Flight], before: Sequence[tuple[int, bool]],
                    after: Sequence[tuple[int, bool]]) -> BlackBoxSample:
    """One scrape turned into an estimate, or into the reason it cannot be one."""
    stored, held, why = estimate_stored(flights, before, after, metrics.block_size)
    if stored is not None and metrics.running is not None and metrics.running != held:
        stored, why = None, (f"the engine runs {metrics.running} requests, the harness has {held} in flight "
                             "(other traffic, or a step boundary)")
    if stored is not None and stored > metrics.used_blocks * metrics.block_size:
        stored, why = None, (f"{stored} tokens estimated in {metrics.used_blocks} blocks "
                             "(prefix blocks not shared as assumed?)")
    return BlackBoxSample(t, metrics.used_blocks, metrics.block_size, metrics.usage, metrics.running, stored, held, why)


@dataclass
class BlackBoxRun:
    samples: list[BlackBoxSample]
    scrapes: int = 0
    wall_s: float = 0.0
    block_size: int = 0
    num_blocks: int = 0  # usable + null block(s), summed over engines
    before: KvMetrics | None = None
    after: KvMetrics | None = None
    error: str | None = None
    rejected: WorkloadRejected | None = None
    failed_requests: list[str] = field(default_factory=list)
    passes: int = 0  # runs of the workload whose scrapes are pooled here

    def kv_samples(self) -> list[KvSample]:
        return [s.as_sample() for s in self.samples if s.usable]

    def counter_delta(self, name: str) -> float | None:
        if self.before is None or self.after is None:
            return None
        a, b = getattr(self.after, name), getattr(self.before, name)
        return None if a is None or b is None else a - b

    @property
    def prefix_hit_rate(self) -> float | None:
        q, h = self.counter_delta("prefix_queries"), self.counter_delta("prefix_hits")
        return h / q if q and h is not None else None


PREFILL_SCRAPE_INTERVAL_S = 1.0  # /metrics period while some request has no token yet
BLACKBOX_PASSES = 3  # the same workload again (fresh cache salt) until enough scrapes resolve
MIN_RESOLVED_SCRAPES = 5  # resolved scrapes that make a black-box estimate (pooled over passes)


async def _models(session: Any, base_url: str) -> dict[str, Any]:
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/models"
    async with session.get(url) as resp:
        if resp.status != 200:
            raise KvCacheError(f"{url}: HTTP {resp.status}")
        return await resp.json(content_type=None)


async def _stream(session: Any, url: str, payload: dict[str, Any], flight: Flight) -> None:
    """One streamed completion; updates ``flight`` as chunks arrive; never raises."""
    try:
        async with session.post(url, json=payload) as resp:
            if resp.status != 200:
                body = " ".join((await resp.text()).split())[:400]
                flight.error = f"http_{resp.status}: {body}"
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    flight.error = f"server error: {str(obj['error'])[:300]}"
                    return
                usage = obj.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    flight.received = int(usage["completion_tokens"])
                if any(c.get("finish_reason") for c in obj.get("choices") or []):
                    flight.done = True
            if not flight.done:
                flight.error = "stream ended before the request finished"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        flight.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        flight.done = True


async def run_blackbox_async(base_url: str, model: str, workload: Sequence[KvRequest], *, interval_s: float = 0.1,
                             samples: list[BlackBoxSample] | None = None, cache_salt: str | None = None,
                             timeout_s: float = 600.0, headers: dict[str, str] | None = None,
                             alive: Callable[[], str | None] | None = None, passes: int = BLACKBOX_PASSES,
                             min_resolved: int = MIN_RESOLVED_SCRAPES) -> BlackBoxRun:
    """The workload over HTTP with /metrics sampled beside it, repeated (same requests, fresh cache
    salt) until ``min_resolved`` scrapes resolve or ``passes`` runs are spent. Resolution depends on
    a scrape landing inside the steady decode window, which is timing, not the deployment; pooling
    passes of one workload makes the estimate resolve on a fast engine as on a slow one."""
    import aiohttp

    from day0.client.prom import PromError, scrape

    run = BlackBoxRun(samples=samples if samples is not None else [])
    base = base_url.rstrip("/").removesuffix("/v1")
    salt = cache_salt or secrets.token_hex(8)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers or {}) as session:
        try:
            models = await _models(session, base)
            cards = [m for m in models.get("data", []) if m.get("id") == model] or models.get("data", [])[:1]
            max_len = cards[0].get("max_model_len") if cards else None
            if max_len:
                check_fits(workload, int(max_len))
            run.before = parse_kv_metrics(await scrape(session, base))
        except WorkloadRejected as exc:
            run.rejected = exc
            return run
        except (PromError, KvCacheError, aiohttp.ClientError, OSError) as exc:
            run.error = _dead_or(alive, f"{type(exc).__name__}: {exc}")
            return run
        run.block_size = run.before.block_size
        run.num_blocks = run.before.usable_blocks + run.before.engines
        deadline = time.perf_counter() + timeout_s
        for k in range(max(1, passes)):
            run.passes += 1
            await _blackbox_pass(session, base, model, workload, run, f"{salt}-{k}", interval_s, deadline, timeout_s,
                                 alive)
            if run.error or run.rejected or sum(s.usable for s in run.samples) >= min_resolved:
                break
        try:
            run.after = parse_kv_metrics(await scrape(session, base))
        except (PromError, aiohttp.ClientError, OSError) as exc:
            run.error = run.error or _dead_or(alive, str(exc))
    return run


async def _blackbox_pass(session: Any, base: str, model: str, workload: Sequence[KvRequest], run: BlackBoxRun,
                         salt: str, interval_s: float, deadline: float, timeout_s: float,
                         alive: Callable[[], str | None] | None) -> None:
    """One pass of the workload; appends its scrapes to ``run`` and sets its error or rejection."""
    from day0.client.prom import PromError, scrape

    perf = time.perf_counter
    flights = [Flight(r.prompt_len, r.max_tokens, prefix_group=r.prefix_group, prefix_len=r.prefix_len)
               for r in workload]
    url = base + "/v1/completions"
    t0 = perf()
    offset = run.wall_s  # passes share one time axis
    tasks = []
    for r, f in zip(workload, flights):
        payload = {"model": model, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0.0,
                   "ignore_eos": True, "stream": True, "cache_salt": salt,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        tasks.append(asyncio.create_task(_stream(session, url, payload, f)))
        await asyncio.sleep(0)  # hand each request to the server in workload order
    try:
        while not all(t.done() for t in tasks):
            if perf() > deadline:
                run.error = f"workload did not finish within kvcache.workload_timeout_s = {timeout_s:g} s"
                break
            before = [f.snapshot() for f in flights]
            try:
                text = await scrape(session, base)
            except PromError as exc:
                run.error = _dead_or(alive, str(exc))
                break
            await asyncio.sleep(0.005)  # let stream chunks that arrived with the answer be read first
            after = [f.snapshot() for f in flights]
            run.scrapes += 1
            run.samples.append(blackbox_sample(offset + perf() - t0, parse_kv_metrics(text), flights, before, after))
            # While a request is still prefilling no scrape can be resolved: sample the usage
            # curve slowly then, so the engine is not competing with /metrics rendering, but
            # resume the fast pace the moment every request streams (the steady window can be short).
            await asyncio.sleep(interval_s)
            slow_until = perf() + PREFILL_SCRAPE_INTERVAL_S - interval_s
            while perf() < slow_until and any(not f.done and f.received == 0 for f in flights):
                await asyncio.sleep(0.02)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    run.wall_s = offset + perf() - t0
    failed = [(r, f) for r, f in zip(workload, flights) if f.error]
    run.failed_requests += [f"pass {run.passes} request {r.index}: {f.error}" for r, f in failed]
    for r, f in failed:
        rejected = rejection_from_message(f.error or "", r.context)
        if rejected:
            run.rejected = rejected
            return
    if failed and run.error is None:
        run.error = _dead_or(alive, failed[0][1].error or "")


def _dead_or(alive: Callable[[], str | None] | None, fallback: str, wait_s: float = 10.0) -> str:
    """The engine's own root-cause line when it died, else what the client saw.

    A server whose engine core died answers 500s for a moment before it exits, so an error that
    is not the client's fault (not an HTTP 4xx) waits up to ``wait_s`` for the exit to show.
    """
    if alive is None:  # nothing to watch: waiting would only delay the same answer
        return fallback
    deadline = time.perf_counter() + (0.0 if fallback.startswith("http_4") else wait_s)
    while True:
        reason = alive()
        if reason:
            return f"engine died: {reason} (the client saw: {fallback[:200]})"
        if time.perf_counter() >= deadline:
            return fallback
        time.sleep(0.5)


def run_blackbox(base_url: str, model: str, workload: Sequence[KvRequest], **kw: Any) -> BlackBoxRun:
    return asyncio.run(run_blackbox_async(base_url, model, workload, **kw))


def http_cache_info(base_url: str) -> KvMetrics:
    from day0.client.prom import scrape_sync

    return parse_kv_metrics(scrape_sync(base_url))


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True)
class Capacity:
    """The live KV pool against what the profile asks it to hold."""

    block_size: int
    num_blocks: int  # as the engine reports it (one is vLLM's null block)
    kv_bytes_per_token: int  # per rank, from config.json under TP x PP
    target_context: int
    target_concurrency: int
    min_margin: float
    engine_kv_bytes_per_token: int | None = None  # from the engine's own KV spec (in-process only)
    engine_pool_bytes: int | None = None

    @property
    def pool_tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size

    @property
    def needed_tokens(self) -> int:
        return self.target_concurrency * math.ceil(self.target_context / self.block_size) * self.block_size

    @property
    def margin(self) -> float:
        return self.pool_tokens / self.needed_tokens - 1.0

    @property
    def required_tokens(self) -> int:
        return math.ceil(self.needed_tokens * (1.0 + self.min_margin))

    @property
    def pool_bytes(self) -> int:
        return self.engine_pool_bytes or self.num_blocks * self.block_size * self.kv_bytes_per_token


def config_kv_bytes_per_token(config: dict[str, Any], engine_args: Mapping[str, Any]) -> int:
    """KV bytes per token on the busiest rank from config.json and the engine args (TP x PP, dtypes)."""
    from day0.model import archs
    from day0.model.plan import MLA_FP8_DS_BYTES, kv_dtype_bytes, resolve_dtype

    tp = int(engine_args.get("tensor_parallel_size", 1) or 1)
    pp = int(engine_args.get("pipeline_parallel_size", 1) or 1)
    dtype = resolve_dtype(str(engine_args.get("dtype", "auto")), config)
    kv_dtype = str(engine_args.get("kv_cache_dtype", "auto"))
    if archs.is_mla(config) and kv_dtype.lower() == "fp8_ds_mla":
        return MLA_FP8_DS_BYTES * math.ceil(archs.num_layers(config) / pp)
    return archs.kv_bytes_per_token(config, kv_dtype_bytes(kv_dtype, dtype), tp=tp, pp=pp)


# --------------------------------------------------------------------------- prefix-cache correctness


@dataclass(frozen=True)
class PrefixProbe:
    cold_tokens: list[int]
    warm_tokens: list[int]
    cold_cached: int | None  # prefix-cache hit tokens of each request (None: not observable)
    warm_cached: int | None
    prompt_len: int

    @property
    def identical(self) -> bool:
        return self.cold_tokens == self.warm_tokens

    @property
    def first_difference(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.cold_tokens, self.warm_tokens)):
            if a != b:
                return i
        return None if len(self.cold_tokens) == len(self.warm_tokens) else min(len(self.cold_tokens), len(self.warm_tokens))


PROBE_KEYS = "kvcache.prefix_check_tokens + prefix_check_output_tokens"


def probe_prompt(settings: Any, vocab_size: int, special_ids: Iterable[int] = ()) -> list[int]:
    specials = set(special_ids)
    usable = [i for i in range(vocab_size) if i not in specials]
    return random.Random(f"day0-kvcache:{settings.seed}:probe").choices(usable, k=settings.prefix_check_tokens)


def prefix_probe_inprocess(llm: Any, prompt: list[int], max_tokens: int) -> PrefixProbe:
    """The same long prompt twice under a fresh cache salt: cold (nothing cached), then warm."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    salt = secrets.token_hex(8)
    check_fits([KvRequest(0, "probe", prompt, max_tokens)], engine_max_model_len(llm), keys=PROBE_KEYS)
    outs = []
    for _ in range(2):
        (o,) = llm.generate([{"prompt_token_ids": prompt, "cache_salt": salt}], params, use_tqdm=False)
        outs.append(o)
    return PrefixProbe(list(outs[0].outputs[0].token_ids), list(outs[1].outputs[0].token_ids),
                       int(outs[0].num_cached_tokens or 0), int(outs[1].num_cached_tokens or 0), len(prompt))


def prefix_probe_http(base_url: str, model: str, prompt: list[int], max_tokens: int, *, timeout_s: float = 300.0,
                      headers: dict[str, str] | None = None) -> PrefixProbe:
    """The HTTP version; hit tokens come from the /metrics counter around each request (idle engine)."""
    from day0.client.prom import PromError, scrape_sync
    from day0.engine import http_json

    base = base_url.rstrip("/").removesuffix("/v1")
    salt = secrets.token_hex(8)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, "cache_salt": salt}
    tokens: list[list[int]] = []
    cached: list[int | None] = []
    for _ in range(2):
        try:
            before = parse_kv_metrics(scrape_sync(base)).prefix_hits
        except PromError:
            before = None
        try:
            out = http_json(base + "/v1/completions", body, timeout=timeout_s, headers=headers)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            raise rejection_from_message(text, len(prompt) + max_tokens, keys=PROBE_KEYS) or KvCacheError(
                f"{base}/v1/completions: HTTP {exc.code}: {' '.join(text.split())[:300]}") from None
        choice = out["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise KvCacheError(f"{base}: /v1/completions returned no token_ids (return_token_ids unsupported?)")
        tokens.append(list(ids))
        details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            cached.append(int(details["cached_tokens"]))
            continue
        try:
            after = parse_kv_metrics(scrape_sync(base)).prefix_hits
        except PromError:
            after = None
        cached.append(int(after - before) if before is not None and after is not None else None)
    return PrefixProbe(tokens[0], tokens[1], cached[0], cached[1], len(prompt))


# --------------------------------------------------------------------------- checks


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 4)


def rejected_check(stage_id: str, rejected: WorkloadRejected, source: str) -> Check:
    return Check(id=stage_id, title="Workload fits the engine's max_model_len", status="fail",
                 value=rejected.context, limit=rejected.max_model_len, unit="tokens", direction="lower_is_better",
                 message=str(rejected), source=source,
                 evidence={"context": rejected.context, "max_model_len": rejected.max_model_len,
                           "engine_message": rejected.detail})


def _series_chart(title: str, y_label: str, series: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "line", "title": title, "x_label": "time since workload start (s)", "y_label": y_label,
            "x_log": False, "series": series, "reference": reference}


def workload_table(workload: Sequence[KvRequest], records: Sequence[RequestRecord] | None = None) -> dict[str, Any]:
    cols = ["#", "kind", "prompt tokens", "output tokens", "context"]
    records = records if records and len(records) == len(workload) else None
    if records:
        cols += ["cached tokens", "preemptions"]
    rows = []
    for i, r in enumerate(workload):
        row: list[Any] = [r.index, r.kind + (f" (prefix {r.prefix_len})" if r.prefix_len else ""), r.prompt_len,
                          r.max_tokens, r.context]
        if records:
            row += [records[i].cached_tokens, records[i].preemptions]
        rows.append(row)
    return {"columns": cols, "rows": rows}


def exact_checks(run: ExactRun, workload: Sequence[KvRequest], settings: Any) -> list[Check]:
    """``kvcache.fragmentation`` (token-weighted mean), ``fragmentation_peak``, preemptions, usage, hits."""
    src = "scheduler"
    if run.rejected is not None:
        return [rejected_check("kvcache.workload_fits", run.rejected, src)]
    limit = _pct(settings.fragmentation_limit)
    long_tokens = min((r.context for r in workload if r.kind == "long"), default=0)
    summ = summarize(run.samples, long_context_tokens=long_tokens)
    steady = summarize(run.samples, steady_only=True)
    s = run.samples
    series = {
        "t_s": [round(x.t, 4) for x in s], "step": [x.step for x in s],
        "allocated_tokens": [x.allocated_tokens for x in s], "stored_tokens": [x.stored_tokens for x in s],
        "usage": [round(x.usage, 6) for x in s], "running": [x.running for x in s], "waiting": [x.waiting for x in s],
        "steady": [x.steady for x in s],
    }
    frag_pct = [_pct(x.fragmentation) if x.allocated_tokens else None for x in s]
    ts = series["t_s"]
    charts = [
        _series_chart("Internal fragmentation per engine step (exact, scheduler)", "fragmentation (%)",
                      [{"name": "fragmentation", "x": ts, "y": frag_pct}],
                      [{"y": limit, "label": f"limit {limit:g}%"}]),
        _series_chart("KV slots allocated (blocks x block size) vs tokens stored", "tokens",
                      [{"name": "allocated", "x": ts, "y": series["allocated_tokens"]},
                       {"name": "stored", "x": ts, "y": series["stored_tokens"]}], []),
        _series_chart("KV pool usage", "usage (%)",
                      [{"name": "kv_cache_usage", "x": ts, "y": [_pct(u) for u in series["usage"]]}], []),
    ]
    partial = f" (engine stopped after {len(s)} samples: {run.error})" if run.error else ""
    table = {"columns": ["figure", "value"], "rows": [
        ["samples (engine steps with blocks held)", summ.samples],
        ["token-weighted mean", f"{_pct(summ.mean)}%"],
        [f"peak at long context (>= {long_tokens} tokens stored)",
         f"{_pct(summ.peak)}% at t={summ.peak_t:.2f} s" if summ.peak_t is not None else "-"],
        ["steady-state mean (every request decoding)", f"{_pct(steady.mean)}% over {steady.samples} samples"],
        ["block size / pool blocks", f"{run.block_size} / {run.num_blocks}"],
        ["wall time / sampling time", f"{run.wall_s:.2f} s / {run.sampling_s * 1000:.1f} ms"],
    ]}
    evidence = {"samples": [v for v in frag_pct if v is not None], "charts": charts, "table": table,
                "time_series": series, "workload": workload_table(workload, run.requests),
                "block_size": run.block_size, "num_blocks": run.num_blocks, "steady_mean_pct": _pct(steady.mean),
                "steady_samples": steady.samples, "stored_tokens_sum": summ.stored_tokens,
                "allocated_tokens_sum": summ.allocated_tokens, "error": run.error}
    checks: list[Check] = []
    if summ.mean is None:
        checks.append(Check(id="kvcache.fragmentation", title="PagedAttention fragmentation (token-weighted mean)",
                            status="error", unit="%", limit=limit, direction="lower_is_better",
                            source=src, evidence=evidence,
                            message=f"no engine step held any KV block{partial}"))
    else:
        checks.append(measured(
            "kvcache.fragmentation", "PagedAttention fragmentation (token-weighted mean)", _pct(summ.mean), limit,
            unit="%", direction="lower_is_better", source=src, evidence=evidence, performance=True,
            message=(f"{_pct(summ.mean):.3g}% of allocated KV slots unused (token-weighted over {summ.samples} steps, "
                     f"block size {run.block_size}); limit {limit:g}%" + partial
                     + ("" if summ.mean <= settings.fragmentation_limit else
                        ": lower block_size, or check for lookahead/speculative slots")),
        ))
    if summ.peak is not None:
        checks.append(measured(
            "kvcache.fragmentation_peak", "PagedAttention fragmentation, worst step at long context", _pct(summ.peak),
            limit, unit="%", direction="lower_is_better", source=src,
            evidence={"t_s": summ.peak_t, "long_context_tokens": long_tokens, "samples_at_long_context": summ.peak_samples},
            message=(f"worst step {_pct(summ.peak):.3g}% at t={summ.peak_t:.2f} s among {summ.peak_samples} steps "
                     f"holding >= {long_tokens} tokens; limit {limit:g}%" + partial),
        ))
    if run.error:  # counters of a run cut short say nothing about the workload; the samples above stay
        checks.append(Check(id="kvcache.engine_alive", title="Engine survived the long-context workload",
                            status="error", message=run.error, source=src,
                            evidence={"samples_taken": len(s), "steps": run.steps, "preemptions": run.preemptions}))
        return checks
    checks.append(measured(
        "kvcache.preemptions", "Requests preempted during the long-context workload", run.preemptions,
        settings.max_preemptions, unit="preemptions", direction="lower_is_better", source=src,
        evidence={"per_request": [r.preemptions for r in run.requests]},
        message=(f"{run.preemptions} preemptions (allowed {settings.max_preemptions})" +
                 ("" if run.preemptions <= settings.max_preemptions else
                  ": the pool ran out of blocks; lower max_num_seqs or the context, or add KV memory")),
    ))
    peak_usage = max((x.usage for x in s), default=0.0)
    checks.append(measured("kvcache.usage_peak", "Peak KV pool usage during the workload", _pct(peak_usage), None,
                           unit="%", direction="lower_is_better", source=src,
                           message=f"peak KV pool usage {_pct(peak_usage):.3g}% of {run.num_blocks} blocks"))
    checks.append(hit_rate_check(run.prefix_hit_rate, workload, src, block_size=run.block_size,
                                 evidence={"cached_tokens": [r.cached_tokens for r in run.requests]}))
    return checks


def expected_hit_tokens(workload: Sequence[KvRequest], block_size: int) -> int:
    """Prefix-cache hits the shared-prefix group must produce: every member after the first reuses
    the prefix's full blocks."""
    groups: dict[int, list[KvRequest]] = {}
    for r in workload:
        if r.prefix_group is not None:
            groups.setdefault(r.prefix_group, []).append(r)
    return sum((len(g) - 1) * (g[0].prefix_len // block_size) * block_size for g in groups.values())


def hit_rate_check(rate: float | None, workload: Sequence[KvRequest], source: str, *, block_size: int | None = None,
                   evidence: dict[str, Any] | None = None, check_id: str = "kvcache.prefix_cache_hit_rate") -> Check:
    prompt_total = sum(r.prompt_len for r in workload)
    ev = dict(evidence or {})
    if rate is None:
        return Check(id=check_id, title="Prefix-cache hit rate over the workload", status="skip",
                     unit="%", source=source, evidence=ev,
                     message="no prefix-cache counters (prefix caching off, or the engine exports none)")
    floor = None
    if block_size:
        floor = _pct(expected_hit_tokens(workload, block_size) / prompt_total) if prompt_total else None
        ev["expected_hit_tokens"] = expected_hit_tokens(workload, block_size)
    return measured(check_id, "Prefix-cache hit rate over the workload", _pct(rate), floor,
                    unit="%", direction="higher_is_better", source=source, evidence=ev,
                    message=(f"{_pct(rate):.3g}% of prompt tokens served from the prefix cache"
                             + (f" (the shared-prefix group alone gives {floor:.3g}%)" if floor is not None else "")))


def blackbox_checks(run: BlackBoxRun, workload: Sequence[KvRequest], settings: Any) -> list[Check]:
    src = "http"
    if run.rejected is not None:
        return [rejected_check("kvcache.blackbox_workload_fits", run.rejected, src)]
    limit = _pct(settings.fragmentation_limit)
    usable = run.kv_samples()
    summ = summarize(usable)
    reasons: dict[str, int] = {}
    for s in run.samples:
        if not s.usable:
            key = s.reason or "no blocks held"
            reasons[key] = reasons.get(key, 0) + 1
    ts = [round(s.t, 4) for s in run.samples]
    est = [_pct(fragmentation(min(s.stored_tokens, s.used_blocks * s.block_size), s.used_blocks * s.block_size))
           if s.usable else None for s in run.samples]
    evidence = {
        "samples": [v for v in est if v is not None],
        "charts": [_series_chart("Fragmentation estimated from /metrics (resolved scrapes)", "fragmentation (%)",
                                 [{"name": "estimate", "x": ts, "y": est}], [{"y": limit, "label": f"limit {limit:g}%"}]),
                   _series_chart("KV pool usage from /metrics", "usage (%)",
                                 [{"name": "vllm:kv_cache_usage_perc", "x": ts,
                                   "y": [_pct(s.usage) for s in run.samples]}], [])],
        "table": {"columns": ["scrapes", "resolved", "unresolved: reason", "count"],
                  "rows": [[run.scrapes, len(usable), k, v] for k, v in reasons.items()] or [[run.scrapes, len(usable), "-", 0]]},
        "time_series": {"t_s": ts, "used_blocks": [s.used_blocks for s in run.samples],
                        "stored_tokens_estimate": [s.stored_tokens for s in run.samples],
                        "running": [s.running for s in run.samples], "usage": [s.usage for s in run.samples]},
        "block_size": run.block_size, "num_blocks": run.num_blocks, "failed_requests": run.failed_requests,
        "error": run.error, "passes": run.passes,
    }
    partial = f" (stopped: {run.error})" if run.error else ""
    checks: list[Check] = []
    if summ.mean is None:
        # Not a verdict on the deployment: the method did not resolve (harness error -> INCOMPLETE).
        checks.append(Check(id="kvcache.blackbox_fragmentation", title="Fragmentation estimated from /metrics",
                            status="error", unit="%", limit=limit, direction="lower_is_better",
                            source=src, evidence=evidence,
                            message=(f"the workload stopped before any of {run.scrapes} /metrics scrapes could be "
                                     f"resolved: {run.error}" if run.error else
                                     f"could not measure: none of {run.scrapes} /metrics scrapes in {run.passes} "
                                     "pass(es) of the workload landed in its steady decode window; raise "
                                     "kvcache.output_tokens (a longer window) or kvcache.blackbox_passes")))
    else:
        checks.append(measured(
            "kvcache.blackbox_fragmentation", "Fragmentation estimated from /metrics", _pct(summ.mean), limit,
            unit="%", direction="lower_is_better", source=src, evidence=evidence,
            message=(f"{_pct(summ.mean):.3g}% estimated (token-weighted over {summ.samples} of {run.scrapes} scrapes "
                     f"in {run.passes} pass(es), block size {run.block_size}); limit {limit:g}%" + partial)))
    pre = run.counter_delta("preemptions")
    if pre is not None and not run.error:
        checks.append(measured("kvcache.blackbox_preemptions", "Preemptions during the workload (/metrics)", int(pre),
                               settings.max_preemptions, unit="preemptions", direction="lower_is_better", source=src))
    if not run.error:  # counters of a run cut short say nothing about the workload
        checks.append(hit_rate_check(run.prefix_hit_rate, workload, src, block_size=run.block_size or None,
                                     check_id="kvcache.blackbox_prefix_cache_hit_rate"))
    else:
        checks.append(Check(id="kvcache.blackbox_engine_alive", title="Engine survived the workload (HTTP)",
                            status="error", message=run.error, source=src,
                            evidence={"scrapes": run.scrapes, "failed_requests": run.failed_requests}))
    return checks


def _steady_series(name: str, samples: Sequence[KvSample]) -> dict[str, Any]:
    """The two views run on their own clocks: align them at their first steady sample."""
    t0 = samples[0].t if samples else 0.0
    return {"name": name, "x": [round(s.t - t0, 4) for s in samples], "y": [_pct(s.fragmentation) for s in samples]}


def agreement_check(exact: ExactRun, blackbox: BlackBoxRun, settings: Any) -> Check:
    """Steady-state means of both views on the same workload, within ``agreement_limit``."""
    limit_pp = round(100.0 * settings.agreement_limit, 4)
    exact_steady = [s for s in exact.samples if s.steady and s.allocated_tokens]
    bb_steady = blackbox.kv_samples()
    a = summarize(exact_steady)
    b = summarize(bb_steady)
    ev: dict[str, Any] = {
        "exact_steady_mean_pct": _pct(a.mean), "exact_steady_samples": a.samples,
        "blackbox_mean_pct": _pct(b.mean), "blackbox_samples": b.samples,
        "exact_all_steps_mean_pct": _pct(summarize(exact.samples).mean),
        "charts": [{**_series_chart("Exact (scheduler) vs black-box (/metrics) fragmentation, steady samples",
                                    "fragmentation (%)", [_steady_series("exact", exact_steady),
                                                          _steady_series("black box", bb_steady)], []),
                    "x_label": "seconds since the view's first steady sample"}],
    }
    title = "Exact and /metrics fragmentation agree"
    if a.mean is None or b.mean is None:
        side = "scheduler" if a.mean is None else "/metrics"
        return Check(id="kvcache.methods_agree", title=title, status="error", unit="pp", limit=limit_pp,
                     direction="lower_is_better", source="scheduler+http", evidence=ev,
                     message=f"could not compare: no steady-state samples from the {side} view; "
                             "raise kvcache.output_tokens")
    diff = round(abs(a.mean - b.mean) * 100.0, 4)
    return measured("kvcache.methods_agree", title, diff, limit_pp, unit="pp", direction="lower_is_better",
                    source="scheduler+http", evidence=ev,
                    message=(f"exact {_pct(a.mean):.3g}% ({a.samples} steady steps) vs /metrics estimate "
                             f"{_pct(b.mean):.3g}% ({b.samples} scrapes): {diff:.3g} pp apart (limit {limit_pp:g} pp)"))


def capacity_checks(cap: Capacity, plan: Any | None, source: str) -> list[Check]:
    """Pool tokens vs target_context x concurrency (with margin), and the plan beside the engine."""
    margin_pct = round(cap.margin * 100.0, 2)
    plan_rows: list[list[Any]] = []

    def row(name: str, measured_v: Any, plan_v: Any) -> None:
        plan_rows.append([name, measured_v, plan_v if plan is not None else "-"])

    row("KV bytes per token per rank (config.json)", cap.kv_bytes_per_token, getattr(plan, "kv_bytes_per_token", None))
    if cap.engine_kv_bytes_per_token is not None:
        row("KV bytes per token per rank (engine's KV spec)", cap.engine_kv_bytes_per_token,
            getattr(plan, "kv_bytes_per_token", None))
    row("block size", cap.block_size, getattr(plan, "block_size", None))
    row("KV blocks", cap.num_blocks, getattr(plan, "kv_blocks", None))
    row("KV tokens held", cap.pool_tokens, getattr(plan, "kv_tokens", None))
    row("KV pool bytes per rank", cap.pool_bytes, getattr(plan, "kv_pool_bytes", None))
    row("needed: concurrency x context", cap.needed_tokens, getattr(plan, "tokens_needed", None))
    evidence = {"table": {"columns": ["figure", "engine (measured)", "stage-0 plan"], "rows": plan_rows},
                "margin": cap.margin, "min_margin": cap.min_margin,
                "charts": [{"kind": "bar", "title": "KV pool vs what the target needs", "x_label": "", "y_label": "tokens",
                            "x_log": False, "series": [
                                {"name": "engine pool", "x": ["tokens"], "y": [cap.pool_tokens]},
                                {"name": "plan pool", "x": ["tokens"], "y": [getattr(plan, "kv_tokens", 0) or 0]},
                                {"name": "needed", "x": ["tokens"], "y": [cap.needed_tokens]}],
                            "reference": [{"y": cap.required_tokens, "label": "needed x (1 + min margin)"}]}]}
    ok = cap.pool_tokens >= cap.required_tokens
    checks = [measured(
        "kvcache.capacity", "KV pool holds target_context x target_concurrency", cap.pool_tokens, cap.required_tokens,
        unit="tokens", direction="higher_is_better", source=source, evidence=evidence,
        message=(f"pool holds {cap.pool_tokens} tokens ({cap.num_blocks - 1} usable blocks x {cap.block_size}); "
                 f"{cap.target_concurrency} x {cap.target_context} needs {cap.needed_tokens}: margin {margin_pct:g}% "
                 f"(min {cap.min_margin * 100:g}%)"
                 + ("" if ok else "; add KV memory (gpu_memory_utilization / VLLM_CPU_KVCACHE_SPACE), "
                                  "use kv_cache_dtype=fp8, or raise tp/pp")),
    )]
    if cap.engine_kv_bytes_per_token is not None:
        checks.append(measured(
            "kvcache.kv_bytes_per_token", "KV bytes per token: config.json x TP x PP equals the engine's KV spec",
            cap.engine_kv_bytes_per_token, cap.kv_bytes_per_token, unit="bytes", direction="exact", source=source,
            message=(f"engine {cap.engine_kv_bytes_per_token} B/token per rank, config.json gives {cap.kv_bytes_per_token}"),
        ))
    if plan is not None and getattr(plan, "kv_tokens", None):
        dev = cap.pool_tokens / plan.kv_tokens - 1.0
        checks.append(measured(
            "kvcache.capacity_vs_plan", "Engine KV pool vs the stage-0 plan", round(dev * 100.0, 2), None,
            unit="% of plan", direction="exact", source=source, evidence={"table": evidence["table"]},
            message=f"engine pool {cap.pool_tokens} tokens vs plan {plan.kv_tokens} ({dev * 100:+.2f}%)"))
    return checks


def prefix_check(probe: PrefixProbe, source: str) -> list[Check]:
    ev = {"prompt_tokens": probe.prompt_len, "cold_cached_tokens": probe.cold_cached,
          "warm_cached_tokens": probe.warm_cached, "cold_tokens": probe.cold_tokens, "warm_tokens": probe.warm_tokens}
    diff = probe.first_difference
    checks = [measured(
        "kvcache.prefix_cache_correctness", "Greedy output with a warm prefix cache equals a cold one",
        0 if probe.identical else 1, 0, unit="mismatching prompts", direction="exact", source=source, evidence=ev,
        message=(f"{len(probe.warm_tokens)} greedy tokens identical for a {probe.prompt_len}-token prompt, cold "
                 f"({probe.cold_cached} cached) and warm ({probe.warm_cached} cached)" if probe.identical else
                 f"warm-cache output differs from cold from token {diff}: cached KV blocks do not reproduce "
                 "the computed ones (block hashing, kv_cache_dtype or attention backend)")),
    ]
    if probe.warm_cached is not None:
        engaged = probe.warm_cached > 0 and (probe.cold_cached or 0) == 0
        checks.append(Check(
            id="kvcache.prefix_cache_engaged", title="The warm request was served from the prefix cache",
            status="pass" if engaged else "fail", value=probe.warm_cached, unit="tokens", direction="higher_is_better",
            source=source, evidence=ev,
            message=(f"warm request reused {probe.warm_cached} of {probe.prompt_len} prompt tokens, cold reused "
                     f"{probe.cold_cached}" + ("" if engaged else
                                               ": the comparison did not exercise the cache (is enable_prefix_caching on?)"))))
    return checks


# --------------------------------------------------------------------------- running both views


def run_in_turn(*views: Callable[[], Any]) -> list[Any]:
    """Run each view's workload alone, one after the other; each exception is returned in place of
    its result, so one failing view never loses the other's samples.

    Not side by side: on a small host the in-process engine and the server compete for the same
    cores, and the in-process engine holds the GIL the HTTP client needs to timestamp its stream,
    so whether a /metrics scrape landed in the steady window became a matter of luck. In turn,
    each view sees the host as the other did, and the verdict stays the same run after run.
    """
    out: list[Any] = []
    for view in views:
        try:
            out.append(view())
        except Exception as exc:
            out.append(exc)
    return out


# --------------------------------------------------------------------------- profile and engine glue


def workload_vocab(profile: Any) -> tuple[int, frozenset[int]]:
    """(vocab size, special ids) for prompts the engine accepts: the local tokenizer when there is
    one, else config.json's ``vocab_size`` minus its BOS/EOS/pad ids."""
    from day0.client.workload import read_vocab
    from day0.engine import local_model_dir

    path = local_model_dir(profile)
    if path is not None and (path / "tokenizer.json").is_file():
        v = read_vocab(path)
        return v.size, v.special_ids
    from day0.model.config import model_config

    config, source = model_config(profile)
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise KvCacheError(f"{source}: no vocab_size; prompts cannot be kept inside the vocabulary")
    special = {x for k in ("bos_token_id", "eos_token_id", "pad_token_id")
               for x in (config.get(k) if isinstance(config.get(k), list) else [config.get(k)]) if isinstance(x, int)}
    return size, frozenset(special)


def live_capacity(engine: Any, profile: Any) -> Capacity:
    """The KV pool of a live engine (scheduler view: exact; HTTP view: /metrics cache_config_info)."""
    from day0.model.config import model_config

    config, _ = model_config(profile)
    per_token = config_kv_bytes_per_token(config, profile.engine.args)
    k = profile.kvcache
    if getattr(engine, "view", "") == "scheduler":
        sampler = SchedulerSampler(engine.scheduler)
        return Capacity(sampler.block_size, sampler.num_blocks, per_token, k.target_context, k.target_concurrency,
                        k.min_capacity_margin, engine_kv_bytes_per_token=engine_kv_bytes_per_token(engine.llm),
                        engine_pool_bytes=engine_pool_bytes(engine.llm))
    m = http_cache_info(engine.base_url)
    blocks = m.usable_blocks + m.engines
    # the pool is whole blocks plus less than one block of slack, so the floor is the exact figure
    measured_per_token = (m.kv_cache_memory_bytes * m.engines // (blocks * m.block_size)
                          if m.kv_cache_memory_bytes else None)
    return Capacity(m.block_size, blocks, per_token, k.target_context, k.target_concurrency, k.min_capacity_margin,
                    engine_kv_bytes_per_token=measured_per_token,
                    engine_pool_bytes=m.kv_cache_memory_bytes * m.engines if m.kv_cache_memory_bytes else None)
