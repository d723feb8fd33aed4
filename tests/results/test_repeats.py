"""--day0-repeat: the measuring stages run N times on one engine; spreads and flipped verdicts.

The pytester suites below are labelled fakes of a stage (no engine): a module fixture stands in
for a measurement whose value is scripted per repeat, so the plumbing is checked exactly.
"""

import json

import pytest

from day0.core.events import EventLog, rebuild
from day0.core.record import Check
from day0.results.repeats import STABILITY_ID, series, stability_check

SUITE = """
import pytest

VALUES = {values}

@pytest.fixture(scope="module")
def ttft(day0_repeat):
    return VALUES[day0_repeat or 1]

@pytest.mark.day0
@pytest.mark.latency
def test_latency(ttft, day0_checks):
    day0_checks.measured("latency.ttft_p99", "TTFT p99", ttft, 20.0, unit="ms", direction="lower_is_better")

@pytest.mark.day0
@pytest.mark.latency
@pytest.mark.day0_once
def test_probe(day0_checks):
    day0_checks.measured("latency.probe", "a correctness probe with its own engine", 1, 1)

@pytest.mark.day0
@pytest.mark.weights
def test_weights(day0_checks):
    day0_checks.measured("weights.a", "a", 1, 1)
"""


def _run(pytester, values: dict, *args: str) -> tuple[pytest.RunResult, dict]:
    pytester.makepyfile(SUITE.format(values=values))
    result = pytester.runpytest("--day0-out", "out", "-v", *args)
    return result, json.loads((pytester.path / "out" / "latest" / "run.json").read_text())


def _checks(run: dict, check_id: str) -> list[dict]:
    return [c for s in run["stages"] for c in s["checks"] if c["id"] == check_id]


def test_repeat_measures_the_stage_n_times_and_reports_the_spread(pytester):
    result, run = _run(pytester, {1: 10.0, 2: 12.0, 3: 11.0}, "--day0-repeat", "3")
    result.assert_outcomes(passed=5)  # latency x3, the once-only probe, weights (not a repeatable stage)
    ttft = _checks(run, "latency.ttft_p99")
    assert [c["repeat"] for c in ttft] == [1, 2, 3] and [c["value"] for c in ttft] == [10.0, 12.0, 11.0]
    assert [c["repeat"] for c in _checks(run, "latency.probe")] == [None]
    assert [c["repeat"] for c in _checks(run, "weights.a")] == [None]
    (stab,) = _checks(run, STABILITY_ID)
    assert stab["status"] == "pass" and run["reason"].startswith("stages not run")  # only what this suite has
    row = next(r for r in stab["evidence"]["table"]["rows"] if r[0] == "latency.ttft_p99")
    assert row[2:6] == [11.0, 10.0, 12.0, pytest.approx(18.18, abs=0.01)]  # median, min, max, spread %


def test_a_verdict_that_flips_between_repeats_is_named(pytester):
    result, run = _run(pytester, {1: 10.0, 2: 12.0, 3: 30.0}, "--day0-repeat", "3")
    (stab,) = _checks(run, STABILITY_ID)
    assert stab["status"] == "error"
    assert stab["message"] == "unstable: latency.ttft_p99 passed 2 of 3, failed 1 of 3"
    assert run["verdict"] == "rejected"  # the failing repeat measured the deployment outside its limit
    result.stdout.fnmatch_lines(["*unstable: latency.ttft_p99 passed 2 of 3, failed 1 of 3*"])


def test_without_repeat_nothing_is_parametrized(pytester):
    result, run = _run(pytester, {1: 10.0})
    result.assert_outcomes(passed=3)
    assert [c["repeat"] for c in _checks(run, "latency.ttft_p99")] == [None]
    assert not _checks(run, STABILITY_ID)


def test_repeat_must_be_a_positive_whole_number(pytester):
    pytester.makepyfile(SUITE.format(values={1: 1.0}))
    result = pytester.runpytest("--day0-out", "out", "--day0-repeat", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--day0-repeat '0': expected a whole number >= 1*"])


def _record(tmp_path, rows):
    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r", {}, {"name": "p"}, ["kvcache"])
    for repeat, status, value in rows:
        log.check("kvcache", Check(id="kvcache.blackbox_fragmentation", title="t", status=status, value=value,
                                   unit="%", repeat=repeat))
    log.run_finished(0)
    return rebuild(tmp_path)


def test_stability_counts_an_error_in_one_repeat_as_a_flip(tmp_path):
    rec = _record(tmp_path, [(1, "pass", 0.5), (2, "error", None), (3, "pass", 0.6)])
    check = stability_check(rec, 3)
    assert check.status == "error" and "kvcache.blackbox_fragmentation passed 2 of 3, errored 1 of 3" in check.message
    row = check.evidence["table"]["rows"][0]
    assert row[2:6] == [None, None, None, None] and row[-1] == "UNSTABLE"  # no spread over a missing value


def test_checks_repeated_within_one_repeat_are_kept_apart(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r", {}, {"name": "p"}, ["collectives"])
    for repeat in (1, 2):
        for op, value in (("a", 1.0), ("b", 5.0 + repeat)):
            log.check("collectives", Check(id="collectives.busbw", title=op, status="pass", value=value,
                                           repeat=repeat))
    log.run_finished(0)
    groups = series(rebuild(tmp_path))
    assert [s.values for s in groups] == [[1.0, 1.0], [6.0, 7.0]]


def test_the_widest_spread_named_is_a_performance_figure(tmp_path):
    """A cross-check whose median is near 0 (client vs engine, ms apart) has a huge relative
    spread that says nothing; the summary names the widest performance figure instead."""
    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r", {}, {"name": "p"}, ["latency"])
    for repeat, (agree, ttft) in enumerate([(0.01, 100.0), (0.5, 120.0)], 1):
        log.check("latency", Check(id="latency.server_agreement", title="t", status="pass", value=agree,
                                   unit="ms", repeat=repeat))
        log.check("latency", Check(id="latency.ttft_p99", title="t", status="pass", value=ttft, unit="ms",
                                   repeat=repeat, performance=True))
    log.run_finished(0)
    check = stability_check(rebuild(tmp_path), 2)
    assert check.status == "pass" and "widest spread latency.ttft_p99" in check.message
