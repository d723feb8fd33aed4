"""Stage 3's flat-out figure for a rate search (:class:`~day0.stages.latency.measurement.Saturation`),
and the settle before each search point.

An open loop at or past the rate a server completes flat out queues without bound, but a search
point of a few seconds that starts on an idle server ends before that queue reaches a limit, and
probes of 32 requests meet every bound at any rate (measured on cpu-tiny: docs/stages/capacity-evidence.md,
"Is it the server or the search?"). So a rate search first keeps the server's batch full for a
while (a closed loop), reads the rate it completes requests at, and misses every rate at or past
it without spending a point there. The figure bounds the search only when /metrics showed
requests waiting while it was read: a server with free slots was not running flat out, and a
ceiling read off it would miss rates the server can sustain.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Awaitable, Callable, Sequence

import aiohttp

from day0.client.loadgen import LoadShape, PhaseResult
from day0.client.prom import PromError, parse_counters, scrape
from day0.client.stream import RequestResult
from day0.stages.latency.measurement import Saturation

MIDDLE = 0.2  # the share of completions left out at each end: the closed loop's fill and its drain
MIN_COMPLETED = 10  # fewer completions give no middle to read a rate over
WATCH_EVERY_S = 0.5  # /metrics polls while saturating: a few dozen a run, not a load of their own
WAITING, RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"


def middle_window(finished: Sequence[float]) -> tuple[float, float, float] | None:
    """(completions per second, start, end) between the ``MIDDLE`` and the ``1 - MIDDLE`` quantile of
    the completion times: the rate while the batch stays full, without the first requests' joint
    prefill or the last ones' drain, when fewer than the batch are left. None under ``MIN_COMPLETED``
    completions or over a window of no length."""
    t = sorted(finished)
    if len(t) < MIN_COMPLETED:
        return None
    i = int(len(t) * MIDDLE)
    j = len(t) - 1 - i
    span = t[j] - t[i]
    return ((j - i) / span, t[i], t[j]) if span > 0 else None


def saturation_of(results: Sequence[RequestResult], requests: int, concurrency: int,
                  waiting: Sequence[tuple[float, float]] | None, no_metrics: str = "") -> Saturation:
    """The figure from a closed loop's requests and the ``(perf_counter, requests waiting)`` polls
    taken while it ran (None: /metrics could not be read, ``no_metrics`` says why)."""
    window = middle_window([r.finished for r in results if r.ok])
    if window is None:
        done = sum(r.ok for r in results)
        return Saturation(None, requests, concurrency, None,
                          f"{done} of {requests} requests completed: no middle to read a rate over")
    rate, start, end = window
    if waiting is None:
        return Saturation(rate, requests, concurrency, None,
                          f"no /metrics to show the batch was full ({no_metrics or 'not read'})", end - start)
    seen = [w for t, w in waiting if start <= t <= end]
    if not seen:
        return Saturation(rate, requests, concurrency, False,
                          "no /metrics poll landed in the window it was read over", end - start)
    if max(seen) <= 0:
        return Saturation(rate, requests, concurrency, False,
                          f"no request waited in {len(seen)} /metrics polls: the batch was not full", end - start)
    return Saturation(rate, requests, concurrency, True, window_s=end - start)


async def _gauges(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    return parse_counters(await scrape(session, base_url), (WAITING, RUNNING))


async def _watch(session: aiohttp.ClientSession, base_url: str, polls: list[tuple[float, float]]) -> str:
    """Poll the waiting gauge into ``polls`` until cancelled; return why it stopped early ("" when cancelled)."""
    try:
        while True:
            gauges = await _gauges(session, base_url)
            if WAITING not in gauges:
                return f"/metrics has no {WAITING}"
            polls.append((time.perf_counter(), gauges[WAITING]))
            await asyncio.sleep(WATCH_EVERY_S)
    except PromError as exc:
        return str(exc)
    except asyncio.CancelledError:
        return ""


async def measure_saturation(phase: Callable[[LoadShape], Awaitable[PhaseResult]], session: aiohttp.ClientSession,
                             base_url: str, requests: int, concurrency: int, seed: int) -> tuple[Saturation, PhaseResult]:
    """Run ``phase`` as a closed loop of ``concurrency`` in flight (0: every request at once) while
    watching /metrics; the figure, and the phase for its own metrics (the Pareto view's flat-out point)."""
    c = concurrency or requests
    polls: list[tuple[float, float]] = []
    watcher = asyncio.create_task(_watch(session, base_url, polls))
    try:
        result = await phase(LoadShape(mode="concurrency", concurrency=c, seed=seed))
    finally:
        watcher.cancel()
        stopped = await watcher  # never raises (_watch returns why it stopped): a failed phase leaves no task
    return saturation_of(result.results, requests, c, polls if polls else None, stopped), result


Measure = Callable[[int, int], Awaitable[tuple[Saturation, PhaseResult]]]  # (requests, in flight) -> a run


async def flat_out(measure: Measure, requests: int, concurrency: int, max_requests: int,
                   say: Callable[[str], None]) -> tuple[Saturation, PhaseResult]:
    """The flat-out run, doubled (its requests, and its in-flight count where one is set) while
    /metrics shows none of them waiting in the window the rate is read over, up to ``max_requests``.
    The figure bounds a search only when the batch was full, and a server's batch is whatever its
    ``max_num_seqs`` (or KV cache) allows: vLLM's own default is 1024 on an H100, H200 or B200 and
    256 on other GPUs, so a fixed 200 would leave every GPU server's batch room and its search
    without a top (the cpu-tiny server's 16 fill at the first run). A fast server's window can
    also be shorter than the /metrics polls, which a longer run mends too. The runs that showed no
    queue are counted (``tried``)."""
    tried: list[int] = []
    while True:
        sat, phase = await measure(requests, concurrency)
        if sat.queued is not False or requests * 2 > max_requests:
            if sat.queued is False:
                sat = replace(sat, why=f"{sat.why} at {requests} requests (raise "
                                       f"latency.search.saturation_max_requests, {max_requests}, past the server's "
                                       "max_num_seqs)")
            return replace(sat, tried=tuple(tried)), phase
        tried.append(requests)
        requests, concurrency = requests * 2, concurrency * 2
        say(f"capacity search: {sat.why}; flat out again with {requests} requests, "
            f"{concurrency or requests} in flight")


async def settle(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 30.0) -> float:
    """Wait until the server runs and queues nothing (its /metrics gauges), at most ``timeout_s``;
    the seconds waited. A point that starts behind the last one's leftovers (an overloaded point
    stopped early cancels its requests, and the server aborts them on its own time) measures a queue
    it did not offer. Without those gauges there is nothing to wait on: 0."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        try:
            gauges = await _gauges(session, base_url)
        except PromError:
            return 0.0
        if WAITING not in gauges or RUNNING not in gauges or gauges[WAITING] + gauges[RUNNING] <= 0:
            break
        await asyncio.sleep(0.05)
    return time.perf_counter() - start
