"""The event log and its fold into a run record.

Checks are appended to an event log (JSONL, flushed and fsync'ed per event) the moment they
finish, so a run that is killed half-way still has every measurement it took; ``run.json``
is only a materialised view of that log, rebuilt with :func:`rebuild`. The record's types, and
reading run.json back, are :mod:`day0.core.record`'s.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from day0.core import record_shape as shape
from day0.core.inputs import MAX_DEPTH, InputError, lines, open_regular, strict_json
from day0.core.outputs import open_output
from day0.core.record import (
    COLLECT_ENV_NOTE,
    PATTERNS_SKIPPED_NOTE,
    RUN_FILE,
    SCHEDULER_NOTE,
    SKIPPED_NOTE,
    STAGE_INFO_SKIPPED_NOTE,
    STAGE_SECONDS_NOTE,
    Check,
    RunRecord,
    StageRecord,
    _seconds,
    jsonable,
    scrubbed,
    utcnow,
)
from day0.core.record_shape import MAX_SKIPPED_SHOWN, SCHEMA_VERSION, RecordError, Skipped
from day0.core.redact import Redactor
from day0.core.stages import DERIVED_STAGES, StageInfo
from day0.core.verdict import (
    DESELECTED_NOTE,
    EXIT_STATUS_NOTE,
    STOPPED_EXIT_STATUSES,
    bad_patterns,
    deselected_of,
    required_checks,
    run_verdict,
    stage_verdict,
    stood_in_checks,
    waivers_of,
)

EVENTS_FILE = "events.jsonl"
# Bounds on what is read: generous (one event of the benchmark's 150,000-sample record is ~1 MB)
# but finite, so a sparse file claiming a terabyte is refused before it is read (run.json's bound
# is day0.core.record.MAX_RECORD_BYTES).
MAX_EVENTS_BYTES = 256 << 20  # run.json, indented, is 2-3x day0's own compact log: a rebuilt log must still load
# (a log of deeply nested values pads far more: its record is refused as it is written, record_text)
MAX_EVENT_LINE = 64 << 20
# A run writes one line per check and note: a few hundred (154 for cpu-tiny's default run). Folding
# takes ~12 us a line, so 256 MiB of one-byte lines held `record rebuild` for ~27 minutes: bounded.
MAX_EVENT_LINES = 1_000_000
# A check sits 3 levels deeper in run.json (stages[i].checks[j]) than in its event (check): a log
# line that passes must make a record that passes.
EVENT_DEPTH = MAX_DEPTH - 3


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


# --------------------------------------------------------------------------- fold into a record


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


def export_path(path: Path | str, flag: str) -> Path:
    """``path`` for what a command writes on request (``--json``, ``--out``), checked before the
    command does its work: never a run's record or event log, by name (``run.json``,
    ``events.jsonl``) or by what it holds (a history entry, a record kept as ``base.json``), which
    the export would replace with something else (a comparison, a list of checks) and lose what the
    run measured. An InputError naming the file otherwise. A link is replaced, not followed, by
    every write, and a FIFO or folder is refused by the writer itself."""
    p = Path(path)
    if p.is_symlink() or not p.is_file():
        return p
    try:
        fh, _ = open_regular(p)
        with fh:
            head = fh.read(_HEAD_BYTES)
    except (InputError, OSError):
        return p  # unreadable here: the writer says why when it gets there
    for name, head_of, what in ((RUN_FILE, _RECORD_HEAD, "a run record"), (EVENTS_FILE, _EVENTS_HEAD, "a run's event log")):
        if p.name == name or head_of.match(head):
            raise InputError(p, f"is {what}, which {flag} would replace; name another")
    return p


_HEAD_BYTES = 4096
_RECORD_HEAD = re.compile(rb'\A\s*+\{\s*+"schema_version"\s*+:')  # as RunRecord.to_dict orders it
_EVENTS_HEAD = re.compile(rb'\A\{[^\n]{0,512}?"type":\s*+"run_started"')  # the log's first event


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
    again = scrubbed(record, str(events))  # an event log from elsewhere (an older day0, a hand edit)
    record = record if again is None else again[0]
    try:
        record.write(run_dir / RUN_FILE)
    except OSError as exc:
        raise RecordError(f"{run_dir / RUN_FILE}: cannot be written ({exc.strerror or exc})") from None
    return record
