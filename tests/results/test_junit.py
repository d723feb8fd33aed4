"""JUnit XML: one testcase per check, statuses mapped the way CI systems read them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from day0.core.record import Check
from day0.results.junit import write_junit, xml_text
from tests.support import run_factory as rf

KIND = {"fail": "failure", "error": "error", "skip": "skipped", "blocked": "skipped", "pass": None}


def _cases(root: ET.Element) -> list[ET.Element]:
    return list(root.iter("testcase"))


def test_one_testcase_per_check_with_status_mapping(tmp_path: Path) -> None:
    record = rf.blocked_stages()
    record.stage("weights").checks.append(Check(id="weights.extra_skip", title="skip", status="skip", message="n/a"))
    record.stage("weights").checks.append(Check(id="weights.crashed", title="err", status="error", message="boom"))
    path = write_junit(record, tmp_path)
    assert path == tmp_path / "junit.xml"
    root = ET.parse(path).getroot()
    checks = [(s.name, c) for s in record.stages for c in s.checks]
    cases = _cases(root)
    assert [(tc.get("classname"), tc.get("name")) for tc in cases] == [(s, c.id) for s, c in checks]
    for tc, (_, c) in zip(cases, checks, strict=True):
        children = [ch.tag for ch in tc if ch.tag != "system-out"]
        assert children == ([KIND[c.status]] if KIND[c.status] else []), c.id
        if c.status == "blocked":
            assert tc.find("skipped").get("message").startswith("blocked: ")
        if c.status in ("fail", "error"):
            assert tc.find(KIND[c.status]).get("message") == c.message
    assert root.get("tests") == str(len(checks))
    assert root.get("failures") == str(sum(c.status == "fail" for _, c in checks))
    assert root.get("errors") == "1"
    assert root.get("skipped") == str(sum(c.status in ("skip", "blocked") for _, c in checks))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [s.name for s in record.stages]


def test_failure_carries_values_and_log_excerpt(tmp_path: Path) -> None:
    record = rf.rejected()
    root = ET.parse(write_junit(record, tmp_path / "out.xml")).getroot()
    failed = next(c for c in record.checks() if c.status == "fail")
    tc = next(t for t in _cases(root) if t.get("name") == failed.id)
    text = tc.find("failure").text
    assert f"value: {failed.value!r} {failed.unit}" in text and f"limit: {failed.limit!r}" in text
    assert "engine log excerpt:" in text and "WARNING queue saturated" in text


@given(st.text(max_size=200))
def test_any_message_gives_parseable_xml(message: str) -> None:
    import tempfile

    record = rf.make_record({"latency": [Check(id="latency.x", title="x", status="fail", message="m")]})
    record.stage("latency").checks[0].message = message  # bypass one_line: raw control characters too
    with tempfile.TemporaryDirectory() as d:
        root = ET.parse(write_junit(record, Path(d) / "j.xml")).getroot()
    got = root.find(".//failure").get("message")
    assert got == xml_text(message)


def _timed(nodeid: str, cid: str, duration: float | None, repeat: int | None = None) -> Check:
    return Check(id=cid, title=cid, status="pass", nodeid=nodeid, duration_s=duration, repeat=repeat)


def test_testcase_time_is_each_checks_share_of_its_test(tmp_path: Path) -> None:
    """A check's duration_s is the time since its test began; the testcases of one test split it."""
    record = rf.make_record({
        "latency": [_timed("t.py::a", "latency.x", 2.0), _timed("t.py::a", "latency.y", 5.5),
                    _timed("t.py::b", "latency.z", 1.25)],
        "kvcache": [_timed("t.py::c[repeat1]", "kvcache.k", 3.0, 1), _timed("t.py::c[repeat2]", "kvcache.k", 4.0, 2),
                    Check(id="kvcache.old", title="from an older record", status="skip")],
    })
    root = ET.parse(write_junit(record, tmp_path)).getroot()
    times = [float(tc.get("time")) for tc in _cases(root)]
    assert times == [2.0, 3.5, 1.25, 3.0, 4.0, 0.0]
    suites = {s.get("name"): float(s.get("time")) for s in root.findall("testsuite")}
    assert suites == {"latency": 6.75, "kvcache": 7.0}
    assert float(root.get("time")) == 13.75


def test_check_without_duration_still_loads_and_says_zero(tmp_path: Path) -> None:
    from day0.core.record import parse_record

    record = rf.accepted()
    data = record.to_dict()
    for s in data["stages"]:
        for c in s["checks"]:
            c.pop("duration_s")  # a run.json from before the field
    import json

    old = parse_record(json.dumps(data), "old run.json")
    assert all(c.duration_s is None for c in old.checks())
    root = ET.parse(write_junit(old, tmp_path)).getroot()
    assert {tc.get("time") for tc in _cases(root)} == {"0.000"}
