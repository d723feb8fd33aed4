"""The report opened from disk in real headless Chromium: it renders, draws its charts, logs no
console errors and makes no network requests.

The browser is driven over the Chrome DevTools protocol on ``--remote-debugging-pipe`` (fds 3
and 4, NUL-separated JSON), so no port, websocket library or network stack is involved.
The tests that need Chromium are marked ``host("browser")`` (tests/support/host.py): without it
they are skipped locally and fail when CI=true (CI must not silently lose them).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from day0.results.report import render
from tests.support import host
from tests.support import run_factory as rf

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
    "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe", "--window-size=1280,1700",
)


@dataclass
class PageResult:
    evaluated: dict[str, Any]
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    screenshot: bytes = b""


class CDPPipe:
    """Minimal CDP client over Chromium's debugging pipe; every wait has a deadline."""

    def __init__(self, proc: subprocess.Popen, wfd: int, rfd: int) -> None:
        self.proc, self.wfd, self.rfd = proc, wfd, rfd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer on the debugging pipe in time")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if ready:
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the debugging pipe (exit {self.proc.poll()})")
                self.buf += chunk
        raw, _, self.buf = self.buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 20) -> dict:
        mid = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 20) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method:
                return msg
            self.events.append(msg)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read(deadline))
        except TimeoutError:
            pass


PROBE = """JSON.stringify({
  verdict: document.querySelector('#verdict') && document.querySelector('#verdict').textContent.trim(),
  reason: document.querySelector('#verdict-reason') && document.querySelector('#verdict-reason').textContent.trim(),
  charts: document.querySelectorAll('svg.chart').length,
  chartsWithSize: Array.from(document.querySelectorAll('svg.chart')).filter(s => s.getBoundingClientRect().width > 100).length,
  polylines: document.querySelectorAll('svg.chart polyline').length,
  stageRows: document.querySelectorAll('.stage-table tbody tr').length,
  injected: document.querySelectorAll('main script, main b').length,
  title: document.title
})"""


def _above(fd: int, low: int) -> int:
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return new


def open_in_chromium(
    browser: str, html: Path, profile_dir: Path, timeout: float = 40, scroll_to: str | None = None
) -> PageResult:
    """Load ``html`` via file://, collect console errors and requests, probe the DOM, screenshot."""
    cmd_r, cmd_w = os.pipe()
    res_r, res_w = os.pipe()
    cmd_r, res_w = _above(cmd_r, 10), _above(res_w, 10)  # so 3<&N / 4>&N below cannot collide
    argv = [browser, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"]
    # Chromium reads commands on fd 3 and writes replies on fd 4: move our pipe ends there
    # (bash, not sh: dash cannot redirect descriptors above 9).
    shell = f'exec "$@" 3<&{cmd_r} 4>&{res_w} {cmd_r}<&- {res_w}>&-'
    proc = subprocess.Popen(
        [shutil.which("bash") or "/bin/bash", "-c", shell, "bash", *argv], pass_fds=(cmd_r, res_w),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    os.close(cmd_r)
    os.close(res_w)
    cdp = CDPPipe(proc, cmd_w, res_r)
    try:
        target = cdp.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            cdp.call(f"{domain}.enable", session=session)
        cdp.call("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
        cdp.wait_event("Page.loadEventFired", timeout=timeout)
        cdp.drain(0.5)  # late console messages (CSP reports arrive after load)
        value = cdp.call("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session=session)
        evaluated = json.loads(value["result"]["value"])
        if scroll_to:  # for screenshots of a given section (docs/report.png)
            expr = f"document.querySelector({json.dumps(scroll_to)}).scrollIntoView()"
            cdp.call("Runtime.evaluate", {"expression": expr}, session=session)
        shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        result = PageResult(evaluated, screenshot=__import__("base64").b64decode(shot))
        for ev in cdp.events:
            m, prm = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and prm.get("type") in ("error", "assert"):
                result.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in prm.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                result.console_errors.append(str(prm.get("exceptionDetails", {}).get("text")))
            elif m == "Log.entryAdded" and prm.get("entry", {}).get("level") == "error":
                result.console_errors.append(prm["entry"].get("text", ""))
            elif m == "Network.requestWillBeSent":
                result.requests.append(prm.get("request", {}).get("url", ""))
        try:
            cdp.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError):
            pass
        return result
    finally:
        os.close(cmd_w)
        os.close(res_r)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # our own session: the browser and its helpers
            proc.wait(timeout=5)


def external_requests(result: PageResult, html: Path) -> list[str]:
    own = html.resolve().as_uri()
    return [u for u in result.requests if u != own and not u.startswith("data:")]


@pytest.mark.host("browser")
def test_report_renders_in_chromium_offline(tmp_path: Path) -> None:
    browser = host.chromium()
    record = rf.rejected()
    html = render(rf.write(record, tmp_path / "run"), tmp_path / "report.html")
    result = open_in_chromium(browser, html, tmp_path / "profile")
    ev = result.evaluated
    assert ev["verdict"] == "REJECTED"
    assert ev["reason"] == record.reason
    n_charts = sum(2 for c in record.checks() if "samples" in c.evidence) + sum(
        len(c.evidence.get("charts", [])) for c in record.checks()
    )
    assert ev["charts"] == n_charts and ev["chartsWithSize"] == n_charts
    assert ev["polylines"] >= 3
    assert ev["stageRows"] == len(record.stages)
    assert ev["injected"] == 0, "markup from the record was rendered as HTML"
    assert result.console_errors == []
    assert external_requests(result, html) == []
    assert result.screenshot.startswith(b"\x89PNG")
    pil = pytest.importorskip("PIL.Image")
    import io

    img = pil.open(io.BytesIO(result.screenshot)).convert("RGB")
    assert img.size[0] >= 1000
    assert len(img.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 10, "screenshot is blank"


@pytest.mark.host("browser")
def test_browser_check_catches_external_resources(tmp_path: Path) -> None:
    """The harness itself must be able to fail: a site template that pulls a remote image."""
    browser = host.chromium()
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.html.j2").write_text(
        '{% extends "day0/report.html.j2" %}{% block head_extra %}'
        '<link rel="stylesheet" href="https://cdn.example.invalid/site.css">{% endblock %}'
        '{% block notes %}<img src="https://example.invalid/logo.png" alt="logo">{% endblock %}',
        encoding="utf-8",
    )
    html = render(rf.write(rf.accepted(), tmp_path / "run"), tmp_path / "report.html", template_dir=site)
    result = open_in_chromium(browser, html, tmp_path / "profile")
    assert result.evaluated["verdict"] == "ACCEPTED"
    problems = result.console_errors + external_requests(result, html)
    assert any("example.invalid" in p for p in problems), problems


def test_missing_chromium_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the ``host("browser")`` marker does without a browser: a failure under CI=true, else a skip."""
    monkeypatch.setenv("DAY0_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        host.require("browser")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="not found"):
        host.require("browser")


# --------------------------------------------------------------------------- layout probe (--dump-dom)

# Runs inside a copy of the report (the report's own CSP allows no script). It measures the page
# as a reader first sees it (height at 1400 px, details closed), then opens every <details> and
# checks each chart's text boxes: getBBox() mapped into the SVG's user space, so a rotated axis
# label counts with its real extent. Writes JSON into <pre id="day0-probe">.
LAYOUT_PROBE = r"""
(function () {
  const out = {height: document.documentElement.scrollHeight, charts: 0, overlaps: [], outside: [],
               first_screen: {}};
  const fold = 900;
  for (const sel of ['#verdict', '#verdict-line', '#headline', '#adaptation', '#not-verified', '#failures-first']) {
    const el = document.querySelector(sel);
    if (el) { const r = el.getBoundingClientRect(); out.first_screen[sel] = {top: r.top, bottom: r.bottom, visible: r.bottom <= fold && r.height > 0}; }
  }
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const svgs = Array.from(document.querySelectorAll('svg.chart'));
  out.charts = svgs.length;
  svgs.forEach((svg, n) => {
    const vb = svg.viewBox.baseVal;
    const inv = svg.getScreenCTM().inverse();
    const boxes = [];
    svg.querySelectorAll('text').forEach(t => {
      if (!t.textContent.trim()) return;
      const b = t.getBBox();
      const m = inv.multiply(t.getScreenCTM());
      const xs = [], ys = [];
      for (const [x, y] of [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]]) {
        const p = new DOMPoint(x, y).matrixTransform(m); xs.push(p.x); ys.push(p.y);
      }
      boxes.push({text: t.textContent, x0: Math.min(...xs), x1: Math.max(...xs), y0: Math.min(...ys), y1: Math.max(...ys)});
    });
    const title = (svg.querySelector('title') || {}).textContent || ('chart ' + n);
    const tol = 0.5;
    boxes.forEach(b => {
      if (b.x0 < vb.x - tol || b.y0 < vb.y - tol || b.x1 > vb.x + vb.width + tol || b.y1 > vb.y + vb.height + tol)
        out.outside.push({chart: title, text: b.text});
    });
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      const w = Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0), h = Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0);
      if (w > tol && h > tol) out.overlaps.push({chart: title, a: a.text, b: b.text});
    }
  });
  const pre = document.createElement('pre');
  pre.id = 'day0-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""
CSP_RE = re.compile(r'(<meta http-equiv="Content-Security-Policy" content=")([^"]*)(")')


def probe_copy(html: Path, dest: Path) -> Path:
    """A copy of the report that runs LAYOUT_PROBE: its CSP relaxed to allow one inline script."""
    text = html.read_text(encoding="utf-8")
    text, n = CSP_RE.subn(lambda m: m.group(1) + m.group(2) + "; script-src 'unsafe-inline'" + m.group(3), text, 1)
    assert n == 1, "the report has no CSP meta tag to relax"
    cut = text.rindex("</body>")
    dest.write_text(text[:cut] + f"<script>{LAYOUT_PROBE}</script>" + text[cut:], encoding="utf-8")
    return dest


def run_chromium(browser: str, args: list[str], profile_dir: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    """One headless Chromium run in its own session (killed as a group on timeout)."""
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--mute-audio", f"--user-data-dir={profile_dir}", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, b"")


def measure_page(browser: str, html: Path, work: Path) -> dict[str, Any]:
    """Height (px at 1400x900), chart count, overlapping text pairs and labels outside their chart."""
    work.mkdir(parents=True, exist_ok=True)
    copy = probe_copy(html, work / "probe.html")
    done = run_chromium(browser, ["--window-size=1400,900", "--virtual-time-budget=5000", "--dump-dom",
                                  copy.resolve().as_uri()], work / "profile")
    m = re.search(rb'<pre id="day0-probe">(.*?)</pre>', done.stdout, re.S)
    assert m, f"the probe wrote nothing (Chromium exit {done.returncode})"
    import html as _html

    return json.loads(_html.unescape(m.group(1).decode("utf-8")))


def chart_record():
    """A record whose charts hold every clash the report once drew: a long title beside a
    four-entry legend (the memory plan), two reference lines 0.01 apart (expected busbw and its pass
    line), a limit near the y axis (a busbw CDF against 0.04 GB/s), bars up to the top tick."""
    from day0.core.record import Check, run_verdict
    from tests.results.test_summary import full_record

    rec = full_record()
    sizes = [2**k for k in range(0, 23)]
    specs = [
        {"kind": "bar", "title": "Memory per rank by pipeline stage (TP=8, PP=4), planned against the device",
         "x_label": "pipeline stage", "y_label": "GiB",
         "series": [{"name": n, "x": ["stage 0", "stage 1"], "y": [v, v]} for n, v in
                    (("weights", 20.0), ("activation headroom", 2.0), ("KV pool", 30.0))],
         "reference": [{"y": 64.0, "label": "device memory x gpu_memory_utilization"}]},
        {"kind": "line", "title": "all_gather busbw vs message size (2 ranks, torch.distributed/gloo)",
         "x_label": "message size S (bytes)", "y_label": "busbw (GB/s)", "x_log": True,
         "series": [{"name": "in_place", "x": sizes, "y": [0.0001 * k for k in range(23)]},
                    {"name": "out_of_place", "x": sizes, "y": [0.0002 * k for k in range(23)]}],
         "reference": [{"y": 0.05, "label": "expected 0.05 GB/s (intra_node)"},
                       {"y": 0.04, "label": "pass line 0.8 x expected"}]},
    ]
    busbw = [0.5 + 0.05 * i for i in range(40)]
    rec.stages[2].checks += [
        Check(id="collectives.plan.charts", title="charts", status="pass", evidence={"charts": specs}),
        Check(id="collectives.all_to_all.busbw_samples", title="all_to_all: bus bandwidth at large messages",
              status="pass", value=2.4, limit=0.04, unit="GB/s", direction="higher_is_better",
              evidence={"samples": busbw}),
    ]
    rec.verdict, rec.reason = run_verdict(rec.stages, True)
    return rec


@pytest.mark.host("browser")
def test_no_chart_text_overlaps_another_or_leaves_its_chart(tmp_path: Path) -> None:
    browser = host.chromium()
    pages = [render(rf.write(rec, tmp_path / name), tmp_path / f"{name}.html")
             for name, rec in (("clash", chart_record()), ("rejected", rf.rejected()))]
    for page in pages:
        got = measure_page(browser, page, tmp_path / f"probe-{page.stem}")
        assert got["charts"] >= 6
        assert got["overlaps"] == [] and got["outside"] == [], page


@pytest.mark.host("browser")
def test_the_overlap_probe_catches_text_that_collides_or_escapes(tmp_path: Path) -> None:
    """The probe itself must be able to fail: a site chart with two labels on one spot and one
    label past the right edge."""
    browser = host.chromium()
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.html.j2").write_text(
        '{% extends "day0/report.html.j2" %}{% block notes %}<svg class="chart" viewBox="0 0 200 100">'
        '<title>bad</title><text x="20" y="40">limit 0.04 GB/s</text><text x="30" y="42">1</text>'
        '<text x="190" y="80">runs off</text></svg>{% endblock %}', encoding="utf-8")
    page = render(rf.write(rf.accepted(), tmp_path / "run"), tmp_path / "report.html", template_dir=site)
    got = measure_page(browser, page, tmp_path / "probe")
    assert {(o["chart"], o["a"], o["b"]) for o in got["overlaps"]} == {("bad", "limit 0.04 GB/s", "1")}
    assert [o["text"] for o in got["outside"]] == ["runs off"]


@pytest.mark.host("browser")
def test_the_first_screen_holds_the_decision_and_the_page_stays_short(tmp_path: Path) -> None:
    browser = host.chromium()
    rec = chart_record()
    page = render(rf.write(rec, tmp_path / "run"), tmp_path / "report.html")
    got = measure_page(browser, page, tmp_path / "probe")
    fold = got["first_screen"]
    for sel in ("#verdict", "#verdict-line", "#headline", "#adaptation", "#not-verified"):
        assert fold[sel]["visible"], (sel, fold[sel])  # wholly above 900 px at 1400 px wide
    # every check's evidence starts collapsed: the page is a screenful per stage, not per chart
    assert got["height"] < 6000, got["height"]


@pytest.mark.host("browser")
def test_print_to_pdf_gives_a_readable_pdf(tmp_path: Path) -> None:
    browser = host.chromium()
    page = render(rf.write(chart_record(), tmp_path / "run"), tmp_path / "report.html")
    pdf = tmp_path / "report.pdf"
    run_chromium(browser, ["--no-pdf-header-footer", f"--print-to-pdf={pdf}", page.resolve().as_uri()],
                 tmp_path / "profile")
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    pages = len(re.findall(rb"/Type\s*/Page(?!s)", data))
    assert 2 <= pages <= 20, pages
