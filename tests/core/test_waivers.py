"""A waiver ([report] waivers) turns a known failure into one the run is accepted with, shown as
such: the check stays fail, its stage's verdict is "waived" (never "pass"), the run's reason names
it, and a failure of any other kind in the same check, an expired waiver, or a check the glob does
not match still rejects. Read from the record's own profile, so a reread gives the same verdict."""

import json

import pytest

from day0.config.profile import ProfileError, load_profile
from day0.core.events import EventLog, rebuild
from day0.core.record import Check, load
from day0.core.verdict import Waiver, stage_verdict, waiver_for
from day0.results.report import render, summary_lines

XGRAMMAR = Waiver("agents.structured_outputs", "xgrammar admits raw control characters (xgrammar#286)",
                  "control_character")


def _fail(cid="agents.structured_outputs", kinds=("control_character",)):
    return Check(id=cid, title="t", status="fail", message="17 of 30 valid", evidence={"findings": list(kinds)})


@pytest.mark.parametrize("check, waiver, covered", [
    (_fail(), XGRAMMAR, True),
    (_fail(kinds=("control_character", "schema")), XGRAMMAR, False),  # a second kind is not covered
    (_fail(kinds=()), XGRAMMAR, False),
    (_fail(kinds=({"kind": "control_character"},)), XGRAMMAR, False),  # a site stage's object: was a TypeError
    (_fail(kinds=("control_character", ["x"])), XGRAMMAR, False),
    (_fail("agents.tool_calls"), XGRAMMAR, False),
    (_fail("agents.tool_calls.streamed"), Waiver("agents.tool_calls*", "r" * 10, "control_character"), True),
    (_fail(kinds=("schema",)), Waiver("agents.structured_outputs", "r" * 10), True),  # no finding: any failure
    (Check(id="agents.structured_outputs", title="t", status="error"), XGRAMMAR, False),
])
def test_what_a_waiver_covers(check, waiver, covered):
    assert (waiver_for(check, [waiver], "2026-12-02T00:00:00Z") is not None) == covered


def test_a_waiver_past_its_last_day_covers_nothing():
    w = Waiver("agents.structured_outputs", "r" * 10, "control_character", until="2026-12-01")
    assert waiver_for(_fail(), [w], "2026-12-01T23:59:59Z") is not None
    assert waiver_for(_fail(), [w], "2026-12-02T00:00:01Z") is None


def test_a_stage_with_only_waived_failures_is_waived_never_pass():
    ok = Check(id="agents.chat_template", title="t", status="pass")
    assert stage_verdict([ok, _fail()], [XGRAMMAR]) == "waived"
    assert stage_verdict([ok, _fail()]) == "fail"
    assert stage_verdict([ok, _fail(), _fail("agents.tool_calls")], [XGRAMMAR]) == "fail"
    assert stage_verdict([_fail(), Check(id="x", title="t", status="error")], [XGRAMMAR]) == "error"


def _run(tmp_path, waivers, checks):
    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r-w", {"host": "h"}, {"name": "p", "report": {"waivers": waivers}}, ["weights", "agents"])
    log.check("weights", Check(id="weights.index", title="t", status="pass"))
    for c in checks:
        log.check("agents", c)
    log.run_finished(0)
    return rebuild(tmp_path)


WAIVER = {"check": "agents.structured_outputs", "finding": "control_character",
          "reason": "xgrammar admits raw control characters (mlc-ai/xgrammar#286)"}


def test_a_run_with_a_waived_failure_is_accepted_saying_so_and_rereads_the_same(tmp_path):
    rec = _run(tmp_path, [WAIVER], [_fail()])
    assert rec.verdict == "accepted" and rec.stage("agents").verdict == "waived"
    assert rec.reason == ("every stage ran and passed but for 1 waived known failure(s): agents.structured_outputs: "
                          "xgrammar admits raw control characters (mlc-ai/xgrammar#286)")
    assert rec.stage("agents").checks[0].status == "fail"
    again = load(tmp_path / "run.json")
    assert (again.verdict, again.reason) == (rec.verdict, rec.reason)
    lines = summary_lines(rec, {})
    assert any(line.startswith("  FAIL (waived by the profile) agents.structured_outputs") for line in lines)
    html = render(tmp_path / "run.json", tmp_path).read_text()
    assert "Known failures, waived by the profile (1)" in html and "mlc-ai/xgrammar#286" in html


def test_the_same_failure_without_the_waiver_or_with_another_kind_rejects(tmp_path):
    assert _run(tmp_path / "a", [], [_fail()]).verdict == "rejected"
    rec = _run(tmp_path / "b", [WAIVER], [_fail(kinds=("control_character", "http_error"))])
    assert rec.verdict == "rejected" and rec.stage("agents").verdict == "fail"


def test_a_record_claiming_pass_for_a_waived_stage_is_refused(tmp_path):
    _run(tmp_path, [WAIVER], [_fail()])
    data = json.loads((tmp_path / "run.json").read_text())
    data["stages"][1]["verdict"] = "pass"
    (tmp_path / "forged.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match="contradicts itself"):
        load(tmp_path / "forged.json")


@pytest.mark.parametrize("waiver, key", [
    ({"check": "agents.x", "reason": "short"}, "reason"),
    ({"check": "agents x", "reason": "a long enough reason"}, "check"),
    ({"check": "agents.x", "reason": "a long enough reason", "until": "next week"}, "until"),
    ({"check": "agents.x", "reason": "a long enough reason", "until": "2024-13-45"}, "until"),  # the shape of a date
])
def test_a_malformed_waiver_is_refused_naming_the_key(waiver, key):
    with pytest.raises(ProfileError, match=key):
        load_profile("cpu-tiny", overrides={"report": {"waivers": [waiver]}})


def test_the_headline_says_waived_beside_fail(tmp_path):
    from day0.results.summary import headline_rows, summarize

    rec = _run(tmp_path, [WAIVER], [_fail()])
    rows = {r[0]: r for r in headline_rows(summarize(rec))}
    assert rows["Structured outputs valid"][3] == "FAIL (waived)"
    unwaived = {r[0]: r for r in headline_rows(summarize(_run(tmp_path / "b", [], [_fail()])))}
    assert unwaived["Structured outputs valid"][3] == "FAIL"
