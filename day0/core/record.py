"""The run record: the single source of truth that reports, comparisons and summaries read.

Here: the record's types (a :class:`Check`, made by :func:`measured`; the stage and run records)
and reading run.json back, validated. Checks reach a record through the run's event log, which
:mod:`day0.core.events` writes and folds into run.json (:func:`day0.core.events.rebuild`), so a
run that is killed half-way still has every measurement it took.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal

from day0.core import record_shape as shape
from day0.core.inputs import read_regular, size_text, strict_json
from day0.core.outputs import write_file
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
from day0.core.stages import StageInfo
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

RUN_FILE = "run.json"
# Bounds on what is read: generous (the benchmark's 150,000-sample record is 6 MB; one event of
# it ~1 MB) but finite, so a sparse file claiming a terabyte is refused before it is read (the event
# log's: day0.core.events).
MAX_RECORD_BYTES = 512 << 20
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
        return write_file(path, record_text(self.to_dict(), path), error=RecordError)


def record_text(obj: dict[str, Any], where: Path | str) -> str:
    """A record's JSON as run.json holds it (indented), refused past :data:`MAX_RECORD_BYTES`.

    Why count while encoding: indentation pads every item by its depth, so a 10 MB event log of
    deeply nested lists (a hand edit, a log from elsewhere) became a 560 MB run.json that no reader
    loads, built whole in memory first. A record that could not be read back is not written, and is
    never built past the cap; its event log stays. Read back (:func:`scrubbed`), a compact foreign
    record that would pass the cap only once indented is refused the same way."""
    blocks: list[str] = []
    chunks: list[str] = []  # joined into a block every 64 Ki chunks: a small str costs ~50 bytes of its own
    size = 1  # the closing newline
    for chunk in json.JSONEncoder(indent=2).iterencode(obj):
        size += len(chunk)  # ASCII (ensure_ascii), so characters are bytes
        if size > MAX_RECORD_BYTES:
            raise RecordError(where, f"the record would be over the {size_text(MAX_RECORD_BYTES)} a run record "
                                     "may hold, indented as run.json is (a value too large or too deeply nested)")
        chunks.append(chunk)
        if len(chunks) >= 1 << 16:
            blocks.append("".join(chunks))
            chunks.clear()
    return "".join(blocks) + "".join(chunks) + "\n"


def _seconds(v: Any) -> float | None:
    return float(v) if shape.SECONDS[0](v) and v is not None else None


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
    """The record and the bytes it stands for (what a report embeds, a signature covers, the history
    stores): one read, so the two cannot differ. A record read from a file may come from anywhere (an
    older day0, another site, a hand edit), so it is redacted again as its events were
    (:func:`redacted`); where that changes anything, the bytes are the redacted record's, and no
    page, junit.xml, comparison or terminal line shows what the file held. A record day0 wrote
    comes back byte for byte."""
    path = record_file(path)
    data = read_regular(path, "run record", MAX_RECORD_BYTES, RecordError)
    record = parse_record(data, str(path))
    again = scrubbed(record, str(path))
    return (record, data) if again is None else (again[0], again[1].encode("utf-8"))


def scrubbed(record: RunRecord, where: str) -> tuple[RunRecord, str] | None:
    """``record`` redacted again (:func:`redacted`, with this environment's secrets known by value)
    and its JSON text as :meth:`RunRecord.write` writes it; None when that changes nothing, as for
    every record day0's own event log made."""
    plain = record.to_dict()
    clean = redacted(plain, Redactor.from_sources())
    if clean == plain:
        return None
    text = record_text(clean, where)
    return parse_record(text, where), text


def redacted(obj: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    """A record's JSON form redacted part by part as the event log redacts the events it is folded
    from (:class:`day0.core.events.EventLog`): the environment, the profile, the notes and each
    check by key and by shape; day0's own stage declarations and the record's own fields (run id,
    verdict, reason) by shape only, since a figure's ``key`` is its name."""
    out = {k: redactor.strings(v) for k, v in obj.items() if k not in ("environment", "profile", "stages", "notes")}
    out.update({k: redactor(obj[k]) for k in ("environment", "profile") if k in obj})
    if "notes" in obj:
        out["notes"] = redactor(obj["notes"])  # day0 names no note like a secret; a foreign record might
    out["stages"] = [{**{k: redactor.strings(v) for k, v in s.items() if k != "checks"},
                      "checks": [redactor(c) for c in s.get("checks", [])]} for s in obj.get("stages", [])]
    return {k: out[k] for k in obj}  # the record's own order


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
