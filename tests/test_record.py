"""The run record: judging, the crash-safe event log, rebuilding, loading old and new schemas."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.core.record import (
    SCHEMA_VERSION,
    Check,
    EventLog,
    RecordError,
    build,
    judge,
    load,
    measured,
    read_events,
    rebuild,
    stage_verdict,
)

numbers = st.floats(allow_nan=False, allow_infinity=False, width=32)


@given(numbers, numbers)
def test_judge_follows_the_direction(value, limit):
    assert judge(value, limit, "lower_is_better") == (value <= limit)
    assert judge(value, limit, "higher_is_better") == (value >= limit)
    assert judge(value, limit, "exact") == (value == limit)
    assert judge(value, None, "lower_is_better")  # no limit: a recorded figure


def test_nan_never_meets_a_limit():
    assert not judge(float("nan"), 1.0, "lower_is_better")
    assert not judge(None, 1.0, "higher_is_better")


def test_measured_sets_status_and_a_readable_message():
    ok = measured("latency.ttft_p99", "TTFT p99", 120.0, 200.0, unit="ms", direction="lower_is_better")
    bad = measured("latency.ttft_p99", "TTFT p99", 250.0, 200.0, unit="ms", direction="lower_is_better")
    assert ok.status == "pass" and bad.status == "fail"
    assert bad.message == "250 ms misses the limit (<= 200 ms)"


def test_check_rejects_unknown_status_and_flattens_messages():
    with pytest.raises(ValueError, match="status"):
        Check(id="x", title="x", status="ok")  # type: ignore[arg-type]
    assert Check(id="x", title="x", status="pass", message="a\nb\n  c").message == "a b c"


@pytest.mark.parametrize(
    "statuses, verdict",
    [([], "not_run"), (["pass", "skip"], "pass"), (["pass", "fail"], "fail"), (["error", "pass"], "error"),
     (["blocked", "blocked"], "blocked"), (["skip"], "skip"), (["fail", "error"], "fail")],
)
def test_stage_verdict(statuses, verdict):
    assert stage_verdict([Check(id=str(i), title="", status=s) for i, s in enumerate(statuses)]) == verdict


def _log(tmp_path, finished=True, checks=(("weights", "pass"),)):
    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r1", {"host": "h"}, {"name": "p"}, ["weights", "latency"])
    for n, (stage, status) in enumerate(checks):
        log.check(stage, Check(id=f"{stage}.c{n}", title="t", status=status, value=n, evidence={"samples": [1.5, 2]}))
    if finished:
        log.run_finished(0)
    return log


def test_a_run_with_every_stage_passing_is_accepted(tmp_path):
    _log(tmp_path, checks=(("weights", "pass"), ("latency", "pass")))
    rec = rebuild(tmp_path)
    assert rec.verdict == "accepted"
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert [s["name"] for s in data["stages"]] == ["weights", "latency"]
    assert data["stages"][0]["checks"][0]["evidence"]["samples"] == [1.5, 2]


def test_a_failed_check_rejects_with_its_reason(tmp_path):
    _log(tmp_path, checks=(("weights", "fail"), ("latency", "blocked")))
    rec = rebuild(tmp_path)
    assert rec.verdict == "rejected" and rec.reason.startswith("stage weights fail: weights.c0")
    assert rec.stage("latency").verdict == "blocked"


def test_a_check_that_could_not_measure_leaves_the_run_incomplete_not_rejected(tmp_path):
    _log(tmp_path, checks=(("weights", "pass"), ("latency", "error"), ("latency", "error")))
    rec = rebuild(tmp_path)
    assert rec.verdict == "incomplete"
    assert rec.reason.startswith("could not measure: latency.c1") and "1 more not measured" in rec.reason
    assert rec.stage("latency").verdict == "error"


def test_a_fail_rejects_even_beside_an_error(tmp_path):
    _log(tmp_path, checks=(("weights", "error"), ("latency", "fail")))
    rec = rebuild(tmp_path)
    assert rec.verdict == "rejected" and rec.reason.startswith("stage latency fail: latency.c1")


def test_stages_not_run_leave_the_run_incomplete(tmp_path):
    _log(tmp_path)
    rec = rebuild(tmp_path)
    assert rec.verdict == "incomplete" and "latency" in rec.reason


def test_a_killed_run_with_a_torn_last_line_rebuilds_as_incomplete(tmp_path):
    _log(tmp_path, finished=False)
    with (tmp_path / "events.jsonl").open("a") as fh:
        fh.write('{"type": "check", "stage": "weights", "check": {"id": "half')  # died mid-write
    rec = rebuild(tmp_path)
    assert rec.verdict == "incomplete" and rec.finished_at is None
    assert [c.id for c in rec.checks()] == ["weights.c0"]


def test_a_corrupt_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    _log(tmp_path)
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    lines.insert(1, "garbage")
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=r"events.jsonl:2: not a JSON event"):
        list(read_events(tmp_path / "events.jsonl"))


def test_build_needs_a_start_event():
    with pytest.raises(RecordError, match="no run_started"):
        build([{"type": "check", "stage": "weights", "check": {"id": "x", "title": "", "status": "pass"}}])


def test_load_round_trips_and_refuses_newer_or_foreign_files(tmp_path):
    _log(tmp_path)
    rec = rebuild(tmp_path)
    again = load(tmp_path)
    assert again.to_dict() == rec.to_dict()
    data = json.loads((tmp_path / "run.json").read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "new.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match="newer"):
        load(tmp_path / "new.json")
    (tmp_path / "foreign.json").write_text("{}")
    with pytest.raises(RecordError, match="not a day0 run record"):
        load(tmp_path / "foreign.json")
    with pytest.raises(RecordError, match="not found"):
        load(tmp_path / "missing.json")


def test_evidence_with_numpy_and_nan_is_stored(tmp_path):
    import numpy as np

    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r", {}, {}, ["weights"])
    log.check("weights", Check(id="w", title="", status="pass", value=np.float32(1.5),
                               evidence={"a": np.arange(3), "nan": float("nan")}))
    rec = rebuild(tmp_path)
    c = next(rec.checks())
    assert c.value == 1.5 and c.evidence == {"a": [0, 1, 2], "nan": None}
