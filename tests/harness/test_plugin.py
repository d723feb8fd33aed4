"""The pytest plugin, driven through pytester: markers, profile errors, gating, records, signals."""

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from day0.core.record import load

PASSING_AND_FAILING = """
import pytest

@pytest.mark.day0
@pytest.mark.latency
def test_latency(day0_checks):
    day0_checks.measured("latency.ttft_p99", "TTFT p99", 100.0, 200.0, unit="ms", direction="lower_is_better")

@pytest.mark.day0
@pytest.mark.weights
def test_weights(day0_checks):
    day0_checks.measured("weights.a", "a", 1, 1)
    day0_checks.measured("weights.b", "b", 3, 0, unit="shards", message="3 shards missing")
    day0_checks.measured("weights.c", "c", 5, 0)
"""


def _run_json(pytester) -> dict:
    return json.loads((pytester.path / "out" / "latest" / "run.json").read_text())


def _stage(run: dict, name: str) -> dict:
    return next(s for s in run["stages"] if s["name"] == name)


def test_markers_are_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.day0:*", "@pytest.mark.preflight:*", "@pytest.mark.weights:*", "@pytest.mark.collectives:*",
                                 "@pytest.mark.latency:*", "@pytest.mark.kvcache:*"])


def test_strict_markers_reject_a_misspelt_stage(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.weightz\ndef test_x(): pass\n")
    result = pytester.runpytest("--strict-markers")
    result.stdout.fnmatch_lines(["*'weightz' not found in `markers` configuration option*"])


def test_a_broken_profile_is_one_line_and_stops_before_collection(pytester):
    pytester.makefile(".toml", bad='[sla]\nttft_p99_ms = "fast"\n')
    pytester.makepyfile(PASSING_AND_FAILING)
    result = pytester.runpytest_subprocess("--day0-profile", "bad.toml", "--day0-out", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: day0: */bad.toml: sla.ttft_p99_ms: expected a number"])
    assert "Traceback" not in result.stderr.str()
    assert not (pytester.path / "out").exists()


def test_a_failed_stage_blocks_later_stages_and_runs_in_stage_order(pytester):
    pytester.makepyfile(PASSING_AND_FAILING)
    result = pytester.runpytest("--day0-out", "out", "-v", "-rs")
    # weights runs first although it is written second
    result.stdout.fnmatch_lines(["*test_weights FAILED*", "*test_latency SKIPPED*",
                                 "SKIPPED*day0 blocked: stage weights failed (weights.b: 3 shards missing)"])
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*weights.b: 3 shards missing*", "*weights.c: 5 misses the limit (== 0)*",
                                 "*verdict: REJECTED*"])
    run = _run_json(pytester)
    assert run["verdict"] == "rejected"
    weights, latency = _stage(run, "weights"), _stage(run, "latency")
    assert [c["status"] for c in weights["checks"]] == ["pass", "fail", "fail"]  # every problem, not the first
    assert latency["verdict"] == "blocked"
    assert "stage weights failed (weights.b: 3 shards missing)" in latency["checks"][0]["message"]


def test_the_terminal_summary_colours_the_verdict_line_not_the_table_header(pytester):
    """The first summary line was the verdict once; since the headline table came first, the table's
    header was shown bold red and "day0 verdict: REJECTED" plain."""
    pytester.makepyfile(PASSING_AND_FAILING)
    result = pytester.runpytest("--day0-out", "out", "--color=yes", "--day0-no-gate")  # latency heads the table
    lines = result.stdout.lines
    verdict = next(ln for ln in lines if "day0 verdict: REJECTED" in ln)
    header = next(ln for ln in lines if re.sub(r"\x1b\[[0-9;]*m", "", ln).startswith("metric "))
    assert "\x1b[31m" in verdict and "\x1b[1m" in verdict  # red and bold
    assert "\x1b[" not in header


def test_no_gate_runs_every_stage(pytester):
    pytester.makepyfile(PASSING_AND_FAILING)
    result = pytester.runpytest("--day0-out", "out", "--day0-no-gate")
    result.assert_outcomes(failed=1, passed=1)
    run = _run_json(pytester)
    assert _stage(run, "latency")["checks"][0]["status"] == "pass"


def test_exceptions_and_skips_become_checks(pytester):
    pytester.makepyfile("""
        import pytest
        pytestmark = [pytest.mark.day0, pytest.mark.kvcache]
        def test_boom(day0_checks):
            raise RuntimeError("engine died\\nsecond line")
        def test_assert(day0_checks):
            assert 1 == 2, "fragmentation 7% over 5%"
        def test_skip(day0_checks):
            pytest.skip("no scheduler view on an external engine")
    """)
    result = pytester.runpytest("--day0-out", "out", "--day0-no-gate")
    result.assert_outcomes(failed=2, skipped=1)
    checks = {c["id"]: c for c in _stage(_run_json(pytester), "kvcache")["checks"]}
    assert checks["kvcache.boom"]["status"] == "error"
    assert checks["kvcache.boom"]["message"] == "RuntimeError: engine died second line"
    assert checks["kvcache.assert"]["status"] == "fail" and "fragmentation 7%" in checks["kvcache.assert"]["message"]
    assert checks["kvcache.skip"]["status"] == "skip"
    assert checks["kvcache.skip"]["message"] == "no scheduler view on an external engine"


def test_a_day0_test_without_a_stage_is_refused(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.day0\ndef test_x(): pass\n")
    result = pytester.runpytest("--day0-out", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x is marked day0 but has no stage marker*"])


def test_the_plugin_is_inert_without_day0_tests(pytester):
    pytester.makepyfile("def test_plain(): pass\n")
    result = pytester.runpytest("--day0-out", "out")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()
    assert "== day0 ==" not in result.stdout.str() and "run record" not in result.stdout.str()


def test_deselected_day0_tests_do_not_start_a_run(pytester):
    pytester.makepyfile(PASSING_AND_FAILING + "\ndef test_plain(): pass\n")
    result = pytester.runpytest("--day0-out", "out", "-m", "not day0")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()


def test_the_day0_tests_a_selection_drops_are_noted_in_the_record(pytester):
    """`-k "not prefix_caching"` left a stage's other tests, and its failing one made no check at all:
    the record did not say a test was left out. The plugin notes each day0 test deselected (not others)."""
    pytester.makepyfile("""
        import pytest
        @pytest.mark.day0
        @pytest.mark.kvcache
        def test_kept(day0_checks):
            day0_checks.measured("kvcache.kept", "kept", 1, 1)
        @pytest.mark.day0
        @pytest.mark.kvcache
        def test_prefix_caching(day0_checks):
            day0_checks.measured("kvcache.prefix_caching", "prefix caching", 0, 1)
        @pytest.mark.day0
        @pytest.mark.kvcache
        @pytest.mark.parametrize("n", [1, 2])
        def test_param(day0_checks, n):
            pass
        def test_plain_prefix_caching():
            pass
    """)
    result = pytester.runpytest("--day0-out", "out", "-k", "not prefix_caching", "--deselect",
                                "test_the_day0_tests_a_selection_drops_are_noted_in_the_record.py::test_param[2]")
    result.assert_outcomes(passed=2, deselected=3)
    run = _run_json(pytester)
    nodeids = [f"test_the_day0_tests_a_selection_drops_are_noted_in_the_record.py::{n}"
               for n in ("test_param[2]", "test_prefix_caching")]
    assert run["notes"]["deselected"] == {"count": 2, "stages": {"kvcache": 2}, "nodeids": nodeids}
    assert [c["id"] for c in _stage(run, "kvcache")["checks"]] == ["kvcache.kept"]


SLOW = """
import pathlib, time, pytest
pytestmark = [pytest.mark.day0, pytest.mark.weights]
def test_measures_then_hangs(day0_checks):
    day0_checks.measured("weights.load_time", "load time", 1.25, 60.0, unit="s", direction="lower_is_better")
    pathlib.Path("measured").write_text("yes")
    time.sleep(120)
"""


def _start_slow(pytester):
    pytester.makepyfile(SLOW)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--day0-out", "out", "-p", "no:cacheprovider"],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (pytester.path / "measured").exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the test never reached its measurement"
        time.sleep(0.1)
    return proc


def test_a_killed_session_leaves_a_rebuildable_record(pytester):
    proc = _start_slow(pytester)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    run_dir = (pytester.path / "out" / "latest").resolve()
    assert not (run_dir / "run.json").exists()
    cli = subprocess.run([sys.executable, "-m", "day0.cli", "record", "rebuild", str(run_dir)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "verdict incomplete" in cli.stdout
    rec = load(run_dir / "run.json")
    assert rec.verdict == "incomplete"
    assert [(c.id, c.value) for c in rec.checks()] == [("weights.load_time", 1.25)]


def test_sigterm_still_writes_the_record(pytester):
    proc = _start_slow(pytester)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    rec = load(pytester.path / "out" / "latest" / "run.json")
    assert rec.finished_at is not None
    assert [c.id for c in rec.checks()] == ["weights.load_time"]
    assert rec.verdict == "incomplete" and rec.reason.startswith("the run was interrupted")


def test_collect_only_lists_the_checklist_and_records_no_run(pytester):
    """--collect-only is a reading of the checklist: no run folder, no history entry, no engine."""
    pytester.makepyfile(PASSING_AND_FAILING)
    result = pytester.runpytest("--day0-out", "out", "--collect-only", "-q")
    result.assert_outcomes()
    assert "test_latency" in result.stdout.str()
    assert not (pytester.path / "out").exists()


SECRET_IN_REASONS = """
import os
import pytest

@pytest.mark.day0
@pytest.mark.weights
def test_weights(day0_checks):
    day0_checks.measured("weights.fake", "bad", 9, 1, message="download failed for token " + os.environ["HF_TOKEN"])

@pytest.mark.day0
@pytest.mark.latency
def test_latency(day0_checks):
    day0_checks.measured("latency.fake", "good", 0, 1)

@pytest.mark.day0
@pytest.mark.preflight
def test_preflight(day0_checks):  # before weights: not blocked, so its own skip is what pytest reports
    pytest.skip("no view: engine at http://ci:Passw0rdCANARY9@10.0.0.5:8000 refused")
"""


def test_skip_reasons_reach_the_console_and_junitxml_redacted(pytester, monkeypatch):
    """A later stage's "blocked" skip quoted the failed check's message, and a test's own skip its
    reason, as they were: pytest prints both under -rs and writes them to its --junitxml."""
    monkeypatch.setenv("HF_TOKEN", "hf_CANARYsecret123456")
    pytester.makepyfile(SECRET_IN_REASONS)
    result = pytester.runpytest_subprocess("--day0-out", "out", "-rs", "--junitxml", "pj.xml")
    text = result.stdout.str() + result.stderr.str() + (pytester.path / "pj.xml").read_text()
    assert "day0 blocked: stage weights failed" in text and "no view: engine at" in text
    assert "hf_CANARYsecret123456" not in text and "Passw0rdCANARY9" not in text


@pytest.mark.parametrize("what", ["latest-folder", "out-file"])
def test_an_output_folder_that_cannot_take_the_run_is_one_line_before_it_starts(pytester, what):
    """A folder named latest where day0 keeps its link, or --day0-out naming a file: an INTERNALERROR
    after the whole run, with a stray link left."""
    pytester.makepyfile(PASSING_AND_FAILING)
    if what == "latest-folder":
        (pytester.path / "out" / "latest").mkdir(parents=True)
    else:
        (pytester.path / "out").write_text("not a folder")
    result = pytester.runpytest_subprocess("--day0-out", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    line = "ERROR: day0: *latest: a folder where day0 keeps its link*" if what == "latest-folder" \
        else "ERROR: day0: --day0-out */out: a file, not a folder*"
    result.stderr.fnmatch_lines([line])
