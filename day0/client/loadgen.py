"""Load shapes and phases: one phase's schedule of requests, driven from one event loop.

A phase is a list of requests and a load shape: closed loop (a fixed number of requests in
flight) or open loop (an arrival process at a request rate). :func:`run_phase` drives a whole
phase from this process; :func:`drive` drives any part of one from a given start instant, which
is what a shard of a phase split across processes runs (``day0.client.shards``), so one process
and N processes time every request with the same code.

Requests are timed from their scheduled send (``day0.client.stream``), so a loop that falls
behind shows as latency, never as a lower offered load.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from day0.client.sse import SSEEvent, SSEParser
from day0.client.stream import (
    ERROR_KINDS,
    TOKEN_SOURCES,
    ClientOptions,
    Endpoint,
    RequestResult,
    TokenAccountant,
    _Failed,
    build_payload,
    endpoint_url,
    fetch_models,
    make_session,
    make_streams,
    stream_one,
    token_source,
)
from day0.client.wire import StreamPool
from day0.client.workload import ARRIVALS, Request, arrival_offsets

__all__ = [
    "ARRIVALS", "ERROR_KINDS", "TOKEN_SOURCES", "ClientOptions", "Endpoint", "LoadShape", "Part", "PhaseResult",
    "RequestResult", "SSEEvent", "SSEParser", "TokenAccountant", "_Failed", "build_payload", "drive",
    "endpoint_url", "fetch_models", "make_session", "make_streams", "new_tag", "request_id", "run_phase", "sleep_until",
    "stream_one", "token_source",
]


@dataclass
class LoadShape:
    """Fixed concurrency (closed loop) or an open-loop arrival rate.

    In ``rate`` mode ``concurrency`` > 0 caps the requests in flight; the wait for a slot is
    inside the measured latency because latency runs from the scheduled time. ``arrivals`` says
    where the first request goes: ``immediate`` at t=0, ``vllm`` after one gap with the schedule
    rescaled so the last request lands at n/rate (``day0.client.workload.arrival_offsets``).
    """

    mode: Literal["concurrency", "rate"] = "concurrency"
    concurrency: int = 4
    request_rate: float = 1.0
    burstiness: float = 1.0
    seed: int = 0
    duration_s: float | None = None  # stop scheduling new requests after this long
    precise_timing: bool = True  # spin the last ~1 ms before a send (epoll sleeps are ms-coarse)
    arrivals: str = "immediate"  # one of ARRIVALS
    exact_rate: bool = False  # rescale the schedule so it offers exactly request_rate (arrival_offsets' exact)
    stream: str = ""  # which of the seed's schedules (arrival_offsets' stream): a sweep step's or search point's own

    def validate(self) -> None:
        if self.mode not in ("concurrency", "rate"):
            raise ValueError(f"load mode: expected 'concurrency' or 'rate', got {self.mode!r}")
        if self.mode == "concurrency" and self.concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1 in concurrency mode, got {self.concurrency}")
        if self.concurrency < 0:
            raise ValueError(f"concurrency: must be >= 0, got {self.concurrency}")
        if self.mode == "rate" and not self.request_rate > 0:
            raise ValueError(f"request_rate: must be > 0, got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness: must be > 0, got {self.burstiness}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s: must be > 0, got {self.duration_s}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals: expected one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")

    def offsets(self, count: int) -> list[float] | None:
        """Scheduled send offsets (s after t=0) of ``count`` requests; None in closed loop."""
        if self.mode != "rate":
            return None
        return arrival_offsets(count, self.request_rate, self.burstiness, self.seed, first=self.arrivals,
                               exact=self.exact_rate, stream=self.stream)


@dataclass
class PhaseResult:
    """One load phase: every request sent, plus those the duration bound kept back."""

    phase: str
    shape: LoadShape
    results: list[RequestResult]
    started: float  # perf_counter at the phase's t=0
    ended: float  # perf_counter when the last request finished (succeeded or failed)
    not_sent: int = 0  # kept back by the duration bound, or by a stop rule (those cancelled in flight too)
    target_offsets: list[float] = field(default_factory=list)
    workers: int = 1  # processes that drove it (day0.client.workers)
    loop_stall_ms: float | None = None  # the longest a driving event loop did not run (None: not watched)

    @property
    def duration(self) -> float:
        return max(self.ended - self.started, 1e-9)


@dataclass
class Part:
    """The requests one event loop drives: a whole phase, or one shard of it.

    ``offsets`` (open loop) are the scheduled sends in seconds after the phase's t=0, one per
    request, ascending; ``None`` is the closed loop. ``concurrency`` is the closed loop's number
    of requests in flight, or the open loop's in-flight cap (0: none).
    """

    requests: Sequence[Request]
    offsets: list[float] | None
    concurrency: int
    duration_s: float | None = None
    precise: bool = True


async def sleep_until(target: float, precise: bool = True) -> None:
    """Sleep to a perf_counter deadline, and never wake before it.

    asyncio's epoll rounds a timeout up to the next millisecond, so a plain sleep wakes 0-1 ms
    late; with ``precise`` it sleeps to 1 ms before the deadline and spins the rest, yielding to
    the loop: at most ~1 ms of CPU per scheduled request. uvloop's millisecond timers may wake
    up to a millisecond early (``day0.client.loops``): the spin covers that in both modes, so a
    request is never sent before its schedule.
    """
    perf = time.perf_counter
    margin = 0.001 if precise else 0.0
    remaining = target - perf()
    if remaining > margin:
        await asyncio.sleep(remaining - margin)
    while perf() < target:
        await asyncio.sleep(0)


def new_tag() -> str:
    """A random tag that makes one phase's request ids unique on the server."""
    return secrets.token_hex(3)


def request_id(phase: str, tag: str, index: int) -> str:
    """The ``X-Request-Id`` of a request: the same in every process that drives part of the phase."""
    return f"day0-{phase}-{tag}-{index}"


# A stop rule: called with each finished request; True ends the phase (nothing more is sent, and
# the requests in flight are cancelled: their connections close, so the server aborts them).
Until = Callable[[RequestResult], bool]


async def drive(streams: StreamPool, url: str, model: str, part: Part, opts: ClientOptions, *,
                t0: float, phase: str, tag: str, watch: "LoopWatch", until: Until | None = None,
                stop: asyncio.Event | None = None) -> tuple[list[RequestResult], int]:
    """Drive ``part`` from the perf_counter instant ``t0``; (results in send order, requests not sent).

    Requests scheduled at or after ``t0 + duration_s`` are not sent (kept back, not failed).
    ``until`` may end the phase early, and so may ``stop`` once set from outside (a load worker's
    stop from the process that judges the whole phase): requests kept back or cancelled count as
    not sent. ``watch`` is this loop's stall watch: each request carries what it stalled through
    (:meth:`LoopWatch.stamp`) before ``until`` sees it, so a stop rule judges what the verdict will."""
    deadline = t0 + part.duration_s if part.duration_s else float("inf")
    stop = stop or asyncio.Event()

    def ended(result: RequestResult) -> None:
        """A request's end: what it stalled through, then the stop rule, which may end the phase."""
        watch.stamp(result)
        if until is not None and until(result):
            stop.set()

    if part.offsets is None:
        return await _closed_loop(streams, url, model, part, opts, deadline, phase, tag, ended, stop)
    return await _open_loop(streams, url, model, part, opts, t0, deadline, phase, tag, ended, stop)


async def _closed_loop(streams: StreamPool, url: str, model: str, part: Part, opts: ClientOptions,
                       deadline: float, phase: str, tag: str, ended: Callable[[RequestResult], None],
                       stop: asyncio.Event) -> tuple[list[RequestResult], int]:
    """``concurrency`` loops, each sending the next request when its previous one ends (scheduled = sent)."""
    perf = time.perf_counter
    queue = iter(part.requests)
    results: list[RequestResult] = []

    async def worker() -> None:
        for r in queue:
            now = perf()
            if now >= deadline or stop.is_set():
                return
            result = await stream_one(streams, url, r, model, opts, scheduled=now, phase=phase,
                                      request_id=request_id(phase, tag, r.index))
            results.append(result)
            ended(result)

    workers = [asyncio.create_task(worker()) for _ in range(min(part.concurrency, max(len(part.requests), 1)))]
    await _until_stopped(workers, stop)
    return results, len(part.requests) - len(results)


async def _open_loop(streams: StreamPool, url: str, model: str, part: Part, opts: ClientOptions,
                     t0: float, deadline: float, phase: str, tag: str, ended: Callable[[RequestResult], None],
                     stop: asyncio.Event) -> tuple[list[RequestResult], int]:
    """Each request at ``t0 + offset``, whatever is in flight; a cap makes it wait (inside its latency)."""
    cap = asyncio.Semaphore(part.concurrency) if part.concurrency > 0 else None
    tasks: list[asyncio.Task[RequestResult]] = []

    async def capped(r: Request, scheduled: float) -> RequestResult:
        rid = request_id(phase, tag, r.index)
        if cap is None:
            result = await stream_one(streams, url, r, model, opts, scheduled=scheduled, phase=phase, request_id=rid)
        else:
            async with cap:
                result = await stream_one(streams, url, r, model, opts, scheduled=scheduled, phase=phase,
                                          request_id=rid)
        ended(result)
        return result

    for r, off in zip(part.requests, part.offsets or []):
        target = t0 + off
        if target >= deadline or stop.is_set():
            break
        await sleep_until(target, part.precise)
        if stop.is_set():
            break
        tasks.append(asyncio.create_task(capped(r, target)))
    done = await _until_stopped(tasks, stop)
    return done, len(part.requests) - len(done)


async def _until_stopped(tasks: list[asyncio.Task[Any]], stop: asyncio.Event) -> list[Any]:
    """Every task's result, or, once ``stop`` is set, those finished by then (the rest cancelled:
    a request in flight closes its connection, so the server aborts it)."""
    everything = asyncio.gather(*tasks, return_exceptions=True)  # one waiter for all: O(n), not O(n^2)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({everything, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    for t in tasks:
        t.cancel()  # a no-op on the finished ones
    await everything
    return [t.result() for t in tasks if not t.cancelled()]  # a task's own error propagates, as gather's did


async def run_phase(
    streams: StreamPool,
    base_url: str,
    model: str,
    requests: Sequence[Request],
    shape: LoadShape,
    opts: ClientOptions,
    *,
    phase: str = "measure",
    until: Until | None = None,
) -> PhaseResult:
    """Drive one phase of load from this process and return every request's result (none raise);
    ``until`` may end it early (:data:`Until`)."""
    shape.validate()
    url = endpoint_url(base_url, opts.endpoint)
    offsets = shape.offsets(len(requests))
    part = Part(requests, offsets, shape.concurrency, shape.duration_s, shape.precise_timing)
    t0 = time.perf_counter()
    async with LoopWatch() as watch:
        results, not_sent = await drive(streams, url, model, part, opts, t0=t0, phase=phase, tag=new_tag(),
                                        watch=watch, until=until)
    ended = max((r.finished for r in results), default=time.perf_counter())
    results.sort(key=lambda r: r.scheduled)
    return PhaseResult(phase, shape, results, t0, ended, not_sent, offsets or [], loop_stall_ms=watch.longest_ms)


STALL_TICK_S = 0.005
STALL_KEEP_MS = 10.0  # stalls kept as spans: a shorter one moves a request's figures by a tick or two


class LoopWatch:
    """``async with LoopWatch() as w:`` watches this event loop for the block's duration: the longest
    stretch it did not run beyond the tick it asked for (``w.longest_ms``), and each one over
    STALL_KEEP_MS as a span. A loop that is not run sends nothing and reads nothing: every request
    due or in flight then is late by that much, in the client, not the server. Measured on
    cpu-tiny's 2-core box: single stalls of 60-460 ms about a second into a phase at 30 req/s, which
    put 7 TTFTs past a 300 ms limit within 45 requests: a p99 miss the server did not earn. The one
    way a phase or a worker's shard is watched, so both report their stalls alike, and each request
    carries its own (:meth:`stamp`)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []  # perf_counter (from, to) the loop did not run
        self.longest_ms: float | None = None
        self._worst, self._last = 0.0, time.perf_counter()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "LoopWatch":
        self._last = time.perf_counter()
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task
        self.longest_ms = self._worst

    async def _watch(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(STALL_TICK_S)
            now = time.perf_counter()
            gap_ms = (now - self._last - STALL_TICK_S) * 1000.0
            if gap_ms > STALL_KEEP_MS:
                self.spans.append((self._last + STALL_TICK_S, now))  # due at last + tick; nothing ran until now
            self._worst, self._last = max(self._worst, gap_ms), now

    def stalled_through(self, start: float, end: float) -> float:
        """Seconds of [start, end] this loop did not run, up to now: the spans so far, and the stall
        that has not ended for the watch yet, while it watches (its wake-up may come after the
        callback asking: the span it then records overlaps [start, end] by as much)."""
        now, total = time.perf_counter(), 0.0
        watching = self._task is not None and not self._stop.is_set()
        if watching and (now - self._last - STALL_TICK_S) * 1000.0 > STALL_KEEP_MS:
            total += max(0.0, min(end, now) - max(start, self._last + STALL_TICK_S))
        for a, b in reversed(self.spans):  # in time order: only the last few can reach a request in flight
            if b <= start:
                break
            total += max(0.0, min(end, b) - max(start, a))
        return total

    def stamp(self, r: RequestResult) -> None:
        """What ``r`` stalled through until its first token and its last were read (its TTFT and
        E2E windows from its scheduled send), set as it ends, so a stop rule judges it as the
        verdict will (``day0.stages.latency.judging``)."""
        if r.ttft is not None:
            r.stalled_to_first = self.stalled_through(r.scheduled, r.scheduled + r.ttft)
        if r.e2e is not None:
            r.stalled_to_last = self.stalled_through(r.scheduled, r.scheduled + r.e2e)
