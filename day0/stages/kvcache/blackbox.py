"""The black-box view: the workload over HTTP with /metrics scraped beside it.

``vllm:kv_cache_usage_perc`` x the pool's block count gives the blocks in use; the harness knows
its own requests' prompt lengths and how many tokens each has streamed, hence the tokens stored.
Only scrapes where that knowledge is exact (every request decoding, none at a boundary) are kept;
passes of the workload are pooled until enough scrapes resolve.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from day0.client.kv_metrics import KvMetrics, parse_kv_metrics
from day0.stages.kvcache.errors import KvCacheError, WorkloadRejected
from day0.stages.kvcache.fragmentation import KvSample
from day0.stages.kvcache.workload import KvRequest, check_fits, rejection_from_message


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
    from day0.client.stream import StreamCut, data_events

    try:
        async with session.post(url, json=payload) as resp:
            if resp.status != 200:
                body = " ".join((await resp.text()).split())[:400]
                flight.error = f"http_{resp.status}: {body}"
                return
            try:
                async for data in data_events(resp):  # day0's one SSE reader: events bounded in size
                    obj = json.loads(data)
                    if "error" in obj:
                        flight.error = f"server error: {str(obj['error'])[:300]}"
                        return
                    usage = obj.get("usage")
                    if usage and usage.get("completion_tokens") is not None:
                        flight.received = int(usage["completion_tokens"])
                    if any(c.get("finish_reason") for c in obj.get("choices") or []):
                        flight.done = True
            except StreamCut:  # no [DONE]: what counts is whether the request finished
                pass
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
    from day0.core.progress import Progress

    bar = Progress(len(workload), f"kvcache workload (pass {run.passes})", "requests")
    try:
        while not all(t.done() for t in tasks):
            bar.set(sum(f.done for f in flights), f"{run.scrapes} scrapes")
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
        bar.close()
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
