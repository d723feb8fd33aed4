"""The device check's frame: the time budget, the one output folder, the run record, progress.

A borrowed GPU is held for minutes and the command is killed at its limit, so every step is
timed against ``--budget-s`` (a step that would start after it is a ``skip``, "budget spent"), an
alarm stops the step in flight at budget + grace, and the record and summary are rewritten after
every step: whatever kills the run, the folder holds what was measured. The folder keeps to the
device tool's return limits (at most 8 files, none in sub-folders, each well under 16 MiB).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from day0.core.events import EVENTS_FILE, EventLog, rebuild
from day0.core.outputs import open_output, write_file
from day0.core.record import RUN_FILE, Check, jsonable
from day0.core.terminal import Terminal

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"
STAGES = ("device", "collectives")
SUMMARY_FILE = "summary.json"
LOG_FILE = "device-check.log"
NCCL_LOG_FILE = "nccl-debug.log"
COLLECTIVES_FILE = "collectives.json"
TOKENS_FILE = "tokens.json"
#: Everything the folder may hold: 7 files, within the device tool's 8 that come back.
OUTPUT_FILES = (EVENTS_FILE, RUN_FILE, SUMMARY_FILE, LOG_FILE, NCCL_LOG_FILE, COLLECTIVES_FILE, TOKENS_FILE)
#: Per text file; half the device tool's 16 MiB, so 7 files stay far under its 64 MiB in all.
MAX_FILE_BYTES = 8 << 20
SUMMARY_SCHEMA = "day0.device-check/1"


class HardStop(BaseException):
    """The alarm at budget + grace: a BaseException so no library's ``except Exception`` eats it."""


@dataclass
class Options:
    out: Path
    budget_s: float = 420.0
    grace_s: float = 60.0
    model_dir: Path | None = None
    work_dir: Path | None = None
    max_new_tokens: int = 16
    top_k: int = 5
    margins: dict[str, float] = field(default_factory=lambda: {"float32": 0.01, "bfloat16": 0.05})
    intra_node: str = "nvlink"

    def to_dict(self) -> dict[str, Any]:
        return jsonable({k: getattr(self, k) for k in self.__dataclass_fields__})


@dataclass
class State:
    """What one step leaves for the next ones."""

    no_cuda: str | None = NO_CUDA  # why the GPU steps cannot run; None once CUDA answered
    cuda: dict[str, Any] = field(default_factory=dict)
    work: Path | None = None
    model_dir: Path | None = None
    config: dict[str, Any] | None = None
    planned: dict[str, int] = field(default_factory=dict)  # dtype -> plan's weight bytes per rank
    references: dict[str, Any] = field(default_factory=dict)  # "cpu/float32" -> list[RefSequence]


@dataclass
class Step:
    """One part of the check. ``ids`` (id -> title) are the checks it always reports, so the set of
    ids is the same on every run and machine; a skipped or broken step reports them as such."""

    name: str
    stage: str
    ids: dict[str, str]
    fn: Callable[["DeviceRun"], None]
    needs_cuda: bool = False
    needs: tuple[str, ...] = ()  # State fields an earlier step must have filled


class DeviceRun:
    """The run in progress: options, shared state, and the folder its record is written to."""

    def __init__(self, opts: Options, run_id: str, environment: dict[str, Any], stream: TextIO | None = None) -> None:
        self.opts, self.run_id = opts, run_id
        self.out = opts.out
        self.t0 = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self.state = State()
        self.events = EventLog(self.out / EVENTS_FILE)
        self.checks: list[Check] = []
        self.steps: list[dict[str, Any]] = []
        self.facts: dict[str, Any] = {}  # the figures a closing note quotes (summary.json "facts")
        self._log_bytes = 0
        self.events.run_started(run_id, environment, {"device_check": opts.to_dict()}, STAGES)

    # -- time ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        return self.opts.budget_s - self.elapsed()

    @contextmanager
    def hard_limit(self) -> Iterator[None]:
        """Raise :class:`HardStop` in the step in flight at budget + grace (SIGALRM: the main thread
        only; elsewhere the device tool's own timeout is the limit, and the record is already on disk)."""
        limit = self.opts.budget_s + self.opts.grace_s
        usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        if usable:
            def _alarm(signum: int, frame: Any) -> None:
                raise HardStop(f"stopped at the hard limit: --budget-s {self.opts.budget_s:g} + "
                               f"--grace-s {self.opts.grace_s:g} s")

            old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, max(0.001, limit - self.elapsed()))
        try:
            yield
        finally:
            if usable:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

    # -- output -------------------------------------------------------------------------
    def progress(self, message: str) -> None:
        """One line on stderr and in device-check.log, stamped with the time since the start."""
        line = f"[device-check {self.elapsed():7.1f}s] {message}"
        print(Terminal(self.events.redactor).line(line), file=self.stream, flush=True)  # paths, errors: escaped
        self.log(line + "\n")

    def log(self, text: str) -> None:
        """Append to device-check.log, which stops growing (once, saying so) at its size cap."""
        data = text.encode("utf-8", errors="replace")
        if self._log_bytes + len(data) > MAX_FILE_BYTES:
            if self._log_bytes < MAX_FILE_BYTES:
                with open_output(self.out / LOG_FILE, append=True) as fh:
                    fh.write(b"\n[device-check] log capped here; later text is on stderr only\n")
                self._log_bytes = MAX_FILE_BYTES
            return
        with open_output(self.out / LOG_FILE, append=True) as fh:
            fh.write(data)
        self._log_bytes += len(data)

    def write_file(self, name: str, text: str) -> Path:
        """One of :data:`OUTPUT_FILES`, cut in the middle when it is over the cap (head and tail kept)."""
        if name not in OUTPUT_FILES:
            raise ValueError(f"{name}: not one of the device check's files {OUTPUT_FILES}")
        return write_file(self.out / name, capped(text, MAX_FILE_BYTES))

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_file(name, json.dumps(jsonable(data), indent=1) + "\n")

    def record(self, stage: str, check: Check) -> None:
        check.stage = stage
        self.events.check(stage, check)
        self.checks.append(check)
        self.progress(f"{check.status.upper():5} {check.id}: {check.message}")

    # -- steps --------------------------------------------------------------------------
    def do(self, step: Step) -> None:
        """Run one step within the budget; every id it declares ends up recorded exactly once."""
        start = self.elapsed()
        before = {c.id for c in self.checks}
        reason = self._skip_reason(step, start)
        status = "skip"
        if reason is not None:
            for cid, title in step.ids.items():
                self.record(step.stage, Check(id=cid, title=title, status="skip", message=reason, source="device_check"))
        else:
            missing = [n for n in step.needs if not getattr(self.state, n)]
            self.progress(f"step {step.name}")
            error: tuple[str, str] | None = None
            if missing:
                error = (f"not measured: {step.name} needs {', '.join(missing)}, which an earlier step did not "
                         "produce (see its check)", "")
            else:
                try:
                    step.fn(self)
                except HardStop as exc:
                    error = (str(exc), "")
                except Exception as exc:  # noqa: BLE001 - one broken step must not cost the others
                    error = (f"{type(exc).__name__}: {exc}{module_hint(exc)}", traceback.format_exc())
            status = "error" if error else "ran"
            self._fill(step, before, error)
        self.steps.append({"name": step.name, "status": status, "started_s": round(start, 2),
                           "seconds": round(self.elapsed() - start, 2)})
        self.flush()

    def _skip_reason(self, step: Step, start: float) -> str | None:
        if start >= self.opts.budget_s:
            return f"budget spent: {start:.1f} s of --budget-s {self.opts.budget_s:g} used before this step"
        if step.needs_cuda and self.state.no_cuda is not None:
            return self.state.no_cuda
        return None

    def _fill(self, step: Step, before: set[str], error: tuple[str, str] | None) -> None:
        """Declared ids the step did not record: errors (its exception, else a day0 bug)."""
        done = {c.id for c in self.checks} - before
        message, trace = error or (f"{step.name} ended without reporting this check (a day0 bug)", "")
        for cid, title in step.ids.items():
            if cid not in done:
                evidence = {"traceback": trace} if trace else {}
                self.record(step.stage, Check(id=cid, title=title, status="error", message=message,
                                              evidence=evidence, source="device_check"))

    # -- the record ---------------------------------------------------------------------
    @property
    def exit_code(self) -> int:
        return 1 if any(c.failed for c in self.checks) else 0

    def flush(self) -> None:
        """run.json and summary.json from what is recorded so far (a kill loses nothing measured)."""
        record = rebuild(self.out)
        self.write_json(SUMMARY_FILE, self.summary(record.verdict, record.reason))

    def summary(self, verdict: str, reason: str) -> dict[str, Any]:
        counts = {s: sum(c.status == s for c in self.checks) for s in ("pass", "fail", "error", "skip")}
        return {
            "schema": SUMMARY_SCHEMA, "run_id": self.run_id, "verdict": verdict, "reason": reason,
            "exit_code": self.exit_code, "elapsed_s": round(self.elapsed(), 2), "budget_s": self.opts.budget_s,
            "cuda": self.state.cuda or {"available": False, "reason": self.state.no_cuda},
            "counts": counts, "steps": self.steps, "facts": self.facts,
            "checks": [{"stage": c.stage, "id": c.id, "status": c.status, "value": c.value, "limit": c.limit,
                        "unit": c.unit, "message": c.message} for c in self.checks],
            "files": sorted(p.name for p in self.out.iterdir() if p.is_file()),
        }

    def finish(self) -> int:
        code = self.exit_code
        self.events.run_finished(code)
        self.flush()
        self.progress(f"done: exit {code}; {len(self.checks)} checks in {self.out}")
        for p in sorted(self.out.iterdir()):
            self.progress(f"  {p.name:<18} {p.stat().st_size:>10} bytes")
        return code


def module_hint(exc: BaseException) -> str:
    """What to do about a module this machine lacks (the device image has no pydantic: wheels travel)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (f" (this Python lacks {exc.name.split('.')[0]}; a pure or manylinux wheel can travel: "
                "bash scripts/device-check.sh --prepare, carry build/device-wheels, docs/device-check.md)")
    return ""


def capped(text: str, limit: int) -> bytes:
    """UTF-8 bytes of ``text``, at most ``limit`` long: the head and the tail, with a marker between."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return data
    marker = f"\n[... {len(data) - limit} bytes cut by day0 device-check to keep the file under {limit} bytes ...]\n"
    keep = (limit - len(marker.encode())) // 2
    return data[:keep] + marker.encode() + data[len(data) - keep:]
