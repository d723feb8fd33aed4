"""The signer's first screen as data (day0.results.summary), without a browser: the verdict line,
stage 0's answer, the headline figures against their limits, what was not verified, and trends."""

from __future__ import annotations

import pytest

from day0.core.record import Check, RunRecord, measured, run_verdict
from day0.results import summary as S
from day0.results import trends
from tests.support import run_factory as rf


def plan_check(verdict: str = "fits_one_node", tp: int = 2, pp: int = 1, smallest=(2, 1, "fits_one_node")) -> Check:
    plan = {"verdict": verdict, "tp": tp, "pp": pp, "nodes": 1, "smallest_tp": smallest[0],
            "smallest_pp": smallest[1], "smallest_verdict": smallest[2]}
    return Check(id="preflight.plan.verdict", title="plan", status="pass", value=verdict, direction="exact",
                 message=f"{verdict}: TP={tp} x PP={pp}", evidence={"plan": plan})


def busbw(op: str, value: float, expected: float, status: str = "pass") -> Check:
    # a pass line of half the expected busbw, so the statuses these records carry follow from their figures
    # (a record re-judges every status when it is loaded: docs/record.md)
    c = measured(f"collectives.{op}.busbw", f"{op} busbw", value, 0.5 * expected, unit="GB/s",
                 direction="higher_is_better", evidence={"expected_gbps": expected})
    c.status = status
    return c


def skipped(cid: str, why: str) -> Check:
    return Check(id=cid, title=cid, status="skip", message=why)


def full_record(ttft: float = 150.0, run_id: str = "run-full", required=()) -> RunRecord:
    stages = {
        "preflight": [plan_check()],
        "weights": [*rf.weights_checks(), skipped("weights.manifest", "no day0-manifest.json")],
        "collectives": [busbw("all_reduce", 300.0, 370.0), busbw("all_gather", 200.0, 370.0),
                        busbw("broadcast", 250.0, 200.0), skipped("collectives.transport.inter_node", "one node")],
        "latency": [measured("latency.ttft_p99", "TTFT p99", ttft, 2000.0, unit="ms", direction="lower_is_better"),
                    measured("latency.ttft_p99", "TTFT p99", ttft * 2, 2000.0, unit="ms", direction="lower_is_better"),  # a repeat
                    measured("latency.tpot_p99", "TPOT p99", 25.0, 200.0, unit="ms", direction="lower_is_better"),
                    measured("latency.output_throughput", "tok/s", 800.0, 100.0, unit="tok/s",
                             direction="higher_is_better"),
                    measured("latency.output_throughput", "tok/s", 700.0, 100.0, unit="tok/s",
                             direction="higher_is_better")],
        "kvcache": [measured("kvcache.capacity", "KV", 262112, 32768, unit="tokens", direction="higher_is_better"),
                    measured("kvcache.fragmentation", "frag", 0.5, 5.0, unit="%", direction="lower_is_better")],
        "risks": [measured("risks.accuracy.ppl_delta", "ppl", 0.0003, 0.02, unit="ratio", direction="lower_is_better")],
    }
    rec = rf.make_record(stages, run_id=run_id)
    rec.profile = {**rec.profile, "report": {"required": list(required)}}
    rec.verdict, rec.reason = run_verdict(rec.stages, True, required)  # as rebuild() would judge it
    return rec


def test_the_verdict_line_counts_each_unverified_check_once() -> None:
    rec = full_record()
    rec.stages[1].checks.append(skipped("weights.manifest", "again, in a repeat"))
    assert rec.verdict == "accepted"
    assert S.verdict_line(rec) == "ACCEPTED, 2 checks not verified"
    assert S.verdict_line(rf.accepted()) == "ACCEPTED"
    one = rf.accepted()
    one.stages[0].checks.append(skipped("weights.golden_tokens", "not set"))
    assert S.verdict_line(one) == "ACCEPTED, 1 check not verified"


def test_stage_zero_answers_whether_a_supernode_is_needed() -> None:
    a = S.adaptation(full_record())
    assert a is not None and a.answer == "Needs several devices on one node" and a.smallest == "TP=2 x PP=1"
    assert a.planned == "TP=2 x PP=1 = 2 ranks on 1 node(s)"
    rec = full_record()
    rec.stages[0].checks[0] = plan_check("needs_supernode", 8, 4, (8, 2, "needs_supernode"))
    a = S.adaptation(rec)
    assert a is not None and a.answer.startswith("Needs a supernode") and a.smallest == "TP=8 x PP=2"
    assert S.adaptation(rf.accepted()) is None


def test_headlines_take_the_worst_repeat_and_the_worst_busbw_against_expected() -> None:
    heads = {h.key: h for h in S.headlines(full_record())}
    figures = S.figures(full_record())  # the stages' declarations, in stage order
    assert [h.key for h in S.headlines(full_record())] == [f.key for f in figures if not f.opt_in]
    assert len(figures) == 11 and [f.key for f in figures if f.opt_in] == ["capacity"]
    assert [f.key for f in figures][:2] == ["busbw", "ttft_p99"]
    assert heads["ttft_p99"].value == 300.0 and heads["ttft_p99"].note == "worst of 2"
    assert heads["ttft_p99"].text == "300 ms" and heads["ttft_p99"].limit == "≤ 2,000 ms"
    assert heads["output_throughput"].value == 700.0 and heads["output_throughput"].limit == "≥ 100 tok/s"
    # all_gather is 0.54x its expected bandwidth; broadcast has the lowest GB/s ratio-wise above 1
    assert heads["busbw"].check_id == "collectives.all_gather.busbw"
    assert heads["busbw"].note.startswith("all_gather; expected 370 GB/s, 0.5405x")
    assert heads["kv_tokens"].text == "262,112 tokens" and "needs 32,768 tokens" in heads["kv_tokens"].note
    assert heads["ppl_delta"].text == "0.03 %" and heads["ppl_delta"].limit == "≤ 2 %"
    assert heads["cost"].status == "absent" and heads["cost"].text == "—"


def test_an_opt_in_figure_shows_only_when_the_run_measured_it() -> None:
    # capacity comes from the capacity search a profile asks for: never "absent" in a run without it
    figures = {f.key: f for f in S.figures(full_record())}
    assert figures["capacity"].opt_in and "capacity" not in {h.key for h in S.headlines(full_record())}
    rec = full_record()
    latency = next(s for s in rec.stages if s.name == "latency")
    latency.checks.append(measured("latency.capacity", "capacity", 16.7, None, unit="req/s",
                                   direction="higher_is_better"))
    heads = {h.key: h for h in S.headlines(rec)}
    assert heads["capacity"].text == "16.7 req/s" and heads["capacity"].status == "pass"
    assert ("Capacity (req/s meeting the SLA)", "16.7 req/s") in [r[:2] for r in S.headline_rows(S.summarize(rec))]


def test_a_failed_busbw_is_the_headline_even_when_another_is_slower() -> None:
    rec = full_record()
    rec.stages[2].checks.append(busbw("sendrecv", 360.0, 370.0, status="fail"))
    busbw_figure = next(f for f in S.figures(rec) if f.key == "busbw")
    assert S.headline(busbw_figure, list(rec.checks())).check_id == "collectives.sendrecv.busbw"


def test_not_verified_lists_each_reason_required_first_with_absent_required_checks() -> None:
    rec = full_record(required=["collectives.transport.*", "weights.golden_tokens"])
    got = S.unverified(rec)
    assert [(u.check_id, u.status, u.required) for u in got] == [
        ("weights.golden_tokens", "absent", True),
        ("collectives.transport.inter_node", "skip", True),
        ("weights.manifest", "skip", False),
    ]
    assert got[1].reason == "one node"
    assert S.summarize(rec).required == ["collectives.transport.*", "weights.golden_tokens"]


def test_failed_checks_are_listed_once_each() -> None:
    rec = rf.rejected()
    rec.stages[2].checks.append(rec.stages[2].checks[0])
    assert [c.id for c in S.failed(rec)] == ["latency.ttft_p99"]


def test_trends_follow_the_history_and_mark_the_baseline() -> None:
    past = [full_record(ttft=100.0 + 10 * i, run_id=f"run-{i}") for i in range(4)]
    now = full_record(ttft=400.0, run_id="run-now")
    s = S.summarize(now, past, baseline_run_id="run-2")
    ttft = next(h for h in s.headlines if h.key == "ttft_p99")
    assert [v for _, v in ttft.trend] == [200.0, 220.0, 240.0, 260.0, 800.0]  # worst repeat of each run
    assert ttft.baseline_index == 2 and s.trend_runs == 5
    cost = next(h for h in s.headlines if h.key == "cost")
    assert cost.trend == [] and trends.sparkline(cost) == ""
    svg = trends.sparkline(ttft)
    assert svg.startswith('<svg class="spark"') and svg.count('class="baseline"') == 1
    assert "<text" not in svg and "baseline: run run-2" in svg
    assert S.summarize(now).trend_runs == 0 and S.summarize(now, [now]).trend_runs == 0


def test_the_this_run_dot_is_drawn_only_on_this_runs_own_point() -> None:
    """A run without the figure leaves a gap: its trend ends at the previous run, which the dark
    "this run" dot then marked as if it were this one."""
    import dataclasses

    past = [full_record(ttft=100.0 + 10 * i, run_id=f"run-{i}") for i in range(3)]
    s = S.summarize(full_record(ttft=400.0, run_id="run-now"), past)
    ttft = next(h for h in s.headlines if h.key == "ttft_p99")
    assert trends.sparkline(ttft).count(f'fill="{trends.NOW}"') == 1
    absent = dataclasses.replace(ttft, value=None, trend=ttft.trend[:-1])  # this run measured nothing
    svg = trends.sparkline(absent)
    assert svg.startswith('<svg class="spark"') and f'fill="{trends.NOW}"' not in svg


def test_unreadable_history_entries_are_named_a_few_at_a_time_and_only_those_before_the_run(tmp_path) -> None:
    """Every entry that did not load was a note (500 corrupt files put the terminal's verdict line 505
    lines down), and one stored after the run being reported was named as missing from its trend,
    though the trend would never have held it."""
    from day0.results import history

    out = tmp_path / "reports"
    now = full_record(run_id="run-now")  # started 2026-11-30T09:00
    folder = history.folder_for(history.history_root(now.profile, out), now)
    folder.mkdir(parents=True)
    good = full_record(run_id="run-good")
    good.started_at = "2026-11-29T09:00:00.000+00:00"
    history.store(rf.write(good, out / good.run_id), folder)
    for number, day in enumerate(["2026-11-28"] * 5 + ["2026-12-05"], start=2):
        (folder / f"{number:04d}_{day.replace('-', '')}T080000Z_0123456789ab_accepted.json").write_text('{"trunc')
    runs, notes = trends.history_runs(now, rf.write(now, out / now.run_id))
    assert [r.run_id for r in runs] == ["run-good"]
    assert len(notes) == 4 and notes[-1] == "and 2 more history entries that did not load", notes
    assert not [n for n in notes if "20261205T" in n]  # stored after this run started: never a gap in its trend


def test_trends_read_the_history_folder_beside_the_run(tmp_path) -> None:
    from day0.results import history

    out = tmp_path / "reports"
    for i in range(3):
        rec = full_record(ttft=100.0 + i, run_id=f"run-{i}")
        history.store(rf.write(rec, out / rec.run_id), history.folder_for(history.history_root(rec.profile, out), rec))
    now = full_record(run_id="run-now")
    src = rf.write(now, out / now.run_id)
    assert [r.run_id for r in trends.history_runs(now, src)[0]] == ["run-0", "run-1", "run-2"]
    assert trends.history_runs(now, tmp_path / "elsewhere" / "x" / "run.json") == ([], [])


@pytest.mark.parametrize("make", [rf.accepted, rf.rejected, rf.incomplete, rf.blocked_stages])
def test_headline_rows_are_the_terminal_block(make) -> None:
    rows = S.headline_rows(S.summarize(make()))
    assert all(len(r) == 4 and r[3] in ("PASS", "FAIL", "SKIP", "BLOCKED", "ERROR") for r in rows)
    assert ("TTFT p99" in [r[0] for r in rows]) == any(c.id == "latency.ttft_p99" for c in make().checks())


def test_a_figure_two_methods_measure_shows_the_one_that_measured() -> None:
    """The cpu-2node case: no scheduler view, so the exact fragmentation is a skip, while the
    /metrics estimate was measured; the headline is the estimate, not "SKIP"."""
    rec = full_record()
    kv = next(s for s in rec.stages if s.name == "kvcache")
    kv.checks = [skipped("kvcache.fragmentation", "no scheduler view across nodes"),
                 measured("kvcache.blackbox_fragmentation", "frag (/metrics)", 1.5, 5.0, unit="%",
                          direction="lower_is_better")]
    heads = {h.key: h for h in S.headlines(rec)}
    assert (heads["frag_mean"].check_id, heads["frag_mean"].status) == ("kvcache.blackbox_fragmentation", "pass")
    kv.checks = kv.checks[:1]  # neither measured: the first method's skip, with its reason
    heads = {h.key: h for h in S.headlines(rec)}
    assert heads["frag_mean"].status == "skip" and "no scheduler view" in heads["frag_mean"].note


def test_a_record_carries_its_stages_figures_and_the_report_reads_them_from_it() -> None:
    from day0.core.stages import Figure, StageInfo

    rec = full_record()
    site = rf.make_record({"risks": []}).stages[0]
    site.name, site.info = "sitecheck", StageInfo("sitecheck", "Site", "?", (Figure("s", "Site figure", ("site.*",)),),
                                                  origin="mysite")
    site.checks = [measured("site.ratio", "r", 0.5, 1.0, direction="lower_is_better")]
    rec.stages[0].info = StageInfo("preflight", "Preflight", "?", origin="day0")
    rec.stages.append(site)
    heads = S.headlines(rec)
    assert [h.key for h in heads] == ["s"] and heads[0].text == "0.5"  # declared in the record: only those


def test_figures_that_do_not_apply_are_left_out_and_missing_ones_still_show_absent(tmp_path):
    """Expert load on a dense model (the stage is not applicable) and speculative acceptance with
    speculation not in force (its checks say so) are not headline rows; a latency figure the run
    did not measure is still 'absent'."""
    from day0.core.events import EventLog, rebuild
    from day0.core.verdict import NOT_APPLICABLE

    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r-na", {"host": "h"}, {"name": "p"}, ["parity", "latency", "experts"])
    log.check("parity", Check(id="parity.features", title="t", status="pass", value=3))
    log.check("parity", Check(id="parity.speculative", title="t", status="skip", evidence={NOT_APPLICABLE: True}))
    log.check("latency", Check(id="latency.ttft_p99", title="t", status="pass", value=10.0, unit="ms"))
    log.check("experts", Check(id="experts.load", title="t", status="skip", evidence={NOT_APPLICABLE: True}))
    log.run_finished(0)
    heads = {h.key: h for h in S.summarize(rebuild(tmp_path)).headlines}
    assert "spec_acceptance" not in heads and "balance" not in heads and "hot_expert" not in heads
    assert heads["features"].status == "pass" and heads["tpot_p99"].status == "absent"


def _many_figures(n_checks: int, n_figures: int, required=()) -> RunRecord:
    from day0.core.stages import Figure, StageInfo

    rec = rf.make_record({"site": [measured(f"site.c{i}", "c", float(i), 1e9, direction="lower_is_better")
                                   for i in range(n_checks)]})
    figs = tuple(Figure(f"k{j}", f"L{j}", (f"site.c{j}*",)) for j in range(n_figures))
    rec.stages[0].info = StageInfo("site", "Site", "?", figs, origin="mysite")
    rec.profile = {**rec.profile, "report": {"required": list(required)}}
    return rec


def test_each_glob_is_matched_once_against_the_distinct_check_ids(monkeypatch) -> None:
    """20,000 checks and 2,000 figures took 107 s to report: every figure matched each glob against
    every check four times. Now each glob is tried once against the ids that share its literal prefix."""
    rec = _many_figures(300, 30, required=[f"site.c{j}*x" for j in range(30)] + ["*.c1"])
    rec.stages[0].checks += [Check(id="site.c7", title="again", status="skip", message="a repeat")] * 50
    from day0.core import globs

    calls = []
    real = globs.matches
    monkeypatch.setattr(globs, "matches", lambda name, glob: calls.append(glob) or real(name, glob))
    s = S.summarize(rec)
    assert [h.text for h in s.headlines][:3] == ["0", "199", "299"] and s.headlines[7].note == "worst of 61"
    ids = {c.id for c in rec.checks()}
    for glob in set(calls):  # once per id it could match (its literal prefix)
        assert calls.count(glob) <= sum(i.startswith(glob.split("*")[0]) for i in ids), glob
    assert calls.count("*.c1") == len(ids)  # no prefix: every distinct id, once
    assert len(calls) < 2000 and [u.check_id for u in s.unverified if u.status == "absent"][:2] == \
        ["site.c0*x", "site.c1*x"]


def test_a_glob_past_the_length_limit_names_its_key() -> None:
    from day0.core.stages import Figure, StageInfo

    rec = _many_figures(3, 1)
    info = rec.stages[0].info
    assert info is not None
    rec.stages[0].info = StageInfo("site", "Site", "?", (*info.figures, Figure("long", "Long", ("s.*", "s" * 300))),
                                   origin="mysite")
    with pytest.raises(ValueError, match=r"^stages\[0\]\.figures\[1\]\.check_ids\[1\]: check pattern .* past 256"):
        S.summarize(rec)


def test_figures_past_a_floats_range_show_a_dash_never_inf() -> None:
    """value x scale overflowed: the headline read "inf x ... PASS"; a ±1e308 history drew a
    sparkline of "5.0,nan" points."""
    from day0.core.stages import Figure, StageInfo

    rec = rf.make_record({"site": [Check(id="site.a", title="a", status="pass", value=1e300, unit="x")]})
    rec.stages[0].info = StageInfo("site", "Site", "?", (Figure("k", "L", ("site.a",), scale=1e300),), origin="mysite")
    h = S.summarize(rec).headlines[0]
    assert (h.text, h.value, h.status) == ("—", None, "pass") and h.note == "1.000e+300 x x 1e+300 is past a float's range"
    assert S.headline_rows(S.summarize(rec))[0][1] == "—"
    assert S.fmt(float("inf")) == S.fmt(float("nan")) == "—" and S.fmt("text") == "text"
    spark = S.Headline("k", "L", 5.0, "5", "", "pass", "site.a", trend=[("r1", -1e308), ("r2", 1e308), ("r3", 5.0)])
    assert trends.sparkline(spark) == ""
    spark.trend = [("r1", 1.0), ("r2", 5.0)]
    assert "nan" not in trends.sparkline(spark) and "<polyline" in trends.sparkline(spark)


def test_a_past_run_whose_figures_cannot_be_read_is_passed_over_with_a_note() -> None:
    """add_trends read every past run's headlines: one history run with a figure glob past 256
    characters raised, and the report of the run being rendered stopped, blaming it (r6_longfig.py)."""
    from day0.core.stages import Figure, StageInfo

    past = [full_record(ttft=100.0 + 10 * i, run_id=f"run-{i}") for i in range(3)]
    past[1].stages[0].info = StageInfo(past[1].stages[0].name, "T", "?", (Figure("k", "L", ("latency." + "x" * 300,)),))
    s = S.summarize(full_record(ttft=400.0, run_id="run-now"), past)
    ttft = next(h for h in s.headlines if h.key == "ttft_p99")
    assert [rid for rid, _ in ttft.trend] == ["run-0", "run-2", "run-now"] and s.trend_runs == 3
    assert len(s.trend_notes) == 1 and s.trend_notes[0].startswith("history run run-1 passed over for the trends: ")
    assert "past 256" in s.trend_notes[0] and S.answer_lines(s)[-1] == "note: " + s.trend_notes[0]
