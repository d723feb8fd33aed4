"""Comparison semantics: direction, tolerance, noise, repeated ids, missing/new checks, CLI, session."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import run_factory as rf
from day0 import compare, history
from day0.compare import CompareError, CompareSettings, Tolerance, compare_records
from day0.profile import load_profile
from day0.record import Check, RunRecord, load, measured
from day0.session import Day0Session

NONE = CompareSettings(method="none")


def chk(id: str, value, limit=None, direction="lower_is_better", unit="ms", samples=None, **ev) -> Check:
    evidence = dict(ev)
    if samples is not None:
        evidence["samples"] = list(samples)
    return measured(id, id.split(".")[-1], value, limit, unit=unit, direction=direction, evidence=evidence)


def run_of(checks: list[Check], run_id: str, stage: str = "latency") -> RunRecord:
    return rf.make_record({stage: checks}, run_id=run_id)


def kind_of(base: Check, new: Check, settings: CompareSettings = NONE) -> str:
    res = compare_records(run_of([base], "b"), run_of([new], "r"), settings)
    [row] = res.rows
    return row.kind


# --------------------------------------------------------------------------- tolerances


@given(st.floats(0, 1e6, allow_nan=False), st.booleans())
def test_tolerance_parses_percent_and_absolute(x, as_text):
    rel = Tolerance.parse(f"{x!r}%", "k")
    assert rel.relative and math.isclose(rel.amount, x / 100, rel_tol=1e-12, abs_tol=1e-300)
    ab = Tolerance.parse(repr(x) if as_text else x, "k")
    assert not ab.relative and ab.amount == x
    assert math.isclose(rel.allowed(-200.0), 2 * x, rel_tol=1e-9, abs_tol=1e-300) and ab.allowed(-200.0) == x


@pytest.mark.parametrize("raw", ["5 percent", "-5%", "%", "fast", -1, True, "nan%", "inf"])
def test_bad_tolerances_name_the_key(raw):
    with pytest.raises(CompareError, match=r"^compare\.tolerances\.ttft_p99: "):
        CompareSettings.from_mapping({"tolerances": {"ttft_p99": raw}})


def test_a_bad_tolerance_in_a_profile_is_one_line_naming_the_key():
    from day0.profile import ProfileError

    with pytest.raises(ProfileError, match=r"compare\.tolerances\.ttft_p99: '5 percent' is not a tolerance"):
        load_profile("cpu-tiny", overrides={"compare": {"tolerances": {"ttft_p99": "5 percent"}}})


def test_tolerance_precedence_exact_then_suffix_then_glob_then_cli():
    s = CompareSettings.from_mapping({"default_tolerance": "5%", "tolerances": {
        "latency.*": "30%", "ttft_p99": "10%", "latency.ttft_p99": "2%", "*_p99": "50%"}})
    assert s.tolerance_for("latency.ttft_p99", "latency.ttft_p99", "lower_is_better").amount == 0.02
    assert s.tolerance_for("latency.tpot_p99", "latency.tpot_p99", "lower_is_better").amount == 0.30
    assert s.tolerance_for("kvcache.frag_p99", "kvcache.frag_p99", "lower_is_better").amount == 0.50
    assert s.tolerance_for("weights.load", "weights.load", "lower_is_better").amount == 0.05
    assert s.tolerance_for("weights.ok", "weights.ok", "exact") == Tolerance(0.0, False, "exact")
    s2 = CompareSettings.from_mapping({"tolerances": {"ttft_p99": "10%"}}).with_overrides(["ttft_p99=1"])
    t = s2.tolerance_for("latency.ttft_p99", "latency.ttft_p99", "lower_is_better")
    assert (t.amount, t.relative) == (1.0, False)


# --------------------------------------------------------------------------- direction x tolerance


@given(
    base=st.floats(1e-3, 1e6), factor=st.floats(0.01, 100), pct=st.floats(0, 200),
    direction=st.sampled_from(["lower_is_better", "higher_is_better"]),
)
def test_direction_and_relative_tolerance(base, factor, pct, direction):
    new = base * factor
    bound = base * pct / 100
    worse = (new - base) if direction == "lower_is_better" else (base - new)
    assume(abs(abs(worse) - bound) > 1e-9 * base)  # not on the boundary itself
    settings = CompareSettings(default=Tolerance(pct / 100, True), method="none")
    got = kind_of(chk("latency.x", base, direction=direction), chk("latency.x", new, direction=direction), settings)
    expected = "regression" if worse > bound else "improvement" if -worse > bound else "unchanged"
    assert got == expected


@given(a=st.floats(-1e6, 1e6), b=st.floats(-1e6, 1e6), tol=st.floats(0, 1e3),
       direction=st.sampled_from(["lower_is_better", "higher_is_better"]))
def test_absolute_tolerance_is_symmetric(a, b, tol, direction):
    assume(abs(abs(a - b) - tol) > 1e-6)
    s = CompareSettings(default=Tolerance(tol, False), method="none")
    ab = kind_of(chk("latency.x", a, direction=direction), chk("latency.x", b, direction=direction), s)
    ba = kind_of(chk("latency.x", b, direction=direction), chk("latency.x", a, direction=direction), s)
    assert {ab, ba} in ({"unchanged"}, {"regression", "improvement"})


@given(limit=st.integers(0, 10), base=st.integers(0, 20), new=st.integers(0, 20))
def test_exact_checks_get_no_slack_and_measure_distance_to_the_limit(limit, base, new):
    b = chk("collectives.x.correct", base, limit, direction="exact", unit="elements")
    n = chk("collectives.x.correct", new, limit, direction="exact", unit="elements")
    got = kind_of(b, n)
    db, dn = abs(base - limit), abs(new - limit)
    if db == 0 and dn > 0:
        assert got == "regression"  # (status pass -> fail too)
    elif dn > db:
        assert got == "regression"
    elif dn < db:
        assert got == "improvement"
    else:
        assert got == "unchanged"


def test_exact_without_a_limit_is_a_change_not_a_regression():
    b = chk("latency.token_accounting", "usage", None, direction="exact", unit="")
    n = chk("latency.token_accounting", "content", None, direction="exact", unit="")
    res = compare_records(run_of([b], "b"), run_of([n], "r"), NONE)
    assert [r.kind for r in res.rows] == ["changed"] and res.exit_code == 0


def test_pass_to_fail_is_a_regression_even_within_tolerance():
    b = chk("latency.ttft_p99", 199.0, 200.0)
    n = chk("latency.ttft_p99", 201.0, 200.0)  # +1%: inside the default 5%
    res = compare_records(run_of([b], "b"), run_of([n], "r"), NONE)
    assert res.rows[0].kind == "regression" and res.exit_code == 1
    assert res.rows[0].why.startswith("status pass -> fail (201 ms vs 199 ms, +1.0%)")
    assert kind_of(n, b) == "improvement"


@pytest.mark.parametrize("before, after, kind", [
    ("pass", "pass", "unchanged"), ("pass", "error", "regression"), ("pass", "fail", "regression"),
    ("fail", "pass", "improvement"), ("fail", "error", "unchanged"), ("skip", "pass", "new"),
    ("skip", "fail", "regression"), ("pass", "blocked", "unmeasured"), ("pass", "skip", "unmeasured"),
])
def test_checks_without_a_value_compare_by_status(before, after, kind):
    def c(status: str) -> Check:
        return Check(id="preflight.tp_divides_heads", title="t", status=status, message=f"it {status}ed")

    res = compare_records(run_of([c(before)], "b", "preflight"), run_of([c(after)], "r", "preflight"), NONE)
    assert [r.kind for r in res.rows] == [kind]
    assert res.exit_code == (1 if kind == "regression" else 0)


def test_units_that_differ_are_not_compared():
    res = compare_records(run_of([chk("latency.x", 1.0, unit="s")], "b"), run_of([chk("latency.x", 900.0)], "r"), NONE)
    assert res.rows[0].kind == "incomparable" and "units differ" in res.rows[0].why and res.exit_code == 0


# --------------------------------------------------------------------------- missing, new, unmeasured


def test_missing_new_and_unmeasured_checks():
    base = run_of([chk("latency.a", 1.0), chk("latency.b", 1.0), chk("latency.c", 1.0)], "b")
    skipped = Check(id="latency.c", title="c", status="skip", message="no HTTP view")
    run = run_of([chk("latency.a", 1.0), skipped, chk("latency.new_ok", 5.0, 10.0),
                  chk("latency.new_bad", 50.0, 10.0)], "r")
    res = compare_records(base, run, NONE)
    kinds = {r.key: r.kind for r in res.rows}
    assert kinds == {"latency.a": "unchanged", "latency.b": "missing", "latency.c": "unmeasured",
                     "latency.new_ok": "new", "latency.new_bad": "regression"}
    assert [r.key for r in res.regressions] == ["latency.new_bad"]  # a new failure counts
    strict = compare_records(base, run, CompareSettings(method="none", fail_on_missing=True))
    assert sorted(r.key for r in strict.regressions) == ["latency.b", "latency.new_bad"]


@given(st.sets(st.sampled_from("abcdefgh"), max_size=8), st.sets(st.sampled_from("abcdefgh"), max_size=8))
def test_every_check_of_either_run_appears_exactly_once(in_base, in_run):
    base = run_of([chk(f"latency.{k}", 1.0) for k in sorted(in_base)], "b")
    run = run_of([chk(f"latency.{k}", 1.0) for k in sorted(in_run)], "r")
    res = compare_records(base, run, NONE)
    keys = [r.key for r in res.rows]
    assert sorted(keys) == sorted(f"latency.{k}" for k in in_base | in_run)
    for r in res.rows:
        name = r.key.split(".")[-1]
        expected = ("unchanged" if name in in_base & in_run else "missing" if name in in_base else "new")
        assert r.kind == expected
    assert res.exit_code == 0


# --------------------------------------------------------------------------- repeated ids


def shard_fail(shard: str, size: int) -> Check:
    return Check(id="weights.shard_size", title="size", status="fail", value=size, limit=1000, unit="bytes",
                 direction="exact", message=f"{shard} is {size} bytes", evidence={"shard": shard, "tensor": None})


def test_repeated_ids_are_matched_by_their_evidence_not_their_order():
    base = run_of([shard_fail("a.safetensors", 990), shard_fail("b.safetensors", 900)], "b", stage="weights")
    run = run_of([shard_fail("c.safetensors", 10), shard_fail("b.safetensors", 999),
                  shard_fail("a.safetensors", 990)], "r", stage="weights")
    res = compare_records(base, run, NONE)
    kinds = {r.key: r.kind for r in res.rows}
    assert kinds == {"weights.shard_size[shard=a.safetensors]": "unchanged",
                     "weights.shard_size[shard=b.safetensors]": "improvement",
                     "weights.shard_size[shard=c.safetensors]": "regression"}
    assert any("matched by shard" in n for n in res.notes)


def test_a_summary_check_that_splits_into_per_shard_failures():
    ok = measured("weights.shard_size", "size", 3000, 3000, unit="bytes", direction="exact")
    base = run_of([ok], "b", stage="weights")
    run = run_of([shard_fail("a.safetensors", 10), shard_fail("b.safetensors", 20)], "r", stage="weights")
    res = compare_records(base, run, NONE)
    assert {r.key: r.kind for r in res.rows} == {"weights.shard_size": "missing",
                                                 "weights.shard_size[shard=a.safetensors]": "regression",
                                                 "weights.shard_size[shard=b.safetensors]": "regression"}


def test_repeated_ids_with_nothing_to_tell_them_apart_are_matched_by_position_and_said_so():
    same = [Check(id="latency.probe", title="p", status="pass", value=v, unit="ms", direction="lower_is_better")
            for v in (1.0, 2.0)]
    later = [Check(id="latency.probe", title="p", status="pass", value=v, unit="ms", direction="lower_is_better")
             for v in (1.0, 9.0)]
    res = compare_records(run_of(same, "b"), run_of(later, "r"), NONE)
    assert {r.key: r.kind for r in res.rows} == {"latency.probe#1": "unchanged", "latency.probe#2": "regression"}
    assert any("matched by position" in n for n in res.notes)


# --------------------------------------------------------------------------- noise


@given(st.lists(st.floats(100, 120), min_size=8, max_size=60), st.floats(1.5, 10), st.integers(0, 2**31),
       st.sampled_from([50.0, 90.0, 99.0]))
def test_bootstrap_flags_a_clear_shift_and_not_a_reshuffle(xs, k, seed, q):
    shifted = [x * k for x in xs]  # every run sample above every baseline sample
    up = compare.bootstrap(xs, shifted, q, toward=+1, alpha=0.05, n_boot=300, seed=seed)
    assert up.significant and up.interval is not None and up.interval[0] > 0
    assert not compare.bootstrap(xs, shifted, q, toward=-1, alpha=0.05, n_boot=300, seed=seed).significant
    same = compare.bootstrap(xs, list(reversed(xs)), q, toward=+1, alpha=0.05, n_boot=300, seed=seed)
    assert not same.significant


def test_a_move_beyond_tolerance_that_the_samples_do_not_support_is_noise():
    xs = rf.samples(400, seed=1, median=100.0)
    ys = rf.samples(400, seed=2, median=100.0)  # same distribution, other draw
    b = chk("latency.ttft_p99", 150.0, samples=xs)
    n = chk("latency.ttft_p99", 180.0, samples=ys)  # summary value 20% worse: beyond 5%
    s = CompareSettings(method="bootstrap", bootstrap=400)
    res = compare_records(run_of([b], "b"), run_of([n], "r"), s)
    assert res.rows[0].kind == "noise" and res.exit_code == 0
    assert "not significant" in res.rows[0].why and res.rows[0].significance.method == "bootstrap p99"
    slow = chk("latency.ttft_p99", 180.0, samples=[y * 1.6 for y in ys])
    res = compare_records(run_of([b], "b"), run_of([slow], "r"), s)
    assert res.rows[0].kind == "regression" and res.rows[0].significance.significant


def test_too_few_samples_leave_the_decision_to_the_tolerance():
    b = chk("latency.ttft_p99", 100.0, samples=[100.0, 101.0])
    n = chk("latency.ttft_p99", 200.0, samples=[100.0, 101.0])
    res = compare_records(run_of([b], "b"), run_of([n], "r"), CompareSettings(method="bootstrap"))
    assert res.rows[0].kind == "regression" and res.rows[0].significance is None


@pytest.mark.skipif(compare.scipy_available(), reason="scipy is installed here")
def test_mann_whitney_without_scipy_is_a_clear_error():
    b = chk("latency.ttft_p99", 100.0, samples=[100.0] * 10)
    n = chk("latency.ttft_p99", 200.0, samples=[200.0] * 10)
    with pytest.raises(CompareError, match="needs scipy"):
        compare_records(run_of([b], "b"), run_of([n], "r"), CompareSettings(method="mann-whitney"))


@pytest.mark.skipif(not compare.scipy_available(), reason="scipy is not installed (bootstrap is used)")
def test_mann_whitney_when_scipy_is_there():  # pragma: no cover - depends on the venv
    xs = rf.samples(50, 1)
    assert compare.mann_whitney(xs, [x * 2 for x in xs], +1, 0.05).significant
    assert not compare.mann_whitney(xs, xs, +1, 0.05).significant


@given(st.integers(1, 99), st.one_of(st.none(), st.integers(1, 9)))
def test_percentile_of_reads_the_check_id(whole, frac):
    pid = f"latency.ttft_p{whole}" + (f"_{frac}" if frac is not None else "")
    assert compare.percentile_of(pid) == float(f"{whole}.{frac}" if frac is not None else whole)
    assert compare.percentile_of("collectives.all_reduce.busbw") == 50.0


# --------------------------------------------------------------------------- compatibility


def test_runs_of_different_profiles_or_the_same_run_are_refused():
    a, b = rf.accepted(), rf.accepted()
    b.run_id = "other"
    b.profile = {**b.profile, "name": "h200x8"}
    with pytest.raises(CompareError, match="profile 'cpu-tiny-fixture' differs from this run's 'h200x8'"):
        compare_records(a, b)
    with pytest.raises(CompareError, match="is run run-accepted itself"):
        compare_records(a, rf.accepted())


def test_profile_changes_are_named_in_the_notes():
    a, b = rf.accepted(), rf.accepted()
    b.run_id = "r2"
    b.profile = json.loads(json.dumps(b.profile))
    b.profile["engine"]["args"]["block_size"] = 16
    res = compare_records(a, b, NONE)
    assert any("engine.args.block_size: 32 -> 16" in n for n in res.notes)


# --------------------------------------------------------------------------- CLI


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="day0")
    compare.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_exit_codes_and_table(tmp_path, capsys):
    ok = rf.write(rf.accepted(), tmp_path / "a")
    worse = rf.rejected()
    worse.run_id = "run-worse"
    bad = rf.write(worse, tmp_path / "b")
    assert _cli(["compare", str(tmp_path / "b"), "--baseline", str(ok), "--json", str(tmp_path / "c.json")]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION  latency.ttft_p99" in out and "result: 1 regression vs baseline run-accepted" in out
    assert json.loads((tmp_path / "c.json").read_text())["exit_code"] == 1
    assert _cli(["compare", str(ok), "--baseline", str(bad)]) == 0  # the other way round: an improvement
    assert "IMPROVEMENT" in capsys.readouterr().out

    def err(argv: list[str]) -> str:
        assert _cli(argv) == 2
        e = capsys.readouterr().err
        assert e.count("\n") == 1 and "Traceback" not in e
        return e

    assert "nope: run record not found" in err(["compare", str(bad), "--baseline", str(tmp_path / "nope")])
    other = rf.accepted()
    other.run_id, other.profile = "x", {**other.profile, "name": "other"}
    assert "differs from this run's" in err(["compare", str(rf.write(other, tmp_path / "o")), "--baseline", str(ok)])
    newer = json.loads(ok.read_text())
    newer["schema_version"] = 99
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "run.json").write_text(json.dumps(newer))
    assert "schema_version 99 is newer" in err(["compare", str(bad), "--baseline", str(tmp_path / "n")])
    assert "no latest-accepted run in" in err(["compare", str(bad), "--baseline", "latest-accepted",
                                               "--history", str(tmp_path / "h")])
    assert "--tolerance" in err(["compare", str(bad), "--baseline", str(ok), "--tolerance", "ttft_p99"])


def test_cli_latest_accepted_reads_the_history(tmp_path, capsys):
    folder = history.folder_for(tmp_path / "h", rf.accepted())
    history.store(rf.write(rf.accepted(), tmp_path / "a"), folder)
    worse = rf.rejected()
    worse.run_id = "run-worse"
    bad = rf.write(worse, tmp_path / "b")
    assert _cli(["compare", str(bad), "--baseline", "latest-accepted", "--history", str(tmp_path / "h"),
                 "--tolerance", "ttft_p99=1000%"]) == 1  # still a regression: pass -> fail
    assert "vs baseline #1 (run-accepted)" in capsys.readouterr().out


# --------------------------------------------------------------------------- in a session


def _session_run(out: Path, ttft: list[float], baseline: str | None) -> Day0Session:
    s = Day0Session(load_profile("cpu-tiny"), out, baseline=baseline, log=lambda m: None)
    s.start()
    xs = sorted(ttft)
    p99 = rf.p(xs, 99)
    s.add_check("latency", measured("latency.ttft_p99", "TTFT p99", p99, 5000.0, unit="ms",
                                    direction="lower_is_better", evidence={"samples": ttft}))
    s.add_check("latency", measured("latency.output_throughput", "Output throughput", 800.0, 10.0,
                                    unit="tok/s", direction="higher_is_better"))
    s.finish(0)
    return s


def test_session_compares_before_the_report_and_keeps_history(tmp_path):
    out = tmp_path / "reports"
    first = _session_run(out, rf.samples(300, 1, median=100.0), "latest-accepted")
    assert all(st.name != "regression" for st in first.record.stages)  # nothing to compare with yet
    assert "no latest-accepted run" in first.record.notes["regression"]
    same = _session_run(out, rf.samples(300, 2, median=100.0), str(first.run_json))
    slow = _session_run(out, rf.samples(300, 3, median=300.0), str(first.run_json))

    reg = same.record.stage("regression")
    assert reg.verdict == "pass" and same.record.verdict == first.record.verdict
    assert compare.regressed(slow.record) and not compare.regressed(same.record)
    assert slow.record.verdict == "rejected"
    assert slow.record.reason.startswith("stage regression fail: regression.baseline: 1 regression vs baseline")
    failed = [c.id for c in slow.record.stage("regression").checks if c.failed]
    assert failed == ["regression.baseline", "regression.latency.ttft_p99"]
    for st_ in slow.record.stages:  # the core stages' verdicts are untouched
        if st_.name != "regression":
            assert st_.verdict == first.record.stage(st_.name).verdict

    html = (slow.run_dir / "report.html").read_text()
    assert 'id="regression"' in html and "latency.ttft_p99 over the last 3 runs" in html
    assert html.count("<svg") >= 2
    junit = (slow.run_dir / "junit.xml").read_text()
    assert 'name="regression.latency.ttft_p99"' in junit

    folder = history.folder_for(history.history_root({}, out), slow.record)
    stored = history.entries(folder)
    assert [e.number for e in stored] == [1, 2, 3]
    assert [load(e.path).run_id for e in stored] == [first.run_id, same.run_id, slow.run_id]
    assert stored[-1].path.read_bytes() == slow.run_json.read_bytes()
    assert stored[-1].verdict == "rejected"


def test_a_baseline_that_cannot_be_used_is_an_error_check_not_a_crash(tmp_path):
    s = _session_run(tmp_path / "r", [1.0] * 10, str(tmp_path / "missing.json"))
    [c] = s.record.stage("regression").checks
    assert c.status == "error" and "missing.json: run record not found" in c.message
    assert s.record.verdict == "rejected" and (s.run_dir / "report.html").exists()
