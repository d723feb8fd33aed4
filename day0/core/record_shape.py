"""The run record's shape, checked before any part of day0 reads a field of it.

``run.json`` and the event log are read back by every command (report, compare, verify, sign,
history, rebuild), often from a file someone else made. A field of the wrong type reaching
those would be a traceback at best and a misread verdict at worst, so every field is checked
here once, and the first wrong one is named by its key path (``stages[2].checks[0].status``)
in one :class:`RecordError` line. Unknown keys are passed over (a newer day0 of the same schema
may add optional fields); a wrong type is never coerced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from day0.core.globs import checked as checked_glob
from day0.core.inputs import InputError, key_path
from day0.core.names import MAX_COMPONENT, is_component
from day0.core.stages import PICKS
from day0.core.verdict import misjudged

SCHEMA_VERSION = 1
STATUSES: tuple[str, ...] = ("pass", "fail", "error", "skip", "blocked")
DIRECTIONS: tuple[str, ...] = ("lower_is_better", "higher_is_better", "exact")
VERDICTS: tuple[str, ...] = ("accepted", "rejected", "incomplete")
STAGE_VERDICTS: tuple[str, ...] = ("pass", "fail", "error", "blocked", "skip", "not_run", "not_applicable",
                                   "waived")
MAX_RUN_ID = MAX_COMPONENT  # a run id names the run folder: names.is_component is the one rule


class RecordError(InputError):
    """A run record or event log that cannot be read; the message names the file and why."""


class NewerSchema(RecordError):
    """A record of a schema this day0 does not know: refused whole, never read as an older one."""


MAX_SKIPPED_SHOWN = 50


class Skipped:
    """Event-log lines a rebuild passed over: the first MAX_SKIPPED_SHOWN named, all counted
    (a log of garbage cannot grow this list without bound)."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.count = 0

    def add(self, problem: str) -> None:
        self.count += 1
        if len(self.shown) < MAX_SKIPPED_SHOWN:
            self.shown.append(problem)

    def summary(self) -> str:
        more = f" (and {self.count - 1} more)" if self.count > 1 else ""
        return f"{self.shown[0]}{more}" if self.shown else ""


Test = tuple[Callable[[Any], bool], str]  # (accepts the value, what it expects in words)


def got(v: Any) -> str:
    """What was found instead, short enough for one line."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        text = repr(v)
        return f"the number {text if len(text) <= 24 else text[:20] + '…'}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}{'…' if len(v) > 40 else ''}"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _iso(v: Any) -> bool:
    try:
        datetime.fromisoformat(v)
    except (TypeError, ValueError):
        return False
    return True


def one_of(values: tuple[str, ...]) -> Test:
    return (lambda v: isinstance(v, str) and v in values), "one of " + ", ".join(values)


ANY: Test = (lambda v: True, "anything")
STR: Test = (lambda v: isinstance(v, str), "a string")
NAME: Test = (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string")
TIME: Test = (lambda v: isinstance(v, str) and _iso(v), "an ISO 8601 time")
OPT_TIME: Test = (lambda v: v is None or (isinstance(v, str) and _iso(v)), "an ISO 8601 time or null")
OBJECT: Test = (lambda v: isinstance(v, dict), "an object")
LIST: Test = (lambda v: isinstance(v, list), "a list")
BOOL: Test = (lambda v: isinstance(v, bool), "true or false")
REPEAT: Test = (lambda v: v is None or (_is_int(v) and v >= 1), "a whole number >= 1 or null")
RUN_ID: Test = (lambda v: is_component(v, MAX_RUN_ID),
                f"a run id (1-{MAX_RUN_ID} characters, no slash or control character)")
SECONDS: Test = (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                         and v == v and 0 <= v < float("inf")),
                 "a number of seconds >= 0 or null")
NAMES: Test = (lambda v: isinstance(v, list) and all(isinstance(s, str) and s.strip() for s in v),
               "a list of non-empty strings")

# name -> (required, test). Required fields are those a day0 of this schema always writes.
CHECK: dict[str, tuple[bool, Test]] = {
    "id": (True, NAME), "title": (True, STR), "status": (True, one_of(STATUSES)),
    "value": (False, ANY), "limit": (False, ANY), "unit": (False, STR), "direction": (False, one_of(DIRECTIONS)),
    "message": (False, STR), "evidence": (False, OBJECT), "source": (False, STR), "performance": (False, BOOL),
    "repeat": (False, REPEAT), "stage": (False, STR), "nodeid": (False, STR), "finished_at": (False, STR),
    "duration_s": (False, SECONDS),
}
NUMBER: Test = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
                and abs(v) < float("inf"), "a finite number")
OPT_STR: Test = (lambda v: v is None or isinstance(v, str), "a string or null")
# A stage's declaration as the record keeps it (day0.core.stages.Stage.describe).
FIGURE: dict[str, tuple[bool, Test]] = {
    "key": (True, NAME), "label": (True, STR), "check_ids": (True, NAMES), "scale": (False, NUMBER),
    "unit": (False, OPT_STR), "pick": (False, one_of(PICKS)), "need": (False, BOOL), "opt_in": (False, BOOL),
    "answer_key": (False, OPT_STR)}
STAGE_INFO: dict[str, tuple[bool, Test]] = {
    "name": (True, NAME), "title": (False, STR), "question": (False, STR), "figures": (False, LIST),
    "required": (False, NAMES), "origin": (False, STR)}
STAGE: dict[str, tuple[bool, Test]] = {
    "name": (True, NAME), "verdict": (True, one_of(STAGE_VERDICTS)), "checks": (False, LIST),
    **{k: v for k, v in STAGE_INFO.items() if k != "name"}, "duration_s": (False, SECONDS)}
RUN: dict[str, tuple[bool, Test]] = {
    "run_id": (True, RUN_ID), "started_at": (True, TIME), "finished_at": (False, OPT_TIME),
    "verdict": (True, one_of(VERDICTS)), "reason": (False, STR), "environment": (False, OBJECT),
    "profile": (False, OBJECT), "notes": (False, OBJECT), "stages": (True, LIST),
}
# Event log lines (run_started's schema_version is checked by schema_version()).
RUN_STARTED: dict[str, tuple[bool, Test]] = {
    "run_id": (True, RUN_ID), "at": (True, TIME), "environment": (False, OBJECT), "profile": (False, OBJECT),
    "stages": (False, NAMES), "stage_info": (False, LIST),
}
CHECK_EVENT: dict[str, tuple[bool, Test]] = {"stage": (True, NAME), "check": (True, OBJECT)}
NOTE_EVENT: dict[str, tuple[bool, Test]] = {"key": (True, NAME), "value": (False, ANY)}
EXIT_STATUS: Test = (lambda v: v is None or _is_int(v), "a whole number or null")
FINISHED_EVENT: dict[str, tuple[bool, Test]] = {"at": (True, TIME), "exit_status": (False, EXIT_STATUS)}
# run.json's notes the verdict reads (day0.core.verdict.EXIT_STATUS_NOTE): optional, for records made before it.
RUN_NOTES: dict[str, tuple[bool, Test]] = {"exit_status": (False, EXIT_STATUS)}


def fields(data: Any, shape: Mapping[str, tuple[bool, Test]], where: str, path: tuple[Any, ...] = ()) -> dict:
    """``data`` itself once every field of ``shape`` has the right type; else the first wrong one."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: {key_path(path)}: expected an object, got {got(data)}")
    for name, (required, (test, expect)) in shape.items():
        if name not in data:
            if required:
                raise RecordError(f"{where}: {key_path((*path, name))}: missing (expected {expect})")
        elif not test(data[name]):
            raise RecordError(f"{where}: {key_path((*path, name))}: expected {expect}, got {got(data[name])}")
    return data


def schema_version(data: Mapping[str, Any], where: str) -> int:
    """The record's schema version: this one or older loads; newer is refused naming both."""
    v = data.get("schema_version")
    if v is None:
        raise RecordError(f"{where}: schema_version: missing; not a day0 run record")
    if not _is_int(v) or v < 1:
        raise RecordError(f"{where}: schema_version: expected a whole number >= 1, got {got(v)}; "
                          "not a day0 run record")
    if v > SCHEMA_VERSION:
        raise NewerSchema(f"{where}: schema_version {v} is newer than this day0 reads ({SCHEMA_VERSION}); "
                          "use the day0 that wrote it, or a newer one")
    return v


WHOLE: Test = (lambda v: _is_int(v) and v >= 1, "a whole number >= 1")
COUNTS: Test = (lambda v: isinstance(v, dict) and all(isinstance(k, str) and k.strip() and _is_int(n) and n >= 1
                                                      for k, n in v.items()), "an object of stage -> whole number >= 1")
STRINGS: Test = (lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of strings")
# The plugin's note of the day0 tests the session deselected (day0.core.verdict.DESELECTED_NOTE).
DESELECTED: dict[str, tuple[bool, Test]] = {"count": (True, WHOLE), "stages": (True, COUNTS), "nodeids": (False, STRINGS)}


def deselected(data: Any, where: str, path: tuple[Any, ...]) -> dict[str, Any]:
    """The deselected note's fields: the verdict reads them, so a wrong one is refused, never taken for none."""
    return fields(data, DESELECTED, where, path)


def stage_info(data: Any, where: str, path: tuple[Any, ...]) -> dict[str, Any]:
    """A stage declaration's fields (in ``run_started.stage_info`` or a run.json stage), each
    figure checked too, so the report never reads a malformed one: a figure's glob no check id could
    match (``day0.core.globs``) is refused here by its key, or ``history add`` would store it and every
    later report that read it for trends would stop on it, blaming the run being rendered."""
    fields(data, STAGE_INFO, where, path)
    for i, f in enumerate(data.get("figures") or []):
        fields(f, FIGURE, where, (*path, "figures", i))
        for k, glob in enumerate(f["check_ids"]):
            try:
                checked_glob(glob)
            except ValueError as exc:
                raise RecordError(f"{where}: {key_path((*path, 'figures', i, 'check_ids', k))}: {exc}") from None
    return data


def check_fields(data: Any, where: str, path: tuple[Any, ...]) -> dict[str, Any]:
    """A check's fields, only those of the contract (a newer day0's extras are passed over), its
    status re-judged from its value, limit and direction (``day0.core.verdict.misjudged``): a status
    its own figures contradict is refused, so no reader takes an edited ``pass`` for one."""
    fields(data, CHECK, where, path)
    claim = SimpleNamespace(**{k: data.get(k) for k in ("id", "status", "value", "limit", "evidence")},
                            direction=data.get("direction", "exact"))
    wrong = misjudged(claim)
    if wrong:
        raise RecordError(f"{where}: {key_path((*path, 'status'))}: {wrong}; the record contradicts itself")
    return {k: v for k, v in data.items() if k in CHECK}
