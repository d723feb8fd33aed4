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

from day0.core import record_shape as shape
from day0.core.inputs import MAX_DEPTH, lines, open_regular, read_regular, strict_json
from day0.core.outputs import open_output, write_file
from day0.core.record_shape import (  # noqa: F401  (re-exported: the record's contract lives in one place)
    DIRECTIONS,
    MAX_SKIPPED_SHOWN,
    SCHEMA_VERSION,
    STAGE_VERDICTS,
    STATUSES,
    VERDICTS,
    RecordError,
    Skipped,
)
from day0.core.redact import Redactor
from day0.core.stages import DERIVED_STAGES, StageInfo
from day0.core.verdict import (  # noqa: F401
    DESELECTED_NOTE,
    EXIT_STATUS_NOTE,
    STOPPED_EXIT_STATUSES,
    bad_patterns,
    contradiction,
    deselected_of,
    judge,
    not_finite,
    required_checks,
    run_verdict,
    stage_verdict,
    stood_in_checks,
    unverified_required,
    waiver_for,
    waivers_of,
)

Status = Literal["pass", "fail", "error", "skip", "blocked"]
Direction = Literal["lower_is_better", "higher_is_better", "exact"]

EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"
# Bounds on what is read: generous (the benchmark's 150,000-sample record is 6 MB; one event of
# it ~1 MB) but finite, so a sparse file claiming a terabyte is refused before it is read.
MAX_RECORD_BYTES = 512 << 20
MAX_EVENTS_BYTES = 256 << 20  # run.json, indented, is 2-3x its compact log: a rebuilt log must still load
MAX_EVENT_LINE = 64 << 20
# A run writes one line per check and note: a few hundred (154 for cpu-tiny's default run). Folding
# takes ~12 us a line, so 256 MiB of one-byte lines held `record rebuild` for ~27 minutes: bounded.
MAX_EVENT_LINES = 1_000_000
# A check sits 3 levels deeper in run.json (stages[i].checks[j]) than in its event (check): a log
# line that passes must make a record that passes.
EVENT_DEPTH = MAX_DEPTH - 3
STAGE_SECONDS_NOTE = "stage_seconds"  # the session's note: wall seconds per stage so far
STAGE_INFO_SKIPPED_NOTE = "stage_info_skipped"  # declarations in run_started that did not validate
# vLLM's collect_env, noted when its background probe finishes (day0.core.environment.CollectEnv);
# rebuild files it under the record's environment, where a run that waited for it had it.
COLLECT_ENV_NOTE = "collect_env"
PATTERNS_SKIPPED_NOTE = "patterns_skipped"  # run_started's [report] globs no check id could match
SKIPPED_NOTE = "events_skipped"  # rebuild's note naming each unreadable event-log line it passed over
SCHEDULER_NOTE = "scheduler"  # day0 slurm submit's note: the Slurm job ended other than COMPLETED (state, reason)


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Check:
    """One measured (or refused) acceptance criterion.

    ``status`` is derived from value/limit/direction by :func:`judge` in the common case;
    callers that know better (an exception, a skip with a reason) set it explicitly. A ``pass`` or
    ``fail`` with a limit must agree with :func:`judge` (``day0.core.verdict.misjudged``): every
    reader re-judges it, and a record that contradicts its own figures is refused.
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
    # Seconds the pytest test that recorded the check took (junit.xml's testcase time); None when
    # unknown: checks from before this field, or recorded outside pytest.
    duration_s: float | None = None

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
    def from_dict(cls, data: dict[str, Any], where: str = "check") -> "Check":
        """A check from its JSON form, every field's type checked (RecordError naming ``where``)."""
        return cls(**shape.check_fields(data, where, ()))


def one_line(text: str, limit: int = 500) -> str:
    """Collapse a message to a single line a person can act on (tracebacks stay in evidence)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


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
    """A check whose status follows from comparing value with limit in the given direction.

    NaN (a mean of nothing, in any direction), an infinity in an ``exact`` direction (a count is never
    infinite) or on the good side of an ordered one (a throughput divided by a zero time) is ``error``:
    nothing was measured, so it can neither pass nor reject the deployment. That holds without a limit
    too: a recorded figure that cannot be true is not a "pass: measured nan". An infinity on the bad
    side of a min/max direction is a true figure, and against a limit a true miss that fails: a KL
    divergence where the deployment gives zero probability to the reference's token, a cost per token
    at zero throughput."""
    ok = judge(value, limit, direction)
    status: Status = "pass" if ok else "fail"
    bad_side = math.inf if direction == "lower_is_better" else -math.inf if direction == "higher_is_better" else None
    if not_finite(value) and value != bad_side:
        status = "error"
        message = f"not a finite measurement: {_default_message(value, limit, unit, direction, None)}" + (
            f"; {message}" if message else "")
    elif not message:
        message = _default_message(value, limit, unit, direction, ok)
    return Check(
        id=id,
        title=title,
        status=status,
        value=value,
        limit=limit,
        unit=unit,
        direction=direction,
        message=message,
        evidence=evidence or {},
        source=source,
        performance=performance,
    )


def _default_message(value: Any, limit: Any, unit: str, direction: Direction, ok: bool | None) -> str:
    """``ok`` None: the value was not judged (it says only what it was against)."""
    u = f" {unit}" if unit else ""
    if limit is None:
        return f"measured {_fmt(value)}{u}"
    rel = {"lower_is_better": "<=", "higher_is_better": ">=", "exact": "=="}[direction]
    verb = "against" if ok is None else "meets" if ok else "misses"
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
    """Append-only JSONL log; each line is written, flushed and fsync'ed before returning.

    Every event passes the run's :class:`~day0.core.redact.Redactor` here, where it is written, so
    no caller (a note of the engine's env, a lint finding quoting an arg, an exception message) can
    put a secret into the log, and so none into run.json, the report, junit.xml or the history,
    which are all built from it.
    """

    # The event's own fields (not payload): a note's ``key`` is the note's name, never a secret.
    _ENVELOPE = frozenset({"at", "type", "stage", "key", "run_id", "schema_version", "stages", "exit_status"})
    # day0's own declarations (Stage.describe): a figure's ``key`` is its name. Their strings still
    # pass the value and shape redaction; no field is blanked for its name (it would blank every
    # figure's key, and with them the headline trends that match figures across runs by key).
    _DECLARED = frozenset({"stage_info"})

    def __init__(self, path: Path, redactor: Redactor | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.redactor = redactor if redactor is not None else Redactor.from_sources()

    def append(self, event: dict[str, Any]) -> None:
        event = jsonable({"at": utcnow(), **event})
        event = {k: (self.redactor.text(v) if isinstance(v, str) else v) if k in self._ENVELOPE else
                 self.redactor.strings(v) if k in self._DECLARED else self.redactor(v) for k, v in event.items()}
        line = json.dumps(event, sort_keys=False)
        with open_output(self.path, append=True) as fh:  # never through a link or into a FIFO
            fh.write((line + "\n").encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())

    def run_started(self, run_id: str, environment: dict, profile: dict, stages: Iterable[str],
                    stage_info: Iterable[dict[str, Any]] = ()) -> None:
        """``stage_info``: each stage's declaration (:meth:`day0.core.stages.Stage.describe`), so the
        record says what each stage asks and which figures head the report without day0's code."""
        self.append(
            {
                "type": "run_started",
                "schema_version": SCHEMA_VERSION,
                "run_id": run_id,
                "environment": environment,
                "profile": profile,
                "stages": list(stages),
                "stage_info": list(stage_info),
            }
        )

    def check(self, stage: str, check: Check) -> None:
        self.append({"type": "check", "stage": stage, "check": check.to_dict()})

    def note(self, key: str, value: Any) -> None:
        """Run-level facts learnt during the run (engine start-up time, engine view, paths)."""
        self.append({"type": "note", "key": key, "value": value})

    def run_finished(self, exit_status: int | None = None) -> None:
        self.append({"type": "run_finished", "exit_status": exit_status})


def _numbered_events(path: Path, skipped: Skipped | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``file:line``, event) for each readable line, streamed with a bounded line length.

    With ``skipped`` an unreadable line is named there and passed over; without it, it is a
    RecordError, except a torn last line (no newline: the process died mid-write), dropped.
    """
    fh, _ = open_regular(Path(path), "event log", RecordError, cap=MAX_EVENTS_BYTES)
    with fh:
        for n, raw, ended in lines(fh, MAX_EVENT_LINE):
            where = f"{path}:{n}"
            if n > MAX_EVENT_LINES:
                raise RecordError(f"{path}: more than {MAX_EVENT_LINES:,} lines, where a run writes a few hundred: "
                                  "not a day0 event log")
            if raw is not None and not raw.strip():
                continue
            try:
                if raw is None:
                    raise RecordError(f"{where}: line over {MAX_EVENT_LINE >> 20} MiB; not an event day0 writes")
                ev = strict_json(raw, where, RecordError, max_depth=EVENT_DEPTH)
                if not isinstance(ev, dict):
                    raise RecordError(f"{where}: expected a JSON object (one event), got {shape.got(ev)}")
            except RecordError as exc:
                if skipped is not None:
                    skipped.add(f"{exc}{'' if ended else ' (torn last line: the run was killed mid-write)'}")
                elif ended:
                    raise
                continue
            yield where, ev


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Yield events; a torn last line (the process died mid-write) is dropped, any other
    unreadable line is a RecordError naming the file and line."""
    for _, ev in _numbered_events(path, None):
        yield ev


# --------------------------------------------------------------------------- run record


@dataclass
class StageRecord:
    name: str
    verdict: str = "not_run"
    checks: list[Check] = field(default_factory=list)
    info: StageInfo | None = None  # the stage's declaration, as the run that made the record knew it
    duration_s: float | None = None  # wall seconds of its tests (None: not timed, an older record)

    @property
    def title(self) -> str:
        return self.info.title if self.info and self.info.title else self.name

    @property
    def question(self) -> str:
        return self.info.question if self.info else ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "verdict": self.verdict}
        if self.info is not None:
            out.update({k: v for k, v in self.info.describe().items() if k != "name"})
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        out["checks"] = [c.to_dict() for c in self.checks]
        return out


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
            "stages": [s.to_dict() for s in self.stages],
        }

    def write(self, path: Path) -> Path:
        return write_file(path, json.dumps(self.to_dict(), indent=2) + "\n", error=RecordError)


class _Fold:
    """The state of folding events into a record; each ``on_<type>`` validates one event."""

    def __init__(self) -> None:
        self.started: dict[str, Any] | None = None
        self.started_where = ""
        self.finished_at: str | None = None
        self.exit_status: int | None = None  # pytest's, as the session ended
        self.stage_names: list[str] = []
        self.stage_info: dict[str, StageInfo] = {d.name: d for d in DERIVED_STAGES}
        self.by_stage: dict[str, list[Check]] = {}
        self.notes: dict[str, Any] = {}
        self.problems: list[str] = []

    def on_run_started(self, ev: dict[str, Any], where: str) -> None:
        shape.schema_version(ev, where)  # newer: refused by the caller, never folded as this schema
        shape.fields(ev, shape.RUN_STARTED, where)
        if self.started is not None:
            raise RecordError(f"{where}: a second run_started event (run {ev['run_id']!r}); the first one counts")
        self.started, self.started_where = ev, where
        self.stage_names = list(dict.fromkeys(ev.get("stages") or self.stage_names))  # a stage once
        for i, raw in enumerate(ev.get("stage_info") or []):
            try:
                info = StageInfo.from_dict(shape.stage_info(raw, where, ("stage_info", i)))
            except RecordError as exc:  # a malformed declaration costs its headlines, never the checks
                self.problems.append(str(exc))
                continue
            self.stage_info.setdefault(info.name, info)

    def on_check(self, ev: dict[str, Any], where: str) -> None:
        shape.fields(ev, shape.CHECK_EVENT, where)
        check = Check(**shape.check_fields(ev["check"], where, ("check",)))
        self.by_stage.setdefault(ev["stage"], []).append(check)

    def on_note(self, ev: dict[str, Any], where: str) -> None:
        shape.fields(ev, shape.NOTE_EVENT, where)
        if ev["key"] == DESELECTED_NOTE:
            shape.deselected(ev.get("value"), where, ("value",))
        self.notes[ev["key"]] = ev.get("value")

    def on_run_finished(self, ev: dict[str, Any], where: str) -> None:
        shape.fields(ev, shape.FINISHED_EVENT, where)
        self.finished_at = ev["at"]
        self.exit_status = ev.get("exit_status")

    def add(self, ev: Any, where: str) -> None:
        if not isinstance(ev, dict):
            raise RecordError(f"{where}: expected an object (one event), got {shape.got(ev)}")
        kind = ev.get("type")
        if kind not in ("run_started", "check", "note", "run_finished"):
            raise RecordError(f"{where}: type: expected run_started, check, note or run_finished, got {shape.got(kind)}")
        getattr(self, f"on_{kind}")(ev, where)


def _fold(events: Iterable[tuple[str, dict[str, Any]]], source: str, skipped: Skipped) -> RunRecord:
    """Fold (where, event) pairs into a record. An event that does not validate is skipped and
    named; since it may have been a failed check, a record with skipped events is never accepted."""
    fold = _Fold()
    for where, ev in events:
        try:
            fold.add(ev, where)
        except shape.NewerSchema:
            raise
        except RecordError as exc:
            skipped.add(str(exc))
    if fold.started is None:
        first = f" ({skipped.shown[0]})" if skipped.shown else ""
        raise RecordError(f"{source}: no run_started event{first}; not a day0 event log")
    names = fold.stage_names + [n for n in fold.by_stage if n not in fold.stage_names]
    times = fold.notes.get(STAGE_SECONDS_NOTE)
    times = times if isinstance(times, dict) else {}
    waivers, on = waivers_of(fold.started.get("profile")), fold.started.get("at")
    stages = [StageRecord(n, stage_verdict(fold.by_stage.get(n, []), waivers, on), fold.by_stage.get(n, []),
                          fold.stage_info.get(n), _seconds(times.get(n))) for n in names]

    profile = fold.started.get("profile")
    verdict, reason = run_verdict(stages, finished=fold.finished_at is not None, required=required_checks(profile),
                                  waivers=waivers, on=on, excused=stood_in_checks(profile),
                                  stopped=fold.exit_status in STOPPED_EXIT_STATUSES, deselected=deselected_of(fold.notes))
    notes = {k: v for k, v in fold.notes.items() if k != EXIT_STATUS_NOTE}  # run_finished's alone says it
    if fold.finished_at is not None:  # in run.json, so contradiction() sees an interrupted session
        notes[EXIT_STATUS_NOTE] = fold.exit_status
    bad = [(key, f"{fold.started_where}: {key}: {why}") for key, why in bad_patterns(profile)]
    if bad:  # passed over by every reader; a required one verified nothing
        notes[PATTERNS_SKIPPED_NOTE] = [named for _, named in bad[:MAX_SKIPPED_SHOWN]]
        required = [named for key, named in bad if key.startswith("profile.report.required")]
        if required and verdict == "accepted":
            verdict, reason = "incomplete", f"{required[0]}; so what it requires was not verified"
    if fold.problems:  # a malformed declaration costs its headlines and titles, never a check
        notes[STAGE_INFO_SKIPPED_NOTE] = fold.problems[:MAX_SKIPPED_SHOWN]
    if skipped.count:
        notes[SKIPPED_NOTE] = skipped.shown + ([f"... and {skipped.count - len(skipped.shown)} more"]
                                               if skipped.count > len(skipped.shown) else [])
        if verdict == "accepted":
            verdict, reason = "incomplete", (f"{skipped.count} unreadable event-log line(s) skipped, and one may "
                                             f"have held a failed check: {skipped.summary()}")
    ended = notes.get(SCHEDULER_NOTE)
    if verdict != "accepted" and isinstance(ended, dict) and ended.get("state") not in (None, "COMPLETED"):
        reason = f"the scheduler ended it: Slurm job {ended.get('job_id')} {ended.get('state')}; {reason}"
    started = fold.started
    environment = started.get("environment", {})
    if COLLECT_ENV_NOTE in notes and isinstance(environment, dict):
        environment = {**environment, "collect_env": notes.pop(COLLECT_ENV_NOTE)}
    return RunRecord(run_id=started["run_id"], started_at=started["at"], finished_at=fold.finished_at,
                     verdict=verdict, reason=reason, environment=environment,
                     profile=started.get("profile", {}), stages=stages, notes=notes)


def _seconds(v: Any) -> float | None:
    return float(v) if shape.SECONDS[0](v) and v is not None else None


def build(events: Iterable[dict[str, Any]], skipped: Skipped | None = None) -> RunRecord:
    """Fold an event stream into a run record (the only place a record is assembled)."""
    return _fold(((f"event {i}", ev) for i, ev in enumerate(events, 1)), "event stream", skipped or Skipped())


def rebuild(run_dir: Path, skipped: Skipped | None = None) -> RunRecord:
    """Turn a run folder's event log into run.json (used at session end and after a crash).

    What is readable is kept; each unreadable line is named in the record's ``notes.events_skipped``
    (and in ``skipped``, for a caller that warns), and such a run is at best incomplete."""
    run_dir = Path(run_dir)
    skipped = skipped if skipped is not None else Skipped()
    events = run_dir / EVENTS_FILE
    record = _fold(_numbered_events(events, skipped), str(events), skipped)
    try:
        record.write(run_dir / RUN_FILE)
    except OSError as exc:
        raise RecordError(f"{run_dir / RUN_FILE}: cannot be written ({exc.strerror or exc})") from None
    return record


def load(path: Path) -> RunRecord:
    """Load run.json (or a run folder's) of this or an older schema version, validated."""
    return load_with_bytes(path)[0]


def record_file(path: Path) -> Path:
    """``run.json`` itself, given it or its run folder (a folder without one is named as such)."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not os.path.lexists(path / RUN_FILE):
        raise RecordError(f"{path}: a folder without {RUN_FILE}; not a run folder or a run record")
    return path / RUN_FILE


def load_with_bytes(path: Path) -> tuple[RunRecord, bytes]:
    """The record and the exact bytes it was parsed from (what a report embeds and a signature
    covers): one read, so the two cannot differ."""
    path = record_file(path)
    data = read_regular(path, "run record", MAX_RECORD_BYTES, RecordError)
    return parse_record(data, str(path)), data


def parse_record(data: bytes | str, where: str) -> RunRecord:
    """A run record from its JSON text; every field checked, ``where`` names it in errors."""
    try:
        obj = strict_json(data, where, RecordError)
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected a JSON object (a day0 run record), got {shape.got(obj)}")
        shape.schema_version(obj, where)
        return _from_v1(obj, where)
    except (RecursionError, MemoryError) as exc:
        raise RecordError(f"{where}: too large or too deeply nested to read ({type(exc).__name__})") from None


def _from_v1(data: dict[str, Any], where: str) -> RunRecord:
    shape.fields(data, shape.RUN, where)
    stages: list[StageRecord] = []
    seen: dict[str, int] = {}
    if DESELECTED_NOTE in data.get("notes", {}):
        shape.deselected(data["notes"][DESELECTED_NOTE], where, ("notes", DESELECTED_NOTE))
    shape.fields(data.get("notes", {}), shape.RUN_NOTES, where, ("notes",))  # a record from before it lacks it
    for i, s in enumerate(data["stages"]):
        shape.fields(s, shape.STAGE, where, ("stages", i))
        if s["name"] in seen:
            raise RecordError(f"{where}: stages[{i}].name: stage {s['name']!r} again (also stages[{seen[s['name']]}])")
        seen[s["name"]] = i
        checks = [Check(**shape.check_fields(c, where, ("stages", i, "checks", j)))
                  for j, c in enumerate(s.get("checks", []))]
        info = StageInfo.from_dict(shape.stage_info(s, where, ("stages", i))) if "title" in s else None
        stages.append(StageRecord(s["name"], s["verdict"], checks, info, _seconds(s.get("duration_s"))))
    record = RunRecord(
        run_id=data["run_id"], started_at=data["started_at"], finished_at=data.get("finished_at"),
        verdict=data["verdict"], reason=data.get("reason", ""), environment=data.get("environment", {}),
        profile=data.get("profile", {}), notes=data.get("notes", {}), stages=stages,
        schema_version=data["schema_version"],
    )
    _consistent(record, where)  # a pattern no check id could be is passed over (verdict.bad_patterns)
    return record


def _consistent(record: RunRecord, where: str) -> None:
    """A record may never claim better than its checks (:func:`day0.core.verdict.contradiction`), nor
    be accepted with event-log lines its rebuild could not read (one may have held a failed check):
    read as written it would be a false PASS."""
    skipped = record.notes.get(SKIPPED_NOTE)
    why = contradiction(record)
    if record.verdict == "accepted" and skipped not in (None, []):
        why = (f"verdict: 'accepted', but notes.{SKIPPED_NOTE} names "
               f"{len(skipped) if isinstance(skipped, list) else 'some'} unreadable event-log line(s)")
    if why:
        raise RecordError(f"{where}: {why}; the record contradicts itself")
