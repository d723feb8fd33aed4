"""Confidence in a percentile (``day0.core.stats``): the order-statistic bounds hold their
confidence over many samples of known distributions, need the sample sizes the binomial says,
refuse to bound what too few samples cannot, and stay fast on a million samples."""

from __future__ import annotations

import math
import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.core.stats import (
    BURSTY,
    binomial_cdf,
    bound_ranks,
    offered_burst,
    percentile,
    percentile_bounds,
    samples_to_bound,
    tail_bursts,
)


def exact_cdf(k: int, n: int, q: float) -> float:
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))


@pytest.mark.parametrize("n,q,k", [(30, 0.9, 26), (300, 0.99, 297), (50, 0.5, 20), (7, 0.3, 0), (1000, 0.95, 940)])
def test_the_binomial_cdf_is_the_exact_sum(n, q, k):
    assert binomial_cdf(k, n, q) == pytest.approx(exact_cdf(k, n, q), rel=1e-9, abs=1e-15)


def test_samples_to_bound_are_the_binomials_own_counts():
    # 1 - q^n >= c: the largest of n samples is above the q-quantile with probability c
    assert (samples_to_bound(99), samples_to_bound(90), samples_to_bound(50)) == (299, 29, 5)
    assert samples_to_bound(99, 0.99) == 459
    for p, c in ((99, 0.95), (90, 0.9), (99.9, 0.95)):
        n = samples_to_bound(p, c)
        assert 1 - (p / 100) ** n >= c > 1 - (p / 100) ** (n - 1)


@given(p=st.floats(1, 99.9), c=st.floats(0.51, 0.999))
def test_the_count_to_bound_is_the_fewest_the_bounds_themselves_accept(p, c):
    """samples_to_bound chooses a run's request count and bound_ranks then judges the sample: they
    must agree. At an exact boundary (p10 at 99%: 1 - 0.1^2 = 0.99 in reals, 0.98999... in floats)
    the count said 2 and the bounds found no upper bound in 2."""
    n = samples_to_bound(p, c)
    assert bound_ranks(n, p, c)[1] is not None
    assert n == 1 or bound_ranks(n - 1, p, c)[1] is None
    assert samples_to_bound(10, 0.99) == 3


def test_too_few_samples_bound_nothing_from_above():
    assert percentile_bounds(list(range(298)), 99).upper is None
    b = percentile_bounds(list(range(299)), 99)
    assert b.upper == 298.0 and b.lower is not None and b.lower <= percentile(list(range(299)), 99) <= b.upper
    assert percentile_bounds([], 99) == percentile_bounds([], 99) and percentile_bounds([], 99).upper is None
    with pytest.raises(ValueError, match="percentile 100"):
        percentile_bounds([1.0], 100)


@pytest.mark.parametrize("p,n", [(90, 60), (99, 400), (50, 25)])
def test_each_bound_misses_the_true_quantile_at_most_as_often_as_its_confidence_allows(p, n):
    # exponential latencies, true p-th percentile known: -ln(1 - q); 2000 samples of n
    rng = random.Random(f"bounds-{p}-{n}")
    truth = -math.log(1 - p / 100)
    trials, above, below = 2000, 0, 0
    for _ in range(trials):
        b = percentile_bounds([rng.expovariate(1.0) for _ in range(n)], p, 0.95)
        above += b.upper is not None and b.upper < truth
        below += b.lower is not None and b.lower > truth
    # each side fails with probability <= 5% (conservative for discrete n); 2000 trials: 3 sigma ~ 1.5%
    assert above / trials <= 0.065 and below / trials <= 0.065, (above, below)
    assert above > 0 or below > 0  # they are bounds, not the whole range


def test_a_million_samples_are_bounded_in_less_time_than_one_pass_over_them():
    # the binomial is summed over a window of +-12 standard deviations, not over all n: a million
    # samples cost less than one Python pass over a million numbers, measured here, on this box
    rng = random.Random(0)
    v = sorted(rng.random() for _ in range(1_000_000))
    t0 = time.process_time()
    sum(math.exp(-x) for x in v)
    one_pass = time.process_time() - t0
    t0 = time.process_time()
    b = percentile_bounds(v, 99, presorted=True)
    assert time.process_time() - t0 < one_pass
    assert b.lower < 0.99 < b.upper and b.upper - b.lower < 0.001


def queue_like(rng: random.Random, n: int, run: int) -> list[float]:
    """Requests that share a queue: each run of ``run`` consecutive requests waits alike (one
    exponential level for the run, a little noise for each)."""
    out: list[float] = []
    while len(out) < n:
        level = rng.expovariate(1.0)
        out += [level + rng.uniform(0, 0.01) for _ in range(run)]
    return out[:n]


def test_independent_samples_are_not_called_bursty():
    rng = random.Random(7)
    for _ in range(300):
        b = tail_bursts([rng.random() for _ in range(299)])
        assert b is not None and not b.bursty and b.equivalent > 299 / BURSTY


def test_a_queues_runs_are_measured_and_cost_their_samples():
    b = tail_bursts(queue_like(random.Random(3), 300, 10))
    assert b.bursty and b.mean_run == pytest.approx(10, rel=0.35)
    assert b.factor == pytest.approx(b.mean_run * 0.9, rel=0.05) and b.equivalent < 60


def test_the_bounds_lose_their_confidence_exactly_where_the_factor_says_bursts():
    """The order-statistic bound assumes independent samples; over requests that wait in runs of
    10 its 95% upper bound on p90 falls below the true p90 far more often than 5%, and every such
    sample is flagged."""
    rng = random.Random(11)
    true_p90 = math.log(10.0)  # of the run levels, Exp(1); the noise moves it by < 1%
    missed = flagged = 0
    for _ in range(400):
        x = queue_like(rng, 299, 10)
        missed += percentile_bounds(x, 90.0).upper < true_p90
        flagged += tail_bursts(x).bursty
    assert missed / 400 > 0.15
    assert flagged == 400


def test_too_few_slow_samples_say_nothing_and_ties_are_no_tail():
    assert tail_bursts([1.0] * 49) is None  # a tenth of 49 is 4 samples
    flat = tail_bursts([1.0] * 100)
    assert flat.slow == 100 and flat.factor == 1.0 and not flat.bursty


def poisson_offsets(rng: random.Random, n: int = 299, rate: float = 50.0) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def test_a_typical_poisson_draw_ranks_in_the_middle_and_a_burst_at_the_bottom():
    """Ranked among Poisson draws, Poisson schedules spread over the range (a tenth of them below
    0.1, give or take); the same schedule with 30 arrivals moved into one instant queues worse than
    nearly every draw; evenly spaced arrivals build no queue at all and rank at the top."""
    rng = random.Random(7)
    ranks = [offered_burst(poisson_offsets(rng), draws=100).calmer for _ in range(40)]
    assert 0.35 < sum(ranks) / len(ranks) < 0.65
    assert sum(r < 0.1 for r in ranks) <= 10
    bursty = poisson_offsets(random.Random(8))
    bursty[100:130] = [bursty[100]] * 30
    assert offered_burst(bursty).calmer < 0.05
    even = offered_burst([i / 50.0 for i in range(299)])
    assert even.wait_p99 == 0.0 and even.calmer > 0.95


def test_the_rank_ignores_the_clock_and_needs_enough_arrivals():
    """The same schedule at twice the rate is as bursty; fewer than 50 arrivals have no p99 to rank."""
    offsets = poisson_offsets(random.Random(9))
    own, faster = offered_burst(offsets), offered_burst([t / 2.0 for t in offsets])
    assert faster.wait_p99 == pytest.approx(own.wait_p99) and faster.calmer == own.calmer
    assert offered_burst(offsets[:49]) is None and offered_burst([0.0] * 60) is None
