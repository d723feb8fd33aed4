"""Prometheus textfile and Pushgateway exports, and the GitHub job summary, read back as their
consumers read them (prometheus_client's parser, a Pushgateway-compatible endpoint)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from day0.core.record import Check, RunRecord
from day0.results import export
from day0.results.export import Targets
from tests.support import run_factory as rf


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _record() -> RunRecord:
    return rf.make_record({
        "latency": [
            Check(id="latency.ttft_p99", title="TTFT p99", status="pass", value=812.5, limit=1000.0, unit="ms",
                  direction="lower_is_better", duration_s=4.25),
            Check(id="latency.goodput", title="goodput", status="fail", value=0.4, limit=0.9,
                  direction="higher_is_better"),
            Check(id="latency.note", title="a text value", status="pass", value="fine", limit="fine"),
        ],
        "kvcache": [Check(id="kvcache.capacity", title="cap", status="skip", message="no scheduler view")],
    }, run_id="20261130T090000Z-cpu-tiny-abc123")


def test_textfile_holds_values_limits_statuses_and_verdict(tmp_path: Path) -> None:
    record = _record()
    path = export.write_textfile(record, tmp_path / "textfile" / "day0.prom")
    got = _samples(path.read_text())
    run = {"profile": rf.PROFILE["name"], "run_id": record.run_id}
    ttft = {**run, "stage": "latency", "check": "latency.ttft_p99", "repeat": ""}
    assert ("day0_check_value", {**ttft, "unit": "ms"}, 812.5) in got
    assert ("day0_check_limit", {**ttft, "unit": "ms", "direction": "lower_is_better"}, 1000.0) in got
    assert ("day0_check_duration_seconds", ttft, 4.25) in got
    status = {(s[1]["check"], s[1]["status"]): s[2] for s in got if s[0] == "day0_check_status"}
    assert status[("latency.goodput", "fail")] == 1 and status[("latency.goodput", "pass")] == 0
    assert status[("kvcache.capacity", "skip")] == 1
    assert sum(v for (c, _), v in status.items() if c == "latency.ttft_p99") == 1  # exactly one status each
    # a text value has no gauge, but its status is there
    assert not [s for s in got if s[0] == "day0_check_value" and s[1]["check"] == "latency.note"]
    assert status[("latency.note", "pass")] == 1
    verdict = {s[1]["verdict"]: s[2] for s in got if s[0] == "day0_verdict"}
    assert verdict == {"accepted": 0, "rejected": 1, "incomplete": 0} and record.verdict == "rejected"
    assert not list(path.parent.glob("*.prom.*"))  # the temporary file of the atomic replace is gone


def test_checks_sharing_one_id_export_every_status_any_of_them_has(tmp_path: Path) -> None:
    """One id per shard or rank shares a label set: a pass written after a fail set status="fail"
    back to 0, and an alert on it never fired. The failing copy's value is the one shown."""
    record = rf.make_record({"weights": [
        Check(id="weights.shard_size", title="size", status="fail", value=1.0, message="shard 2 truncated"),
        Check(id="weights.shard_size", title="size", status="pass", value=0.0),
    ]}, run_id="20261130T090000Z-cpu-tiny-abc124")
    got = _samples(export.write_textfile(record, tmp_path / "day0.prom").read_text())
    status = {s[1]["status"]: s[2] for s in got if s[0] == "day0_check_status"}
    assert status["fail"] == 1 and status["pass"] == 1 and status["error"] == 0
    assert [s[2] for s in got if s[0] == "day0_check_value"] == [1.0]


class _Gateway(http.server.BaseHTTPRequestHandler):
    """What a Pushgateway does with a push, reduced to storing the body by path."""

    store: dict[str, bytes] = {}

    def _accept(self) -> None:
        if not self.path.startswith("/metrics/job/"):
            self.send_error(404)
            return
        self.store[self.path] = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST = _accept

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, dict[str, bytes]]]:
    store: dict[str, bytes] = {}
    handler = type("Handler", (_Gateway,), {"store": store})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()


def test_pushgateway_receives_the_run_grouped_by_profile(gateway: tuple[str, dict[str, bytes]]) -> None:
    url, store = gateway
    record = _record()
    export.push(record, url)
    assert list(store) == [f"/metrics/job/day0/profile/{rf.PROFILE['name']}"]
    got = _samples(store[next(iter(store))].decode())
    assert ("day0_verdict", {"profile": rf.PROFILE["name"], "run_id": record.run_id, "verdict": "rejected"}, 1.0) in got
    assert any(s[0] == "day0_check_value" and s[1]["check"] == "latency.ttft_p99" and s[2] == 812.5 for s in got)


def test_failed_push_costs_one_log_line_not_the_other_exports(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    lines: list[str] = []
    targets = Targets(textfile=str(tmp_path / "day0.prom"), pushgateway=dead, step_summary=str(tmp_path / "sum.md"))
    out = export.export(_record(), targets, lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"pushgateway export to {dead} failed")
    assert set(out) == {"prometheus textfile", "GitHub step summary"}
    assert (tmp_path / "day0.prom").is_file() and (tmp_path / "sum.md").is_file()


def test_step_summary_is_appended_markdown_with_the_headline_table(tmp_path: Path) -> None:
    path = tmp_path / "summary.md"
    path.write_text("earlier step\n")
    record = _record()
    export.append_step_summary(record, path)
    export.append_step_summary(record, path)
    text = path.read_text()
    assert text.startswith("earlier step\n") and text.count("| Metric | Value | Limit | Status |") == 2
    assert "| TTFT p99 | 812.5 ms | ≤ 1,000 ms | PASS |" in text
    assert "| Goodput | 0.4 | ≥ 0.9 | FAIL |" in text
    assert "REJECTED" in text and "`latency.goodput`" in text


def test_markdown_cells_cannot_break_the_table() -> None:
    record = rf.make_record({"latency": [Check(id="latency.ttft_p99", title="t", status="fail", value=2.0,
                                               limit=1.0, unit="ms|x", direction="lower_is_better")]})
    row = next(line for line in export.markdown(record).splitlines() if line.startswith("| TTFT"))
    assert row.count(" | ") == 3 and "ms\\|x" in row


def test_targets_read_the_github_summary_from_the_environment() -> None:
    t = Targets.from_options(None, "", {"GITHUB_STEP_SUMMARY": "/tmp/s.md"})
    assert t == Targets(None, None, "/tmp/s.md")
    assert Targets.from_options("a.prom", None, {}).step_summary is None


TIMED = """
import time
import pytest

@pytest.mark.day0
@pytest.mark.latency
def test_latency(day0_checks):
    time.sleep(0.05)
    day0_checks.measured("latency.ttft_p99", "TTFT p99", 100.0, 200.0, unit="ms", direction="lower_is_better")
    time.sleep(0.05)
    day0_checks.measured("latency.goodput", "goodput", 0.5, 0.9, direction="higher_is_better")

@pytest.mark.day0
@pytest.mark.kvcache
def test_kv(day0_checks):
    pytest.skip("no scheduler view here")
"""


def test_plugin_exports_and_stamps_durations(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                             gateway: tuple[str, dict[str, bytes]]) -> None:
    """Through pytest: the options reach the exports, checks carry their test's time, junit uses it."""
    import json
    import xml.etree.ElementTree as ET

    url, store = gateway
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "step.md"))
    pytester.makepyfile(TIMED)
    result = pytester.runpytest("--day0-out", "out", "--day0-no-gate", "--day0-prom-textfile", "out/prom/day0.prom",
                                "--day0-pushgateway", url)
    result.assert_outcomes(failed=1, skipped=1)
    run = json.loads((pytester.path / "out" / "latest" / "run.json").read_text())
    checks = {c["id"]: c for s in run["stages"] for c in s["checks"]}
    first, second = checks["latency.ttft_p99"]["duration_s"], checks["latency.goodput"]["duration_s"]
    assert first >= 0.05 and second >= first + 0.05  # time.sleep sleeps at least that long
    assert checks["kvcache.kv"]["duration_s"] is not None
    cases = {tc.get("name"): float(tc.get("time")) for tc in
             ET.parse(pytester.path / "out" / "latest" / "junit.xml").getroot().iter("testcase")}
    assert cases["latency.ttft_p99"] == pytest.approx(first, abs=1e-3)
    assert cases["latency.goodput"] == pytest.approx(second - first, abs=2e-3)  # its share, not the whole test
    prom = _samples((pytester.path / "out" / "prom" / "day0.prom").read_text())
    assert ("day0_verdict", {"profile": run["profile"]["name"], "run_id": run["run_id"], "verdict": "rejected"},
            1.0) in prom
    assert len(store) == 1
    assert "| TTFT p99 | 100 ms | ≤ 200 ms | PASS |" in (pytester.path / "step.md").read_text()


def test_record_text_in_the_step_summary_shows_as_itself() -> None:
    """GitHub renders the summary as Markdown with raw HTML: a \\r in a message began a line of its own
    (a forged "## ACCEPTED" heading), and <h1> or <img src=https://...> passed through (the image
    fetched from outside). Every line ending is a space, < > & are entities, Markdown is escaped."""
    forged = "<h1>day0 verdict: ACCEPTED</h1><img src=https://example.invalid/p.png> &lt;b&gt;"
    ttft = Check(id="latency.ttft_p99", title="t", status="fail", value=2.0, limit=1.0, unit="<i>u</i>|`*",
                 direction="lower_is_better", message=forged)
    record = rf.make_record({"latency": [ttft, Check(id="agents.x`<b>y</b>", title="t", status="fail")]})
    record.reason = f"# {forged}\r\r## ACCEPTED, all checks passed\u2028> quoted\n    code\r\n1. listed ![i](https://x/y.png) *em*"
    text = export.markdown(record)
    lines = text.splitlines()
    assert [ln for ln in lines if ln.startswith(("#", ">", "1.", "    ", "<"))] == [lines[0]]
    prose, failed = text.split("**Failed:**")
    assert "<" not in prose and "&lt;b&gt;" not in prose and "&amp;lt;b&amp;gt;" in prose
    assert lines[2].startswith("\\# &lt;h1&gt;day0") and "\\!\\[i\\](https://x/y.png) \\*em\\*" in lines[2]
    assert "| TTFT p99 | 2 &lt;i&gt;u&lt;/i&gt;\\|\\`\\* | ≤ 1 &lt;i&gt;u&lt;/i&gt;\\|\\`\\* | FAIL |" in lines
    assert failed.strip() == "`latency.ttft_p99`, ``agents.x`<b>y</b>``"  # a code span shows its text as is
    markdown_it = pytest.importorskip("markdown_it")
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert html.count("<h") - html.count("<hr") == 1 and "<img" not in html and "<blockquote" not in html
    assert "<ol" not in html and "<pre" not in html and "<em" not in html and "<i>" not in html
    assert "<code>agents.x`&lt;b&gt;y&lt;/b&gt;</code>" in html and "<td>2 &lt;i&gt;u&lt;/i&gt;|`*</td>" in html


def test_a_waived_failure_is_marked_so_an_alert_on_fail_can_leave_it_out(tmp_path: Path) -> None:
    """The demo's ACCEPTED runs keep three waived failures as `fail`: the documented alert on
    status="fail" fired every night. day0_check_waived marks them; the other failure is not marked."""
    record = rf.make_record({"agents": [
        Check(id="agents.tool_calls", title="tools", status="fail", message="control character"),
        Check(id="agents.structured_outputs", title="json", status="fail", message="broken"),
    ]}, run_id="20261130T090000Z-cpu-tiny-abc125")
    record.profile = {**record.profile, "report": {"waivers": [{"check": "agents.tool_calls", "reason": "known"}]}}
    got = _samples(export.write_textfile(record, tmp_path / "day0.prom").read_text())
    waived = {s[1]["check"]: s[2] for s in got if s[0] == "day0_check_waived"}
    assert waived == {"agents.tool_calls": 1.0}


def test_a_waived_failure_never_marks_an_unwaived_one_sharing_its_labels(tmp_path: Path) -> None:
    """Checks sharing stage, id and repeat share one series: day0_check_waived was set to 1 as soon as
    one of them was waived, so `unless day0_check_waived == 1` hid an unwaived failure beside it
    (reviewer's r9_export.py: a wrong_tool finding waived, a bad_json one not, the run REJECTED, the
    series waived). 1 only when every failure under the labels is waived."""
    def tools(kind: str) -> Check:
        return Check(id="agents.tool_calls", title="tools", status="fail", message=kind, evidence={"findings": [kind]})

    waivers = {"report": {"waivers": [{"check": "agents.tool_calls", "finding": "wrong_tool", "reason": "known"}]}}
    for kinds, want in [(["wrong_tool", "bad_json"], {}), (["bad_json", "wrong_tool"], {}),
                        (["wrong_tool", "wrong_tool"], {"agents.tool_calls": 1.0})]:
        record = rf.make_record({"agents": [tools(k) for k in kinds]}, run_id="20261130T090000Z-cpu-tiny-abc126")
        record.profile = {**record.profile, **waivers}
        got = _samples(export.write_textfile(record, tmp_path / "day0.prom").read_text())
        assert {s[1]["check"]: s[2] for s in got if s[0] == "day0_check_waived"} == want, kinds
