"""JUnit XML: one testcase per check, statuses mapped the way CI systems read them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from day0.core.record import Check
from day0.results.junit import write_junit, xml_text

import run_factory as rf

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
