"""Why an engine failed, in one line a person can act on, and the log lines around it.

vLLM reports an engine-core failure twice: the real exception in the core process, then a generic
wrapper (``Engine core initialization failed. See root cause above``) in the front end. The first
is the root cause; argparse's ``error:`` line and a pydantic ``ValidationError``'s detail lines
are read too. A native crash has no exception line: vLLM's signal handler prints ``Segfault
encountered`` and the native stack, so the crash and its first frame in vLLM's own sources
(``cpu_fused_moe.cpp:242 in fused_moe_impl``) are the cause, not the ``RuntimeError: cancelled``
the dying core logs after it.
"""

from __future__ import annotations

import re

_EXC_LINE = re.compile(r"^(?:\S+ )*?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")
_ARGPARSE = re.compile(r"^\S+: error: (.+)$")
_WRAPPERS = (
    "See root cause above",
    "Engine core initialization failed",
    "Engine process failed to start",
    "EngineCore encountered an issue",
    "Worker failed with error",
    "EngineDeadError",
)
# A native crash, as vLLM's signal handler, Python's faulthandler or the C library report it.
_CRASHES = (
    (re.compile(r"^!+ Segfault encountered !+$|^Fatal Python error: Segmentation fault"), "segmentation fault"),
    (re.compile(r"^Fatal Python error: Illegal instruction"), "illegal instruction"),
    (re.compile(r"^Fatal Python error: Bus error"), "bus error"),
    (re.compile(r"^Fatal Python error: Aborted"), "abort"),
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_SYSTEM_FRAME = re.compile(r"sysdeps/|libc|/include/|<unknown>|site-packages/torch/")
_FRAMES_SCANNED = 40
_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:ERROR|WARNING|INFO|DEBUG)\s+[\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")


def root_cause(log_text: str) -> str | None:
    found = _root_cause_at(log_text)
    return found[1] if found else None


def excerpt(log_text: str, before: int = 12, after: int = 3, last: int = 15) -> str:
    """The log lines around the root cause, then the log's end: what a person reads first."""
    lines = log_text.splitlines()
    found = _root_cause_at(log_text)
    end = lines[-last:]
    if not found:
        return "\n".join(end)
    n = found[0]
    around = lines[max(0, n - before): n + after + 1]
    if n + after + 1 >= len(lines) - last:
        return "\n".join(lines[max(0, n - before):])
    return "\n".join([*around, "[...]", *end])


def _root_cause_at(log_text: str) -> tuple[int, str] | None:
    """The line that says why the engine failed, from its log (first non-wrapper exception).

    vLLM reports an engine-core failure twice: the real exception in the core process, then a
    generic ``RuntimeError: Engine core initialization failed. See root cause above`` in the
    front end. The first is what a person can act on.
    """
    lines = [_PREFIX.sub("", ln).rstrip() for ln in log_text.splitlines()]
    for n, line in enumerate(lines):
        crash = _crash(lines, n)
        if crash:
            return n, crash
        m = _ARGPARSE.match(line)
        if m:
            return n, f"vLLM rejected its arguments: {m.group(1)}"
        m = _EXC_LINE.match(line)
        if not m or any(w in line for w in _WRAPPERS):
            continue
        name, text = m.group(1).rsplit(".", 1)[-1], m.group(2)
        if name == "ValidationError":  # pydantic: the reason is on the following lines
            detail = [ln.strip() for ln in lines[n + 1 : n + 4] if ln.strip() and "errors.pydantic.dev" not in ln]
            text = text + ": " + " ".join(detail)
        return n, f"{name}: {text}"
    return None


def _crash(lines: list[str], n: int) -> str | None:
    """``line n`` reports a native crash: its kind and the first frame in the engine's own code."""
    kind = next((name for pattern, name in _CRASHES if pattern.search(lines[n])), None)
    if kind is None:
        return None
    for line in lines[n + 1: n + 1 + _FRAMES_SCANNED]:
        m = _FRAME.match(line)
        if m and not _SYSTEM_FRAME.search(m.group(1)):
            function = re.split(r"[<(]", m.group(3), maxsplit=1)[0].strip() or m.group(3)[:80]
            return f"{kind} in {m.group(1).rsplit('/', 1)[-1]}:{m.group(2)} ({function})"
    return f"{kind} in native code (the log shows no source frame)"


def exception_root_cause(exc: BaseException) -> str:
    """The innermost exception of a chain, as ``Name: message`` on one line."""
    seen = set()
    cur: BaseException = exc
    while True:
        nxt = cur.__cause__ or cur.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(cur))
        cur = nxt
    text = str(cur).strip().splitlines()
    msg = " ".join(t.strip() for t in text[:4] if t.strip())
    if any(w in msg for w in _WRAPPERS) and cur is not exc:
        msg = str(exc)
    return f"{type(cur).__name__}: {msg}"
