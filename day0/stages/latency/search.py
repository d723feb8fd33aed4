"""Stage 3's capacity search: the highest offered request rate at which the engine meets every SLA
limit, with confidence.

Bracketing multiplies the rate by ``growth`` until a point misses (or divides it until one meets),
then bisection at geometric midpoints narrows the bracket until the first missed rate is within
``precision`` above the sustained one. Each point is a fresh prompt set (its own stream name, so
the prefix-cache rule of the measured phase holds) of enough requests to bound the highest
limited percentile (``day0.core.stats.samples_to_bound``: 299 for p99 at 95%), judged by
order-statistic bounds, never by a point estimate: a p99 over 32 requests is their maximum, and a
coin flip decides whether it lands under a limit. A point stops early once it has missed whatever
its remaining requests do (:class:`ClearMiss`): an overloaded point costs a handful of requests,
not hundreds, and frees the engine for the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Awaitable, Callable

from day0.client.prom import pct_name
from day0.client.stream import RequestResult
from day0.config.latency import MIN_REQUESTS, CapacitySearch, SlaSection
from day0.core.stats import bound_ranks, percentile, percentile_bounds
from day0.stages.latency.measurement import CLIENT_LAGGED, MEETS, MISSES, PROBED, UNDECIDED, SearchPoint, SearchResult
from day0.stages.latency.metrics import LatencyMetrics, tpot_of

# A point's queue grows when the median TTFT of its last quarter of requests (by scheduled time) is
# more than QUEUE_GROWTH times its first quarter's, and higher by more than QUEUE_FLOOR of the
# tightest TTFT limit: a rate the engine cannot keep up with, whatever the bounds say of a point
# too short for the queue to reach the limit. The floor keeps a busy host's slowdown over a long
# point at a low rate (30 ms becoming 60 ms against a 2 s limit) from reading as a queue.
QUEUE_GROWTH, QUEUE_FLOOR = 2.0, 0.1


def requests_per_point(search: CapacitySearch, sla: SlaSection) -> int:
    """``search.requests``, else the fewest that can bound the highest limited percentile from
    above (``MIN_REQUESTS`` when no latency limit is set: errors alone are judged)."""
    return search.requests or max(MIN_REQUESTS, sla.requests_to_bound())


@dataclass
class _Tally:
    """One limited percentile in a :class:`ClearMiss`: values past ``limit`` (ms) seen so far, and
    how many decide the point."""

    key: str
    metric: str
    limit: float
    needed: int
    seen: int = 0


class ClearMiss:
    """A point's stop rule (``day0.client.loadgen.Until``), fed each finished request: it fires
    once the point misses the SLA whatever the rest of its ``n`` requests do. For a limited
    percentile that is n - l + 1 values past the limit, l the rank of the lower bound over n
    samples (``bound_ranks``): then at most l - 1 of any final sample lie within the limit, so its
    lower bound is past it (failures only shrink the sample, and n - l(n) never grows as n
    shrinks). For errors it is more failures than ``max_error_rate`` of n. ``key`` names the limit
    that decided, ``why`` says it in words."""

    METRICS = {"ttft": lambda r: r.ttft, "tpot": tpot_of, "e2e": lambda r: r.e2e}  # per request, seconds

    def __init__(self, sla: SlaSection, n: int) -> None:
        self.n, self.failed, self.key, self.why = n, 0, "", ""
        self.failures_allowed = sla.max_error_rate * n
        self.tallies: list[_Tally] = []
        for metric, p, limit in sla.latency_limits():
            lower, _ = bound_ranks(n, p, sla.confidence)
            if metric in self.METRICS and lower is not None:
                self.tallies.append(_Tally(f"{metric}_{pct_name(p)}", metric, limit, n - lower + 1))

    def __call__(self, r: RequestResult) -> bool:
        if self.why:
            return True
        if not r.ok:
            self.failed += 1
            if self.failed > self.failures_allowed:
                self.key = "error_rate"
                self.why = (f"{self.failed} of {self.n} requests failed: the error rate is past max_error_rate "
                            "whatever the rest do")
            return bool(self.why)
        for t in self.tallies:
            value = self.METRICS[t.metric](r)
            if value is not None and value * 1000.0 > t.limit:
                t.seen += 1
                if t.seen >= t.needed:
                    self.key = t.key
                    self.why = (f"{t.seen} {t.key} values past {t.limit:g} ms: the lower bound over {self.n} "
                                "requests is past the limit whatever the rest do")
                    break
        return bool(self.why)


def judge_point(load: float, m: LatencyMetrics, sla: SlaSection, early: ClearMiss | None = None, *,
                gap_ms: float | None = None) -> SearchPoint:
    """Meets when every limited percentile's upper bound is within its limit and errors within
    ``sla.max_error_rate``; misses when a lower bound is past its limit (or errors are); else
    undecided. A point whose queue grows (:func:`queue_grows`) misses too:
    a short point can end before a growing queue reaches the limit. The client's own send lag
    decides first: when a tenth of the requests left more than one mean arrival gap late (p90 of
    the lag), the client fell behind its schedule and the rate offered was not ``load``; a few
    late sends (a busy host's hiccup) are not that. ``gap_ms`` is that mean gap (1000 / rate);
    None for a closed loop, which has no schedule to fall behind."""
    lag = percentile(m.samples.get("send_lag") or [0.0], 90)
    misses, undecided, bounds = [], [], {}
    for metric, p, limit in sla.latency_limits():
        b = percentile_bounds(m.samples.get(metric) or [], p, sla.confidence)
        key = f"{metric}_{pct_name(p)}"
        bounds[key] = (b.lower, b.upper)
        if b.lower is not None and b.lower > limit:
            misses.append(key)
        elif b.upper is None or b.upper > limit:
            undecided.append(key)
    if m.completed == 0:
        misses.append("no_completed_requests")
    elif m.error_rate > sla.max_error_rate:
        misses.append("error_rate")
    quarters = quarter_ttfts(m)
    if queue_grows(quarters, sla):
        misses.append("queue_growth")
    if early is not None and early.why:  # decided before the point ended: its partial sample may not show it
        undecided = [k for k in undecided if k != early.key]
        misses += [] if early.key in misses else [early.key]
    if gap_ms is not None and lag > gap_ms:
        # the load offered was below ``load``, so a miss that is not the client's own lag is still a
        # miss (less load than stated, and the engine missed anyway); anything else concludes nothing
        misses = lag_free(misses, m, sla)
        verdict = MISSES if misses else CLIENT_LAGGED
    else:
        verdict = MISSES if misses else UNDECIDED if undecided else MEETS
    return SearchPoint(load, m, verdict, misses, undecided, bounds, lag, early.why if early is not None else "",
                       quarters)


def lag_free(misses: list[str], m: LatencyMetrics, sla: SlaSection) -> list[str]:
    """The misses that stand with the client's send lag taken out: errors, TPOT and ITL (their
    clocks start after the send), and a TTFT limit whose lower bound from the actual send
    (``ttft_from_send``) is still past it. E2E and queue growth include the lag: not conclusive."""
    limits = {f"{metric}_{pct_name(p)}": (metric, p, limit) for metric, p, limit in sla.latency_limits()}
    kept = []
    for key in misses:
        metric, p, limit = limits.get(key, (key, 0.0, 0.0))
        if key in ("error_rate", "no_completed_requests") or metric in ("tpot", "itl"):
            kept.append(key)
        elif metric == "ttft":
            lower = percentile_bounds(m.samples.get("ttft_from_send") or [], p, sla.confidence).lower
            if lower is not None and lower > limit:
                kept.append(key)
    return kept


def quarter_ttfts(m: LatencyMetrics) -> tuple[float, float] | None:
    """Median TTFT (ms) of the first and of the last quarter of the point's requests, by scheduled
    time; None under 12 requests. Alike where the engine keeps up; apart, by more the longer the
    point, where it does not (every request waits behind more than the one before)."""
    pairs = sorted(zip(m.sample_offsets_s, m.samples.get("ttft") or []))
    quarter = len(pairs) // 4
    if quarter < 3:
        return None
    first, last = (percentile([t for _, t in part], 50) for part in (pairs[:quarter], pairs[-quarter:]))
    return first, last


def queue_grows(quarters: tuple[float, float] | None, sla: SlaSection) -> bool:
    """The last quarter's median TTFT (:func:`quarter_ttfts`) over ``QUEUE_GROWTH`` times the
    first's and above it by more than ``QUEUE_FLOOR`` of the tightest TTFT limit (the ratio alone
    without a TTFT limit)."""
    if quarters is None:
        return False
    first, last = quarters
    ttft_limits = [limit for metric, _, limit in sla.latency_limits() if metric == "ttft"]
    floor = QUEUE_FLOOR * min(ttft_limits) if ttft_limits else 0.0
    return last > QUEUE_GROWTH * first and last - first > floor


@dataclass(frozen=True)
class Axis:
    """What a search varies: the open loop's request rate, or the closed loop's concurrency (whole
    requests in flight, so its steps round up and its bisection stops at adjacent integers)."""

    name: str  # "rate" or "concurrency"
    unit: str
    start: float
    limit: float
    limit_key: str  # the [latency.search] key the limit comes from
    integer: bool
    floor: float = 1.0  # the lowest load tried: below it every point would only take longer to miss


    def text(self, x: float) -> str:
        return f"{x:.4g} {self.unit}" if not self.integer else f"concurrency {x:g}"

    def up(self, x: float, growth: float) -> float:
        return float(max(math.ceil(x * growth), x + 1)) if self.integer else x * growth

    def down(self, x: float, growth: float) -> float | None:
        """The next point below ``x``; None where there is none (concurrency 1)."""
        if not self.integer:  # each point below takes longer (its requests at a lower rate): bounded
            return x / growth if x / growth >= self.floor * (1 - 1e-9) else None
        return float(min(math.floor(x / growth), x - 1)) if x > 1 else None

    def between(self, met: float, missed: float) -> float:
        return float((met + missed) // 2) if self.integer else math.sqrt(met * missed)

    def narrow(self, met: float, missed: float, precision: float) -> bool:
        return missed / met - 1.0 <= precision or (self.integer and missed - met <= 1)


def _all_failed(points: list[SearchPoint], k: int) -> bool:
    """The last ``k`` points sent requests and every one failed: a broken server, not a load too high
    (descending further would only wait longer for the same errors)."""
    return len(points) == k and all(pt.metrics.sent > 0 and pt.metrics.failed == pt.metrics.sent for pt in points)


def axis_of(search: CapacitySearch) -> Axis:
    if search.over == "concurrency":
        return Axis("concurrency", "concurrent requests", float(search.start_concurrency),
                    float(search.max_concurrency), "max_concurrency", True)
    # a start far over capacity descends (50 -> 3 req/s is 4 steps), but not without end: each point
    # below takes twice as long, so 1/64 of the start is the lowest load a search tries
    return Axis("rate", "req/s", search.start_rate, search.max_rate, "max_rate", False,
                floor=search.start_rate / 64.0)


async def search_capacity(measure_at: Callable[..., Awaitable[LatencyMetrics]], search: CapacitySearch,
                          sla: SlaSection, requests: int, say: Callable[[str], None]) -> SearchResult:
    """Bracket, then bisect, ``measure_at(x, n, until=stop_rule)`` giving each point's metrics
    (``x`` on :func:`axis_of`'s axis; a :class:`ClearMiss` per point, which a measurer that cannot
    stop early may ignore). Stops at the set precision, at ``max_points``, past the axis' limit
    with every point meeting, at a point too short to bound a limit at all, or where the client
    lagged (more points would not help: more requests, or more load workers, would). A point whose
    bounds straddle a limit is the SLA's edge: it bounds the bracket from above, as a miss does,
    and the bisection goes on below it (a sustained load always met, with confidence).

    While the bracket climbs (nothing has missed yet) a point is a probe of ``probe_requests``:
    it only has to not miss for the search to go up, and a full point at twice the load usually
    decides more. A probe is never the answer: once a full point has missed above it (or the
    bracket is narrow), the probe's load is measured in full, and a probe that then does not meet
    is a miss like any other. Full points start at the first miss, so a climb of k doublings costs
    k probes, not k full points (299 requests each for a p99)."""
    axis = axis_of(search)
    points: list[SearchPoint] = []
    met: float | None = None  # highest load that met
    missed: float | None = None  # lowest load that missed
    probe = search.probe_requests if 0 < search.probe_requests < requests else 0

    def result(stopped: str) -> SearchResult:
        return SearchResult(points, requests, sla.confidence, stopped, axis.name, axis.unit, probe)

    def lower_end() -> float | None:
        """The highest load below the lowest miss that met, or that a probe found not missing."""
        below = [pt.load for pt in points if pt.verdict in (MEETS, PROBED) and (missed is None or pt.load < missed)]
        return max(below) if below else None

    x: float | None = axis.start
    while x is not None:
        probing = bool(probe) and missed is None and all(pt.load != x for pt in points)
        if sum(pt.verdict != PROBED for pt in points) >= search.max_points:
            return result(f"max_points ({search.max_points}) reached")
        point = await _measure_point(measure_at, x, probe if probing else requests, sla, axis, say, probing)
        points.append(point)
        unbounded = point.unbounded if point.verdict == UNDECIDED and not probing else []
        if point.verdict == CLIENT_LAGGED or unbounded:
            # more points would not help: more load workers would, or more requests a point
            return result(f"{point.verdict} at {axis.text(x)}"
                          + (f": {requests} requests cannot bound {', '.join(unbounded)}" if unbounded else ""))
        if met is None and _all_failed(points[-2:], 2):
            return result(f"every request failed at {axis.text(points[-2].load)} and at {axis.text(x)}: a lower "
                          "load will not help (first error: "
                          f"{next(iter(point.metrics.errors), 'unknown')}); no load meets the SLA")
        if point.verdict == MEETS:
            met = x if met is None else max(met, x)
        elif point.verdict != PROBED:  # a miss, or bounds straddling a limit: the SLA's edge is at or below it
            missed = x if missed is None else min(missed, x)
        low = lower_end()
        if missed is None:
            if axis.up(x, search.growth) > axis.limit:
                if point.verdict == PROBED:
                    continue  # the same load again, full-sized: "at least max_rate" is a claim
                return result(f"every point met the SLA up to {axis.limit_key} ({axis.text(axis.limit)})")
            x = axis.up(x, search.growth)
        elif low is None:
            x = axis.down(missed, search.growth)
        elif low != met and not probing:
            x = low  # a full point missed above a probe: is the probe right? (measured here, a short probe
            # at the edge passed where its full point then missed, and bisection spent its points above it)
        elif axis.narrow(low, missed, search.precision):
            if low == met:
                return result(f"precision {search.precision:g} reached")
            x = low  # a probe: measured in full before the search ends on it
        else:
            x = axis.between(low, missed)
    lowest = min(pt.load for pt in points) if points else axis.start
    return result(f"no load meets the SLA: {axis.text(axis.start)} and every point below it, down to "
                  f"{axis.text(lowest)}, missed")


async def _measure_point(measure_at: Callable[..., Awaitable[LatencyMetrics]], x: float, n: int, sla: SlaSection,
                         axis: Axis, say: Callable[[str], None], probing: bool) -> SearchPoint:
    """One point, judged. A probe that did not miss is ``probed``, straddling bounds included: over a
    probe's few requests (32 by default) an upper bound is the largest value or the next, so one
    host stall would make a short probe the SLA's edge and cap the bracket there; the full points
    above it decide."""
    say(f"capacity search: {axis.text(x)}, {n} requests" + (" (a probe: it only has to not miss)" if probing else ""))
    rule = ClearMiss(sla, n)
    point = judge_point(x, await measure_at(x, n, until=rule), sla, rule, gap_ms=None if axis.integer else 1000.0 / x)
    if point.early:
        say(f"capacity search: {axis.text(x)} stopped early after {point.metrics.sent} requests: {point.early}")
    if probing and point.verdict in (MEETS, UNDECIDED):
        point.verdict = PROBED
    return point
