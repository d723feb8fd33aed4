"""A stage's and a run's verdict from their checks: the one rule every reader of a record applies.

Only a ``fail`` (measured, outside its limit) rejects, unless the profile waives it as a known
failure (``[report] waivers``: the check stays ``fail``, its stage is ``waived``, the run's reason
names it); an ``error``, a stage that did not run, or a required check that verified nothing leaves
the run INCOMPLETE. Kept apart from the record's
types (duck-typed below) so that rule reads on one page.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Collection, Protocol

from day0.core.globs import Names
from day0.core.globs import checked as checked_glob
from day0.core.globs import matches as glob_matches

# The evidence key of a skip that says the stage does not apply to this target (the expert-load
# stage on a dense model): such a stage is "not_applicable", neither missing nor unverified, so a
# dense run can be ACCEPTED without it. Any other skip still leaves the run INCOMPLETE.
NOT_APPLICABLE = "not_applicable"
# The note naming the day0 tests a session deselected (-k, -m, --deselect): what they would have
# checked is not in the record, so such a run is never accepted as a full one.
DESELECTED_NOTE = "deselected"
# The record's note of pytest's exit status as the session ended (its run_finished event's): a
# reader of run.json alone must see an interrupted session, or an edit to "accepted" would stand.
EXIT_STATUS_NOTE = "exit_status"
# pytest's exit statuses of a session that did not run its tests through: INTERRUPTED (Ctrl-C, or the
# SIGTERM the plugin turns into one) and INTERNAL_ERROR. Its session still ends, so the event log
# has its run_finished, but the tests after the interruption never ran.
STOPPED_EXIT_STATUSES = (2, 3)


class _Check(Protocol):
    id: str
    status: str
    message: str
    evidence: Any


class _Stage(Protocol):
    name: str
    verdict: str

    @property
    def checks(self) -> Sequence[_Check]: ...


# How far a recorded figure may sit on the wrong side of its limit and still stand as a ``fail``: the
# record rounds figures (latency ms and bounds to 3 decimals, shares to 4) after judging them, so a
# value a hair past its limit can be written equal to it, or just inside. Half the 3rd decimal.
# Only a ``fail`` gets it: a pass claimed past its limit is never excused.
ROUNDING = 5e-4


def judge(value: Any, limit: Any, direction: str) -> bool:
    """Whether ``value`` meets ``limit``. No limit means nothing to meet (a recorded figure). A value
    that is not a finite number (None, NaN, +-inf) meets no ordered limit: an infinite throughput is
    a division by a zero time, never a pass (and the record writes it as null)."""
    if limit is None:
        return True
    if direction == "exact":
        return value == limit
    if value is None or not_finite(value):
        return False
    if direction == "lower_is_better":
        return value <= limit
    return value >= limit


def not_finite(value: Any) -> bool:
    """NaN or +-inf (a float, or a numpy scalar): a figure that cannot be true."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isfinite(value)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bounds(evidence: Any) -> tuple[Any, Any] | None:
    """(lower, upper) confidence bounds a percentile check was judged by (``evidence.bounds``), if any."""
    b = evidence.get("bounds") if isinstance(evidence, dict) else None
    return (b.get("lower"), b.get("upper")) if isinstance(b, dict) and ("lower" in b or "upper" in b) else None


def _claim_holds(status: str, value: Any, limit: Any, direction: str, evidence: Any) -> bool:
    """Whether a ``pass``/``fail`` with a limit follows from the check's own figures, by :func:`judge`.

    A check judged by confidence bounds (a latency percentile) passes only when the bound on the bad
    side is within the limit (:func:`judge` of that bound) and fails only when the bound on the good
    side is past it; its value, the point estimate, lies between them. A ``fail`` within
    :data:`ROUNDING` of its limit stands (the figure was rounded after it was judged)."""
    if direction == "exact":  # a count equals its limit; a description (a string, a list) is not judged
        if not (_number(value) and _number(limit)):
            return True
        return judge(value, limit, direction) == (status == "pass")
    if not _number(limit):
        return status == "fail"  # an ordered limit that is not a number cannot be met, only missed
    bounds = _bounds(evidence)
    worse, better = (1, 0) if direction == "lower_is_better" else (0, 1)  # which bound is on which side
    if status == "pass":
        figures = [value] + ([bounds[worse]] if bounds else [])
        return all(_number(x) and judge(x, limit, direction) for x in figures)
    slack = ROUNDING + 1e-9 * abs(limit)
    edge = limit - slack if direction == "lower_is_better" else limit + slack
    figure = bounds[better] if bounds else value
    return not _number(figure) or not judge(figure, edge, direction) or figure == edge


def misjudged(check: _Check) -> str | None:
    """Why the check's status contradicts its own value, limit and direction, or None when it holds.

    Only ``pass`` and ``fail`` with a limit are re-judged; ``error``, ``skip`` and ``blocked`` say the
    check did not judge, and a check without a limit records a figure. A waived failure stays ``fail``
    and is re-judged like any other. Every reader applies this to a record it loads, so a record whose
    statuses were edited (a ``pass`` past its limit) cannot report ACCEPTED or be signed."""
    status, limit = check.status, getattr(check, "limit", None)
    if status not in ("pass", "fail") or limit is None:
        return None
    value, direction = getattr(check, "value", None), getattr(check, "direction", "exact")
    if _claim_holds(status, value, limit, direction, getattr(check, "evidence", None)):
        return None
    rel = {"lower_is_better": "<=", "higher_is_better": ">=", "exact": "=="}.get(direction, direction)
    bounds = _bounds(getattr(check, "evidence", None))
    judged = f" (confidence bounds {_short(bounds[0])} .. {_short(bounds[1])})" if bounds else ""
    cid = str(check.id) if len(str(check.id)) <= 120 else str(check.id)[:119] + "…"
    return (f"{cid} claims {status!r}, but its value {_short(value)}{judged} against its limit "
            f"{rel} {_short(limit)} ({direction}) says otherwise")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:59] + "…"


def not_applicable(check: _Check) -> bool:
    evidence = getattr(check, "evidence", None)
    return check.status == "skip" and isinstance(evidence, dict) and evidence.get(NOT_APPLICABLE) is True


@dataclass(frozen=True)
class Waiver:
    """A known failure the profile accepts for now (``[report] waivers``), read from the record's own
    profile so every reader of the record applies it the same way."""

    check: str
    reason: str
    finding: str | None = None
    until: str | None = None  # YYYY-MM-DD, the last day (UTC) it applies


def _report_list(profile: Any, key: str) -> list[Any]:
    rep = profile.get("report") if isinstance(profile, dict) else None
    raw = rep.get(key) if isinstance(rep, dict) else None
    return raw if isinstance(raw, list) else []


def _bad_glob(glob: str) -> str | None:
    try:
        checked_glob(glob)
    except ValueError as exc:
        return str(exc)
    return None


def bad_patterns(profile: Any) -> list[tuple[str, str]]:
    """(key path, why) for each check pattern in a record's ``[report] required`` or ``waivers`` that
    no check id could match (``day0.core.globs``: over MAX_GLOB characters). A profile day0 loads has
    none; a record is data. Readers pass them over (:func:`required_checks`, :func:`waivers_of`): a
    waiver passed over waives nothing, and a required one makes the run incomplete (events.rebuild)."""
    out = [(f"profile.report.required[{i}]", why) for i, g in enumerate(_report_list(profile, "required"))
           if isinstance(g, str) and (why := _bad_glob(g))]
    return out + [(f"profile.report.waivers[{i}].check", why) for i, w in enumerate(_report_list(profile, "waivers"))
                  if isinstance(w, dict) and isinstance(w.get("check"), str) and (why := _bad_glob(w["check"]))]


def waivers_of(profile: Any) -> list[Waiver]:
    out = []
    for w in _report_list(profile, "waivers"):
        if isinstance(w, dict) and isinstance(w.get("check"), str) and isinstance(w.get("reason"), str) \
                and _bad_glob(w["check"]) is None:
            finding, until = w.get("finding"), w.get("until")
            out.append(Waiver(w["check"], w["reason"], finding if isinstance(finding, str) else None,
                              until if isinstance(until, str) else None))
    return out


def waiver_for(check: _Check, waivers: Sequence[Waiver], on: str | None = None) -> Waiver | None:
    """The waiver that covers this failed check: its id matches, the run (``on``, an ISO time) is not
    past ``until``, and, when the waiver names a finding kind, that kind is the only one the check's
    evidence lists; a failure of any other kind in the same check stays a failure."""
    if check.status != "fail":
        return None
    evidence = getattr(check, "evidence", None)
    kinds = evidence.get("findings") if isinstance(evidence, dict) else None
    for w in waivers:
        if not glob_matches(check.id, w.check):
            continue
        if w.until and on and on[:10] > w.until:
            continue
        # a kind that is not a string (a site stage's object) is one no waiver names: not covered
        if w.finding is not None and (not isinstance(kinds, list) or not kinds or any(k != w.finding for k in kinds)):
            continue
        return w
    return None


def stage_verdict(checks: Sequence[_Check], waivers: Sequence[Waiver] = (), on: str | None = None) -> str:
    """``waived``: the stage's only failures are waived ones (it gates nothing, and is not a pass)."""
    if not checks:
        return "not_run"
    if all(not_applicable(c) for c in checks):
        return NOT_APPLICABLE
    statuses = {c.status for c in checks}
    waived = [c for c in checks if waiver_for(c, waivers, on)]
    if "fail" in statuses and len(waived) < sum(c.status == "fail" for c in checks):
        return "fail"
    if "error" in statuses:
        return "error"
    if waived:
        return "waived"
    if statuses == {"blocked"}:
        return "blocked"
    if "pass" in statuses:
        return "pass"
    if "blocked" in statuses:
        return "blocked"
    return "skip"


def required_checks(profile: Any) -> list[str]:
    """The profile's ``[report] required`` globs, read from the record's own profile section so a
    record's verdict follows from the record alone (rebuild and load agree, run after run). A glob no
    check id could match is left out here and named by :func:`bad_patterns`."""
    return [g for g in _report_list(profile, "required") if isinstance(g, str) and _bad_glob(g) is None]


def stood_in_checks(profile: Any) -> set[str]:
    """Required check ids this run could not measure and required a stand-in for instead (the
    record's ``[report] substituted``, written by the session): a glob that also matches one of them
    does not require it."""
    rep = profile.get("report") if isinstance(profile, dict) else None
    subs = rep.get("substituted") if isinstance(rep, dict) else None
    return {s["check"] for s in subs if isinstance(s, dict) and isinstance(s.get("check"), str)} \
        if isinstance(subs, list) else set()


def unverified_required(stages: Sequence[_Stage], required: Sequence[str],
                        excused: Collection[str] = ()) -> list[tuple[str, str]]:
    """(check id or glob, why) for each required check that was not verified: a matching check that
    is skip, blocked or error, or a glob no check matches at all (a required check that never ran).
    ``excused`` ids (:func:`stood_in_checks`) are not required through a glob."""
    out: list[tuple[str, str]] = []
    by_id: dict[str, list[tuple[int, _Check]]] = {}  # each id's checks, with their place in the run
    for n, c in enumerate(c for s in stages for c in s.checks):
        by_id.setdefault(c.id, []).append((n, c))
    names, reported = Names(by_id), set[str]()  # each glob matched once; each id reported once
    idle = {s.name for s in stages if s.verdict == NOT_APPLICABLE}
    for glob in required:
        if glob.split(".", 1)[0] in idle:
            continue  # a stage that does not apply to this target requires nothing of it
        ids = names.matching(glob)
        if not ids:
            out.append((glob, "required, but no such check ran"))
            reported.add(glob)
        hits = sorted((p for i in ids if i not in excused for p in by_id[i]), key=lambda p: p[0])
        for _, c in hits:  # in run order: the first not-verified check of each id gives its reason
            if c.id not in reported and c.status in ("skip", "blocked", "error") and not not_applicable(c):
                out.append((c.id, f"required, but {c.status}: {c.message}"))
                reported.add(c.id)
    return out


def run_verdict(stages: Sequence[_Stage], finished: bool, required: Sequence[str] = (),
                waivers: Sequence[Waiver] = (), on: str | None = None,
                excused: Collection[str] = (), stopped: bool = False,
                deselected: Mapping[str, int] | None = None) -> tuple[str, str]:
    """(verdict, one-line reason). Only a ``fail`` (measured, outside its limit) rejects; a check
    the harness could not measure (``error``) leaves the run INCOMPLETE, never REJECTED, so a
    method that did not resolve can never be mistaken for a verdict on the deployment. A check the
    profile lists as ``required`` that was skipped, blocked or never ran also leaves it INCOMPLETE:
    a run cannot be accepted on what it did not verify."""
    for s in stages:
        failed = [c for c in s.checks if c.status == "fail" and not waiver_for(c, waivers, on)]
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
    if stopped:  # the session ended, its tests did not: what came after the interruption never ran
        return "incomplete", "the run was interrupted (Ctrl-C or SIGTERM) before its tests ended; the record holds what was measured"
    missing = [s.name for s in stages if s.verdict in ("not_run", "skip", "blocked")]
    if missing:
        return "incomplete", "stages not run, skipped or blocked: " + ", ".join(missing)
    idle = {s.name for s in stages if s.verdict == NOT_APPLICABLE}
    dropped = {name: n for name, n in (deselected or {}).items() if name not in idle}
    if dropped:  # a stage that ran some of its tests: the others' checks, failed or not, are not in the record
        return "incomplete", (f"{sum(dropped.values())} day0 test(s) deselected (-k, -m or --deselect), so not a "
                              "full run: " + ", ".join(f"{n} of stage {name}" for name, n in dropped.items()))
    unverified = unverified_required(stages, required, excused)
    if unverified:
        more = f" (and {len(unverified) - 1} more)" if len(unverified) > 1 else ""
        first, why = unverified[0]
        return "incomplete", f"required check not verified: {first}: {why}{more}"
    waived = [(c, w) for s in stages for c in s.checks if (w := waiver_for(c, waivers, on))]
    if waived:
        c, w = waived[0]
        more = f" (and {len(waived) - 1} more)" if len(waived) > 1 else ""
        return "accepted", (f"every stage ran and passed but for {len(waived)} waived known failure(s): "
                            f"{c.id}: {w.reason}{more}")
    return "accepted", "every stage ran and passed"


@dataclass(frozen=True)
class _Judged:
    """A stage as its checks judge it (duck-types :class:`_Stage` for :func:`run_verdict`)."""

    name: str
    verdict: str
    checks: Sequence[_Check]


def deselected_of(notes: Any) -> dict[str, int]:
    """Stage -> how many of its day0 tests the session deselected (the record's ``notes.deselected``,
    written by the plugin; its shape is checked where it is read, ``record_shape.deselected``)."""
    note = notes.get(DESELECTED_NOTE) if isinstance(notes, dict) else None
    stages = note.get("stages") if isinstance(note, dict) else None
    return {k: v for k, v in stages.items() if isinstance(v, int)} if isinstance(stages, dict) else {}


def contradiction(record: Any) -> str | None:
    """Why a loaded record claims better than its own checks (``key: why``), or None. A stage
    ``pass`` or a run ``accepted`` that its checks contradict is a forged or broken record. Claiming
    worse (a run rejected by hand) is allowed."""
    waivers = waivers_of(record.profile)
    derived = [_Judged(s.name, stage_verdict(s.checks, waivers, record.started_at), s.checks) for s in record.stages]
    for i, (s, d) in enumerate(zip(record.stages, derived)):
        if s.verdict == "pass" and d.verdict != "pass":
            return f"stages[{i}].verdict: 'pass', but its checks give {d.verdict!r}"
    required = [(key, why) for key, why in bad_patterns(record.profile) if key.startswith("profile.report.required")]
    if record.verdict == "accepted" and required:
        return f"verdict: 'accepted', but {required[0][0]} verified nothing ({required[0][1]})"
    if record.verdict == "accepted":
        exit_status = record.notes.get(EXIT_STATUS_NOTE) if isinstance(record.notes, dict) else None
        verdict, reason = run_verdict(derived, finished=record.finished_at is not None,
                                      required=required_checks(record.profile), waivers=waivers,
                                      on=record.started_at, excused=stood_in_checks(record.profile),
                                      stopped=exit_status in STOPPED_EXIT_STATUSES,
                                      deselected=deselected_of(record.notes))
        if verdict != "accepted":
            return f"verdict: 'accepted', but its checks give {verdict!r} ({reason})"
    return None
