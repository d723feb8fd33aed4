"""Running the workload on the engine and reading the two views of where its tokens went.

* **router** (in-process): day0's worker extension (:mod:`.router_hook`) counts every router's
  top-k ids on every worker; ``collective_rpc`` arms and reads it (``POST /collective_rpc`` on a
  server started with ``VLLM_SERVER_DEV_MODE=1``, ``LLM.collective_rpc`` in-process).
* **routed** (black box): vLLM's ``routed_experts`` on each non-streamed response (:mod:`.routed`).

A view that is not there says why in one line; the stage turns that into "could not measure".
Requests are non-streamed because vLLM puts ``routed_experts`` only on the whole response; routing
does not depend on how the answer is delivered.
"""

from __future__ import annotations

import json
import reprlib
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

from day0.client.workload import Request
from day0.core.numbers import token_count
from day0.stages.experts.load import LayerLoad, LoadError, merge
from day0.stages.experts.routed import Routed, RoutedError, count, decode
from day0.stages.experts.router_hook import EXTENSION

RESET, READ = "day0_experts_reset", "day0_experts_read"


class ViewMissing(RuntimeError):
    """A view this engine does not give; the message says what would turn it on."""


@dataclass(frozen=True)
class Answer:
    prompt_tokens: int | None  # None: the response did not say (no usable usage)
    completion_tokens: int | None
    routed: Routed | None  # vLLM's routed_experts, when the engine returns it
    routed_error: str | None = None  # it returned one that cannot be read: that view could not measure

    @property
    def forwarded(self) -> int | None:
        """Tokens that went through the model: every prompt token and every output token but the
        last (sampled, never fed back); None when the response did not give its token counts."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + max(0, self.completion_tokens - 1)


class Driver(Protocol):
    """What the stage needs of an engine: one completion, and a call on every worker."""

    source: str

    def complete(self, req: Request, extra: dict[str, Any]) -> Answer: ...

    def rpc(self, method: str) -> list[Any]: ...

    def run(self, reqs: Sequence[Request], extra: dict[str, Any], concurrency: int) -> list[Answer]: ...


@dataclass
class HttpDriver:
    """The engine's OpenAI-compatible API (``day0.engine.Endpoint``: the URL, name and key)."""

    endpoint: Any
    source: str = "http"

    def complete(self, req: Request, extra: dict[str, Any]) -> Answer:
        body = {"model": self.endpoint.model, "prompt": req.prompt, "max_tokens": req.output_len,
                "ignore_eos": True, **extra, "stream": False}
        out = self.endpoint.json("/v1/completions", body)
        choice, usage = out["choices"][0], out.get("usage")
        raw = choice.get("routed_experts")
        prompt, completion = _usage_count(usage, "prompt_tokens"), _usage_count(usage, "completion_tokens")
        try:
            return Answer(prompt, completion, decode(raw) if raw is not None else None)
        except RoutedError as exc:  # one bad response: the view could not measure, the stage goes on
            return Answer(prompt, completion, None, routed_error=str(exc))

    def run(self, reqs: Sequence[Request], extra: dict[str, Any], concurrency: int) -> list[Answer]:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(reqs)))) as pool:
            return list(pool.map(lambda r: self.complete(r, extra), reqs))

    def rpc(self, method: str) -> list[Any]:
        try:
            out = self.endpoint.json("/collective_rpc", {"method": method})
        except urllib.error.HTTPError as exc:
            raise ViewMissing(rpc_refusal(exc.code, _body(exc))) from None
        results = out.get("results") if isinstance(out, dict) else None
        if not isinstance(results, list):
            raise ViewMissing(f"POST /collective_rpc answered {str(out)[:200]!r}, not {{\"results\": [...]}}")
        return results


def _usage_count(usage: Any, key: str) -> int | None:
    """``usage[key]`` when it is a token count; None (not 0) when absent or not a count, so the
    router view is reported unverified rather than checked against a workload of no tokens."""
    return token_count(usage.get(key)) if isinstance(usage, dict) else None


def _body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode("utf-8", "replace")[:2000]
    except Exception:  # a body that cannot be read is no worse than an empty one
        return ""


def rpc_refusal(status: int, body: str) -> str:
    """Why ``POST /collective_rpc`` did not answer, in terms of the setting that would fix it."""
    if status == 404:
        return ("POST /collective_rpc answered 404: the server's dev endpoints are off (start it with "
                "VLLM_SERVER_DEV_MODE=1 in engine.env)")
    if "has no attribute" in body and "day0_experts" in body:
        return (f"the engine's workers have no {RESET}: start it with engine.args.worker_extension_cls = "
                f"\"{EXTENSION}\"")
    try:
        msg = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = body
    return f"POST /collective_rpc answered HTTP {status}: {' '.join(str(msg).split())[:300]}"


@dataclass
class InprocessDriver:
    """``vllm.LLM`` in this process (``engine.mode = "inprocess"``)."""

    llm: Any
    source: str = "scheduler"

    def complete(self, req: Request, extra: dict[str, Any]) -> Answer:
        return self.run([req], extra, 1)[0]

    def run(self, reqs: Sequence[Request], extra: dict[str, Any], concurrency: int) -> list[Answer]:
        from vllm import SamplingParams

        known = set(getattr(SamplingParams, "__struct_fields__", ()))  # request-body keys vLLM's sampler takes
        kw = {k: v for k, v in extra.items() if k in known}
        salt = {"cache_salt": extra["cache_salt"]} if extra.get("cache_salt") else {}
        outs = self.llm.generate([{"prompt_token_ids": list(r.prompt), **salt} for r in reqs],
                                 [SamplingParams(max_tokens=r.output_len, ignore_eos=True, **kw) for r in reqs],
                                 use_tqdm=False)
        return [Answer(None if o.prompt_token_ids is None else len(o.prompt_token_ids), len(o.outputs[0].token_ids),
                       _from_array(getattr(o.outputs[0], "routed_experts", None))) for o in outs]

    def rpc(self, method: str) -> list[Any]:
        try:
            return list(self.llm.collective_rpc(method))
        except AttributeError as exc:
            raise ViewMissing(f"the engine's workers have no {method} ({exc}): start it with "
                              f"engine.args.worker_extension_cls = \"{EXTENSION}\"") from None


def _from_array(arr: Any) -> Routed | None:
    if arr is None:
        return None
    shape = tuple(int(n) for n in arr.shape)
    if len(shape) != 3:
        raise RoutedError(f"routed_experts: expected (tokens, layers, top_k), got shape {shape}")
    return Routed(arr.reshape(-1).tolist(), *shape)


@dataclass
class Workers:
    """What the router view's workers answered, combined into one count per layer."""

    loads: dict[int, LayerLoad]
    workers: int
    tp_agree: bool  # every TP rank of a data-parallel group counted the same (a replicated router)
    sharded: bool  # sequence-parallel MoE: each TP rank routed a shard, their counts were summed
    skipped: list[str] = field(default_factory=list)


def combine(results: Sequence[Any]) -> Workers:
    """Per data-parallel group and layer: one TP rank's counts when its ranks each route every
    token (the router is replicated: their counts must agree), their sum under sequence-parallel
    MoE (each TP rank routes its own shard); then the sum over data-parallel groups (each routes
    its own requests). Pipeline stages hold different layers, so their layers sit side by side.
    An answer that is no count (:func:`read_worker`) is ViewMissing naming the worker and field."""
    groups: dict[tuple[int, int], list[tuple[int, list[int], int]]] = {}
    skipped: list[str] = []
    sharded = False
    for i, res in enumerate(results):
        if not isinstance(res, dict) or "counts" not in res:
            why = res.get("error") if isinstance(res, dict) else str(res)[:200]
            raise ViewMissing(f"a worker answered {READ} without counts: {why}")
        dp, tp, layers, said = read_worker(i, res)
        skipped += [s for s in said if s not in skipped]
        sharded |= bool(res.get("sequence_parallel"))
        for layer, (counts, tokens) in layers.items():
            groups.setdefault((dp, layer), []).append((tp, counts, tokens))
    agree = True
    parts: list[dict[int, LayerLoad]] = []
    for (_, layer), entries in sorted(groups.items()):
        entries.sort(key=lambda e: e[0])
        n = len(entries[0][1])
        if sharded:
            if any(len(c) != n for _, c, _ in entries):
                raise ViewMissing(f"layer {layer}: the TP ranks' shards hold {sorted({len(c) for _, c, _ in entries})} "
                                  "expert counts, not one number of experts")
            parts.append({layer: LayerLoad.of(layer, [sum(c[e] for _, c, _ in entries) for e in range(n)],
                                              sum(t for _, _, t in entries), n)})
            continue
        agree = agree and all(c == entries[0][1] and t == entries[0][2] for _, c, t in entries)
        parts.append({layer: LayerLoad.of(layer, entries[0][1], entries[0][2], n)})
    return Workers(merge(parts), len(results), agree, sharded, skipped)


def read_worker(i: int, res: dict[str, Any]) -> tuple[int, int, dict[int, tuple[list[int], int]], list[str]]:
    """(dp rank, tp rank, {layer: (counts, tokens)}, skipped) from worker ``i``'s answer, every
    number a count by :func:`~day0.core.numbers.token_count`. The answer crosses JSON from another
    process: ``int()`` of it raised ValueError on NaN, OverflowError on Infinity, TypeError on "3"
    (past observe, which catches only ViewMissing) and cut 3.7 to 3; now each is ViewMissing, one
    line naming the worker and the field ("worker 1: counts[3][5] is nan, not a count")."""
    where = f"worker {i}"
    counts, tokens, said = res["counts"], res.get("tokens"), res.get("skipped") or []
    for key, value in (("counts", counts), ("tokens", tokens)):
        if not isinstance(value, dict):
            raise ViewMissing(f"{where}: {key} is {reprlib.repr(value)}, not an object of layers")
    if not isinstance(said, list):
        raise ViewMissing(f"{where}: skipped is {reprlib.repr(said)}, not a list")
    dp, tp = (_count(res.get(k, 0), f"{where}: {k}") for k in ("dp_rank", "tp_rank"))
    layers: dict[int, tuple[list[int], int]] = {}
    for key, row in counts.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ViewMissing(f"{where}: counts key {reprlib.repr(key)} is not a layer number")
        if not isinstance(row, list):
            raise ViewMissing(f"{where}: counts[{key}] is {reprlib.repr(row)}, not a list of counts")
        layers[int(key)] = ([_count(c, f"{where}: counts[{key}][{e}]") for e, c in enumerate(row)],
                            _count(tokens.get(key), f"{where}: tokens[{key}]"))
    return dp, tp, layers, [str(s) for s in said]


def _count(value: Any, field_name: str) -> int:
    n = token_count(value)
    if n is None:
        raise ViewMissing(f"{field_name} is {'missing' if value is None else reprlib.repr(value)}, not a count")
    return n


@dataclass
class Observed:
    """One pass of the workload and what each view saw of it."""

    answers: list[Answer]
    seconds: float
    cacheable_tokens: int = 0  # at most these prompt tokens come from the prefix cache (:func:`cacheable`)
    router: Workers | None = None
    router_missing: str | None = None
    routed: dict[int, LayerLoad] | None = None
    routed_missing: str | None = None

    @property
    def prompt_tokens(self) -> int | None:
        return _total(a.prompt_tokens for a in self.answers)

    @property
    def completion_tokens(self) -> int | None:
        return _total(a.completion_tokens for a in self.answers)

    @property
    def forwarded_tokens(self) -> int | None:
        """Every answer's :attr:`Answer.forwarded`; None when any answer did not give its counts."""
        return _total(a.forwarded for a in self.answers)

    @property
    def uncounted(self) -> int:
        """Answers that did not say how many tokens they took."""
        return sum(1 for a in self.answers if a.forwarded is None)


def _total(counts: Iterable[int | None]) -> int | None:
    out = 0
    for n in counts:
        if n is None:
            return None
        out += n
    return out


def cacheable(reqs: Sequence[Request]) -> int:
    """The most prompt tokens the prefix cache can serve this workload: a shared prefix is cached
    only once a request of its group has computed it, and the run's fresh ``cache_salt`` keeps any
    earlier run's cache out, so the first request of each group computes its prefix whole. Per
    prefix group, every member's ``shared_len`` but the smallest (whichever goes first, the bound
    holds). The experts workload has no nonce, so requests of different groups share nothing; a
    request without a group shares nothing. Counting the first of each group too excused a whole
    prefix per group that no cache could serve (with a prefix per request, every prefix token)."""
    groups: dict[int, list[int]] = {}
    for r in reqs:
        if r.prefix_group is not None:
            groups.setdefault(r.prefix_group, []).append(r.shared_len)
    return sum(sum(lens) - min(lens) for lens in groups.values())


def observe(driver: Driver, reqs: Sequence[Request], extra: dict[str, Any], concurrency: int, num_experts: int,
            moe_layers: Sequence[int] | None, progress: Callable[[str], None] | None = None) -> Observed:
    """Arm the router view, run the requests, read both views."""
    say = progress or (lambda _msg: None)
    armed: str | None = None
    try:
        driver.rpc(RESET)
    except ViewMissing as exc:
        armed = str(exc)
    say(f"experts: {len(reqs)} requests, {concurrency} at a time (router view: {'off: ' + armed if armed else 'armed'})")
    t0 = time.perf_counter()
    answers = driver.run(reqs, extra, concurrency)
    obs = Observed(answers, time.perf_counter() - t0, cacheable(reqs), router_missing=armed)
    if armed is None:
        try:
            obs.router = combine(driver.rpc(READ))
        except (ViewMissing, LoadError) as exc:
            obs.router_missing = str(exc)
    obs.routed, obs.routed_missing = _routed(answers, num_experts, moe_layers)
    return obs


def _routed(answers: Sequence[Answer], num_experts: int, moe_layers: Sequence[int] | None
            ) -> tuple[dict[int, LayerLoad] | None, str | None]:
    unreadable = next((a.routed_error for a in answers if a.routed_error), None)
    if unreadable:
        return None, unreadable
    have = [a.routed for a in answers if a.routed is not None]
    if have and num_experts < 1:
        return None, "the responses carry routed_experts, but without a config.json here the number of experts is unknown"
    if not have:
        return None, ("no response carried routed_experts (the engine was started without "
                      "enable_return_routed_experts; vLLM 0.32 builds it only with Model Runner V2, which "
                      "needs Triton: not on the CPU backend)")
    if len(have) < len(answers):
        return None, f"only {len(have)} of {len(answers)} responses carried routed_experts"
    try:
        return merge([count(r, num_experts, moe_layers) for r in have]), None
    except (RoutedError, LoadError) as exc:
        return None, str(exc)
