"""The run record: the single source of truth that reports, comparisons and summaries read.

Checks are appended to an event log (JSONL, flushed and fsync'ed per event) the moment they
finish, so a run that is killed half-way still has every measurement it took; ``run.json``
is only a materialised view of that log, rebuilt with :func:`rebuild`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

from day0.core.stages import STAGES

SCHEMA_VERSION = 1

Status = Literal["pass", "fail", "error", "skip", "blocked"]
Direction = Literal["lower_is_better", "higher_is_better", "exact"]
STATUSES: tuple[str, ...] = ("pass", "fail", "error", "skip", "blocked")
DIRECTIONS: tuple[str, ...] = ("lower_is_better", "higher_is_better", "exact")

EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"


class RecordError(ValueError):
    """A run record or event log that cannot be read; the message names the file and why."""


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Check:
    """One measured (or refused) acceptance criterion.

    ``status`` is derived from value/limit/direction by :func:`judge` in the common case;
    callers that know better (an exception, a skip with a reason) set it explicitly.
    """

    id: str
    title: str
    status: Status
    value: Any = None
    limit: Any = None
    unit: str = ""
    direction: Direction = "exact"
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # which view of the engine produced the number: http, scheduler, static, ...
    # A performance figure (latency, throughput, bandwidth, cost) that a nightly compares with the
    # spread of earlier runs; cross-checks, counts and correctness checks are judged by their limit only.
    performance: bool = False
    repeat: int | None = None  # 1..N under --day0-repeat N: the same check measured again on the same engine
    stage: str = ""
    nodeid: str = ""
    finished_at: str = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.id}: status {self.status!r} is not one of {STATUSES}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"check {self.id}: direction {self.direction!r} is not one of {DIRECTIONS}")
        self.message = one_line(self.message)

    @property
    def failed(self) -> bool:
        """Not a pass: the deployment is outside its limit (fail) or the harness could not tell (error)."""
        return self.status in ("fail", "error")

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Check":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def one_line(text: str, limit: int = 500) -> str:
    """Collapse a message to a single line a person can act on (tracebacks stay in evidence)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def judge(value: Any, limit: Any, direction: Direction) -> bool:
    """Whether ``value`` meets ``limit``. No limit means nothing to meet (a recorded figure)."""
    if limit is None:
        return True
    if direction == "exact":
        return value == limit
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if direction == "lower_is_better":
        return value <= limit
    return value >= limit


def measured(
    id: str,
    title: str,
    value: Any,
    limit: Any = None,
    *,
    unit: str = "",
    direction: Direction = "exact",
    message: str = "",
    evidence: dict[str, Any] | None = None,
    source: str = "",
    performance: bool = False,
) -> Check:
    """A check whose status follows from comparing value with limit in the given direction."""
    ok = judge(value, limit, direction)
    if not message:
        message = _default_message(value, limit, unit, direction, ok)
    return Check(
        id=id,
        title=title,
        status="pass" if ok else "fail",
        value=value,
        limit=limit,
        unit=unit,
        direction=direction,
        message=message,
        evidence=evidence or {},
        source=source,
        performance=performance,
    )


def _default_message(value: Any, limit: Any, unit: str, direction: Direction, ok: bool) -> str:
    u = f" {unit}" if unit else ""
    if limit is None:
        return f"measured {_fmt(value)}{u}"
    rel = {"lower_is_better": "<=", "higher_is_better": ">=", "exact": "=="}[direction]
    verb = "meets" if ok else "misses"
    return f"{_fmt(value)}{u} {verb} the limit ({rel} {_fmt(limit)}{u})"


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def jsonable(obj: Any) -> Any:
    """Make measurement payloads JSON-safe (numpy scalars, paths, NaN) without losing data."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return jsonable(tolist())
    return str(obj)


# --------------------------------------------------------------------------- event log


class EventLog:
    """Append-only JSONL log; each line is written, flushed and fsync'ed before returning."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: dict[str, Any]) -> None:
        line = json.dumps(jsonable({"at": utcnow(), **event}), sort_keys=False)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def run_started(self, run_id: str, environment: dict, profile: dict, stages: Iterable[str]) -> None:
        self.append(
            {
                "type": "run_started",
                "schema_version": SCHEMA_VERSION,
                "run_id": run_id,
                "environment": environment,
                "profile": profile,
                "stages": list(stages),
            }
        )

    def check(self, stage: str, check: Check) -> None:
        self.append({"type": "check", "stage": stage, "check": check.to_dict()})

    def note(self, key: str, value: Any) -> None:
        """Run-level facts learnt during the run (engine start-up time, engine view, paths)."""
        self.append({"type": "note", "key": key, "value": value})

    def run_finished(self, exit_status: int | None = None) -> None:
        self.append({"type": "run_finished", "exit_status": exit_status})


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Yield events; a torn last line (the process died mid-write) is dropped, not fatal."""
    path = Path(path)
    if not path.exists():
        raise RecordError(f"{path}: event log not found")
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines):
                return  # torn write at the very end of a killed run
            raise RecordError(f"{path}:{n}: not a JSON event ({exc.msg})") from None


# --------------------------------------------------------------------------- run record


@dataclass
class StageRecord:
    name: str
    verdict: str = "not_run"
    checks: list[Check] = field(default_factory=list)


STAGE_VERDICTS = ("pass", "fail", "error", "blocked", "skip", "not_run")


def stage_verdict(checks: list[Check]) -> str:
    if not checks:
        return "not_run"
    statuses = {c.status for c in checks}
    if "fail" in statuses:
        return "fail"
    if "error" in statuses:
        return "error"
    if statuses == {"blocked"}:
        return "blocked"
    if "pass" in statuses:
        return "pass"
    if "blocked" in statuses:
        return "blocked"
    return "skip"


def run_verdict(stages: list[StageRecord], finished: bool) -> tuple[str, str]:
    """(verdict, one-line reason). Only a ``fail`` (measured, outside its limit) rejects; a check
    the harness could not measure (``error``) leaves the run INCOMPLETE, never REJECTED, so a
    method that did not resolve can never be mistaken for a verdict on the deployment."""
    for s in stages:
        failed = [c for c in s.checks if c.status == "fail"]
        if failed:
            return "rejected", f"stage {s.name} fail: {failed[0].id}: {failed[0].message}"
    for s in stages:
        errors = [c for c in s.checks if c.status == "error"]
        if errors:
            more = sum(c.status == "error" for st in stages for c in st.checks) - 1
            tail = f" (and {more} more not measured)" if more else ""
            return "incomplete", f"could not measure: {errors[0].id}: {errors[0].message}{tail}"
    if not finished:
        return "incomplete", "the run did not finish (no run_finished event); the record holds what was measured"
    missing = [s.name for s in stages if s.verdict in ("not_run", "skip", "blocked")]
    if missing:
        return "incomplete", "stages not run, skipped or blocked: " + ", ".join(missing)
    return "accepted", "every stage ran and passed"


@dataclass
class RunRecord:
    run_id: str
    started_at: str
    finished_at: str | None
    verdict: str
    reason: str
    environment: dict[str, Any]
    profile: dict[str, Any]
    stages: list[StageRecord]
    notes: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def stage(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def checks(self) -> Iterator[Check]:
        for s in self.stages:
            yield from s.checks

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "verdict": self.verdict,
            "reason": self.reason,
            "environment": jsonable(self.environment),
            "profile": jsonable(self.profile),
            "notes": jsonable(self.notes),
            "stages": [
                {"name": s.name, "verdict": s.verdict, "checks": [c.to_dict() for c in s.checks]}
                for s in self.stages
            ],
        }

    def write(self, path: Path) -> Path:
        path = Path(path)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def build(events: Iterable[dict[str, Any]]) -> RunRecord:
    """Fold an event stream into a run record (the only place a record is assembled)."""
    started: dict[str, Any] | None = None
    finished_at: str | None = None
    stage_names: list[str] = [s.name for s in STAGES]
    by_stage: dict[str, list[Check]] = {}
    notes: dict[str, Any] = {}
    for ev in events:
        kind = ev.get("type")
        if kind == "run_started":
            started = ev
            stage_names = list(ev.get("stages") or stage_names)
        elif kind == "check":
            by_stage.setdefault(ev["stage"], []).append(Check.from_dict(ev["check"]))
        elif kind == "note":
            notes[ev["key"]] = ev["value"]
        elif kind == "run_finished":
            finished_at = ev.get("at")
    if started is None:
        raise RecordError("event log has no run_started event")
    for name in by_stage:
        if name not in stage_names:
            stage_names.append(name)
    stages = [StageRecord(n, stage_verdict(by_stage.get(n, [])), by_stage.get(n, [])) for n in stage_names]
    verdict, reason = run_verdict(stages, finished=finished_at is not None)
    return RunRecord(
        run_id=started["run_id"],
        started_at=started["at"],
        finished_at=finished_at,
        verdict=verdict,
        reason=reason,
        environment=started.get("environment", {}),
        profile=started.get("profile", {}),
        stages=stages,
        notes=notes,
    )


def rebuild(run_dir: Path) -> RunRecord:
    """Turn a run folder's event log into run.json (used at session end and after a crash)."""
    run_dir = Path(run_dir)
    record = build(read_events(run_dir / EVENTS_FILE))
    record.write(run_dir / RUN_FILE)
    return record


def load(path: Path) -> RunRecord:
    """Load run.json of this or an older schema version."""
    path = Path(path)
    if path.is_dir():
        path = path / RUN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{path}: run record not found") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    version = data.get("schema_version")
    if version is None or not isinstance(version, int):
        raise RecordError(f"{path}: no schema_version; not a day0 run record")
    if version > SCHEMA_VERSION:
        raise RecordError(f"{path}: schema_version {version} is newer than this day0 ({SCHEMA_VERSION})")
    return _from_v1(data)


def _from_v1(data: dict[str, Any]) -> RunRecord:
    return RunRecord(
        run_id=data["run_id"],
        started_at=data["started_at"],
        finished_at=data.get("finished_at"),
        verdict=data["verdict"],
        reason=data.get("reason", ""),
        environment=data.get("environment", {}),
        profile=data.get("profile", {}),
        notes=data.get("notes", {}),
        stages=[
            StageRecord(s["name"], s["verdict"], [Check.from_dict(c) for c in s.get("checks", [])])
            for s in data.get("stages", [])
        ],
        schema_version=data["schema_version"],
    )
