"""Percentiles as the field computes them, in one place for the stages and the report.

Latency percentiles follow vLLM's benchmark (numpy's default linear interpolation); the report's
charts must show the same numbers the checks judged, so they use this function too. The
collective sweep's per-iteration times follow nccl-tests' nearest-rank rule (``method="nearest"``).
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass
from typing import Any, Sequence


def ordered(values: Sequence[float]) -> Sequence[float]:
    """``values`` sorted. A compact array of doubles (``array('d')``: an import's millions of
    inter-token gaps) is sorted as one, 8 bytes a value: ``sorted()`` would make each a float
    object of 32 bytes, four times the array, in every percentile taken of it."""
    if isinstance(values, array) and values.typecode == "d":
        import numpy as np  # here, not at the top: most callers never pass an array and skip its import

        out: Any = np.sort(np.frombuffer(values, dtype=np.float64))  # a Sequence in all but name
        return out
    return sorted(values)


def percentile(values: Sequence[float], p: float, *, presorted: bool = False, method: str = "linear") -> float:
    """``linear``: interpolation between closest ranks (numpy's default, what vLLM bench uses);
    ``nearest``: the value at rank ceil(n p / 100) (nccl-tests' rule, never a value not seen)."""
    if len(values) == 0:  # not `not values`: a sorted array (ordered) has no single truth value
        return math.nan
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside [0, 100]")
    v = values if presorted else ordered(values)
    if method == "nearest":
        return float(v[min(len(v) - 1, max(0, math.ceil(len(v) * p / 100.0) - 1))])
    if method != "linear":
        raise ValueError(f"percentile method {method!r} is not 'linear' or 'nearest'")
    rank = (len(v) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(v) - 1)
    frac = rank - lo
    # in Python floats (the same IEEE doubles): numpy's scalars warn on stderr where the span is past
    # a float (inf - inf), and the report must not print a warning about its own arithmetic
    low, high = float(v[lo]), float(v[hi])
    return low + (high - low) * frac if frac else low


# -- confidence in a percentile ----------------------------------------------------------------
#
# Distribution-free bounds from order statistics: of n independent samples, the number below the
# true q-quantile is Binomial(n, q), so an order statistic brackets the quantile with a probability
# the binomial gives, whatever the latency distribution (docs/metrics.md, "Confidence"). This is
# MLPerf LoadGen's early-stopping rule read the other way round: with k of n samples over a limit,
# the p-th percentile is within the limit at confidence c when P(Binomial(n, 1 - q) <= k) <= 1 - c.


@dataclass(frozen=True)
class PercentileBounds:
    """One-sided bounds on the true p-th percentile, each holding with probability ``confidence``.

    ``upper`` None: too few samples to bound it from above (:func:`samples_to_bound` says how many
    would); ``lower`` None: too few to bound it from below."""

    p: float
    confidence: float
    n: int
    lower: float | None
    upper: float | None


def _cumulative(n: int, q: float) -> tuple[int, list[float]]:
    """(first index, P(B <= i) for i from it on) for B ~ Binomial(n, q), over the window of mean
    +- 12 standard deviations: outside it the mass is below 1e-30, so the work is O(sqrt(n)), not
    O(n), for the million-request runs an import can hold."""
    mean, sd = n * q, math.sqrt(n * q * (1.0 - q))
    lo, hi = max(0, math.floor(mean - 12 * sd - 2)), min(n, math.ceil(mean + 12 * sd + 2))
    lq, l1q, lgn = math.log(q), math.log1p(-q), math.lgamma(n + 1)
    total, out = 0.0, []
    for i in range(lo, hi + 1):
        total += math.exp(lgn - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lq + (n - i) * l1q)
        out.append(min(1.0, total))
    return lo, out


def binomial_cdf(k: int, n: int, q: float) -> float:
    """P(Binomial(n, q) <= k)."""
    if k < 0 or q >= 1.0:
        return 0.0 if k < n else 1.0
    if k >= n or q <= 0.0:
        return 1.0
    lo, cdf = _cumulative(n, q)
    if k < lo:
        return 0.0
    return cdf[k - lo] if k - lo < len(cdf) else 1.0


def bound_ranks(n: int, p: float, confidence: float = 0.95) -> tuple[int | None, int | None]:
    """(l, u): the 1-based ranks of the order statistics :func:`percentile_bounds` returns, u the
    smallest rank with P(B <= u - 1) >= c, l the largest with P(B >= l) >= c, B ~ Binomial(n,
    p / 100); None where no rank bounds that side. Ranks alone, so a stop rule knows before the
    sample is complete how many values past a limit already decide it (n - l + 1)."""
    if not 0 < p / 100.0 < 1:  # as the fraction: 1e-323 is above 0, its hundredth is not
        raise ValueError(f"percentile {p} is not inside (0, 100)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} is not inside (0, 1)")
    if n <= 0:
        return None, None
    first, cdf = _cumulative(n, p / 100.0)

    def at_most(k: int) -> float:  # P(B <= k)
        return 0.0 if k < first else 1.0 if k - first >= len(cdf) else cdf[k - first]

    # P(X(u) >= quantile) = P(B <= u - 1); P(X(l) <= quantile) = P(B >= l) = 1 - P(B <= l - 1)
    upper = next((u for u in range(max(1, first), n + 1) if at_most(u - 1) >= confidence), None)
    lower = next((r for r in range(min(n, first + len(cdf)), 0, -1) if 1.0 - at_most(r - 1) >= confidence), None)
    return lower, upper


def percentile_bounds(values: Sequence[float], p: float, confidence: float = 0.95, *,
                      presorted: bool = False) -> PercentileBounds:
    """The order statistics X(u), X(l) with P(X(u) >= true p-th percentile) >= confidence and
    P(X(l) <= it) >= confidence (:func:`bound_ranks`)."""
    v = values if presorted else ordered(values)
    lower, upper = bound_ranks(len(v), p, confidence)
    return PercentileBounds(p, confidence, len(v), None if lower is None else float(v[lower - 1]),
                            None if upper is None else float(v[upper - 1]))


def samples_to_bound(p: float, confidence: float = 0.95) -> int:
    """The fewest samples whose largest can bound the p-th percentile from above at ``confidence``:
    1 - q^n >= c, so n = ceil(ln(1 - c) / ln q) (299 for p99 at 95%, 29 for p90)."""
    q = p / 100.0
    n = max(1, math.ceil(math.log(1.0 - confidence) / math.log(q) - 1e-9))
    # at an exact boundary (p10 at 99%: 1 - 0.1^2 is 0.99 in reals, 0.98999... in floats) the
    # formula's count is one that bound_ranks, which judges the sample, finds no bound in
    while bound_ranks(n, p, confidence)[1] is None:
        n += 1
    return n


# -- how independent the slow requests were ------------------------------------------------------
#
# The bounds above hold for independent samples. Requests that share a queue are not: near a
# server's edge one burst of arrivals delays the next dozen requests together, so the slowest
# requests come in runs and a sample of n says less than n independent ones would. Measured here
# (docs/stages/capacity-evidence.md, "One rate, the arms in turn"): at 47 req/s on the cpu-tiny server, the
# 95% intervals of one workload run five times minutes apart overlapped in 1 to 4 of 10 pairs.

TAIL_SHARE = 0.1  # the slowest tenth: enough samples (30 of 299) to count runs in, still the tail
MIN_TAIL = 5  # fewer slow samples than this say nothing about how they cluster
BURSTY = 1.5  # a factor past independent samples' noise: over 2,000 draws of 299 its largest was 1.31


@dataclass(frozen=True)
class TailBursts:
    """How the slowest ``share`` of a series, taken in the order the requests were scheduled, sat
    in time: ``slow`` samples in ``runs`` maximal runs of consecutive ones. Independent samples put
    a slow one next to another with probability ``share``, so their runs average 1 / (1 - share)
    (1.11 for a tenth); ``factor`` is the observed mean run over that, 1 for independent requests.
    A count of slow requests that arrive in runs of m varies at least m times as much as an
    independent count, so n such samples bound a percentile about as n / factor independent ones
    would (``equivalent``): an estimate from the tenth, read as a floor for the farther tail, whose
    runs in a queue are longer still."""

    n: int
    share: float
    slow: int
    runs: int

    @property
    def mean_run(self) -> float:
        return self.slow / self.runs

    @property
    def factor(self) -> float:
        return max(1.0, self.mean_run * (1.0 - self.slow / self.n))

    @property
    def equivalent(self) -> int:
        return math.floor(self.n / self.factor)

    @property
    def bursty(self) -> bool:
        return self.factor >= BURSTY


def tail_bursts(series: Sequence[float], share: float = TAIL_SHARE) -> TailBursts | None:
    """The runs of the slowest ``share`` of ``series`` (in schedule order); None when that share
    holds fewer than MIN_TAIL samples. Ties at the threshold count as slow, all of them."""
    n = len(series)
    k = math.floor(n * share)
    if not 0 < share < 1 or k < MIN_TAIL:
        return None
    threshold = float(ordered(series)[n - k])
    slow = runs = 0
    before = False  # whether the sample before was slow: a run starts at a slow one after a fast one
    for x in series:  # counted as it goes, not as a list of flags: a series may hold millions (an import's ITL)
        now = x >= threshold
        slow += now
        runs += now and not before
        before = now
    return TailBursts(n, share, slow, runs)


# Offered bursts: how bursty the arrivals a client sent were, before any server answered them.
# A percentile over a few hundred Poisson arrivals near a server's edge is decided as much by the
# draw of arrivals as by the server: the cpu-tiny vLLM server met 51.6 req/s on one draw and missed
# 50.21 on another minutes apart, and a benchmark that reuses a seed per rate reuses its bursts in
# every run (docs/stages/capacity-evidence.md, "The dense list's seeds").

QUEUE_LOAD = 0.85  # the reference server's utilisation: near an edge, where bursts decide a tail
OFFER_DRAWS = 200  # Poisson draws the schedule is ranked among: a share to the nearest half percent


@dataclass(frozen=True)
class OfferedBurst:
    """A schedule's arrivals in a reference queue (one server taking ``load`` mean gaps a request,
    first come first served): ``wait_p99`` is the p99 of the waits they build, in mean gaps, and
    ``calmer`` the share of ``draws`` fresh Poisson schedules of as many arrivals over the same span
    that build a longer one (ties half): about 0.5 for a typical draw, near 0 for a schedule
    burstier than almost any. Over the same span, so the realised rate does not enter."""

    wait_p99: float
    calmer: float
    draws: int


def _queue_wait_p99(offsets: Sequence[float], service: float) -> float:
    """Lindley's recursion: each arrival waits for the work left by those before it."""
    wait, waits = 0.0, []
    for prev, t in zip(offsets, offsets[1:]):
        wait = max(0.0, wait + service - (t - prev))
        waits.append(wait)
    return percentile([0.0, *waits], 99.0, method="nearest")


def offered_burst(offsets: Sequence[float], *, load: float = QUEUE_LOAD, draws: int = OFFER_DRAWS,
                  seed: int = 0) -> OfferedBurst | None:
    """Rank a schedule (send or scheduled offsets, seconds, in order) among ``draws`` Poisson
    schedules; None under 50 arrivals (a p99 of fewer is their maximum) or over no span."""
    n = len(offsets)
    span = offsets[-1] - offsets[0] if n else 0.0
    if n < 50 or span <= 0:
        return None
    gap = span / (n - 1)
    own = _queue_wait_p99([(t - offsets[0]) / gap for t in offsets], load)
    rng, worse = random.Random(seed), 0.0
    for _ in range(draws):
        times, t = [], 0.0
        for _ in range(n - 1):
            t += rng.expovariate(1.0)
            times.append(t)
        drawn = _queue_wait_p99([0.0, *(x * (n - 1) / t for x in times)], load)
        worse += 1.0 if drawn > own else 0.5 if drawn == own else 0.0
    return OfferedBurst(own, worse / draws, draws)
