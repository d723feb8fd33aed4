"""Stage 3's measured run over HTTP: warm up, scrape /metrics, the measured phase, scrape again,
the optional sweep; and the short throughput run other stages price."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import aiohttp

from day0.client import loops
from day0.client.loadgen import (
    ClientOptions,
    LoadShape,
    PhaseResult,
    Until,
    fetch_models,
    make_session,
    make_streams,
    run_phase,
)
from day0.client.prom import PrefixCacheWindow, PromError, ServerFigure, prefix_cache_window, scrape, server_view
from day0.client.spec_decode import acceptance
from day0.client.wire import StreamPool
from day0.client.workers import WorkerPool
from day0.client.workload import Request, Vocab, as_text, build_requests, new_nonce, shared_share
from day0.config.latency import LatencySection, SlaSection
from day0.stages.latency.measurement import CacheIntent, LatencyRun, Saturation, SearchResult, SpecWindow
from day0.stages.latency.metrics import LatencyMetrics, compute_metrics
from day0.stages.latency.saturation import flat_out, measure_saturation, settle
from day0.stages.latency.search import requests_per_point, search_capacity
from day0.stages.latency.settings import (
    DEFAULT_BLOCK_SIZE,
    EngineContext,
    client_options,
    dataset_lengths,
    load_shape,
    load_workers,
    phase_workers,
    search_shape,
    workload_spec,
)
from day0.stages.latency.sweep import run_sweep


def cache_intent(reqs: Sequence[Request], s: LatencySection, block_size: int | None, workload: str) -> CacheIntent:
    """The prefix-cache share the measured requests mean to have (see :class:`CacheIntent`)."""
    block = block_size or DEFAULT_BLOCK_SIZE
    total = sum(r.input_len for r in reqs)
    allowance = min(block, min((r.input_len for r in reqs), default=0)) * len(reqs) / total if total else 0.0
    return CacheIntent(shared_share(reqs), allowance, block, s.fresh_prompts, workload=workload)


def report_percentiles(settings: LatencySection, sla: SlaSection) -> list[float]:
    """The percentiles every phase reports: the profile's, every SLA limit's, p50 and p99."""
    return sorted(set(settings.percentiles) | {p for _, p, _ in sla.latency_limits()} | {50.0, 99.0})


class _Load:
    """Where a phase's load comes from: this process (one worker: the plain single-loop path) or
    a pool of worker processes that each drive a shard (``day0.client.workers``)."""

    def __init__(self, session: aiohttp.ClientSession, streams: StreamPool, pool: WorkerPool | None, base_url: str,
                 opts: ClientOptions, share: Callable[[LoadShape], int]) -> None:
        self.session, self.streams, self.pool, self.base_url, self.opts = session, streams, pool, base_url, opts
        self.share = share  # how many of the pool's workers a phase at this load uses

    async def phase(self, model: str, reqs: Sequence[Request], shape: LoadShape, name: str,
                    until: Until | None = None) -> PhaseResult:
        """``until`` (a stop rule) judges the whole phase here, a pool's workers' requests as they end
        (``WorkerPool.run_phase``)."""
        if self.pool is None:
            return await run_phase(self.streams, self.base_url, model, reqs, shape, self.opts, phase=name, until=until)
        return await self.pool.run_phase(self.base_url, model, reqs, shape, self.opts, phase=name, until=until,
                                         workers=self.share(shape))


async def _scrape(session: aiohttp.ClientSession, base_url: str) -> tuple[Any, str | None]:
    try:
        return await scrape(session, base_url), None
    except PromError as exc:
        return None, str(exc)


async def measure_latency(
    base_url: str,
    model: str | None,
    vocab: Vocab | int,
    settings: LatencySection | None = None,
    sla: SlaSection | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    headers: dict[str, str] | None = None,
    ctx: EngineContext | None = None,
) -> LatencyRun:
    """Warm up, scrape /metrics, run the measured phase, scrape again, optionally sweep.

    ``headers`` go with every request (the engine's bearer key, from ``day0.engine.auth_headers``).
    With more than one load worker (``latency.workers``) every phase is split across them.
    ``ctx`` says what the workload needs of the engine (tokenizer, max_model_len, block size)."""
    s = settings or LatencySection()
    sla = sla or SlaSection()
    say = progress or (lambda _msg: None)
    if isinstance(vocab, int):
        vocab = Vocab(vocab, frozenset(s.special_token_ids))
    elif s.special_token_ids:
        vocab = Vocab(vocab.size, vocab.special_ids | frozenset(s.special_token_ids))
    ctx = ctx or EngineContext()
    dataset = dataset_lengths(s, ctx)
    spec = workload_spec(s, nonce=new_nonce() if s.fresh_prompts else None, dataset=dataset, ctx=ctx)
    opts, pcts, slo = client_options(s, headers), report_percentiles(s, sla), sla.per_request_slo()
    workers = load_workers(s, base_url)

    def requests(n: int, stream: str) -> list[Request]:
        reqs = build_requests(spec, vocab, n, stream=stream)
        return as_text(reqs, s.seed) if s.endpoint == "chat" else reqs

    # the timed requests on their own connections (day0.client.wire); model list and /metrics on aiohttp's
    async with make_session(opts) as session, make_streams(opts) as streams, contextlib.AsyncExitStack() as stack:
        if not model:
            names = await fetch_models(session, base_url)
            if not names:
                raise RuntimeError(f"{base_url}/v1/models lists no model; pass the served model name")
            model = names[0]
        pool = await stack.enter_async_context(WorkerPool(workers)) if workers > 1 else None
        load = _Load(session, streams, pool, base_url, opts, lambda shape: phase_workers(s, shape, workers))
        warm = None
        if s.warmup_requests:
            say(f"warm-up: {s.warmup_requests} requests")
            warm = compute_metrics(await load.phase(model, requests(s.warmup_requests, "warmup"), load_shape(s),
                                                    "warmup"), pcts)
        before, server_error = await _scrape(session, base_url) if s.server_metrics else (None, None)
        count = s.measured_requests(sla)
        say(f"measure: {count} requests, load={s.load}" + (f", {workers} load workers" if pool else ""))
        main = requests(count, "main")
        phase = await load.phase(model, main, load_shape(s), "measure")
        metrics = compute_metrics(phase, pcts, slo)
        cache = cache_intent(main, s, ctx.block_size, dataset.counted_with if dataset else "")
        cache.why_unmeasured = server_error or ("latency.server_metrics = false" if not s.server_metrics else "")
        server, drafts = None, SpecWindow(why_unmeasured=cache.why_unmeasured)
        if s.server_metrics and server_error is None:
            after, server_error = await _scrape(session, base_url)
            cache.why_unmeasured = drafts.why_unmeasured = server_error or ""
            if after is not None:
                server, server_error = _server_view(before, after, pcts)
                cache.window, cache.why_unmeasured = _cache_window(before, after)
                drafts = _spec_window(before, after)

        async def measure_at(rate: float, n: int) -> LatencyMetrics:
            stream = f"sweep{rate:g}"  # the step's own prompts and arrivals
            sp = await load.phase(model, requests(n, stream), load_shape(s, rate, stream), "sweep")
            return compute_metrics(sp, pcts, slo)

        sweep = await run_sweep(measure_at, s, sla, say)
        search = await _search(load, model, requests, s, sla, pcts, slo, say) if s.search is not None else None
    return LatencyRun(base_url, model, s, sla, metrics, warm, server, server_error, sweep, cache, drafts, search)


async def _search(load: _Load, model: str, requests: Callable[[int, str], list[Request]], s: LatencySection,
                  sla: SlaSection, pcts: list[float], slo: dict[str, float], say: Callable[[str], None]) -> SearchResult:
    """The capacity search (``[latency.search]``) on the stage's own load and workload."""
    search = s.search
    assert search is not None
    points = 0

    async def search_at(x: float, n: int, until: Until | None = None) -> LatencyMetrics:
        nonlocal points
        points += 1  # each point its own prompts and arrivals: a fresh stream name
        stream = f"search{points}"
        waited = await settle(load.session, load.base_url) if s.server_metrics else 0.0
        if waited >= 1.0:
            say(f"capacity search: waited {waited:.1f} s for the server to finish the last point's requests")
        sp = await load.phase(model, requests(n, stream), search_shape(s, x, stream), "search", until)
        return compute_metrics(sp, pcts, slo)

    async def saturate() -> tuple[Saturation, LatencyMetrics | None]:
        n = search.saturation_requests
        if not s.server_metrics:  # the figure could not be trusted: not worth its requests
            return Saturation(None, n, search.saturation_concurrency or n, None,
                              "latency.server_metrics = false, so no /metrics to show the batch full"), None
        say(f"capacity search: saturation, {n} requests, {search.saturation_concurrency or n} in flight")

        async def run(count: int, in_flight: int) -> tuple[Saturation, PhaseResult]:
            reqs = requests(count, f"saturation{count}")  # each run its own prompts: no cache hit on a rerun
            return await measure_saturation(lambda shape: load.phase(model, reqs, shape, "saturation"),
                                            load.session, load.base_url, count, in_flight, s.seed)

        sat, phase = await flat_out(run, n, search.saturation_concurrency, search.saturation_max_requests, say)
        return sat, compute_metrics(phase, pcts, slo)

    return await search_capacity(search_at, search, sla, requests_per_point(search, sla), say,
                                 saturate if search.saturation_requests else None)


def _server_view(before: str | None, after: str, pcts: list[float]) -> tuple[dict[str, ServerFigure] | None, str | None]:
    """The engine's latency histograms over the window, or why not: a server that restarted between
    the scrapes (counts went down) leaves the client's figures measured and the server view not."""
    try:
        server = server_view(before, after, percentiles=pcts)
    except PromError as exc:
        return None, str(exc)
    return server, None if server else "/metrics has no vllm:* latency histograms (not a vLLM server?)"


def _cache_window(before: str | None, after: str) -> tuple[PrefixCacheWindow | None, str]:
    try:
        window = prefix_cache_window(before, after)
    except PromError as exc:
        return None, str(exc)
    return window, "" if window else "/metrics has no vllm:prefix_cache_hits/queries counters"


def _spec_window(before: str | None, after: str) -> SpecWindow:
    """Speculative decoding's counters over the same window; read whether or not the profile
    speculates (the checks decide what applies), so an engine that does is never unread."""
    try:
        acc = acceptance(before, after)
    except PromError as exc:
        return SpecWindow(None, str(exc))
    return SpecWindow(acc, "" if acc else "/metrics has no vllm:spec_decode_* counters (speculation off?)")


def run_latency(base_url: str, model: str | None, vocab: Vocab | int, settings: LatencySection | None = None,
                sla: SlaSection | None = None, *, progress: Callable[[str], None] | None = None,
                headers: dict[str, str] | None = None, ctx: EngineContext | None = None) -> LatencyRun:
    """Blocking entry point for the suite and the CLI (runs its own event loop)."""
    return loops.run(measure_latency(base_url, model, vocab, settings, sla, progress=progress, headers=headers,
                                     ctx=ctx))


@dataclass(frozen=True)
class MeasuredThroughput:
    """Output throughput of a short run of this stage's workload, with where it came from."""

    tok_s: float
    source: str  # where the figure came from, in words
    detail: dict[str, Any]


def measure_throughput(base_url: str, model: str, vocab: Any, latency: LatencySection, requests: int,
                       progress: Any = None, headers: dict[str, str] | None = None) -> MeasuredThroughput:
    """A short run of stage 3's own workload (the profile's ``[latency]`` load shape, fewer
    requests, no sweep), for runs where stage 3 did not record a throughput."""
    settings = LatencySection.from_table({**latency.model_dump(), "num_requests": requests,
                                          "warmup_requests": min(1, requests), "sweep_rates": [],
                                          "server_metrics": False})
    run = run_latency(base_url, model, vocab, settings, progress=progress, headers=headers)
    m = run.metrics
    if m.completed == 0 or not m.output_throughput > 0:
        raise RuntimeError(f"throughput measurement at {base_url}: no request completed")
    return MeasuredThroughput(float(m.output_throughput), f"own measurement: {m.completed} requests, {settings.load} "
                              f"load (concurrency {settings.concurrency})",
                              {"requests": requests, "completed": m.completed, "load": settings.load,
                               "concurrency": settings.concurrency})
