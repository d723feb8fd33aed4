"""Late requests spell by spell (``day0.stages.latency.spells``): values past a limit grouped by their
scheduled times, each beside the arrivals the schedule offered before it, and carried by a search
point into its row, its record and the capacity check's message."""

from __future__ import annotations

import asyncio
import json

import pytest

from day0.config.latency import CapacitySearch, LatencySection, SlaSection
from day0.stages.latency import latency_checks
from day0.stages.latency.capacity import capacity_check, why_not_met
from day0.stages.latency.judging import judge_point
from day0.stages.latency.measurement import MISSES
from day0.stages.latency.search import search_capacity
from day0.stages.latency.spells import LateSpells, Spell, late_spells, late_text
from day0.stages.latency.sweep import run_sweep
from tests.stages.latency.test_search import metrics_with, modelled
from tests.stages.latency.test_stats import by_id, result, run_of


def even(rate: float, seconds: float) -> list[float]:
    return [i / rate for i in range(int(rate * seconds))]


def test_late_values_after_a_burst_are_one_spell_and_a_lone_one_another():
    # 10 req/s for 10 s, plus 10 more arrivals crowded into 4.0-4.18 s; the requests from 5.0 to 5.3 s
    # run late (the queue the burst built), and one request at 8 s alone
    offsets = sorted(even(10.0, 10.0) + [4.0 + 0.02 * i for i in range(10)])
    values = [400.0 if 5.0 <= t <= 5.3 or t == 8.0 else 50.0 for t in offsets]
    burst, lone = late_spells(offsets, values, 300.0, 10.0)
    assert (burst.start_s, burst.end_s, burst.late, burst.worst_ms) == (5.0, 5.3, 4, 400.0)
    # the second before 5.0 s offered its 10 and the burst's 10: twice the rate, more than in any other
    # second of the point but those that hold the burst too (ties half)
    assert (burst.lead, burst.ratio) == (20, 2.0) and burst.busier > 0.8
    assert (lone.start_s, lone.late, lone.lead, lone.ratio) == (8.0, 1, 10, 1.0) and lone.busier < 0.5
    assert "the second before offered 2x the rate, busier than" in burst.text()


def test_a_spell_in_the_points_first_second_has_no_second_before_it():
    offsets = even(10.0, 5.0)
    [first] = late_spells(offsets, [400.0 if t < 0.5 else 50.0 for t in offsets], 300.0, 10.0)
    assert (first.start_s, first.late, first.lead, first.ratio, first.busier) == (0.0, 5, None, None, None)
    assert "second before" not in first.text()


def test_spells_join_within_a_second_or_the_limit_and_say_nothing_of_a_rate_they_do_not_have():
    offsets = [0.0, 1.0, 1.9, 3.0, 6.0]
    values = [100.0, 500.0, 500.0, 500.0, 500.0]
    assert [(s.start_s, s.late) for s in late_spells(offsets, values, 300.0, None)] == [(1.0, 2), (3.0, 1), (6.0, 1)]
    # a 2 s limit: values that late come from a queue that lasts seconds, so they join within 2 s
    assert [(s.start_s, s.late) for s in late_spells(offsets, [v * 10 for v in values], 2000.0, None)] == \
        [(1.0, 3), (6.0, 1)]
    # a closed loop has no schedule: no arrival ratio, and the text does not invent one
    spell = late_spells(offsets, values, 300.0, None)[0]
    assert spell.ratio is None and spell.busier is None and "second before" not in spell.text()
    assert late_spells(offsets, [100.0] * 5, 300.0, 4.0) == []


def test_scheduled_times_must_pair_with_the_values():
    with pytest.raises(ValueError, match="3 scheduled times for 2 values"):
        late_spells([0.0, 1.0, 2.0], [1.0, 2.0], 300.0, 1.0)


def test_a_limits_text_names_the_largest_spells_in_time_order():
    spells = [Spell(float(t), float(t), n, 350.0, 10, 1.0, 0.5) for t, n in ((1, 1), (2, 5), (3, 2), (4, 7), (5, 3))]
    text = LateSpells("ttft_p99", 300.0, spells).text()
    assert text.startswith("ttft_p99: 18 values past 300 ms in 5 spells; the largest 3: 5 at 2.0 s")
    assert text.index("7 at 4.0 s") < text.index("3 at 5.0 s") and "1 at 1.0 s" not in text
    one = LateSpells("ttft_p99", 300.0, [Spell(5.51, 5.71, 6, 374.0, 60, 1.42, 0.973)]).text()
    assert one == ("ttft_p99: 6 values past 300 ms in one spell, 6 at 5.5-5.7 s (up to 374 ms; the second before "
                   "offered 1.4x the rate, busier than 97% of the point's seconds)")
    assert late_text([LateSpells("ttft_p99", 300.0, [])]) == ""


def test_a_point_that_misses_carries_its_spells_into_its_row():
    sla = SlaSection.from_table({"ttft_p90_ms": 100.0})
    # 60 requests at 10 req/s; 15 in a row from 3.0 s run late: p90 misses, in one spell
    offsets = even(10.0, 6.0)
    ttfts = [250.0 if 3.0 <= t < 4.45 else 40.0 for t in offsets]
    point = judge_point(10.0, metrics_with(ttfts, offsets=offsets), sla, gap_ms=100.0)
    assert point.verdict == MISSES and point.misses == ["ttft_p90"]
    [late] = point.late
    assert (late.key, late.limit_ms, [(s.start_s, s.late) for s in late.spells]) == ("ttft_p90", 100.0, [(3.0, 15)])
    assert why_not_met(point).startswith("ttft_p90 (ttft_p90: 15 values past 100 ms in one spell, 15 at 3.0-4.4 s")
    # a closed loop's point (no arrival gap): the same spell, no arrival ratio
    closed = judge_point(10.0, metrics_with(ttfts, offsets=offsets), sla)
    assert closed.late[0].spells[0].ratio is None
    # a point that met has nothing late to show
    assert judge_point(10.0, metrics_with([40.0] * 60, offsets=offsets), sla, gap_ms=100.0).late == []


def test_the_capacity_check_names_the_top_misses_spells_and_the_record_keeps_every_points():
    sla = SlaSection.from_table({"ttft_p90_ms": 100.0})
    measure_at, _ = modelled(12.0)
    search = CapacitySearch(start_rate=2.0, precision=0.05)
    result = asyncio.run(search_capacity(measure_at, search, sla, 32, lambda _m: None))
    check = capacity_check(result, sla, search)
    top = result.ceiling
    told = check.message.split(f"; {top.load:.4g} req/s misses ", 1)[1]
    assert told.startswith("ttft_p90") and f"(ttft_p90: {top.late[0].late} values past 100 ms in one spell, " in told
    late = json.loads(json.dumps(check.evidence["late"]))  # the run record keeps it as JSON
    missed = [pt for pt in result.points if pt.verdict == MISSES]
    assert len(late) == len(missed) > 0 and all(row["offered"] > result.sustained for row in late)
    assert all(row["limit"] == "ttft_p90" and sum(s["late"] for s in row["spells"]) > 0 for row in late)


def test_a_sweep_step_that_misses_says_its_spells_in_the_sweep_check():
    sla = SlaSection.from_table({"ttft_p90_ms": 100.0})
    offsets = even(10.0, 6.0)

    async def measure_at(rate, n):
        return metrics_with([250.0 if 3.0 <= t < 4.45 else 40.0 for t in offsets], offsets=offsets)

    settings = LatencySection(sweep_rates=[10.0], sweep_requests=60)
    [step] = asyncio.run(run_sweep(measure_at, settings, sla, lambda _m: None))
    assert not step.meets_sla and [(s.start_s, s.late) for s in step.late[0].spells] == [(3.0, 15)]
    check = by_id(latency_checks(run_of([result(0, [0.01, 0.02], [1, 1])], sla, sweep=[step])))["latency.sla_sweep"]
    assert "10 req/s does not meet it (ttft_p90; ttft_p90: 15 values past 100 ms in one spell, 15 at 3.0-4.4 s" \
        in check.message
    assert check.evidence["table"]["rows"][0][-1].startswith("misses: ttft_p90; ttft_p90: 15 values past 100 ms")
