"""The exact view: an in-process engine driven step by step, its scheduler's block tables read after each step.

After every engine step the scheduler's own block tables (``req_to_blocks``) are set against each
request's ``num_computed_tokens`` (tokens whose KV is written); blocks shared through the prefix
cache are counted once.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from day0.core.progress import Progress
from day0.stages.kvcache.errors import WorkloadRejected
from day0.stages.kvcache.fragmentation import BlockTable, Holding, KvSample, count_blocks, is_steady
from day0.stages.kvcache.workload import KvRequest, check_fits, rejection_from_message


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
    prefix_caching: bool = True  # the engine's enable_prefix_caching: off, every request reports 0 cached

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.requests)

    @property
    def prefix_hit_rate(self) -> float | None:
        """None (nothing to judge) with prefix caching off, as the HTTP view has no counters then:
        vLLM still reports 0 cached tokens a request, which read as a miss of the shared-prefix floor."""
        if not self.prefix_caching:
            return None
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
                holdings.append(Holding(BlockTable(head, len(blocks)), min(computed, len(blocks) * bs), len(head)))
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


def _prefix_caching(engine: Any) -> bool:
    cache = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    return bool(getattr(cache, "enable_prefix_caching", True))


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
                   num_blocks=sampler.num_blocks,
                   prefix_caching=_prefix_caching(engine))
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
    bar = Progress(len(workload), "kvcache workload (in-process)", "requests")
    try:
        while engine.has_unfinished_requests():
            if perf() - t0 > timeout_s:
                engine.abort_request([rid for rid, (_, done) in state.items() if not done], internal=True)
                run.error = (f"workload did not finish within kvcache.workload_timeout_s = {timeout_s:g} s "
                             f"({run.steps} steps)")
                break
            outputs = engine.step()
            run.steps += 1
            bar.update(_finished(run, outputs, ids, external, state), f"step {run.steps}")
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
    finally:
        bar.close()
    run.wall_s = perf() - t0
    return run


def _finished(run: ExactRun, outputs: Any, ids: dict[str, int], external: dict[str, str],
              state: dict[str, tuple[int, bool]]) -> int:
    """Record the requests one engine step finished; returns how many."""
    n = 0
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
        n += 1
    return n
