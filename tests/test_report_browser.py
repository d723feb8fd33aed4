"""The report opened from disk in real headless Chromium: it renders, draws its charts, logs no
console errors and makes no network requests.

The browser is driven over the Chrome DevTools protocol on ``--remote-debugging-pipe`` (fds 3
and 4, NUL-separated JSON), so no port, websocket library or network stack is involved.
Chromium missing: skipped locally, a failure when CI=true (CI must not silently lose this test).
"""

from __future__ import annotations

import fcntl
import json
import os
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

import run_factory as rf

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
    "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe", "--window-size=1280,1700",
)


def find_chromium() -> str | None:
    env = os.environ.get("DAY0_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    return next((p for b in BROWSERS if (p := shutil.which(b))), None)


def chromium_or_skip() -> str:
    path = find_chromium()
    if path is None:
        reason = "headless Chromium not found (apt-get install -y chromium, or set DAY0_CHROMIUM)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI=true, so the browser test must run")
        pytest.skip(reason)
    return path


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


def test_report_renders_in_chromium_offline(tmp_path: Path) -> None:
    browser = chromium_or_skip()
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


def test_browser_check_catches_external_resources(tmp_path: Path) -> None:
    """The harness itself must be able to fail: a site template that pulls a remote image."""
    browser = chromium_or_skip()
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
    monkeypatch.setenv("DAY0_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        chromium_or_skip()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="not found"):
        chromium_or_skip()
