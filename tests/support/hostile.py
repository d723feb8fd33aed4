"""The hostile-input corpus's one way to run a case: a subprocess under a memory and time bound.

Each case runs day0 (or pytest with the day0 plugin) as a user would, in a child process whose
address space is capped with ``resource.setrlimit`` and whose wall time is capped by a timeout,
so a case that would allocate without bound or hang fails the test instead of the machine. The
bounds are ceilings for "did not run away", not performance claims: a refusal takes well under a
second, the bound is tens of seconds, so a busy CI box cannot turn a correct case red.

A refusal is judged on what a user sees: the exit code, and stderr holding exactly one line that
names the input and the problem (no traceback, no second line to scroll for).
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

# "Did not run away" ceilings. torch is never imported by a refusal path; 1 GiB of address space
# is ~25x what `day0` needs to refuse, and far below what an unbounded loop reaches.
MEM_MB = 1024
TIMEOUT_S = 60.0
USAGE = 2  # unusable input (day0's exit code for it)


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        """stderr's non-empty lines, minus Python warnings a dependency prints on import."""
        return [ln for ln in self.stderr.splitlines() if ln.strip() and "Warning:" not in ln
                and not ln.startswith("  warnings.warn")]

    def explain(self) -> str:
        return (f"{' '.join(self.argv)} -> exit {self.code} in {self.seconds:.1f}s\n"
                f"--- stderr ---\n{self.stderr[-3000:]}\n--- stdout ---\n{self.stdout[-2000:]}")


def _limit(mem_mb: int, then: Callable[[], None] | None = None):
    def apply() -> None:
        cap = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if then is not None:
            then()
    return apply


def read_only_as_root() -> None:
    """For ``preexec``: a root child loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from
    its bounding set, so the exec'd interpreter never has them), and permission bits stop it as they
    stop anyone: how a case tests a read-only folder when the suite runs as root. No-op otherwise."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        mem_mb: int = MEM_MB, timeout_s: float = TIMEOUT_S, stdin: str | None = None,
        preexec: Callable[[], None] | None = None) -> Outcome:
    """Run ``argv`` under the bounds; a timeout is a test failure naming the case, never a hang.
    ``preexec`` runs in the child before the exec, after the bounds (a case that drops a privilege)."""
    full_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "NO_COLOR": "1", **(env or {})}
    started = time.monotonic()
    try:
        proc = subprocess.run(list(argv), cwd=cwd, env=full_env, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, preexec_fn=_limit(mem_mb, preexec),
                              input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{' '.join(argv)}: still running after {timeout_s:.0f}s "
                             f"(unbounded time); stderr so far: {exc.stderr!r}") from None
    return Outcome(tuple(argv), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def day0(*args: str | Path, **kw) -> Outcome:
    """``day0 ARGS`` as the console script runs it."""
    return run([sys.executable, "-m", "day0.cli", *map(str, args)], **kw)


def pytest_day0(*args: str | Path, **kw) -> Outcome:
    """``pytest -m day0 ARGS`` (the plugin path: profile options, collection, the run record)."""
    return run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *map(str, args)], **kw)


def leaks(root: Path, canaries: Iterable[str]) -> list[str]:
    """Every (file, canary) pair where a file under ``root`` holds a canary, symlinks not followed:
    the canary test's one reading of a run's files (events.jsonl, run.json, the report, junit, the
    history copy, engine and collect_env logs), byte for byte."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path.relative_to(root)}: {c}" for c in canaries if c.encode() in data]
    return found


def refused(out: Outcome, *names: str | Path, code: int = USAGE, problem: str | Iterable[str] = ()) -> str:
    """Assert a clean refusal: exit ``code``, one stderr line naming every one of ``names``.

    ``problem`` is a word (or words) the line must hold to say *what* is wrong, matched without
    case. Returns the line, for cases that check more.
    """
    assert out.code == code, f"expected exit {code}\n{out.explain()}"
    assert "Traceback" not in out.stderr, f"traceback instead of one line\n{out.explain()}"
    lines = out.lines
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}\n{out.explain()}"
    line = lines[0]
    for name in names:
        assert str(name) in line, f"the line does not name {name!r}\n{out.explain()}"
    for word in [problem] if isinstance(problem, str) else problem:
        assert word.lower() in line.lower(), f"the line does not say {word!r}\n{out.explain()}"
    return line
