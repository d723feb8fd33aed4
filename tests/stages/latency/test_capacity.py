"""The capacity answer (``day0.stages.latency.capacity``): per replica, margin, replicas, the
Pareto view, and the cost stage pricing the sustained load (``day0.stages.risks.cost``)."""

from __future__ import annotations

import asyncio

import pytest

from day0.config.latency import CapacitySearch, SlaSection
from day0.config.risks import CostSettings
from day0.results import summary
from day0.results.report import summary_lines
from day0.stages.latency.capacity import capacity_check, margins
from day0.stages.latency.measurement import MEETS
from day0.stages.latency.search import search_capacity
from day0.stages.risks.cost import Throughput, priced_checks, sustained_throughput
from tests.stages.latency.test_search import modelled
from tests.support import run_factory as rf

SLA = SlaSection.from_table({"ttft_p90_ms": 100.0, "tpot_p90_ms": 50.0})


def searched(capacity_rate: float, target: float | None = None):
    measure_at, _ = modelled(capacity_rate)
    search = CapacitySearch(start_rate=2.0, precision=0.05, target_rate=target)
    return asyncio.run(search_capacity(measure_at, search, SLA, 32, lambda _m: None)), search


def test_the_answer_names_rate_per_replica_throughput_per_device_margin_and_replicas():
    result, search = searched(12.0, target=100.0)
    check = capacity_check(result, SLA, search, devices=4)
    best = next(pt for pt in result.points if pt.load == result.sustained)
    # metrics_with: TTFT 50 ms at or under capacity (limit 100: upper bound 50, margin 50%), TPOT 3.33 ms
    tight = margins(best, SLA)
    assert [m.key for m in tight] == ["ttft_p90", "tpot_p90"] and tight[0].share == pytest.approx(0.5)
    told = check.evidence["answer"]
    assert told.startswith(f"{result.sustained:.4g} req/s per replica ({best.metrics.output_throughput / 4:.4g} "
                           "output tok/s per device, 4 device(s))")
    assert "margin 50% on ttft_p90 (50 of 100 ms, upper bound)" in told
    assert f"{-(-100 // result.sustained):.0f} replicas for 100 req/s" in told and told in check.message
    assert check.evidence["sustained"]["output_tok_s"] == pytest.approx(best.metrics.output_throughput, rel=1e-3)


def test_the_pareto_view_has_every_point_by_rate_and_marks_the_sla():
    result, search = searched(12.0)
    ev = capacity_check(result, SLA, search, devices=2).evidence
    rows = ev["pareto"]
    points = sorted(result.points, key=lambda pt: pt.load)
    assert [r["offered"] for r in rows] == pytest.approx([pt.load for pt in points], rel=1e-4)
    for r, pt in zip(rows, points):
        assert r["output_tok_s_per_device"] == pytest.approx(pt.metrics.output_throughput / 2, rel=1e-3)
        assert r["tok_s_per_user"] == pytest.approx(1000.0 / pt.metrics.stats["tpot"].mean, rel=1e-3)
    chart = next(c for c in ev["charts"] if c["kind"] == "scatter")
    met = next(s for s in chart["series"] if s["name"] == "meets the SLA")
    assert len(met["x"]) == sum(1 for pt in result.points if pt.verdict == MEETS)
    assert chart["reference"] == [{"y": 20.0, "label": "tpot p90 limit 50 ms"}]  # 1000 / 50 ms


def test_no_answer_without_a_met_point():
    result, search = searched(1e-9)
    check = capacity_check(result, SLA, search)
    assert check.status == "fail" and check.evidence["answer"] == "" and "sustained" not in check.evidence
    assert sustained_throughput([check]) is None


def test_cost_is_judged_at_the_sustained_load_and_the_stage_load_is_kept_beside_it():
    result, search = searched(12.0)
    check = capacity_check(result, SLA, search)
    check.stage = "latency"
    sustained = sustained_throughput([check])
    assert sustained is not None and sustained.tok_s == pytest.approx(check.evidence["sustained"]["output_tok_s"])
    stage_load = Throughput(sustained.tok_s / 4, "stage latency: latency.output_throughput", {})
    settings = CostSettings(price_per_device_hour=2.0, max_per_million_output_tokens=1e9)
    checks = {c.id: c for c in priced_checks(stage_load, sustained, settings, 1, 1)}
    judged = checks["risks.cost.per_million_output_tokens"]
    kept = checks["risks.cost.per_million_output_tokens.latency_load"]
    assert judged.limit == 1e9 and kept.limit is None
    assert kept.value == pytest.approx(4 * judged.value, rel=1e-3)  # a quarter of the throughput, 4x the cost
    assert judged.evidence["load"].startswith(f"priced at the sustained load, {result.sustained:.4g}"[:36])
    # without a search: judged at the stage's load, no second figure
    alone = priced_checks(stage_load, None, settings, 1, 1)
    assert [c.id for c in alone] == ["risks.cost.per_million_output_tokens", "risks.cost.per_hour"]
    assert alone[0].evidence["load"] == "priced at the latency stage's load"


def test_the_answer_is_on_the_first_screen_and_under_the_terminal_table():
    result, search = searched(12.0, target=100.0)
    check = capacity_check(result, SLA, search)
    record = rf.make_record({"latency": [check]})
    head = next(h for h in summary.summarize(record).headlines if h.key == "capacity")
    assert head.answer == check.evidence["answer"] and head.answer in head.note
    lines = summary_lines(record, {})
    assert f"Capacity (req/s meeting the SLA): {check.evidence['answer']}" in lines
