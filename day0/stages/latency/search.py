"""Stage 3's capacity search: the highest offered request rate at which the engine meets every SLA
limit, with confidence.

Bracketing multiplies the rate by ``growth`` until a point misses (or divides it until one meets),
then bisection at geometric midpoints narrows the bracket until the first missed rate is within
``precision`` above the sustained one. Each point is a fresh prompt set (its own stream name, so
the prefix-cache rule of the measured phase holds) of enough requests to bound the highest
limited percentile (``day0.core.stats.samples_to_bound``: 299 for p99 at 95%), judged by
order-statistic bounds, never by a point estimate: a p99 over 32 requests is their maximum, and a
coin flip decides whether it lands under a limit. A full point stops early once it cannot meet
whatever its remaining requests do (:class:`ClearMiss`; a probe once it has missed): a point above
the answer costs the requests up to its first slow one, not hundreds, and frees the engine for the
next.

A rate search first measures what the server completes flat out (``saturation``): every rate at
or past it misses without a point spent there, the bisection starts under it, and its answer is
judged over a longer sample before the search ends on it (its confirmation: ``confirm_requests``, and
``confirm_s`` seconds of load at its rate). Below a confirmation that did not meet, short points have
shown they overstate what holds, so the search walks down one ``precision`` step at a time with
points of the confirmation's size (:meth:`_Bracket.walk_down`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from day0.client.prom import pct_name
from day0.client.stream import RequestResult
from day0.config.latency import MIN_REQUESTS, CapacitySearch, SlaSection
from day0.core.stats import bound_ranks, percentile, percentile_bounds
from day0.stages.latency.measurement import (
    CLIENT_LAGGED,
    MEETS,
    MISSES,
    PROBED,
    SATURATION,
    UNDECIDED,
    Saturation,
    SearchPoint,
    SearchResult,
)
from day0.stages.latency.metrics import LatencyMetrics, pooled, tpot_of

# A point's queue grows when the median TTFT of its last quarter of requests (by scheduled time) is
# more than QUEUE_GROWTH times its first quarter's, and higher by more than QUEUE_FLOOR of the
# tightest TTFT limit: a rate the engine cannot keep up with, whatever the bounds say of a point
# too short for the queue to reach the limit. The floor keeps a busy host's slowdown over a long
# point at a low rate (30 ms becoming 60 ms against a 2 s limit) from reading as a queue.
QUEUE_GROWTH, QUEUE_FLOOR = 2.0, 0.1
# A point the client's event loop stalled through for more than STALL_SHARE of the tightest per-event
# limit (TTFT, E2E, ITL), and more than STALL_FLOOR_MS, cannot miss on latency: the stall delayed
# sends and reads alike, so it is measured again, once (``loop_stall``; TPOT, averaged over a
# request's tokens, is left out). The floor lets a busy host's ordinary stalls of a few tens of ms
# stand as latency: they touch the few requests in flight, not a percentile over hundreds.
STALL_SHARE, STALL_FLOOR_MS = 0.1, 50.0


def stall_limit(sla: SlaSection) -> float | None:
    """The longest loop stall (ms) a point may have and still miss on latency; None: no limit it threatens."""
    limits = [limit for metric, _, limit in sla.latency_limits() if metric in ("ttft", "e2e", "itl")]
    return max(STALL_SHARE * min(limits), STALL_FLOOR_MS) if limits else None


def confirm_size(search: CapacitySearch, requests: int) -> int:
    """Requests the answer's point goes on to, in all, before the search ends on it: ``confirm_requests``,
    by default 300 or twice a point's, whichever is more; 0 (off) when no more than a point's own."""
    n = search.confirm_requests if search.confirm_requests is not None else max(300, 2 * requests)
    return n if n > requests else 0


def requests_per_point(search: CapacitySearch, sla: SlaSection) -> int:
    """``search.requests``, else the fewest that can bound the highest limited percentile from
    above (``MIN_REQUESTS`` when no latency limit is set: errors alone are judged)."""
    return search.requests or max(MIN_REQUESTS, sla.requests_to_bound())


@dataclass
class _Tally:
    """One limited percentile in a :class:`ClearMiss`: values past ``limit`` (ms) seen so far, how many
    decide a miss, and how many keep the point from meeting (None: no count does)."""

    key: str
    metric: str
    limit: float
    needed: int
    edge: int | None = None
    seen: int = 0


class ClearMiss:
    """A point's stop rule (``day0.client.loadgen.Until``), fed each finished request: it fires
    once the point misses the SLA whatever the rest of its ``n`` requests do. For a limited
    percentile that is n - l + 1 values past the limit, l the rank of the lower bound over n
    samples (``bound_ranks``): then at most l - 1 of any final sample lie within the limit, so its
    lower bound is past it (failures only shrink the sample, and n - l(n) never grows as n
    shrinks). For errors it is more failures than ``max_error_rate`` of n. ``key`` names the limit
    that decided, ``why`` says it in words, ``missed`` whether the point missed.

    With ``edge`` it fires sooner, once the point cannot *meet*: n - u + 1 values past a limit, u the
    rank of the upper bound (1 for p99 over 299 requests: the upper bound is the largest value).
    The search treats a point that does not meet as the bracket's top whether its lower bound is past
    the limit or not, so the requests after that one decide nothing it uses; near the SLA's edge,
    where a miss takes most of a point to prove, this is what makes a point above the answer cheap.
    The same argument holds as for the miss: n - u(n) never grows as failures shrink n."""

    METRICS = {"ttft": lambda r: r.ttft, "tpot": tpot_of, "e2e": lambda r: r.e2e}  # per request, seconds

    def __init__(self, sla: SlaSection, n: int, *, edge: bool = False) -> None:
        self.n, self.failed, self.key, self.why, self.missed = n, 0, "", "", False
        self.failures_allowed = sla.max_error_rate * n
        self.tallies: list[_Tally] = []
        for metric, p, limit in sla.latency_limits():
            lower, upper = bound_ranks(n, p, sla.confidence)
            if metric in self.METRICS and lower is not None:
                self.tallies.append(_Tally(f"{metric}_{pct_name(p)}", metric, limit, n - lower + 1,
                                           n - upper + 1 if edge and upper is not None else None))

    def thresholds(self, key: str) -> tuple[int, int | None]:
        """(values past the limit that decide a miss, those that keep the point from meeting) for ``key``."""
        t = next(t for t in self.tallies if t.key == key)
        return t.needed, t.edge

    def count(self, m: LatencyMetrics) -> None:
        """Start from an earlier phase at the same load (a confirmation's point): its failures and
        values past each limit count as this sample's; only a finished sample is passed, so the rule
        cannot have fired on it (that point met)."""
        self.failed += m.failed
        for t in self.tallies:
            t.seen += sum(1 for v in m.samples.get(t.metric) or [] if v > t.limit)

    def __call__(self, r: RequestResult) -> bool:
        if self.missed:
            return True
        if not r.ok:
            self.failed += 1
            if self.failed > self.failures_allowed:
                self.key, self.missed = "error_rate", True
                self.why = (f"{self.failed} of {self.n} requests failed: the error rate is past max_error_rate "
                            "whatever the rest do")
            return bool(self.why)
        for t in self.tallies:
            value = self.METRICS[t.metric](r)
            if value is not None and value * 1000.0 > t.limit:
                t.seen += 1
                if t.seen >= t.needed:
                    self.key, self.missed = t.key, True
                    self.why = (f"{t.seen} {t.key} values past {t.limit:g} ms: the lower bound over {self.n} "
                                "requests is past the limit whatever the rest do")
                    break
                if t.edge is not None and t.seen >= t.edge and not self.why:
                    self.key = t.key
                    self.why = (f"{t.seen} {t.key} value{'s' if t.seen > 1 else ''} past {t.limit:g} ms: the "
                                f"upper bound over {self.n} requests is past the limit whatever the rest do "
                                "(it cannot meet)")
        return bool(self.why)


def judge_point(load: float, m: LatencyMetrics, sla: SlaSection, early: ClearMiss | None = None, *,
                gap_ms: float | None = None, queue: bool = True) -> SearchPoint:
    """Meets when every limited percentile's upper bound is within its limit and errors within
    ``sla.max_error_rate``; misses when a lower bound is past its limit (or errors are); else
    undecided. A point whose queue grows (:func:`queue_grows`) misses too, unless ``queue`` is off
    (a search bounded by the server's flat-out rate, which catches overload without it): a short
    point can end before a growing queue reaches the limit. The client's own send lag
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
    if queue and queue_grows(quarters, sla):
        misses.append("queue_growth")
    if early is not None and early.why:  # decided before the point ended: its partial sample may not show it
        # what the stop left unmeasured (no upper bound over the requests it had) is not a finding
        undecided = [k for k in undecided if k != early.key and bounds[k][1] is not None]
        if early.missed:
            misses += [] if early.key in misses else [early.key]
        elif early.key not in misses:
            undecided.append(early.key)
    tolerated = stall_limit(sla)
    stalled = tolerated is not None and (m.loop_stall_ms or 0.0) > tolerated
    if gap_ms is not None and lag > gap_ms:
        # the load offered was below ``load``, so a miss that is not the client's own lag is still a
        # miss (less load than stated, and the engine missed anyway); anything else concludes nothing
        misses = lag_free(misses, m, sla)
        verdict = MISSES if misses else CLIENT_LAGGED
    elif stalled and (misses or undecided):
        # a stall delays reads as well as sends: what stands is what the requests show with the time the
        # client stalled through taken out (a point that met, met anyway)
        misses, undecided = stall_free(misses, undecided, m, sla, early)
        verdict = MISSES if misses else UNDECIDED if undecided else CLIENT_LAGGED
    else:
        verdict = MISSES if misses else UNDECIDED if undecided else MEETS
    return SearchPoint(load, m, verdict, misses, undecided, bounds, lag, early.why if early is not None else "",
                       quarters)


def limits_by_key(sla: SlaSection) -> dict[str, tuple[str, float, float]]:
    """Each latency limit under the key a point's misses and bounds name it by ("ttft_p99")."""
    return {f"{metric}_{pct_name(p)}": (metric, p, limit) for metric, p, limit in sla.latency_limits()}


def stall_free(misses: list[str], undecided: list[str], m: LatencyMetrics, sla: SlaSection,
               early: ClearMiss | None) -> tuple[list[str], list[str]]:
    """The misses and undecided limits that stand with each request's TTFT and E2E taken down by the
    time the client's loop stalled through while it was in flight (``*_without_stalls``): failures,
    and a TTFT or E2E limit that the values without the stalls still miss (or still cannot meet,
    where the stop rule decided it: counted as it counts). TPOT, ITL and queue growth do not stand:
    a stall sits in their gaps and no per-request figure takes it out."""
    limits = limits_by_key(sla)
    kept_misses = [k for k in misses if k in ("error_rate", "no_completed_requests")]
    kept_undecided: list[str] = []
    for key in misses + undecided:
        metric, p, limit = limits.get(key, ("", 0.0, 0.0))
        if metric not in ("ttft", "e2e"):
            continue
        values = m.samples.get(f"{metric}_without_stalls") or m.samples.get(metric) or []
        if early is not None and early.key == key:
            needed, edge = early.thresholds(key)
            past = sum(1 for v in values if v > limit)
            missed, unmet = past >= needed, edge is not None and past >= edge
        else:
            b = percentile_bounds(values, p, sla.confidence)
            missed, unmet = b.lower is not None and b.lower > limit, b.upper is None or b.upper > limit
        (kept_misses if missed else kept_undecided if unmet else []).append(key)
    return kept_misses, kept_undecided


def lag_text(point: SearchPoint) -> str:
    """Why a ``client_lagged`` point concluded nothing, in words."""
    stall = point.metrics.loop_stall_ms
    if stall and point.lag_ms <= 1000.0 / max(point.load, 1e-9):
        return (f"the load generator's event loop stalled {stall:.0f} ms (the host did not run it) with the "
                f"requests past the limit in flight: without the stall they do not decide the point")
    return f"the load generator lagged {point.lag_ms:.1f} ms (p90) behind its schedule (more than one arrival gap)"


def lag_free(misses: list[str], m: LatencyMetrics, sla: SlaSection) -> list[str]:
    """The misses that stand with the client's send lag taken out: errors, TPOT and ITL (their
    clocks start after the send), and a TTFT limit whose lower bound from the actual send
    (``ttft_from_send``) is still past it. E2E and queue growth include the lag: not conclusive."""
    limits = limits_by_key(sla)
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


Saturate = Callable[[], Awaitable[tuple[Saturation, LatencyMetrics | None]]]  # None: nothing was run


def saturation_point(sat: Saturation, m: LatencyMetrics, sla: SlaSection) -> SearchPoint:
    """The flat-out figure as the search's top miss: every rate at or past it queues without bound.
    Its bounds are the closed loop's own (the Pareto view's flat-out point), not a rate's."""
    point = judge_point(sat.req_s or 0.0, m, sla)
    point.verdict, point.misses, point.undecided = MISSES, [SATURATION], []
    return point


async def search_capacity(measure_at: Callable[..., Awaitable[LatencyMetrics]], search: CapacitySearch,
                          sla: SlaSection, requests: int, say: Callable[[str], None],
                          saturate: Saturate | None = None) -> SearchResult:
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
    k probes, not k full points (299 requests each for a p99).

    ``saturate`` (a rate search's flat-out run, ``day0.stages.latency.saturation``) goes first: a
    figure F that applies is the bracket's top, a miss named ``saturation``, and the bracket is
    [F / growth, F] with its lower end presumed, not measured: the search starts at its geometric
    middle with full points (nothing left to climb to) and measures F / growth only when the
    bisection comes down to it. Answers here sat at 0.52-0.96 of F, so a point at F / growth
    would almost always have met, and told the bisection nothing it does not assume."""
    axis = axis_of(search)
    probe = search.probe_requests if 0 < search.probe_requests < requests else 0
    b = _Bracket(axis, search)
    sat: Saturation | None = None

    def result(stopped: str) -> SearchResult:
        return SearchResult(b.points, requests, sla.confidence, stopped, b.axis.name, b.axis.unit, probe, sat)

    if saturate is not None and axis.name == "rate":
        sat, top = await _flat_out_top(saturate, sla, say)
        if top is not None:
            b.points.append(top)
            b.missed, b.presumed = top.load, top.load / search.growth
            b.axis = replace(axis, start=axis.between(b.presumed, top.load), floor=b.presumed / 64.0)
    # with the flat-out rate as the bracket's top, overload is a rate past it, not a TTFT trend: the queue
    # rule fired at 0.64-0.88 of that rate here, on 3-second points of stable loads (docs/stages/latency.md)
    queue_rule = not (sat is not None and sat.applies)
    if not queue_rule:
        b.confirm, b.hold_s = confirm_size(search, requests), search.confirm_s
    x: float | None = b.axis.start
    size = 0  # requests of the next point when judged as the answer's confirmation (else a point's default)
    while x is not None:
        probing = bool(probe) and b.missed is None and all(pt.load != x for pt in b.points) and not size
        prior = b.met_at(x) if size else None  # a confirmation goes on from the point that met there, if one did
        if prior is None and b.counted() >= search.max_points:
            return result(f"max_points ({search.max_points}) reached")
        n = size or (probe if probing else requests)
        point = await _measure_point(measure_at, x, n, sla, b.axis, say, probing, queue_rule, prior, held=bool(size))
        if point.verdict == CLIENT_LAGGED:  # a host's hiccup passes: the same point once more, fresh prompts
            say(f"capacity search: {b.axis.text(x)} again: {lag_text(point)}")
            b.points.append(point)
            point = await _measure_point(measure_at, x, n, sla, b.axis, say, probing, queue_rule, prior,
                                         held=bool(size))
        b.points.append(point)
        if prior is not None:
            b.confirmations += 1
        stop = b.hopeless(point, n, probing)
        if stop:
            return result(stop)
        b.record(point)
        x, size, stop = b.next_load(point, probing)
        if stop:
            return result(stop)
    lowest = min(pt.load for pt in b.points) if b.points else b.axis.start
    return result(f"no load meets the SLA: {b.axis.text(b.axis.start)} and every point below it, down to "
                  f"{b.axis.text(lowest)}, missed")


@dataclass
class _Bracket:
    """The search's state: its points, the highest load met and the lowest not met, and which loads
    were measured over a confirmation's requests; it decides the next point (:meth:`next_load`)."""

    axis: Axis
    search: CapacitySearch
    points: list[SearchPoint] = field(default_factory=list)
    met: float | None = None  # highest load that met
    missed: float | None = None  # lowest load that missed (or straddled a limit)
    presumed: float | None = None  # a lower end assumed until the bisection narrows to it (flat out / growth)
    confirm: int = 0  # requests the answer's point goes on to, in all (0: not)
    hold_s: float = 0.0  # seconds of load at its rate the answer's point goes on for (0: not)
    confirmed: set[float] = field(default_factory=set)
    confirmations: int = 0  # extensions of a point that met (a point held from its start is a point)
    walking: bool = False  # a confirmation did not meet: every point below is held (:meth:`walk_down`)

    def counted(self) -> int:
        """The points ``max_points`` bounds: not probes that stayed probes, not the flat-out figure, not
        extensions (each re-measures a load a counted point met, so they are bounded by those); a point
        of the walk down, held from its start, is a load measured anew and counts."""
        return sum(pt.verdict not in (PROBED, CLIENT_LAGGED) and SATURATION not in pt.misses
                   for pt in self.points) - self.confirmations

    def met_at(self, x: float) -> SearchPoint | None:
        """The last point that met at load ``x`` (what a confirmation there goes on from)."""
        return next((pt for pt in reversed(self.points) if pt.load == x and pt.verdict == MEETS), None)

    def lower_end(self) -> float | None:
        """The highest load below the lowest miss that met, or that a probe found not missing; else the
        presumed lower end while it is below the lowest miss."""
        below = [pt.load for pt in self.points
                 if pt.verdict in (MEETS, PROBED) and (self.missed is None or pt.load < self.missed)]
        if not below and self.presumed is not None and (self.missed is None or self.presumed < self.missed):
            return self.presumed
        return max(below) if below else None

    def hopeless(self, point: SearchPoint, n: int, probing: bool) -> str:
        """Why no further point can help ("" when one can): the client lagged, a point too short to
        bound a limit at all, or a server failing every request."""
        unbounded = point.unbounded if point.verdict == UNDECIDED and not probing and not point.early else []
        if point.verdict == CLIENT_LAGGED or unbounded:
            # more points would not help: more load workers would, or more requests a point
            return (f"{point.verdict} at {self.axis.text(point.load)}"
                    + (f": {n} requests cannot bound {', '.join(unbounded)}" if unbounded else ""))
        if self.met is None and _all_failed(self.points[-2:], 2):
            return (f"every request failed at {self.axis.text(self.points[-2].load)} and at "
                    f"{self.axis.text(point.load)}: a lower load will not help (first error: "
                    f"{next(iter(point.metrics.errors), 'unknown')}); no load meets the SLA")
        return ""

    def record(self, point: SearchPoint) -> None:
        x = point.load
        if point.held and point.verdict != MEETS:
            self.walking = True
        if point.verdict == MEETS:
            self.met = x if self.met is None else max(self.met, x)
        elif point.verdict != PROBED:  # a miss, or bounds straddling a limit: the SLA's edge is at or below it
            self.missed = x if self.missed is None else min(self.missed, x)
            if self.met is not None and self.met >= self.missed:  # a confirmation missed where a short point met
                self.met = max((pt.load for pt in self.points if pt.verdict == MEETS and pt.load < self.missed),
                               default=None)

    def next_load(self, point: SearchPoint, probing: bool) -> tuple[float | None, int, str]:
        """(next load, its requests when not a point's default, why the search ends: "" to go on)."""
        axis, search, x, low, missed = self.axis, self.search, point.load, self.lower_end(), self.missed
        if missed is None:
            if axis.up(x, search.growth) > axis.limit:
                if point.verdict == PROBED:
                    return x, 0, ""  # the same load again, full-sized: "at least max_rate" is a claim
                return None, 0, f"every point met the SLA up to {axis.limit_key} ({axis.text(axis.limit)})"
            return axis.up(x, search.growth), 0, ""
        if self.walking:
            return self.walk_down()
        if low is None:
            return axis.down(missed, search.growth), 0, ""
        if low != self.met and low != self.presumed and not probing:
            # a full point missed above a probe: is the probe right? (measured here, a short probe at the
            # edge passed where its full point then missed, and bisection spent its points above it)
            return low, 0, ""
        if not axis.narrow(low, missed, search.precision):
            return axis.between(low, missed), 0, ""
        if low != self.met:
            return low, 0, ""  # a probe or the presumed end: measured in full before the search ends on it
        return self.end_on(low)

    def end_on(self, x: float) -> tuple[float | None, int, str]:
        """The answer at ``x``, a load that met: its confirmation first (its point and more requests
        at that load, judged as one sample; from its start where no point met there) unless it has had
        one or its point is as long already; then the search ends."""
        point = self.met_at(x)
        if (self.confirm or self.hold_s) and x not in self.confirmed:
            self.confirmed.add(x)
            size = self.confirm_at(x)
            if point is None or size > point.metrics.sent:
                return x, size, ""
        held = point if x in self.confirmed else None
        missed = sum(pt.held and pt.verdict != MEETS for pt in self.points)
        return None, 0, (f"precision {self.search.precision:g} reached"
                         + (f"; the answer held over {held.metrics.sent} requests, {held.metrics.duration_s:.0f} s of "
                            "load" if held is not None else "")
                         + (f" ({missed} held {'rates' if missed > 1 else 'rate'} above it did not meet)"
                            if missed else ""))

    def walk_down(self) -> tuple[float | None, int, str]:
        """Below a confirmation that did not meet, short points have shown they overstate what holds (on
        the cpu-tiny server rates met for 2 s up to flat out, where 24-35% less was the most that held for
        30 s): each point is held from its start, one ``precision`` step under the lowest load not met, or
        from where it stopped at a short point that met within that step, until one holds, which is then
        the answer at the set precision. A walk from above, not a bisection: a hold that misses stops once
        it cannot meet, while one that passes costs its whole length, and a bisection passes more often."""
        top, axis = self.missed, self.axis
        if top is None:  # the walk starts at a load that did not meet
            return None, 0, ""
        held = [pt.load for pt in self.points if pt.held and pt.verdict == MEETS and pt.load < top]
        if held and axis.narrow(max(held), top, self.search.precision):
            return self.end_on(max(held))
        step = top / (1.0 + self.search.precision) * (1.0 + 1e-9)  # within the precision of ``top``, not past it
        if step < axis.floor:
            return None, 0, ""
        met = [pt.load for pt in self.points if pt.verdict == MEETS and step <= pt.load < top]
        return self.end_on(max(met) if met else step)

    def confirm_at(self, x: float) -> int:
        """Requests the answer's sample at rate ``x`` spans, in all (its point's own included):
        ``confirm``, or as many as keep ``x`` up for ``hold_s``, whichever is more (a confirmation needs
        the flat-out figure, so only a rate search has one). A few seconds of load can fall between a
        server's slow spells, and a replica serves through them (docs/stages/latency.md, "The answer
        holds for a while"); MLPerf's minimum duration counts the whole run the same way."""
        return max(self.confirm, math.ceil(self.hold_s * x))


async def _flat_out_top(saturate: Saturate, sla: SlaSection,
                        say: Callable[[str], None]) -> tuple[Saturation, SearchPoint | None]:
    """The flat-out figure, and the miss it puts at the top of the bracket when it applies."""
    sat, flat_out = await saturate()
    say(f"capacity search: {sat.text()}")
    return sat, saturation_point(sat, flat_out, sla) if sat.applies and flat_out is not None else None


async def _measure_point(measure_at: Callable[..., Awaitable[LatencyMetrics]], x: float, n: int, sla: SlaSection,
                         axis: Axis, say: Callable[[str], None], probing: bool, queue: bool = True,
                         prior: SearchPoint | None = None, *, held: bool = False) -> SearchPoint:
    """One point, judged. A probe that did not miss is ``probed``, straddling bounds included: over a
    probe's few requests (32 by default) an upper bound is the largest value or the next, so one
    host stall would make a short probe the SLA's edge and cap the bracket there; the full points
    above it decide.

    With ``prior`` (a confirmation) the point is the ``prior`` point's requests and as many more as
    make ``n``, judged as one sample (``metrics.pooled``): its stop rule starts from what ``prior``
    already counted, so the extension stops once the pooled sample cannot meet. ``held`` marks either
    kind of confirmation, an extension or a point of the walk down held from its start."""
    before = prior.metrics if prior is not None else None
    more = n - before.sent if before is not None else n
    say(f"capacity search: {axis.text(x)}, {more} requests"
        + (" (a probe: it only has to not miss)" if probing else "")
        + (f" more ({more / x:.0f} s at its rate), judged with the {before.sent} of its point ({n} in all)"
           if before is not None else "")
        + (f" ({n / x:.0f} s at its rate, held from its start: a held rate above it did not meet)"
           if held and before is None else ""))
    rule = ClearMiss(sla, n, edge=not probing)
    if before is not None:
        rule.count(before)
    m = await measure_at(x, more, until=rule)
    point = judge_point(x, pooled(before, m) if before is not None else m, sla, rule,
                        gap_ms=None if axis.integer else 1000.0 / x, queue=queue)
    point.extends, point.held = (before.sent if before is not None else 0), held
    if point.early:
        say(f"capacity search: {axis.text(x)} stopped early after {m.sent} requests: {point.early}")
    if probing and point.verdict in (MEETS, UNDECIDED):
        point.verdict = PROBED
    return point
