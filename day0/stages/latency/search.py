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
points of the confirmation's size (:meth:`_Bracket.walk_down`), past the rates a hold that was
overloaded showed it cannot complete.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from day0.config.latency import MIN_REQUESTS, CapacitySearch, SlaSection
from day0.stages.latency.judging import ClearMiss, judge_point, lag_text
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
from day0.stages.latency.metrics import LatencyMetrics, pooled
from day0.stages.latency.spells import late_text

BACKLOG_STEPS = 3  # precision steps over what a held miss completed: the requests it had in flight when it stopped


@dataclass(frozen=True)
class Skip:
    """The walk down past an overloaded hold: offered ``load``, it completed ``completed`` req/s; the
    walk went on at ``to`` (``BACKLOG_STEPS`` ``precision`` steps over that, or a short point that met
    within the step above it, whose point the hold extends)."""

    load: float
    completed: float
    to: float


def skip_text(k: Skip, axis: Axis) -> str:
    return (f"{axis.text(k.load)} held completed only {k.completed:.4g} req/s, so the walk went on at "
            f"{axis.text(k.to)}, past the rates between")


def confirm_size(search: CapacitySearch, requests: int) -> int:
    """Requests the answer's point goes on to, in all, before the search ends on it: ``confirm_requests``,
    by default 300 or twice a point's, whichever is more; 0 (off) when no more than a point's own."""
    n = search.confirm_requests if search.confirm_requests is not None else max(300, 2 * requests)
    return n if n > requests else 0


def requests_per_point(search: CapacitySearch, sla: SlaSection) -> int:
    """``search.requests``, else the fewest that can bound the highest limited percentile from
    above (``MIN_REQUESTS`` when no latency limit is set: errors alone are judged)."""
    return search.requests or max(MIN_REQUESTS, sla.requests_to_bound())


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
    point.verdict, point.misses, point.undecided, point.late = MISSES, [SATURATION], [], []
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
    b = _Bracket(axis, search, requests)
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
    # rule fired at 0.64-0.88 of that rate here, on 3-second points of stable loads (docs/stages/capacity-evidence.md)
    queue_rule = not (sat is not None and sat.applies)
    if not queue_rule:
        b.confirm, b.hold_s = confirm_size(search, requests), search.confirm_s
    x: float | None = b.axis.start
    size = 0  # requests of the next point when judged as the answer's confirmation (else a point's default)
    while x is not None:
        probing = bool(probe) and b.missed is None and all(pt.load != x for pt in b.points) and not size
        prior = b.met_at(x) if size else None  # a confirmation goes on from the point that met there, if one did
        if prior is None and b.counted() >= search.max_points:
            return result(f"max_points ({search.max_points}) reached" + (
                "; no rate under the confirmations that did not meet has held yet (raise latency.search.max_points)"
                if b.missed_holds() else ""))
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
        skips = len(b.skips)
        x, size, stop = b.next_load(point, probing)
        if len(b.skips) > skips:
            say(f"capacity search: {skip_text(b.skips[-1], b.axis)}")
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
    requests: int  # a full point's: the fewest over which a hold's completed rate is read (:meth:`overloaded`)
    points: list[SearchPoint] = field(default_factory=list)
    met: float | None = None  # highest load that met
    missed: float | None = None  # lowest load that missed (or straddled a limit)
    presumed: float | None = None  # a lower end assumed until the bisection narrows to it (flat out / growth)
    confirm: int = 0  # requests the answer's point goes on to, in all (0: not)
    hold_s: float = 0.0  # seconds of load at its rate the answer's point goes on for (0: not)
    confirmed: set[float] = field(default_factory=set)
    confirmations: int = 0  # extensions of a point that met (a point held from its start is a point)
    skips: list[Skip] = field(default_factory=list)  # where the walk down went past an overloaded hold

    def counted(self) -> int:
        """The points ``max_points`` bounds: not probes that stayed probes, not the flat-out figure, not
        extensions (each re-measures a load a counted point met, so they are bounded by those); a point
        of the walk down, held from its start, is a load measured anew and counts."""
        return sum(pt.verdict not in (PROBED, CLIENT_LAGGED) and SATURATION not in pt.misses
                   for pt in self.points) - self.confirmations

    def held_misses(self) -> list[SearchPoint]:
        """The confirmations that did not meet. One the client lagged through concluded nothing: it is
        measured again at the same load."""
        return [pt for pt in self.points if pt.held_miss]

    def missed_holds(self) -> set[float]:
        """The loads a confirmation did not meet at (each counted once); once there is one, every point
        below is held (:meth:`walk_down`)."""
        return {pt.load for pt in self.held_misses()}

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
        if self.missed_holds():
            return self.walk_down(missed)
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
        missed = len(self.missed_holds())
        return None, 0, (f"precision {self.search.precision:g} reached"
                         + (f"; the answer held over {held.metrics.sent} requests, {held.metrics.duration_s:.0f} s of "
                            "load" if held is not None else "")
                         + (f" ({missed} held {'rates' if missed > 1 else 'rate'} above it did not meet"
                            + "".join(f"; {skip_text(k, self.axis)}" for k in self.skips) + ")" if missed else ""))

    def walk_down(self, top: float) -> tuple[float | None, int, str]:
        """Below a confirmation that did not meet, short points have shown they overstate what holds (on
        the cpu-tiny server rates met for 2 s up to flat out, where 24-35% less was the most that held for
        30 s): each point is held from its start, one ``precision`` step under the lowest load not met, or
        from where it stopped at a short point that met within that step, until one holds, which is then
        the answer at the set precision (``top``: the lowest load not met). A walk from above, not a
        bisection: a hold that misses stops once it cannot meet, while one that passes costs its whole
        length, and a bisection passes more often.

        The walk never holds a rate above what a held miss showed the server completes (:meth:`overloaded`):
        past an overloaded hold it goes straight there. Should the hold there meet, the rates between it
        and ``top`` are bisected, held."""
        axis, precision = self.axis, self.search.precision
        held = [pt.load for pt in self.points if pt.held and pt.verdict == MEETS and pt.load < top]
        if held and axis.narrow(max(held), top, precision):
            return self.end_on(max(held))
        if held:  # a hold met below the skip: the server had completed more than its overloaded hold showed
            return self.end_on(axis.between(max(held), top))
        step = top / (1.0 + precision) * (1.0 + 1e-9)  # within the precision of ``top``, not past it
        skip = self.overloaded()
        skip = skip if skip is not None and skip.to < step else None
        step = skip.to if skip is not None else step
        if step < axis.floor:
            return None, 0, (f"the walk down would go under {axis.text(axis.floor)}, the lowest load a search tries, "
                             "and no rate under the holds that did not meet has held")
        met = [pt.load for pt in self.points
               if pt.verdict == MEETS and step <= pt.load < min(top, step * (1.0 + precision))]
        x = max(met) if met else step
        if skip is not None:
            self.skips.append(replace(skip, to=x))
        return self.end_on(x)

    def overloaded(self) -> Skip | None:
        """The most a held miss showed the server completes. No rate above what a server completes can
        hold; a hold that did not meet completed its requests over its length less the ones in flight
        when it stopped (cancelled), so what it completed understates that. Hence the held miss (over at
        least a point's requests) that completed the fewest a second, and ``BACKLOG_STEPS`` ``precision``
        steps over that (1.158 times it at 5%): in 31 searches on bench_search_repeat's workload the
        answer was at most 1.13 times what any of 138 held misses completed, 1.16 and 1.17 once each,
        near the edge, where the bound lands at the answer or 1.2% under it, within the precision of
        the miss above it (docs/stages/latency.md, "Past an overloaded hold the walk skips"). A hold
        stopped on a spell completes nearly its rate, which puts this over the walk's next step, where
        it changes nothing. Only a rate search holds points (a confirmation needs the flat-out figure)."""
        behind = [pt for pt in self.held_misses() if pt.metrics.completed >= self.requests]
        if not behind:
            return None
        worst = min(behind, key=lambda pt: pt.metrics.request_throughput)
        done = worst.metrics.request_throughput
        return Skip(worst.load, done, done * (1.0 + self.search.precision) ** BACKLOG_STEPS)

    def confirm_at(self, x: float) -> int:
        """Requests the answer's sample at rate ``x`` spans, in all (its point's own included):
        ``confirm``, or as many as keep ``x`` up for ``hold_s``, whichever is more (a confirmation needs
        the flat-out figure, so only a rate search has one). A few seconds of load can fall between a
        server's slow spells, and a replica serves through them (docs/stages/latency.md, "The answer
        holds for a while"); MLPerf's minimum duration counts the whole run the same way. Never fewer
        than a full point's: a rate whose hold is shorter than that (``hold_s * x`` under 299 for a
        p99) could not bound the limit, and the walk down would stop there, undecided."""
        return max(self.confirm, math.ceil(self.hold_s * x), self.requests)


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
        late = late_text(point.late)
        say(f"capacity search: {axis.text(x)} stopped early after {m.sent} requests: {point.early}"
            + (f" ({late})" if late else ""))
    if probing and point.verdict in (MEETS, UNDECIDED):
        point.verdict = PROBED
    return point
