"""The capacity search over closed-loop concurrency (``[latency.search] over = "concurrency"``):
whole requests in flight, integer steps, the answer in concurrency with the req/s it achieved."""

from __future__ import annotations

import asyncio
import random

import pytest

from day0.config.latency import CapacitySearch, LatencySection, SlaSection
from day0.stages.latency import latency_checks, run_latency
from day0.stages.latency.capacity import CHECK_ID, capacity_check
from day0.stages.latency.measurement import CLIENT_LAGGED, MEETS, MISSES, PROBED, UNDECIDED
from day0.stages.latency.search import search_capacity
from tests.stages.latency.test_search import metrics_with
from tests.support.sse_server import Script, SSEServer, schedule

SLA = SlaSection.from_table({"ttft_p90_ms": 100.0})


@pytest.mark.parametrize("seed", range(5))
def test_integer_bracketing_and_bisection_find_a_known_concurrency(seed):
    c_star = random.Random(seed).randint(1, 200)
    asked = []

    async def measure_at(x: float, n: int, until=None):
        asked.append(x)
        assert x == int(x) and x >= 1  # whole requests in flight
        return metrics_with([50.0 if x <= c_star else 50.0 + 400.0 * (i + 1) / n for i in range(n)])

    search = CapacitySearch(over="concurrency", start_concurrency=4, precision=0.01, max_points=30,
                            target_rate=1000.0)
    result = asyncio.run(search_capacity(measure_at, search, SLA, 32, lambda _m: None))
    assert result.sustained == c_star and result.first_miss.load == c_star + 1, (c_star, asked)
    assert result.axis == "concurrency" and result.unit == "concurrent requests"
    check = capacity_check(result, SLA, search)
    assert check.status == "pass" and check.value == c_star and check.unit == "concurrent requests"
    best = next(pt for pt in result.points if pt.load == c_star)
    told = check.evidence["answer"]
    # replicas from the req/s the sustained concurrency achieved, not from the concurrency itself
    achieved = best.metrics.request_throughput
    assert told.startswith(f"concurrency {c_star} per replica ({achieved:.4g} req/s, ")
    assert f"{-(-1000 // achieved):.0f} replicas for 1000 req/s" in told


def test_the_stage_finds_the_concurrency_of_a_scripted_server():
    # 2 slots: up to 2 in flight nobody waits; a third waits a whole service time S for a slot,
    # past a TTFT limit of S / 2, for a third of the requests (p90's lower bound is past it). S is
    # 150 ms, so a busy box has 75 ms of scheduling noise to spend before a met point could miss.
    script = Script(ttft_ms=[30.0], gaps_ms=[40.0], slots=2)
    service_ms = schedule(script, 0, 4)[-1][0] * 1000.0
    settings = LatencySection(num_requests=4, warmup_requests=0, input_len=8, output_len=4, workers=1,
                              server_metrics=False,
                              search=CapacitySearch(over="concurrency", start_concurrency=1, requests=40))
    sla = SlaSection.from_table({"ttft_p90_ms": 30.0 + service_ms / 2})
    with SSEServer(script) as srv:
        run = run_latency(srv.url, "scripted", 300, settings, sla)
        loops = {e["phase"] for e in srv.log()}
    check = next(c for c in latency_checks(run) if c.id == CHECK_ID)
    assert check.status == "pass" and check.value == 2, (check.message, check.evidence["table"]["rows"])
    # the climb is probes (32 requests) up to the first miss; the answer, 2, is then measured in full.
    # A point the busy host stalled the client through is measured again at once (client_lagged, then
    # the same load): the path is the same without those
    points = run.search.points
    assert all(b.load == a.load for a, b in zip(points, points[1:]) if a.verdict == CLIENT_LAGGED)
    # over 2 a full point stops once it cannot meet (its first slow request): a miss when enough slow
    # ones were already in flight to prove it, else undecided; either bounds the bracket from above
    assert [(pt.load, pt.verdict if pt.load <= 2 else "not met") for pt in points if pt.verdict != CLIENT_LAGGED] == [
        (1, PROBED), (2, PROBED), (4, "not met"), (3, "not met"), (2, MEETS)]
    assert all(pt.verdict in (MISSES, UNDECIDED) and pt.early for pt in points if pt.load > 2)
    assert run.search.ceiling is not None and run.search.ceiling.load == 3
    assert "search" in loops
