"""A capacity-search point stops once it has missed whatever its remaining requests do, or (a
full point) once it cannot meet (``day0.stages.latency.judging.ClearMiss``), and the load generator
honours the stop (``day0.client.loadgen`` ``until``): fewer requests sent, those in flight
cancelled."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from day0.client.loadgen import ClientOptions, LoadShape, make_streams, run_phase
from day0.client.stream import RequestResult
from day0.client.workload import WorkloadSpec, build_requests
from day0.config.latency import CapacitySearch, SlaSection
from day0.core.stats import bound_ranks, percentile_bounds
from day0.stages.latency.judging import ClearMiss
from day0.stages.latency.measurement import MEETS, MISSES, UNDECIDED
from day0.stages.latency.search import search_capacity
from tests.stages.latency.test_search import metrics_with
from tests.support.sse_server import Script, SSEServer

SLA = SlaSection.from_table({"ttft_p90_ms": 100.0})


def done(ttft_ms: float, ok: bool = True) -> RequestResult:
    r = RequestResult(0, "search", 0.0, 0.0, 8, 4)
    r.msg_t, r.msg_n, r.output_tokens, r.ok = [ttft_ms / 1000.0, ttft_ms / 1000.0 + 0.01], [1, 3], 4, ok
    if not ok:
        r.error, r.reason = "http", "http_500"
    return r


def test_the_rule_fires_at_exactly_the_count_that_decides():
    lower, _ = bound_ranks(32, 90.0, 0.95)
    needed = 32 - lower + 1
    rule = ClearMiss(SLA, 32)
    fired = [rule(done(250.0 if i % 2 else 20.0)) for i in range(2 * needed)]
    assert fired.index(True) == 2 * needed - 1 and rule.key == "ttft_p90"  # the needed-th slow one
    assert f"{needed} ttft_p90 values past 100 ms" in rule.why
    errors = ClearMiss(SlaSection.from_table({"ttft_p90_ms": 100.0, "max_error_rate": 0.1}), 30)
    assert [errors(done(20.0, ok=False)) for _ in range(4)] == [False, False, False, True]  # 4 > 0.1 x 30
    assert errors.key == "error_rate"


def test_with_edge_the_rule_fires_once_the_point_cannot_meet_and_a_miss_still_counts_as_one():
    _, upper = bound_ranks(299, 99.0, 0.95)
    assert upper == 299  # p99 over 299: the upper bound is the largest value, so one value past decides
    sla = SlaSection.from_table({"ttft_p99_ms": 100.0})
    rule = ClearMiss(sla, 299, edge=True)
    assert [rule(done(t)) for t in (20.0, 30.0, 250.0)] == [False, False, True]
    assert rule.key == "ttft_p99" and not rule.missed and "cannot meet" in rule.why
    probe = ClearMiss(sla, 299)  # without edge (a probe only has to not miss): the same values decide nothing
    assert not any(probe(done(t)) for t in (20.0, 30.0, 250.0))
    lower, _ = bound_ranks(299, 99.0, 0.95)
    for _ in range(299 - lower):  # the rest of a miss: the rule goes on counting after it fired
        rule(done(250.0))
    assert rule.missed and "lower bound" in rule.why


@pytest.mark.parametrize("seed", range(20))
def test_whenever_the_edge_rule_fires_the_whole_point_would_not_have_met(seed):
    # soundness, as for the miss: any continuation, failures included, leaves the upper bound past the
    # limit (or no upper bound at all), so the full point would not have met
    rng = random.Random(seed)
    n = rng.choice([29, 32, 60, 120, 299, 598])
    p = rng.choice([90.0, 99.0])
    ttfts = [rng.choice([rng.uniform(10, 99)] * 9 + [rng.uniform(101, 400)]) for _ in range(n)]
    rule = ClearMiss(SlaSection.from_table({f"ttft_p{p:g}_ms": 100.0}), n, edge=True)
    stop = next((i for i, t in enumerate(ttfts) if rule(done(t))), None)
    if stop is None:
        return
    rest = [t if rng.random() > 0.2 else None for t in ttfts[stop + 1:]]
    upper = percentile_bounds(ttfts[:stop + 1] + [t for t in rest if t is not None], p, 0.95).upper
    assert upper is None or upper > 100.0, (n, p, stop)


@pytest.mark.parametrize("seed", range(20))
def test_whenever_the_rule_fires_the_whole_point_would_have_missed(seed):
    # soundness: from the first request at which the rule fires, any continuation (here: random),
    # failures included, gives a full sample whose lower bound is past the limit
    rng = random.Random(seed)
    n = rng.choice([29, 32, 60, 120, 299])
    ttfts = [rng.choice([rng.uniform(10, 99), rng.uniform(101, 400)]) for _ in range(n)]
    rule = ClearMiss(SLA, n)
    stop = next((i for i, t in enumerate(ttfts) if rule(done(t))), None)
    if stop is None:
        return
    rest = [t if rng.random() > 0.2 else None for t in ttfts[stop + 1:]]  # some of the rest fail
    sample = ttfts[:stop + 1] + [t for t in rest if t is not None]
    assert percentile_bounds(sample, 90.0, 0.95).lower > 100.0, (n, stop)


def test_a_stopped_point_does_not_meet_and_says_why_and_the_search_goes_on():
    asked = []

    async def measure_at(rate: float, n: int, until=None):
        ttfts = [50.0 if rate <= 8 else 400.0] * n
        sent = []
        for t in ttfts:  # a measurer that honours the rule: stop feeding once it fires
            sent.append(t)
            if until is not None and until(done(t)):
                break
        asked.append((rate, len(sent)))
        return metrics_with(sent)

    result = asyncio.run(search_capacity(measure_at, CapacitySearch(start_rate=2.0, precision=0.05), SLA, 32,
                                         lambda _m: None))
    over = [pt for pt in result.points if pt.load > 8]
    assert over and all(pt.verdict == UNDECIDED and pt.undecided == ["ttft_p90"] and pt.early for pt in over)
    _, upper = bound_ranks(32, 90.0, 0.95)
    assert all(n == 32 - upper + 1 for rate, n in asked if rate > 8)  # the first slow value decides, not 32
    assert all(pt.verdict == MEETS for pt in result.points if pt.load <= 8)
    assert 8 / 1.05 <= result.sustained <= 8
    assert "ttft_p90" in result.ceiling.undecided


def test_a_point_that_misses_at_once_is_still_a_miss():
    async def measure_at(rate: float, n: int, until=None):
        sent = []
        for _ in range(n):  # every value past the limit: the edge fires first, the miss a few later
            sent.append(400.0)
            if until is not None and until(done(400.0)) and until.missed:
                break
        return metrics_with(sent)

    result = asyncio.run(search_capacity(measure_at, CapacitySearch(start_rate=2.0, probe_requests=0,
                                                                    max_points=3), SLA, 32, lambda _m: None))
    assert result.points and all(pt.verdict == MISSES and pt.misses == ["ttft_p90"] for pt in result.points)


def stopped_phase(script: Script, shape: LoadShape, n: int, stop_after: int):
    """(phase, requests the server received): ``n`` requests at ``shape`` against ``script``, a
    stop rule that fires at the ``stop_after``-th finished request."""
    reqs = build_requests(WorkloadSpec(16, 4), 300, n)
    seen: list[RequestResult] = []

    def until(r: RequestResult) -> bool:
        seen.append(r)
        return len(seen) >= stop_after

    async def go(url: str):
        async with make_streams(ClientOptions()) as streams:
            return await run_phase(streams, url, "scripted", reqs, shape, ClientOptions(), phase="search", until=until)

    with SSEServer(script) as srv:
        phase = asyncio.run(go(srv.url))
        return phase, len([e for e in srv.log() if e["phase"] == "search"])


def test_the_load_generator_stops_sending_and_cancels_what_is_in_flight():
    phase, received = stopped_phase(Script(ttft_ms=[300.0], gaps_ms=[5.0]),
                                    LoadShape(mode="rate", request_rate=40.0, seed=0), 60, 3)
    # 40 req/s, 300 ms to a first token: ~12 sent before the first result, none after the third
    assert len(phase.results) < 60 and phase.not_sent == 60 - len(phase.results)
    assert received < 40, received  # the rest of the schedule never left the client
    assert len(phase.results) >= 3 and all(r.ok for r in phase.results)


def test_a_closed_loop_stops_too():
    phase, received = stopped_phase(Script(ttft_ms=[20.0], gaps_ms=[5.0]),
                                    LoadShape(mode="concurrency", concurrency=2), 40, 5)
    # two loops: the fifth result stops both; at most the other loop's request was in flight
    assert 5 <= len(phase.results) <= 6 and received <= 7 and phase.not_sent == 40 - len(phase.results)


def test_a_confirmation_is_its_point_and_more_judged_as_one_sample():
    from day0.stages.latency.metrics import pooled

    first = metrics_with([20.0, 30.0, 40.0], lag_ms=1.0)
    more = metrics_with([50.0, 60.0], lag_ms=[2.0, 3.0], failed=1)
    first.loop_stall_ms, more.loop_stall_ms = 80.0, 6.0
    both = pooled(first, more)
    assert list(both.samples["ttft"]) == [20.0, 30.0, 40.0, 50.0, 60.0] and both.samples["send_lag"] == pytest.approx([1, 1, 1, 2, 3])
    assert (both.sent, both.completed, both.failed, both.errors) == (6, 5, 1, {"http": 1})
    assert both.duration_s == first.duration_s + more.duration_s
    assert both.request_throughput == pytest.approx(5 / both.duration_s)
    assert both.stats["ttft"].max == 60.0 and both.stats["ttft"].percentiles["p50"] == 40.0
    # the second phase's offsets after the first's whole duration; the stall the part just measured
    assert both.sample_offsets_s[3] == pytest.approx(first.duration_s + more.sample_offsets_s[0])
    assert both.loop_stall_ms == 6.0


def test_a_confirmation_stops_once_its_point_and_what_came_after_cannot_meet():
    sla = SlaSection.from_table({"ttft_p99_ms": 100.0})
    _, upper = bound_ranks(598, 99.0, 0.95)
    allowed = 598 - upper  # values past the limit the pooled 598 may hold and still meet (1)
    # the point met with none past the limit: the extension may have ``allowed``
    rule = ClearMiss(sla, 598, edge=True)
    rule.count(metrics_with([50.0] * 299))
    assert not any(rule(done(t)) for t in [50.0] * 100 + [250.0] * allowed)
    assert rule(done(250.0)) and not rule.missed
    # one already past it in the point (a p90 SLA met with it) leaves one fewer to the extension
    lax = SlaSection.from_table({"ttft_p99_ms": 100.0, "ttft_p90_ms": 1000.0})
    rule = ClearMiss(lax, 598, edge=True)
    rule.count(metrics_with([50.0] * 298 + [250.0]))
    assert [rule(done(250.0)) for _ in range(allowed)][-1] is True


def test_a_search_on_load_workers_stops_its_points_early_too():
    """The stop rule judges the pool's requests in the stage's process and stops every worker
    (``WorkerPool.run_phase``): on a pool, as in one process, a point that has missed costs the
    requests up to its proof, not its whole schedule."""
    from day0.config.latency import LatencySection
    from day0.stages.latency import run_latency

    settings = LatencySection(num_requests=4, warmup_requests=0, input_len=8, output_len=4, workers=2,
                              search=CapacitySearch(start_rate=40.0, probe_requests=0, requests=120, max_points=2,
                                                    saturation_requests=0))
    with SSEServer(Script(ttft_ms=[30.0], gaps_ms=[5.0])) as srv:  # every first token past the 10 ms limit
        run = run_latency(srv.url, "scripted", 300, settings, SlaSection.from_table({"ttft_p90_ms": 10.0}))
        received = len([e for e in srv.log() if e["phase"] == "search"])
    points = run.search.points
    assert len(points) == 2 and all(pt.verdict == MISSES and pt.early for pt in points), points
    assert run.metrics.workers == 2 and all(pt.metrics.sent < 60 for pt in points), [pt.metrics.sent for pt in points]
    assert received < 120, received  # of the two points' 240: the rest never left the workers


def test_the_rule_counts_each_value_with_the_clients_stalls_taken_out():
    """What the verdict reads of a point the client's loop stalled through (``*_without_stalls``):
    a first token read 250 ms after its schedule, 200 ms of it a stall, came at 50 ms, inside a
    100 ms limit, and does not count; with 100 ms of stall it came at 150 ms, and counts."""
    rule = ClearMiss(SLA, 32)
    lower, _ = bound_ranks(32, 90.0, 0.95)
    excused = done(250.0)
    excused.stalled_to_first, excused.stalled_to_last = 0.2, 0.2
    assert not any(rule(excused) for _ in range(32))
    late = done(250.0)
    late.stalled_to_first = late.stalled_to_last = 0.1
    assert [rule(late) for _ in range(32 - lower + 1)][-1] is True and rule.missed
    # TPOT: a stall moves it by the stall over the request's tokens less one (3 here)
    tpot = ClearMiss(SlaSection.from_table({"tpot_p90_ms": 10.0}), 32)
    slow = done(20.0)
    slow.msg_t = [0.02, 0.02 + 3 * 0.03]  # TPOT 30 ms
    slow.stalled_to_last = 0.045  # 15 ms a token of it the client's: 15 ms, still past 10
    assert [tpot(slow) for _ in range(32 - lower + 1)][-1] is True
    slow.stalled_to_last, tpot = 0.075, ClearMiss(SlaSection.from_table({"tpot_p90_ms": 10.0}), 32)
    assert not any(tpot(slow) for _ in range(32))  # 5 ms a token: within


def test_a_stall_of_the_clients_own_loop_does_not_stop_a_point():
    """Live: the client's loop blocked 400 ms mid-point (a host that does not run it) puts first tokens
    past a 300 ms limit as measured, enough that a rule counting them would stop the point; each
    request is stamped with what it stalled through as it ends, so the rule sees the server's 20 ms
    and the point runs to its end, as its verdict would have it (bench_capacity's runs ag and ah
    measured four stopped 30 s holds again for this)."""
    sla = SlaSection.from_table({"ttft_p90_ms": 300.0})
    n, blocked = 60, []
    rule = ClearMiss(sla, n, edge=True)
    reqs = build_requests(WorkloadSpec(16, 4), 300, n)

    def until(r: RequestResult) -> bool:
        if not blocked and r.index >= 5:
            blocked.append(r.index)
            time.sleep(0.4)
        return rule(r)

    async def go(url: str):
        async with make_streams(ClientOptions()) as streams:
            return await run_phase(streams, url, "scripted", reqs, LoadShape(mode="rate", request_rate=40.0, seed=0),
                                   ClientOptions(), phase="search", until=until)

    with SSEServer(Script(ttft_ms=[20.0], gaps_ms=[5.0])) as srv:
        phase = asyncio.run(go(srv.url))
    raw_past = sum(1 for r in phase.results if r.ttft is not None and r.ttft > 0.3)
    _, edge_needed = rule.thresholds("ttft_p90")
    assert edge_needed is not None and raw_past >= edge_needed, raw_past  # as measured, they would stop it
    assert len(phase.results) == n and phase.not_sent == 0 and not rule.why
    assert max(r.stalled_to_first for r in phase.results) >= 0.3
    assert all(r.ttft - r.stalled_to_first < 0.3 for r in phase.results if r.ttft is not None)
