"""How a capacity-search point is judged: by order-statistic bounds on each limited percentile,
errors, a growing queue and the client's own lag and stalls (:func:`judge_point`), and when it may
stop before its last request (:class:`ClearMiss`). The search (``search``) decides where to
measure; the fixed-rate sweep (``sweep``) judges its points the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.client.prom import pct_name
from day0.client.stream import RequestResult
from day0.config.latency import SlaSection
from day0.core.stats import bound_ranks, percentile, percentile_bounds
from day0.stages.latency.measurement import CLIENT_LAGGED, MEETS, MISSES, UNDECIDED, SearchPoint
from day0.stages.latency.metrics import LatencyMetrics, e2e_without_stalls, tpot_without_stalls, ttft_without_stalls
from day0.stages.latency.spells import TIME_METRICS, LateSpells, late_spells

# A point's queue grows when the median TTFT of its last quarter of requests (by scheduled time) is
# more than QUEUE_GROWTH times its first quarter's, and higher by more than QUEUE_FLOOR of the
# tightest TTFT limit: a rate the engine cannot keep up with, whatever the bounds say of a point
# too short for the queue to reach the limit. The floor keeps a busy host's slowdown over a long
# point at a low rate (30 ms becoming 60 ms against a 2 s limit) from reading as a queue.
QUEUE_GROWTH, QUEUE_FLOOR = 2.0, 0.1
# A point the client's event loop stalled through for more than STALL_SHARE of the tightest per-event
# limit (TTFT, E2E, ITL), and more than STALL_FLOOR_MS, misses on latency only where its values with
# the stall taken out still miss (``stall_free``): the stall delayed sends and reads alike, and a point
# it decides is measured again, once (stalls: ``day0.client.loadgen.LoopWatch``; TPOT, averaged over
# a request's tokens, does not set the share: a stall moves it by the stall over the request's
# tokens). The floor lets a busy host's ordinary stalls of a few tens of ms stand as latency: they
# touch the few requests in flight, not a percentile over hundreds.
STALL_SHARE, STALL_FLOOR_MS = 0.1, 50.0


def stall_limit(sla: SlaSection) -> float | None:
    """The longest loop stall (ms) a point may have and still miss on latency; None: no limit it threatens."""
    limits = [limit for metric, _, limit in sla.latency_limits() if metric in ("ttft", "e2e", "itl")]
    return max(STALL_SHARE * min(limits), STALL_FLOOR_MS) if limits else None


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
    The same argument holds as for the miss: n - u(n) never grows as failures shrink n.

    It counts each value with the time the client's loop stalled through taken out (``*_without_stalls``,
    stamped on the request as it ends). That is what the verdict reads of a point the client stalled
    through (:func:`stall_free`), and never more than the value as measured, which it reads of any
    other: so the rule fires only on what the verdict will count, and a stall does not stop a point
    only for it to be measured again (bench_capacity's runs ag and ah: four 30 s holds stopped on
    first tokens the client's stalls had made late, 644-1,131 requests each, then measured again)."""

    METRICS = {"ttft": ttft_without_stalls, "tpot": tpot_without_stalls, "e2e": e2e_without_stalls}  # s

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
            t.seen += sum(1 for v in m.samples.get(f"{t.metric}_without_stalls") or [] if v > t.limit)

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
    point = SearchPoint(load, m, verdict, misses, undecided, bounds, lag, early.why if early is not None else "",
                        quarters)
    point.late = late_of(m, sla, misses + undecided, None if gap_ms is None else load)
    return point


def late_of(m: LatencyMetrics, sla: SlaSection, keys: list[str], rate: float | None) -> list[LateSpells]:
    """The late requests of each TTFT or E2E limit in ``keys``, spell by spell (``spells.late_spells``;
    ``rate`` None: a closed loop, no schedule); none where the scheduled times do not pair with the values."""
    out = []
    for key, (metric, _, limit) in limits_by_key(sla).items():
        values = m.samples.get(metric) or []
        if key in keys and metric in TIME_METRICS and values and len(values) == len(m.sample_offsets_s):
            out.append(LateSpells(key, limit, late_spells(m.sample_offsets_s, values, limit, rate)))
    return out


def limits_by_key(sla: SlaSection) -> dict[str, tuple[str, float, float]]:
    """Each latency limit under the key a point's misses and bounds name it by ("ttft_p99")."""
    return {f"{metric}_{pct_name(p)}": (metric, p, limit) for metric, p, limit in sla.latency_limits()}


def stall_free(misses: list[str], undecided: list[str], m: LatencyMetrics, sla: SlaSection,
               early: ClearMiss | None) -> tuple[list[str], list[str]]:
    """The misses and undecided limits that stand with each request's TTFT, E2E and TPOT taken down by
    the time the client's loop stalled through while it was in flight (``*_without_stalls``): failures,
    and a TTFT, E2E or TPOT limit that the values without the stalls still miss (or still cannot meet,
    where the stop rule decided it: counted as it counts). A stall of 55 ms adds under 2 ms to the
    TPOT of a 32-token request, so it does not excuse one 30 ms past a limit. ITL and queue growth do
    not stand: a stall sits in their gaps and no per-request figure takes it out."""
    limits = limits_by_key(sla)
    kept_misses = [k for k in misses if k in ("error_rate", "no_completed_requests")]
    kept_undecided: list[str] = []
    for key in misses + undecided:
        metric, p, limit = limits.get(key, ("", 0.0, 0.0))
        if metric not in ("ttft", "e2e", "tpot"):
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
    clocks start after the send), and a TTFT or E2E limit whose lower bound from the actual send
    (``ttft_from_send``, ``e2e_from_send``) is still past it. Queue growth includes the lag: not
    conclusive."""
    limits = limits_by_key(sla)
    kept = []
    for key in misses:
        metric, p, limit = limits.get(key, (key, 0.0, 0.0))
        if key in ("error_rate", "no_completed_requests") or metric in ("tpot", "itl"):
            kept.append(key)
        elif metric in ("ttft", "e2e"):
            lower = percentile_bounds(m.samples.get(f"{metric}_from_send") or [], p, sla.confidence).lower
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
