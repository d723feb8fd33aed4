"""What stage 3 measured, as data: one run (:class:`LatencyRun`), its sweep steps
(:class:`SweepPoint`), its capacity search (:class:`SearchResult`), its prefix-cache intent
(:class:`CacheIntent`) and speculative decoding's acceptance over the measured window
(:class:`SpecWindow`).

The measuring modules (``run``, ``inprocess``, ``sweep``, ``search``) build these; the judging
modules (``checks``, ``agreement``, ``sweep``, ``search``) read them. Both import this module and it
imports neither, so the stage's modules form no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from day0.client.prom import PrefixCacheWindow, ServerFigure
from day0.client.spec_decode import Acceptance
from day0.config.latency import LatencySection, SlaSection
from day0.stages.latency.metrics import LatencyMetrics
from day0.stages.latency.spells import LateSpells


@dataclass
class SweepPoint:
    """One offered rate of the sweep: what it measured and which SLA limits it missed."""

    rate: float
    metrics: LatencyMetrics
    meets_sla: bool
    failing: list[str]
    late: list[LateSpells] = field(default_factory=list)  # as a search point's (SearchPoint.late)
    unmeasured: str = ""  # why the step decided nothing (the client lagged; too few requests to bound a limit)


# A capacity-search point's verdicts (:class:`SearchPoint`)
MEETS, MISSES, UNDECIDED, CLIENT_LAGGED = "meets", "misses", "undecided", "client_lagged"
PROBED = "probed"  # a short point while bracketing upward that did not miss: the bracket moves up, nothing is claimed


@dataclass
class SearchPoint:
    """One offered rate of the capacity search, judged with confidence bounds.

    ``verdict``: ``meets`` (every limited percentile's upper bound within its limit, errors within
    ``max_error_rate``), ``misses`` (a lower bound past its limit, too many errors, or nothing
    completed), ``undecided`` (a bound decides nothing: too few requests, or the limit inside the
    interval), ``client_lagged`` (the load generator fell an arrival gap behind its schedule, so
    the rate offered was not this one; ``lag_ms`` is the p90 of its send lag) or ``probed`` (a
    probe of the upward bracketing, too short to bound a limit from above, that did not miss: it
    steers the search and is never the answer). ``bounds``: limit id
    -> (lower, upper) in ms, None where the sample cannot bound that side."""

    load: float  # the offered load: req/s, or (a concurrency search) requests in flight
    metrics: LatencyMetrics
    verdict: str
    misses: list[str]
    undecided: list[str]
    bounds: dict[str, tuple[float | None, float | None]]
    lag_ms: float
    early: str = ""  # why the point stopped before its last request (judging.ClearMiss), "" when it ran out
    quarters_ms: tuple[float, float] | None = None  # median TTFT of its first and last quarter (judging.quarter_ttfts)
    extends: int = 0  # requests of the earlier point at this load that ``metrics`` includes (a confirmation)
    held: bool = False  # judged as the answer's confirmation: a point's extension (``extends``), or, below one that
    # did not meet, a point of the confirmation's size from its start (search._Bracket.walk_down)
    late: list[LateSpells] = field(default_factory=list)  # each TTFT or E2E limit it did not meet: its late
    # requests spell by spell, with the arrivals before each (day0.stages.latency.spells)

    @property
    def unbounded(self) -> list[str]:
        """The undecided limits the point's sample cannot bound from above at all (too few
        requests): more points would not decide them, only more requests a point."""
        return [k for k in self.undecided if self.bounds.get(k, (None, None))[1] is None]

    @property
    def held_miss(self) -> bool:
        """A held point that did not meet. One the client lagged through concluded nothing: it is
        measured again at the same load."""
        return self.held and self.verdict not in (MEETS, CLIENT_LAGGED)


SATURATION = "saturation"  # a search point's miss: a rate at or past what the server completes flat out


@dataclass(frozen=True)
class Saturation:
    """What the server completes flat out (a closed loop that keeps its batch full), measured before a
    rate search: the rate no open loop can be sustained at, since past it the queue grows without
    bound whatever a point's short sample shows. ``req_s`` is None when it could not be measured;
    ``queued`` says whether /metrics showed requests waiting in the window it was read over (None:
    no /metrics), and only a queued figure bounds the search (``applies``): a server with free
    slots was not running flat out. ``why`` says what kept it from applying."""

    req_s: float | None
    requests: int
    concurrency: int
    queued: bool | None
    why: str = ""
    window_s: float = 0.0  # the middle of the run the rate is read over
    tried: tuple[int, ...] = ()  # requests of each run before this one, none of which showed a queue

    @property
    def applies(self) -> bool:
        return self.req_s is not None and bool(self.queued) and not self.why

    def text(self) -> str:
        before = f"; runs of {', '.join(map(str, self.tried))} requests showed no queue" if self.tried else ""
        if self.req_s is None:
            return f"saturation not measured: {self.why}{before}"
        told = (f"flat out {self.req_s:.4g} req/s ({self.requests} requests, {self.concurrency} in flight, read over "
                f"the middle {self.window_s:.3g} s{before})")
        return told + ("" if self.applies else f", not used: {self.why}")


@dataclass
class SearchResult:
    """The capacity search: its points in the order measured and why it stopped."""

    points: list[SearchPoint]
    requests_per_point: int
    confidence: float
    stopped: str  # why the search ended, in words
    axis: str = "rate"  # what it varied: "rate" (open loop) or "concurrency" (closed loop)
    unit: str = "req/s"
    probe_requests: int = 0  # requests of a probe while the bracket climbed (0: every point full-sized)
    saturation: Saturation | None = None  # measured before a rate search (None: not measured)

    @property
    def requests_sent(self) -> int:
        """What the search sent, the flat-out run included; a confirmation's own requests only (its
        metrics include the point it goes on from): :attr:`requests_by_part` added up."""
        return sum(self.requests_by_part.values())

    @property
    def _flat_out_unplaced(self) -> int:
        """The flat-out requests no point holds: every run that showed no queue (``tried``), and the
        last one too where its figure did not apply (where it did, its point holds them)."""
        placed = any(SATURATION in pt.misses for pt in self.points)
        if self.saturation is None:
            return 0
        return sum(self.saturation.tried) + (0 if placed else self.saturation.requests)

    @property
    def requests_by_part(self) -> dict[str, int]:
        """:attr:`requests_sent` split by what each request served: the flat-out run, short points,
        the held points that met and those that did not (one measured again after a client stall
        included). A short point that a hold went on from counts with the last such hold, which
        judged its requests (a hold the client lagged through is measured again from the same
        point). The split answers what a search's cost is made of: on a server whose 30 s edge sits
        well under the rate its short points meet, the held points that did not meet
        (docs/stages/capacity-evidence.md, "What a search spends")."""
        parts = {"flat_out": self._flat_out_unplaced, "short": 0, "held_met": 0, "held_not_met": 0}
        went_on: dict[float, tuple[str, int]] = {}  # load -> (the last hold's part, its point's requests)
        for pt in self.points:
            part = ("flat_out" if SATURATION in pt.misses else "short" if not pt.held
                    else "held_met" if pt.verdict == MEETS else "held_not_met")
            parts[part] += pt.metrics.sent - pt.extends
            if pt.extends:
                went_on[pt.load] = (part, pt.extends)
        for part, n in went_on.values():
            parts["short"] -= n
            parts[part] += n
        return parts

    @property
    def first_miss(self) -> SearchPoint | None:
        """The lowest offered load that missed the SLA."""
        missed = [p for p in self.points if p.verdict == MISSES]
        return min(missed, key=lambda p: p.load) if missed else None

    @property
    def ceiling(self) -> SearchPoint | None:
        """The lowest offered load that did not meet the SLA: a miss, or a point whose bounds
        straddle a limit (the SLA's edge lies at or below it)."""
        over = [p for p in self.points if p.verdict in (MISSES, UNDECIDED)]
        return min(over, key=lambda p: p.load) if over else None

    @property
    def held_missed(self) -> bool:
        """A held point (a confirmation, or a point of the walk down) did not meet: from then on short
        points have shown they overstate what holds, and only a held point can be the answer."""
        return any(p.held_miss for p in self.points)

    def _met_under_ceiling(self) -> list[SearchPoint]:
        top = self.ceiling
        return [p for p in self.points if p.verdict == MEETS and (top is None or p.load < top.load)]

    @property
    def sustained_point(self) -> SearchPoint | None:
        """The highest-load point that met the SLA below the ceiling (None: none did); of two at that
        load (a short point and its confirmation), the one over more requests. Once a held point has
        missed, only held points count: a short point that met between the held answer and the held
        miss is not an answer (it had been, above both the answer and what the server held)."""
        held_only = self.held_missed
        met = [p for p in self._met_under_ceiling() if p.held or not held_only]
        return max(met, key=lambda p: (p.load, p.metrics.sent)) if met else None

    @property
    def unheld(self) -> SearchPoint | None:
        """The highest short point that met below the ceiling where no held point is the answer
        after a held miss: the search ran out of points before any rate held."""
        if not self.held_missed or self.sustained_point is not None:
            return None
        met = self._met_under_ceiling()
        return max(met, key=lambda p: p.load) if met else None

    @property
    def sustained(self) -> float | None:
        """The sustained load itself (:attr:`sustained_point`'s)."""
        point = self.sustained_point
        return point.load if point is not None else None


@dataclass
class CacheIntent:
    """How much of the measured window's prompt tokens the prefix cache may serve, and how much it did.

    ``intended`` is the workload's own shared share (nonce + shared prefix, exact from the
    requests sent); ``allowance`` one KV block per request (a cache hits whole blocks, and a chat
    template's common head is up to about one); ``window`` what /metrics counted, None unmeasured."""

    intended: float
    allowance: float
    block_size: int
    fresh: bool
    window: PrefixCacheWindow | None = None
    why_unmeasured: str = ""
    workload: str = ""  # where the lengths came from, in words

    @property
    def limit(self) -> float:
        return min(1.0, self.intended + self.allowance)


@dataclass
class SpecWindow:
    """Speculative decoding's counters over the measured window (the scrapes around the measured
    phase that ``latency.server_agreement`` and the prefix-cache share read): what the drafter
    achieves on the workload the SLA is judged on, not on the parity stage's three prompts.

    ``acceptance`` is None when it could not be read, ``why_unmeasured`` says why; a window with
    no draft is an ``Acceptance`` with ``drafts == 0`` (read, but nothing was speculated)."""

    acceptance: Acceptance | None = None
    why_unmeasured: str = ""


@dataclass
class LatencyRun:
    """Everything one latency stage measured; ``checks.latency_checks`` turns it into run-record checks."""

    base_url: str
    model: str
    settings: LatencySection
    sla: SlaSection
    metrics: LatencyMetrics
    warmup: LatencyMetrics | None
    server: dict[str, ServerFigure] | None
    server_error: str | None
    sweep: list[SweepPoint] = field(default_factory=list)
    cache: CacheIntent | None = None
    spec: SpecWindow | None = None  # None: a view without /metrics (in-process)
    search: SearchResult | None = None  # the capacity search ([latency.search]), when run
    devices: int = 1  # what serves the engine (the profile's topology): throughput per device
