"""JUnit XML from a run record, so CI systems show each Day0 check as a test case.

One testcase per check (classname = stage, name = check id). fail -> <failure>, error ->
<error>, skip and blocked -> <skipped> (a blocked check did not run because an earlier stage
failed; CI has no closer word). Built from the run record only, like the HTML report.

A testcase's ``time`` is the part of its pytest test's time that went into this check: a check's
``duration_s`` is stamped when it is recorded (seconds since the test's set-up began), so the
first check of a test gets the time up to it and each later one the time since the one before;
a test's checks add up to the test's time, and a suite's time is the sum of its testcases.
A record without durations (older runs, checks made outside pytest) says "0", as before.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from day0.core.outputs import write_file
from day0.core.record import Check, RunRecord

# XML 1.0 forbids most control characters; an engine log excerpt may well contain them.
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(value: Any) -> str:
    """Text safe for an XML 1.0 attribute or element (illegal characters become U+FFFD)."""
    return _ILLEGAL_XML.sub("\ufffd", "" if value is None else str(value))


def _detail(check: Check) -> str:
    lines = [
        f"status: {check.status}",
        f"value: {check.value!r} {check.unit}".rstrip(),
        f"limit: {check.limit!r} ({check.direction})",
        f"message: {check.message}",
    ]
    if check.source:
        lines.append(f"source: {check.source}")
    excerpt = check.evidence.get("log_excerpt") if isinstance(check.evidence, dict) else None
    if isinstance(excerpt, str) and excerpt.strip():
        lines += ["", "engine log excerpt:", excerpt[-20000:]]
    return xml_text("\n".join(lines))


def check_seconds(checks: list[Check]) -> list[float]:
    """Each check's own share of its test's time, in the order given (see the module docstring)."""
    last: dict[tuple[str, int | None], float] = {}
    out = []
    for c in checks:
        d = c.duration_s
        if d is None or not c.nodeid:
            out.append(max(0.0, d or 0.0))
            continue
        key = (c.nodeid, c.repeat)
        prev = last.get(key, 0.0)
        out.append(max(0.0, d - prev))
        last[key] = max(prev, d)
    return out


def _seconds(x: float) -> str:
    return f"{x:.3f}"


def junit_tree(record: RunRecord) -> ET.ElementTree:
    root = ET.Element("testsuites", name=xml_text(f"day0 {record.run_id}"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    host = record.environment.get("host") or record.environment.get("hostname") or ""
    all_checks = list(record.checks())
    seconds = dict(zip(map(id, all_checks), check_seconds(all_checks)))
    total_s = 0.0
    for stage in record.stages:
        checks_s = sum(seconds.get(id(c), 0.0) for c in stage.checks)
        stage_s = stage.duration_s if stage.duration_s is not None else checks_s  # its tests' wall time, when timed
        counts = {
            "tests": len(stage.checks),
            "failures": sum(c.status == "fail" for c in stage.checks),
            "errors": sum(c.status == "error" for c in stage.checks),
            "skipped": sum(c.status in ("skip", "blocked") for c in stage.checks),
        }
        suite = ET.SubElement(
            root,
            "testsuite",
            name=xml_text(stage.name),
            timestamp=xml_text(record.started_at),
            hostname=xml_text(host),
            time=_seconds(stage_s),
            **{k: str(v) for k, v in counts.items()},
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="stage_verdict", value=xml_text(stage.verdict))
        if stage.info is not None:
            ET.SubElement(props, "property", name="stage_title", value=xml_text(stage.title))
            ET.SubElement(props, "property", name="stage_question", value=xml_text(stage.question))
        for check in stage.checks:
            case = ET.SubElement(suite, "testcase", classname=xml_text(stage.name), name=xml_text(check.id),
                                 time=_seconds(seconds.get(id(check), 0.0)))
            msg = xml_text(check.message)
            if check.status == "fail":
                ET.SubElement(case, "failure", message=msg, type="fail").text = _detail(check)
            elif check.status == "error":
                ET.SubElement(case, "error", message=msg, type="error").text = _detail(check)
            elif check.status == "skip":
                ET.SubElement(case, "skipped", message=msg)
            elif check.status == "blocked":
                ET.SubElement(case, "skipped", message=xml_text(f"blocked: {check.message}"))
            ET.SubElement(case, "system-out").text = _detail(check)
        for k in totals:
            totals[k] += counts[k]
        total_s += stage_s
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", _seconds(total_s))
    return ET.ElementTree(root)


def write_junit(record: RunRecord, path: Path) -> Path:
    """Write JUnit XML for ``record`` to ``path`` (a directory gets ``junit.xml``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "junit.xml"
    tree = junit_tree(record)
    ET.indent(tree)
    buf = io.BytesIO()
    tree.write(buf, encoding="utf-8", xml_declaration=True)
    return write_file(path, buf.getvalue())
