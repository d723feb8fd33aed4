"""A rate search bounded by what the server completes flat out (``day0.stages.latency.saturation``):
the figure read over the middle of a closed loop, used only when /metrics showed the batch full;
every rate at or past it a miss without a point spent there; the answer measured once more over a
longer point before the search ends on it. Against a scripted server with a known capacity the
whole stage finds it, starting under the figure."""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import replace

import pytest

from day0.client.loadgen import LoadShape, PhaseResult
from day0.client.stream import RequestResult
from day0.config.latency import CapacitySearch, LatencySection, SlaSection
from day0.stages.latency import latency_checks, run_latency
from day0.stages.latency.capacity import CHECK_ID, capacity_check
from day0.stages.latency.judging import judge_point, lag_text
from day0.stages.latency.measurement import SATURATION, Saturation, SearchPoint, SearchResult
from day0.stages.latency.saturation import flat_out, middle_window, saturation_of
from day0.stages.latency.search import (
    CLIENT_LAGGED,
    MEETS,
    MISSES,
    PROBED,
    UNDECIDED,
    _Bracket,
    axis_of,
    search_capacity,
)
from tests.stages.latency.test_search import counted, metrics_with, stamp
from tests.support.sse_server import Script, SSEServer, capacity, schedule, served_capacity

SLA = SlaSection.from_table({"ttft_p90_ms": 100.0})


def finished_at(times: list[float], ok: bool = True) -> list[RequestResult]:
    out = []
    for i, t in enumerate(times):
        r = RequestResult(i, "saturation", 0.0, 0.0, 8, 4)
        r.ok, r.finished = ok, t
        out.append(r)
    return out


def test_the_flat_out_rate_is_read_over_the_middle_of_the_completions():
    # a slow fill (the first 20 in 4 s), 60 at 10/s, a slow drain (the last 20 in 4 s): the middle alone
    times = [0.2 * i for i in range(20)] + [4.0 + 0.1 * i for i in range(60)] + [10.0 + 0.2 * i for i in range(20)]
    rate, start, end = middle_window(times)
    assert rate == pytest.approx(10.0, rel=0.03) and start == pytest.approx(4.0) and end == pytest.approx(9.9)
    assert middle_window([1.0] * 9) is None  # too few completions to have a middle
    assert middle_window([1.0] * 20) is None  # a window of no length is no rate


def test_the_figure_bounds_a_search_only_when_metrics_showed_requests_waiting():
    results = finished_at([4.0 + 0.1 * i for i in range(100)])
    full = saturation_of(results, 100, 100, [(3.0, 0.0), (6.0, 40.0), (9.0, 12.0)])
    assert full.applies and full.queued and full.req_s == pytest.approx(10.0, rel=0.03)
    assert "flat out 10" in full.text() and "not used" not in full.text()
    idle = saturation_of(results, 100, 100, [(6.0, 0.0), (9.0, 0.0)])
    assert not idle.applies and "no request waited in 2 /metrics polls" in idle.why and "not used" in idle.text()
    # a queue seen only before the window (the burst's own arrival) is not a full batch in it
    early = saturation_of(results, 100, 100, [(3.0, 90.0), (20.0, 5.0)])
    assert not early.applies and "no /metrics poll landed" in early.why
    blind = saturation_of(results, 100, 100, None, "http://x/metrics: HTTP 404")
    assert not blind.applies and blind.queued is None and "HTTP 404" in blind.why
    failed = saturation_of(finished_at([1.0] * 100, ok=False), 100, 100, [(1.0, 5.0)])
    assert failed.req_s is None and not failed.applies and "0 of 100 requests completed" in failed.why


def batch_of(size: int, req_s: float = 40.0):
    """A flat-out run against a server whose batch holds ``size`` requests: with more in flight some
    wait (/metrics shows them), with no more none do; the (requests, in flight) of every run."""
    runs: list[tuple[int, int]] = []

    async def measure(requests: int, in_flight: int) -> tuple[Saturation, PhaseResult]:
        runs.append((requests, in_flight))
        full = (in_flight or requests) > size
        sat = Saturation(req_s, requests, in_flight or requests, full,
                         "" if full else "no request waited in 4 /metrics polls: the batch was not full")
        return sat, PhaseResult("saturation", LoadShape(mode="concurrency", concurrency=in_flight or requests),
                                [], 0.0, 1.0, 0)
    return measure, runs


def test_a_flat_out_run_doubles_until_the_servers_batch_is_full():
    """vLLM's default max_num_seqs is 1024 on an H100: 200 requests at once leave its batch room, and
    a figure read off a batch with room is no ceiling. Each run that did not fill it is counted."""
    said: list[str] = []
    measure, runs = batch_of(1024)
    sat, _ = asyncio.run(flat_out(measure, 200, 0, 3200, said.append))
    assert runs == [(200, 0), (400, 0), (800, 0), (1600, 0)] and sat.applies
    assert sat.requests == 1600 and sat.tried == (200, 400, 800)
    assert "runs of 200, 400, 800 requests showed no queue" in sat.text()
    assert len(said) == 3 and "flat out again with 400 requests, 400 in flight" in said[0]
    points = [SearchPoint(sat.req_s, metrics_with([900.0] * 1600), MISSES, [SATURATION], [], {}, 0.0)]
    assert SearchResult(points, 299, 0.95, "", saturation=sat).requests_by_part["flat_out"] == 3000
    # a set in-flight count doubles with the requests; a batch the first run fills is measured once
    measure, runs = batch_of(100)
    assert asyncio.run(flat_out(measure, 400, 50, 3200, said.append))[0].applies
    assert runs == [(400, 50), (800, 100), (1600, 200)]
    measure, runs = batch_of(16)
    assert asyncio.run(flat_out(measure, 200, 0, 3200, said.append))[0].tried == () and runs == [(200, 0)]


def test_the_doubling_stops_at_its_cap_and_says_what_to_raise():
    measure, runs = batch_of(5000)
    sat, _ = asyncio.run(flat_out(measure, 200, 0, 1000, lambda _: None))
    assert runs == [(200, 0), (400, 0), (800, 0)] and not sat.applies  # 1600 would pass the cap
    assert "at 800 requests (raise latency.search.saturation_max_requests, 1000," in sat.why
    assert "not used" in sat.text() and "runs of 200, 400 requests" in sat.text()
    unplaced = SearchResult([], 299, 0.95, "", saturation=sat)
    assert unplaced.requests_by_part["flat_out"] == 1400  # every run sent, no point holds them
    measure, runs = batch_of(5000)
    assert asyncio.run(flat_out(measure, 200, 0, 0, lambda _: None))[0].tried == () and runs == [(200, 0)]

    async def blind(requests: int, in_flight: int) -> tuple[Saturation, PhaseResult]:
        runs.append((requests, in_flight))  # no /metrics: more requests would not show a queue either
        return Saturation(40.0, requests, requests, None, "no /metrics"), PhaseResult(
            "saturation", LoadShape(mode="concurrency", concurrency=requests), [], 0.0, 1.0, 0)
    runs.clear()
    assert asyncio.run(flat_out(blind, 200, 0, 3200, lambda _: None))[0].why == "no /metrics" and runs == [(200, 0)]


def test_the_stage_doubles_its_flat_out_run_past_a_scripted_servers_batch():
    # 12 at once fit the 16 slots (and end within one /metrics poll): no ceiling; doubled until a poll shows a queue
    script = Script(ttft_ms=[10.0], gaps_ms=[15.0], slots=16)
    settings = LatencySection(num_requests=4, warmup_requests=0, input_len=8, output_len=4, workers=1,
                              burstiness=100.0, search=CapacitySearch(max_points=2, requests=30, saturation_requests=12,
                                                                      confirm_requests=0, confirm_s=0.0))
    with SSEServer(script) as srv:
        run = run_latency(srv.url, "scripted", 300, settings, SlaSection.from_table({"ttft_p90_ms": 1000.0}))
        sent = sum(1 for e in srv.log() if e["phase"] == "saturation")
    sat = run.search.saturation
    assert sat is not None and sat.applies and sat.tried and sat.tried[0] == 12, sat
    assert sat.tried == tuple(12 * 2 ** k for k in range(len(sat.tried))) and sat.requests == 2 * sat.tried[-1]
    assert sent == sat.requests + sum(sat.tried) == run.search.requests_by_part["flat_out"]
    assert sat.req_s == pytest.approx(capacity(script, 4), rel=0.25) and "showed no queue" in sat.text()


def server(capacity_rate: float, settles_at: float, completes: float | None = None):
    """measure_at for a server whose short points (60 requests) meet up to ``capacity_rate`` but whose
    longer ones (a queue that settles slowly) meet only up to ``settles_at``; a point completes what it
    is offered, or a longer one at most ``completes`` req/s where that is given (overload)."""
    async def measure_at(rate: float, n: int, until=None):
        fine = rate <= settles_at or (rate <= capacity_rate and n <= 60)
        done = rate if completes is None or n <= 60 else min(rate, completes)
        return metrics_with([50.0 if fine else 50.0 + 400.0 * (i + 1) / n for i in range(n)], span_s=n / done)
    return measure_at


def test_what_a_search_spent_counts_each_request_once_in_the_part_that_judged_it():
    """A short point's requests count with the hold that went on from it; with a hold the client
    lagged through, measured again from the same point, with the last one."""
    def pt(load, n, verdict, held=False, extends=0, misses=()):
        return SearchPoint(load, metrics_with([50.0] * n), verdict, list(misses), [], {}, 0.0,
                           extends=extends, held=held)
    points = [pt(70.0, 200, MISSES, misses=[SATURATION]),
              pt(52.0, 299, MEETS), pt(52.0, 299 + 400, MISSES, held=True, extends=299),  # held, missed
              pt(50.0, 299, MEETS), pt(50.0, 299 + 500, CLIENT_LAGGED, held=True, extends=299),
              pt(50.0, 299 + 1000, MEETS, held=True, extends=299),  # measured again: the answer
              pt(55.0, 120, UNDECIDED)]
    result = SearchResult(points, 299, 0.95, "precision 0.05 reached")
    assert result.requests_by_part == {"flat_out": 200, "short": 120, "held_met": 1299,
                                       "held_not_met": 699 + 500}
    assert sum(result.requests_by_part.values()) == result.requests_sent == 200 + 299 + 400 + 299 + 500 + 1000 + 120


def saturated(req_s: float, queued: bool = True):
    async def saturate():
        return Saturation(req_s, 200, 200, queued), metrics_with([900.0] * 200)
    return saturate


@pytest.mark.parametrize("seed", range(3))
def test_a_search_under_the_flat_out_rate_starts_below_it_and_the_answer_holds_over_a_longer_point(seed):
    top = random.Random(seed).uniform(5.0, 300.0)
    measure_at, calls = counted(server(0.97 * top, 0.8 * top))
    # 7 counted points and 3 extensions: an extension does not count toward max_points (each re-measures
    # a load a counted point met), or this search would end on a short point's answer
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=8, confirm_requests=300, confirm_s=0)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    # no climb from start_rate and no probes: full points from the middle of [figure / growth, figure], none
    # at or past it, and the presumed lower end never measured (the answer is above it)
    assert calls[0] == (pytest.approx(top / math.sqrt(2)), 60) and all(top / 2 < x < top for x, _ in calls), calls
    assert not any(pt.verdict == PROBED for pt in result.points)
    flat = next(pt for pt in result.points if SATURATION in pt.misses)
    assert flat.load == top and flat.verdict == MISSES and result.saturation.req_s == top
    # the answer is a load met over 300 requests, judged as one sample (a point's 60 and 240 more, or 300
    # from its start); short points that met above it were confirmed the same way and missed
    best = result.sustained_point
    assert best.verdict == MEETS and best.metrics.sent == 300 and 0.8 * top / 1.05 <= best.load <= 0.8 * top, calls
    assert best.held and best.metrics.completed == 300 and len(best.metrics.samples["ttft"]) == 300
    assert (best.load, 300 - best.extends) in calls and "the answer held over 300 requests" in result.stopped
    assert any(n == 240 and x > 0.8 * top for x, n in calls), calls  # a short point's meet did not stand
    # below the first confirmation that missed, each point is held (extended, or 300 from its start), one
    # precision step under the lowest load not met: no short point, and every step within 5% of the last
    walk = calls[next(i for i, (_, n) in enumerate(calls) if n != 60):]
    assert all(n != 60 for _, n in walk) and any(n == 300 for _, n in walk), calls
    assert all(1.0 < a / b <= 1.05 + 1e-6 for (a, _), (b, _) in zip(walk, walk[1:])), walk
    assert f"{len(walk) - 1} held rates above it did not meet" in result.stopped
    # what the search spent counts each request once: the confirmations' own, not their points' again
    assert result.requests_sent == sum(n for _, n in calls) + 200
    # and says what they served: every hold is 300 requests (an extension of 240 takes its point's 60 along)
    shorts, extensions, holds = (sum(1 for _, n in calls if n == k) for k in (60, 240, 300))
    assert result.requests_by_part == {"flat_out": 200, "short": 60 * (shorts - extensions), "held_met": 300,
                                       "held_not_met": 300 * (extensions + holds - 1)}, calls
    check = capacity_check(result, SLA, search)
    assert check.evidence["requests_by_part"] == result.requests_by_part
    assert check.status == "pass" and f"of the {top:.4g} req/s it completes flat out" in check.message
    assert check.evidence["saturation"]["applies"] is True
    # the table tells an extension from a point held from its start
    verdicts = [row[-1] for row in check.evidence["table"]["rows"]]
    assert any("held from its start" in v for v in verdicts), verdicts
    assert any("its point's 60 requests and 240 more" in v for v in verdicts), verdicts


@pytest.mark.parametrize("seed", range(2))
def test_the_answer_also_holds_for_confirm_s_of_load_at_its_rate(seed):
    """Where ``confirm_s`` seconds at the answer's rate are more requests than ``confirm_requests``, its
    point goes on for those seconds; a rate met only over short points does not stand."""
    top = random.Random(seed).uniform(50.0, 300.0)
    measure_at, calls = counted(server(0.97 * top, 0.8 * top))
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=8, confirm_requests=300, confirm_s=10.0)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    best, held = result.sustained_point, math.ceil(10.0 * result.sustained)  # its point's own included
    assert best.verdict == MEETS and best.held and best.metrics.sent == held > 300
    assert 0.8 * top / 1.05 <= best.load <= 0.8 * top and (best.load, held - best.extends) in calls, calls
    assert f"the answer held over {held} requests" in result.stopped
    off = CapacitySearch(start_rate=1.0, precision=0.05, max_points=8, confirm_requests=0, confirm_s=0)
    assert asyncio.run(search_capacity(server(0.97 * top, 0.8 * top), off, SLA, 60, lambda _m: None,
                                       saturated(top))).sustained > 0.8 * top  # no confirmation: a short point's


def test_a_held_rate_measured_again_after_the_client_lagged_counts_once():
    top = 100.0
    base, lagged = server(0.97 * top, 0.8 * top), []

    async def measure_at(rate: float, n: int, until=None):
        if n == 300 and not lagged:  # the walk's first point held from its start: the client fell behind
            lagged.append(rate)
            return metrics_with([60.0] * n, lag_ms=2000.0 / rate)  # two arrival gaps late
        return await base(rate, n)
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=8, confirm_requests=300, confirm_s=0)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    at = [pt.verdict for pt in result.points if pt.load == lagged[0]]
    assert at == [CLIENT_LAGGED, UNDECIDED] or at == [CLIENT_LAGGED, MISSES], at  # measured again, then missed
    missed = {pt.load for pt in result.points if pt.held and pt.verdict in (MISSES, UNDECIDED)}
    assert lagged[0] in missed and f"({len(missed)} held rates above it did not meet)" in result.stopped


def test_a_walk_down_cut_short_by_max_points_says_its_answer_was_not_held():
    top = 100.0
    measure_at, calls = counted(server(0.97 * top, 0.5 * top))  # short points overstate by nearly half
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=6, confirm_requests=300, confirm_s=0)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    assert result.stopped.startswith("max_points (6) reached; no rate under the confirmations"), result.stopped
    # a short point met above the held misses' answer-to-be, but short points overstate what holds: no answer
    assert result.sustained_point is None and result.unheld.load > 0.5 * top and not result.unheld.held
    check = capacity_check(result, SLA, search)
    assert check.status == "error" and check.message.startswith(
        f"could not measure: {result.unheld.load:.4g} req/s met over a short point, but max_points (6) reached")


@pytest.mark.parametrize("edge", [62.0, 66.5, 69.5, 72.0])
@pytest.mark.parametrize("share", [0.3, 0.4, 0.5, 0.6])
def test_once_a_hold_missed_the_answer_is_a_held_rate_never_a_short_point_between(edge, share):
    """Short points meet up to 97 req/s, held ones only up to ``edge``, and an overloaded hold completes
    ``share`` of the edge: the walk skips down and bisects back up, leaving short points that met
    between its held answer and the held miss above it. Before, the highest of those was reported
    (70.71 req/s here, never held, over the 68.18 that held)."""
    top = 100.0
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=30, confirm_requests=300, confirm_s=0)
    measure_at, _ = counted(server(0.97 * top, edge, completes=share * edge))
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    best = result.sustained_point
    assert best.held and edge / 1.05 <= best.load <= edge, [(pt.load, pt.verdict, pt.held) for pt in result.points]
    assert capacity_check(result, SLA, search).value == round(best.load, 4)


def test_a_walk_that_would_go_under_the_lowest_load_tried_says_so_and_answers_nothing():
    """An overloaded hold that completed 0.5 req/s puts the walk's next step under the axis' floor
    (1/64 of where the search started): the search ends saying why, and the short points that met
    above are not the answer (before: "no load meets the SLA", and a pass at a short point's 91.7)."""
    top = 100.0
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=30, confirm_requests=300, confirm_s=0)
    result = asyncio.run(search_capacity(server(0.97 * top, 30.0, completes=0.5), search, SLA, 60,
                                         lambda _m: None, saturated(top)))
    assert result.stopped.startswith("the walk down would go under 0.7812 req/s, the lowest load a search tries")
    check = capacity_check(result, SLA, search)
    assert check.status == "error" and "met over a short point" in check.message


def held_rates(calls: list[tuple[float, int]]) -> list[float]:
    return [x for x, n in calls if n != 60]


@pytest.mark.parametrize("seed", range(3))
def test_below_an_overloaded_hold_the_walk_goes_on_three_steps_over_what_it_completed(seed):
    """Short points meet up to 0.97 of the flat-out rate; held, the server completes only ``mu`` a second
    (its edge under 0.65 of it): the first hold, far above, completes under 1 / 1.05 ** 4 of its rate, and the
    walk skips the rates between instead of holding each."""
    rng = random.Random(seed)
    top = rng.uniform(50.0, 300.0)
    edge = rng.uniform(0.45, 0.6) * top
    mu = 1.02 * edge  # a rate just past the edge queues: what it completes is barely above it
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=30, confirm_requests=300, confirm_s=0)
    said: list[str] = []
    measure_at, calls = counted(server(0.97 * top, edge, completes=mu))
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, said.append, saturated(top)))
    held = held_rates(calls)
    # the first hold, far above the edge (its point's 60 at its rate, then 240 at mu), then the skip
    first = next(pt for pt in result.points if pt.held)
    done = first.metrics.request_throughput
    assert first.load == held[0] > 0.85 * top and first.load > 1.05 ** 4 * done
    assert 1.05 ** 3 * done <= held[1] < 1.05 ** 4 * done, (held, done)  # or a short point's within the step
    assert edge / 1.05 <= result.sustained <= edge and result.sustained_point.held, (result.sustained, edge)
    # down from there, never under the answer's precision: each hold completes mu, so the bound stays over it
    assert all(b < a for a, b in zip(held, held[1:])) and min(held) >= edge / 1.05, held
    assert "held completed only" in result.stopped and any("held completed only" in line for line in said)
    # the same server without the overload's signature (every hold completes what it is offered) walks
    # one step at a time from the first hold down: many more held rates
    plain, plain_calls = counted(server(0.97 * top, edge))
    walked = asyncio.run(search_capacity(plain, search, SLA, 60, lambda _m: None, saturated(top)))
    assert len(held_rates(plain_calls)) > len(held) + 3 and "held completed only" not in walked.stopped


def test_a_skip_that_lands_under_the_edge_is_bisected_back_up_to_the_precision():
    """An overloaded hold that completed less than the server sustains (here 0.6 of its edge): the hold
    three steps over it meets, and held points between it and the lowest held miss narrow to the precision."""
    top, edge = 100.0, 60.0
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=16, confirm_requests=300, confirm_s=0)
    measure_at, calls = counted(server(0.97 * top, edge, completes=0.6 * edge))
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    held, first = held_rates(calls), next(pt for pt in result.points if pt.held)
    assert held[1] == pytest.approx(1.05 ** 3 * first.metrics.request_throughput) and held[1] < edge / 1.05, held
    assert edge / 1.05 <= result.sustained <= edge and result.sustained_point.held, (result.sustained, held)
    assert len(held) <= 8, held  # a bisection from there, not a walk up one step at a time


def test_a_hold_that_completed_under_its_rate_by_a_spell_walks_one_step():
    """A hold stopped on a spell has that spell's requests in flight: offered 1.18 times what it completed,
    three precision steps over that (``search.BACKLOG_STEPS``) is above the walk's next step, which
    goes one precision step at a time."""
    top = 100.0
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=12, confirm_requests=300, confirm_s=0)

    def behind(rate: float, n: int, until=None):  # every hold completes 0.85 of its rate
        return server(0.97 * top, 0.6 * top, completes=0.85 * rate)(rate, n, until)
    measure_at, calls = counted(behind)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    held = held_rates(calls)
    assert all(1.0 < a / b <= 1.05 + 1e-6 for a, b in zip(held, held[1:])), held
    assert 0.6 * top / 1.05 <= result.sustained <= 0.6 * top and "completed only" not in result.stopped


def test_overload_is_read_over_a_points_requests_at_least():
    """A hold that stopped after fewer requests than a point has too few to read a completed rate from
    (40 over one second is 40 +- 6 req/s by count alone)."""
    search = CapacitySearch(start_rate=1.0, precision=0.05, confirm_requests=300, confirm_s=0)
    b = _Bracket(axis_of(search), search, 60)
    b.points.append(replace(judge_point(100.0, metrics_with([500.0] * 40, span_s=1.0), SLA), held=True))
    assert b.overloaded() is None
    b.points.append(replace(judge_point(90.0, metrics_with([500.0] * 80, span_s=2.0), SLA), held=True))
    b.points.append(replace(judge_point(80.0, metrics_with([500.0] * 120, span_s=2.0), SLA), held=True))
    skip = b.overloaded()  # the one that completed the least: 40 req/s offered 90
    assert (skip.load, skip.completed, skip.to) == (90.0, pytest.approx(40.0), pytest.approx(40.0 * 1.05 ** 3))
    met = replace(judge_point(70.0, metrics_with([50.0] * 120, span_s=2.0), SLA), held=True)  # not a miss: no skip
    assert met.verdict == MEETS and _Bracket(axis_of(search), search, 60, points=[met]).overloaded() is None


def test_a_hold_is_never_shorter_than_a_full_point():
    """With confirm_requests off and a rate under 299 / 30 s, a hold from its start got fewer requests
    than bound a p99, and the walk down stopped there undecided."""
    search = CapacitySearch(start_rate=1.0, precision=0.05, confirm_requests=0, confirm_s=30)
    b = _Bracket(axis_of(search), search, 299, confirm=0, hold_s=30.0)
    assert b.confirm_at(5.0) == 299  # 30 s at 5 req/s is 150
    assert b.confirm_at(20.0) == 600  # the hold's own length where it is the longer


@pytest.mark.parametrize("share", [0.2, 0.45])
def test_an_answer_under_the_presumed_lower_end_is_found_below_it(share):
    top = 100.0
    measure_at, calls = counted(server(share * top, share * top))
    search = CapacitySearch(start_rate=1.0, precision=0.05, max_points=20, confirm_requests=300, confirm_s=0)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(top)))
    # the bisection came down to the presumed end, measured it in full (it missed) and went below it
    assert (pytest.approx(top / 2), 60) in calls and result.ceiling.load <= top / 2
    assert share * top / 1.05 <= result.sustained <= share * top, calls
    assert result.sustained_point.metrics.sent == 300


def test_a_figure_that_does_not_apply_leaves_the_climb_and_its_queue_rule_as_they_were():
    measure_at, calls = counted(server(40.0, 40.0))
    search = CapacitySearch(start_rate=2.0, precision=0.05, max_points=30)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 60, lambda _m: None, saturated(44.0, queued=False)))
    assert calls[0] == (2.0, 32) and result.points[0].verdict == PROBED  # the climb's probes, as without one
    assert not any(SATURATION in pt.misses for pt in result.points) and 40.0 / 1.05 <= result.sustained <= 40.0
    assert all(n != 300 for _, n in calls)  # no confirmation without the figure
    assert "not used" in capacity_check(result, SLA, search).message
    # its 200 requests were sent all the same, and are counted as the flat-out run's
    assert result.requests_sent == sum(n for _, n in calls) + 200
    assert result.requests_by_part == {"flat_out": 200, "short": sum(n for _, n in calls), "held_met": 0,
                                       "held_not_met": 0}


def test_with_the_figure_a_rising_ttft_within_the_limit_is_no_miss():
    """The queue rule fired on short points of stable loads (docs/stages/capacity-evidence.md); with the flat-out
    rate bounding the search a point is judged by its limits alone."""
    rising = metrics_with([10.0] * 15 + [60.0] * 15 + [80.0] * 15 + [90.0] * 15)  # 10 -> 90 ms, under 100
    assert judge_point(20.0, rising, SLA).misses == ["queue_growth"]
    assert judge_point(20.0, rising, SLA, queue=False).verdict == MEETS


def test_the_stage_bounds_a_scripted_servers_search_by_its_flat_out_rate():
    # 2 slots (waiting requests show on its /metrics as vLLM's num_requests_waiting), 4 tokens a request:
    # R* = 2 / service time, 31-43 req/s, and past it the queue grows without bound
    gap = random.Random().uniform(12.0, 20.0)
    script = Script(ttft_ms=[10.0], gaps_ms=[gap], slots=2)
    service_ms = schedule(script, 0, 4)[-1][0] * 1000.0
    settings = LatencySection(num_requests=4, warmup_requests=0, input_len=8, output_len=4, workers=1,
                              burstiness=100.0, search=CapacitySearch(precision=0.03, max_points=16, requests=60,
                                                                      saturation_requests=120, confirm_requests=0,
                                                                      confirm_s=4.0))
    sla = SlaSection.from_table({"ttft_p90_ms": 2.5 * service_ms})
    for _attempt in range(3):  # a busy host's stall can make one point miss: the search is run again, at most twice
        with SSEServer(script) as srv:
            run = run_latency(srv.url, "scripted", 300, settings, sla)
            r_star = served_capacity(script, [e for e in srv.log() if e["phase"] == "search"])
        if run.search.sustained and abs(run.search.sustained / r_star - 1) <= 0.08:
            break
    sat = run.search.saturation
    check = next(c for c in latency_checks(run) if c.id == CHECK_ID)
    assert sat is not None and sat.applies, sat
    # the burst kept both slots busy: what it completed is the capacity (a busy host lowers both alike)
    assert sat.req_s == pytest.approx(r_star, rel=0.1), (sat, r_star, capacity(script, 4))
    assert check.status == "pass" and r_star * 0.92 <= check.value <= r_star * 1.05, (r_star, check.message)
    assert run.search.points[1].load == pytest.approx(sat.req_s / math.sqrt(2))  # after the flat-out point
    assert min(pt.load for pt in run.search.points) > sat.req_s / 2  # the presumed lower end, not measured
    # the answer was judged over 4 s of load at its rate, its point's own included, as one sample
    best = run.search.sustained_point
    assert best.held and best.metrics.sent == math.ceil(4.0 * best.load) > 60 and "flat out" in check.message


def test_the_load_generator_measures_how_long_its_own_loop_stalled():
    from day0.client.loadgen import LoopWatch

    block: list[float] = []
    inside: list[float] = []

    async def blocked() -> LoopWatch:
        async with LoopWatch() as watch:
            await asyncio.sleep(0.02)
            block.append(time.perf_counter())
            time.sleep(0.15)  # a host that does not run the client (or a blocking call) for 150 ms
            block.append(time.perf_counter())
            # asked before the watch has woken: the stall that has not ended for it yet counts already
            inside.append(watch.stalled_through(block[0] - 1.0, block[1]))
            await asyncio.sleep(0.02)
        return watch
    began = time.perf_counter()
    watch = asyncio.run(blocked())
    whole_ms = (time.perf_counter() - began) * 1000.0  # no stall inside the run can be longer than it
    assert watch.longest_ms is not None and 140.0 <= watch.longest_ms <= whole_ms, (watch.longest_ms, whole_ms)
    # the stall as a span, which a request in flight through it has taken out of its figures
    assert any(a <= block[0] + 0.01 and b >= block[1] for a, b in watch.spans), (watch.spans, block)
    assert inside[0] >= 0.14
    assert watch.stalled_through(block[0] - 1.0, block[1] + 1.0) >= 0.14
    assert watch.stalled_through(block[1] + 0.5, block[1] + 1.0) == 0.0
    # a request stamped as it ends: its TTFT window (scheduled to first token) held the stall, its own
    r = RequestResult(0, "search", block[0] - 0.01, block[0] - 0.01, 8, 4)
    r.msg_t, r.msg_n, r.ok = [0.3, 0.4], [1, 3], True
    watch.stamp(r)
    assert 0.14 <= r.stalled_to_first <= r.stalled_to_last < 0.3


def stalled(ttfts_ms: list[float], stall_ms: float, failed: int = 0, at: float = 103.0):
    """metrics_with, the client's loop stalled ``stall_ms`` from ``at`` (the last requests of 299,
    scheduled 102.9-102.98 s, are in flight then)."""
    return metrics_with(ttfts_ms, failed=failed, stalls=[(at, at + stall_ms / 1000.0)])


def test_a_point_the_client_stalled_through_cannot_miss_on_latency_and_is_measured_again():
    # 300 ms TTFT limit: a stall over 50 ms (the floor; a tenth of the limit is 30) that could explain
    # the values past the limit turns a latency miss into "could not measure"; a meet stands
    limit = SlaSection.from_table({"ttft_p99_ms": 300.0})
    slow = [50.0] * 290 + [400.0] * 9  # the last nine in flight at 103.0 s
    assert judge_point(30.0, stalled(slow, 45.0), limit).verdict == MISSES  # under the tolerance: the server's
    wide, slower = SlaSection.from_table({"ttft_p99_ms": 600.0}), [50.0] * 290 + [700.0] * 9  # a tenth: 60 ms
    assert judge_point(30.0, stalled(slower, 55.0), wide).verdict == MISSES
    assert judge_point(30.0, stalled(slower, 250.0), wide).verdict == CLIENT_LAGGED
    lagged = judge_point(30.0, stalled(slow, 262.0), limit)
    assert lagged.verdict == CLIENT_LAGGED and lagged.metrics.loop_stall_ms == pytest.approx(262.0)
    assert "stalled 262 ms" in lag_text(lagged)
    # a stall over the tolerance that cannot explain them: 65 ms does not take 700 ms under 600, and one
    # before the slow requests were sent touches none of them; the server's misses stand
    assert judge_point(30.0, stalled(slower, 65.0), wide).verdict == MISSES
    assert judge_point(30.0, stalled(slow, 262.0, at=100.5), limit).verdict == MISSES
    # where a stall explains some of the values past the limit, what the rest show stands: 9 past 300 ms,
    # sent 100 ms apart from 100.1 s; a 620 ms stall from 100.0 s takes 100-400 ms off the first five
    # (under the limit) and 20 ms off the sixth; 4 stay past it (undecided: the upper bound is past, the lower not)
    spread = [400.0 if i % 10 == 0 and 10 <= i <= 90 else 50.0 for i in range(299)]
    part = judge_point(30.0, stalled(spread, 620.0, at=100.0), limit)
    assert part.verdict == UNDECIDED and part.undecided == ["ttft_p99"]
    assert sum(v > 300.0 for v in part.metrics.samples["ttft_without_stalls"]) == 4
    assert judge_point(30.0, stalled([50.0] * 299, 262.0), limit).verdict == MEETS
    assert judge_point(30.0, stalled([50.0] * 299, 262.0, failed=5), limit).misses == ["error_rate"]

    # the search measures a stalled point once more; a second stall at the same load ends it, an error
    stalls = {30.0: [262.0]}

    async def measure_at(rate: float, n: int, until=None):
        stall = stalls[rate].pop(0) if stalls.get(rate) else 0.0
        return stalled(slow if stall or rate > 30.0 else [50.0] * n, stall)  # the stall put 9 past the limit
    measure, calls = counted(measure_at)
    search = CapacitySearch(start_rate=30.0, precision=0.05, probe_requests=0)
    result = asyncio.run(search_capacity(measure, search, limit, 299, lambda _m: None))
    assert calls[:2] == [(30.0, 299), (30.0, 299)] and result.points[0].verdict == CLIENT_LAGGED
    assert 30.0 <= result.sustained < 30.0 * 1.06 and "precision" in result.stopped
    stalls[30.0] = [262.0, 300.0]
    result = asyncio.run(search_capacity(measure_at, search, limit, 299, lambda _m: None))
    check = capacity_check(result, limit, search)
    assert check.status == "error" and "stalled 300 ms" in check.message and "twice at 30 req/s" in check.message


def decoding(slow: int, stall_ms: float):
    """299 requests 10 ms apart from 100 s, first token 50 ms after their scheduled time, then 31 more
    tokens at 10 ms each (TPOT 10 ms), the last ``slow`` at 45 ms each (TPOT 45 ms; 8 of them are in
    flight from 102.91 s to past 104.3 s); the client's loop stalled ``stall_ms`` from 103.0 s, through
    all of the slow ones."""
    from day0.stages.latency.metrics import compute_metrics

    results = []
    for i in range(299):
        scheduled, tpot = 100.0 + 0.01 * i, 0.045 if i >= 299 - slow else 0.010
        r = RequestResult(i, "search", scheduled, scheduled, 128, 32)
        r.msg_t, r.msg_n, r.output_tokens, r.ok = [0.05, 0.05 + 31 * tpot], [1, 31], 32, True
        r.finished = scheduled + r.msg_t[-1]
        results.append(r)
    stamp(results, [(103.0, 103.0 + stall_ms / 1000.0)])
    return compute_metrics(PhaseResult("search", LoadShape(), results, 100.0, 103.0, loop_stall_ms=stall_ms),
                           [50, 90, 99])


def test_a_stall_excuses_a_tpot_past_the_limit_only_where_it_could_have_caused_it():
    """A stall delays the last token's read by at most the time the request was in flight through it,
    so a TPOT moves by at most that over the request's tokens less one. 8 of 299 TPOTs at 45 ms against
    a 40 ms limit (the p99's lower bound past it): a 55 ms stall (over the 50 ms tolerance) takes 1.8 ms
    off each and they stand, a miss of the server's (a 30 s hold in bench_capacity run ad was measured
    again in full over such a stall); a 310 ms stall takes 10 ms off each and they are the client's."""
    limits = SlaSection.from_table({"ttft_p99_ms": 300.0, "tpot_p99_ms": 40.0})
    m = decoding(8, 55.0)
    assert m.samples["tpot_without_stalls"][-8:] == pytest.approx([45.0 - 55.0 / 31] * 8)
    assert m.samples["tpot_without_stalls"][0] == pytest.approx(10.0)  # done before the stall
    point = judge_point(30.0, m, limits)
    assert point.verdict == MISSES and point.misses == ["tpot_p99"]
    assert judge_point(30.0, decoding(8, 310.0), limits).verdict == CLIENT_LAGGED
    assert judge_point(30.0, decoding(8, 20.0), limits).verdict == MISSES  # under the tolerance: as measured
    assert judge_point(30.0, decoding(0, 310.0), limits).verdict == MEETS


def test_a_flat_out_run_that_fails_leaves_no_metrics_watcher_running():
    from day0.client.stream import ClientOptions, make_session
    from day0.stages.latency.saturation import measure_saturation

    async def broken(shape: LoadShape) -> PhaseResult:
        await asyncio.sleep(0.05)  # the watcher has polled by now
        raise RuntimeError("the phase broke")

    async def go(url: str) -> set:
        async with make_session(ClientOptions()) as session:
            with pytest.raises(RuntimeError, match="the phase broke"):
                await measure_saturation(broken, session, url, 10, 0, 0)
            return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}

    with SSEServer(Script(ttft_ms=[10.0], gaps_ms=[5.0], slots=2)) as srv:
        assert asyncio.run(go(srv.url)) == set()


def test_the_slot_servers_first_token_histogram_counts_the_wait_for_a_slot():
    """vLLM's TTFT histogram runs from a request's arrival, its wait in the queue included; the
    scripted slot server's must mean the same, or a comparison with /metrics (bench_capacity asks
    the server how many first tokens were past the limit) sees no queue at all. One slot, two
    requests at once: the second waits ~110 ms for the first (10 ms + 2 gaps of 50 ms)."""
    import json
    import threading
    import urllib.request

    from day0.client.prom import parse_histograms, scrape_sync

    def ask(url: str) -> None:
        body = json.dumps({"model": "scripted", "prompt": "x", "max_tokens": 3, "stream": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    with SSEServer(Script(ttft_ms=[10.0], gaps_ms=[50.0], slots=1)) as srv:
        threads = [threading.Thread(target=ask, args=(srv.url,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        h = parse_histograms(scrape_sync(srv.url))["vllm:time_to_first_token_seconds"]
    assert h.count == 2
    # without the wait: ~0.02 s in all; with it, the second request's first token alone is past 0.11 s
    assert h.sum > 0.1


def test_the_slot_servers_drift_stretches_each_window_as_scripted():
    """A drifting slot server serves its first window at the scripted pace and later ones
    ``drift`` times slower: the moving edge bench_capacity's ``--scripted-drift`` measures tools on.
    (A request's window is logged; its time is bounded from below only, as a busy host's sleeps
    overshoot and never undershoot.)"""
    import json
    import urllib.request

    def ask(url: str) -> None:
        body = json.dumps({"model": "scripted", "prompt": "x", "max_tokens": 3, "stream": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    script = Script(ttft_ms=[10.0], gaps_ms=[40.0], slots=1, drift=[1.0] + [3.0] * 40, drift_period_s=0.5)
    with SSEServer(script) as srv:
        t0 = time.perf_counter()
        ask(srv.url)
        time.sleep(max(0.0, 0.6 - (time.perf_counter() - t0)))
        ask(srv.url)
        served = [e for e in srv.log() if "held_s" in e]
    assert [e["stretch"] for e in served] == [1.0, 3.0]
    assert served[1]["held_s"] >= 0.27  # 3 x (10 ms + 2 gaps of 40 ms)


def test_the_slot_servers_long_run_truth_is_a_queues():
    """The long-run figures bench_capacity prints as the truth a tool's short points estimate: an
    M/D/1 queue at load rho leaves 1 - rho of its requests unqueued (their TTFT is the script's
    own), and a drift that slows some windows lowers the edge below the steady one, both below
    the scripted capacity."""
    from tests.support.sse_server import capacity, queue_edge, queue_percentile

    one = Script(ttft_ms=[10.0], gaps_ms=[40.0], slots=1)  # 90 ms a request of 3 tokens
    rho_half = 0.5 / 0.090
    assert queue_percentile(one, rho_half, 3, p=40.0, n=20_000) == pytest.approx(0.010)
    assert queue_percentile(one, rho_half, 3, p=99.0, n=20_000) > 0.1
    steady = Script(ttft_ms=[10.0], gaps_ms=[5.0], slots=8)
    moving = Script(ttft_ms=[10.0], gaps_ms=[5.0], slots=8, drift=[1.0, 1.25], drift_period_s=5.0)
    edge, moved = queue_edge(steady, 0.3, 32), queue_edge(moving, 0.3, 32)
    assert moved < edge < capacity(steady, 32)
