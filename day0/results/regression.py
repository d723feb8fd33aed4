"""Judge a run's performance figures against the spread of earlier runs of the same system.

Two runs of an unchanged deployment differ by the run itself: a busier neighbour, a cooler
node, a different request mix in flight. The samples *within* one run (per-request TTFT,
per-iteration busbw) are correlated and say nothing about that spread, so per-sample tests of
one baseline run against this run (Mann-Whitney, bootstrap) flagged noise as "significant";
they are gone. What is known about run-to-run noise is the history: the last N runs of the
same profile on the same machine. Per compared metric:

    centre = median of the history's values        spread = max(1.4826 x MAD, sample std)
    regression: worse than the centre by more than  k_n x spread + tolerance(centre),
                or by the gross factor (doubled / halved), whichever comes first

where ``k_n`` is ``spread_k`` widened for a spread estimated from n runs (a Student-t prediction
interval; :func:`effective_k`: 6.0 for 5 runs, 3.6 for 10, 2.8 for 30 at the default
``spread_k = 2.5``; chosen on simulated nights so that an unchanged system with 10% run-to-run
noise is flagged about once in a thousand nights per metric while a halved throughput is caught),

and symmetrically for an improvement. With fewer than ``history_runs`` values the spread is
unknown, so only gross changes count: worse than the centre by ``gross_factor`` or more (a
lower-is-better metric doubled, a higher-is-better one halved).

Only checks marked ``performance`` are compared: a cross-check (two views agreeing), a count
or a correctness check is judged by its own limit in its own run. A check that fails its own
limit already rejects the run, so it is listed here but not flagged again. Checks measured
several times on one engine (``--day0-repeat N``) are one metric whose run value is the median
over the repeats; ids repeated for another reason (one check per shard or rank) are told apart
by a discriminator from their evidence, else by position.

This module holds the judgement only (records in, rows out); ``day0.results.compare`` turns rows into
run-record checks, charts and the ``day0 compare`` command.
"""

from __future__ import annotations

import difflib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from day0.config.compare import CompareError, CompareSection, Tolerance, match_rank
from day0.core.record import Check, RunRecord, one_line
from day0.core.stats import percentile
from day0.results import history

__all__ = ["CompareError", "CompareResult", "CompareSettings", "KINDS", "Metric", "Row", "Tolerance",
           "check_compatible", "effective_k", "fmt", "is_number", "judge_history", "judge_metric", "match_rank",
           "metrics_by_key", "performance_checks", "profile_differences", "settings_for", "spread_of", "with_unit"]

MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of a normal distribution
KINDS: tuple[str, ...] = ("regression", "improvement", "failed", "new", "missing", "unmeasured", "incomparable",
                          "unchanged")
_ORDER = {k: i for i, k in enumerate(KINDS)}
# Evidence keys that tell repeated checks apart, most telling first.
DISCRIMINATORS: tuple[str, ...] = (
    "shard", "tensor", "rank", "node", "host", "op", "mode", "size_bytes", "file", "name")


# --------------------------------------------------------------------------- settings

#: The profile's ``[compare]`` table, defined once in day0.config.compare (a strict pydantic model):
#: ``from_mapping`` reads it back from a run record, ``with_overrides`` adds ``--tolerance`` pairs,
#: ``tolerance_for`` picks a check's tolerance.
CompareSettings = CompareSection


def settings_for(record: RunRecord, where: str = "") -> CompareSettings:
    """The ``[compare]`` table a run was made with, from its resolved profile in ``run.json``;
    ``where`` names that file in a refusal (the run id where the record was never a file)."""
    return CompareSettings.from_mapping(history.compare_section(record.profile),
                                        f"{where or record.run_id}: profile compare")


# --------------------------------------------------------------------------- metrics of one run


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Metric:
    """One performance figure of one run: the median of its repeats (one value without repeats)."""

    key: str
    check_id: str
    title: str
    unit: str
    direction: str
    checks: tuple[Check, ...]

    @property
    def values(self) -> list[float]:
        """The repeats that measured a number (a fail measured one too; error, skip, blocked did not)."""
        return [float(c.value) for c in self.checks if c.status in ("pass", "fail") and is_number(c.value)]

    @property
    def value(self) -> float | None:
        vs = self.values
        return percentile(vs, 50) if vs else None

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


def performance_checks(record: RunRecord) -> list[Check]:
    """The checks a nightly compares: marked ``performance`` and with a better direction."""
    return [c for c in record.checks() if getattr(c, "performance", False) and c.direction != "exact"]


def _disc_value(check: Check, name: str) -> Any:
    if name == "nodeid":
        return check.nodeid or None
    ev = check.evidence if isinstance(check.evidence, dict) else {}
    v = ev.get(name)
    return v if v is None or isinstance(v, (str, int, float, bool)) else None


def _discriminator(groups: Sequence[list[Check]]) -> tuple[str, ...] | None:
    """The fewest discriminator names whose values are unique within each group. A node id
    differs per repeat (``[repeat2]``), so it tells checks apart only where nothing repeats."""
    names = [*DISCRIMINATORS] + ([] if any(c.repeat is not None for g in groups for c in g) else ["nodeid"])
    names = [n for n in names if any(_disc_value(c, n) is not None for g in groups for c in g)]
    for size in (1, 2, 3):
        for combo in combinations(names, size):
            if all(len({tuple(_disc_value(c, n) for n in combo) for c in g}) == len(g) for g in groups):
                return combo
    return None


def _key(check: Check, names: tuple[str, ...]) -> str:
    shown = [f"{n}={v}" for n, v in ((n, _disc_value(check, n)) for n in names) if v is not None]
    return f"{check.id}[{','.join(shown)}]" if shown else check.id


def metrics_by_key(records: Sequence[RunRecord]) -> tuple[list[dict[str, Metric]], list[str]]:
    """Every record's performance metrics under one keying (so keys match across runs), and
    notes on how repeated ids were told apart. Checks that differ only in ``repeat`` share a key."""
    per_run = [performance_checks(r) for r in records]
    groups: dict[str, list[list[Check]]] = {}  # id -> the checks of one (run, repeat) each
    for checks in per_run:
        by: dict[tuple[str, int | None], list[Check]] = {}
        for c in checks:
            by.setdefault((c.id, c.repeat), []).append(c)
        for (cid, _), g in by.items():
            groups.setdefault(cid, []).append(g)
    how: dict[str, tuple[str, ...] | None] = {}
    notes: list[str] = []
    for cid, gs in sorted(groups.items()):
        most = max(len(g) for g in gs)
        if most < 2:
            continue
        how[cid] = _discriminator(gs)
        if how[cid] is None:
            notes.append(f"{cid} appears up to {most}x in one run with nothing in its evidence to tell them apart; "
                         "matched by position (#1, #2, ...)")
        else:
            notes.append(f"{cid} appears up to {most}x in one run; matched by {', '.join(how[cid] or ())}")
    out: list[dict[str, Metric]] = []
    for checks in per_run:
        pos: Counter[tuple[str, int | None]] = Counter()
        keyed: dict[str, list[Check]] = {}
        for c in checks:
            if c.id not in how:
                k = c.id
            elif how[c.id] is None:
                pos[(c.id, c.repeat)] += 1
                k = f"{c.id}#{pos[(c.id, c.repeat)]}"
            else:
                k = _key(c, how[c.id])  # type: ignore[arg-type]
            keyed.setdefault(k, []).append(c)
        out.append({k: Metric(k, cs[-1].id, cs[-1].title, cs[-1].unit, cs[-1].direction, tuple(cs))
                    for k, cs in keyed.items()})
    return out, notes


# --------------------------------------------------------------------------- the judgement


def spread_of(values: Sequence[float]) -> tuple[float, float]:
    """(median, sigma): a centre one odd run cannot drag, and the larger of 1.4826 x MAD and the
    sample standard deviation. MAD alone, from five runs, is near zero whenever three happen to
    agree: on 100,000 simulated nights of an unchanged system (10% normal noise, 5 runs, 5%
    tolerance) a bound on MAD alone flagged 3.9% of them at k = 3 and 1.2% at the widened k; on
    the larger of the two, 0.08%. An odd night widens the bound, never narrows it."""
    centre = percentile(values, 50)
    mad = MAD_TO_SIGMA * percentile([abs(v - centre) for v in values], 50)
    if len(values) < 2:
        return centre, mad
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return centre, max(mad, std)


@dataclass
class Row:
    """One metric judged against the history; ``why`` is the line a person reads."""

    key: str
    check_id: str
    title: str
    unit: str
    direction: str
    kind: str
    why: str = ""
    value: float | None = None
    repeats: int = 0
    centre: float | None = None
    spread: float | None = None
    bound: float | None = None  # the worst value still accepted
    tolerance: Tolerance | None = None
    gross: bool = False  # fewer than history_runs values: only a gross_factor change counts
    history: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # the history runs the values came from

    @property
    def relative(self) -> float | None:
        if self.value is None or not self.centre:
            return None
        return (self.value - self.centre) / abs(self.centre)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "id": self.check_id, "title": self.title, "unit": self.unit,
                "direction": self.direction, "kind": self.kind, "value": self.value, "repeats": self.repeats,
                "median": self.centre, "spread": self.spread, "bound": self.bound, "relative": self.relative,
                "tolerance": str(self.tolerance) if self.tolerance else None, "gross": self.gross,
                "history": self.history, "history_runs": self.runs, "runs": len(self.history), "why": self.why}


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def with_unit(v: Any, unit: str) -> str:
    return f"{fmt(v)} {unit}".rstrip() if v is not None else "—"


# One-sided Student-t quantiles at the normal 3-sigma tail (p = 0.99865) for 1..30 degrees of freedom.
T_3SIGMA = (235.8, 19.21, 9.22, 6.62, 5.51, 4.9, 4.53, 4.28, 4.09, 3.96, 3.85, 3.76, 3.69, 3.64, 3.59, 3.54,
            3.51, 3.48, 3.45, 3.42, 3.4, 3.38, 3.36, 3.34, 3.33, 3.32, 3.3, 3.29, 3.28, 3.27)


def effective_k(k: float, n: int) -> float:
    """``spread_k`` widened for a spread estimated from only ``n`` runs, as a Student-t prediction
    interval widens: ``k x t(n-1) / z x sqrt(1 + 1/n)`` with the t and normal quantiles at the
    3-sigma tail. With 5 runs, 2.5 becomes 6.0; with 10, 3.6; with 30, 2.8. Without it a plain
    3-sigma bound on five runs flagged 2-5% of the nights of an unchanged system per metric
    (simulated), a false alarm most nights across a dozen metrics."""
    df = n - 1
    t = T_3SIGMA[df - 1] if 1 <= df <= len(T_3SIGMA) else 3.0
    return k * (t / 3.0) * math.sqrt(1.0 + 1.0 / max(n, 1))


def _allowances(centre: float, spread: float, tol: float, gross: bool, factor: float, k: float,
                direction: str) -> tuple[float, float]:
    """(how far worse, how far better) the run may sit from the centre before it counts; ``k`` is
    already widened for the number of runs (:func:`effective_k`). A change by the gross factor
    counts whatever the history's spread: a noisy metric must not hide a halved throughput."""
    up, down = (factor - 1.0) * abs(centre), (1.0 - 1.0 / factor) * abs(centre)  # to centre*f, to centre/f
    bad, good = (up, down) if direction == "lower_is_better" else (down, up)
    bad, good = max(bad, tol), max(good, tol)
    if gross:
        return bad, good
    return min(k * spread + tol, bad), min(k * spread + tol, good)


def judge_metric(now: Metric, past: Sequence[tuple[str, Metric]], settings: CompareSettings) -> Row:
    """One metric of this run against its values in the history runs (label, metric)."""
    row = Row(now.key, now.check_id, now.title, now.unit, now.direction, "unchanged",
              value=now.value, repeats=len(now.checks))
    if row.value is None:
        last = now.checks[-1]
        row.kind, row.why = "unmeasured", one_line(f"not measured in this run ({last.status}: {last.message})")
        return row
    same = [(lbl, v) for lbl, m in past if (v := m.value) is not None and (m.unit or "") == (now.unit or "")]
    if not same:
        other = ", ".join(sorted({m.unit or "none" for _, m in past if m.value is not None}))
        if other:
            row.kind, row.why = "incomparable", f"units differ (history {other}, this run {now.unit or 'none'})"
        else:
            row.kind, row.why = "new", "not measured by the history's runs (a new performance figure)"
        return row
    row.runs = [lbl for lbl, _ in same]
    row.history = [v for _, v in same]
    row.centre, row.spread = spread_of(row.history)
    row.gross = len(row.history) < settings.history_runs
    row.tolerance = settings.tolerance_for(now.key, now.check_id)
    if row.centre == 0 and row.spread == 0 and row.tolerance.relative and row.value != 0:
        # every past run measured 0: a share of 0 allows nothing, so any rise (fragmentation 0.01%)
        # was a regression, noise included. No scale to judge a change by: said, and not judged.
        row.kind, row.why = "incomparable", (f"{with_unit(row.value, row.unit)} vs 0 in all {len(row.history)} runs: "
                                             f"a relative tolerance ({row.tolerance}) of 0 allows nothing; set an "
                                             f"absolute one in [compare.tolerances] to judge {now.key}")
        return row
    bad, good = _allowances(row.centre, row.spread, row.tolerance.allowed(row.centre), row.gross,
                            settings.gross_factor, effective_k(settings.spread_k, len(row.history)),
                            now.direction)
    sign = 1.0 if now.direction == "lower_is_better" else -1.0  # +1: larger is worse
    row.bound = row.centre + sign * bad
    worse = sign * (row.value - row.centre)
    # a gross change counts from the factor on (doubled, halved); a spread-based one beyond its bound
    row.kind = ("regression" if _beyond(worse, bad) else "improvement" if _beyond(-worse, good) else "unchanged")
    row.why = _why(row, good, settings)
    if now.failed:  # the run's own limit rejects it already; listed, not flagged twice
        row.kind = "failed"
        row.why = one_line(f"fails its own limit, which rejects the run already ({now.checks[-1].message}); "
                           f"against the history: {row.why}")
    return row


def _beyond(distance: float, allowed: float) -> bool:
    """At or past the bound (a change of exactly the gross factor counts); nothing when it is 0."""
    return distance >= allowed if allowed > 0 else distance > allowed


def _why(row: Row, good: float, settings: CompareSettings) -> str:
    n = len(row.history)
    rel = row.relative
    change = f"{rel * 100:+.1f}%" if rel is not None else f"{(row.value or 0) - (row.centre or 0):+.4g}"
    reps = f" (median of {row.repeats} repeats)" if row.repeats > 1 else ""
    head = (f"{with_unit(row.value, row.unit)}{reps} vs history median {with_unit(row.centre, row.unit)} "
            f"of {n} run{'s' if n != 1 else ''} ({change})")
    lower = row.direction == "lower_is_better"
    tol = row.tolerance.allowed(row.centre or 0.0) if row.tolerance else 0.0
    reach = abs((row.bound or 0.0) - (row.centre or 0.0))  # how far from the median the bound sits
    by_factor = f"median {'x' if lower else '/'} {settings.gross_factor:g}"
    if row.gross:
        factor = by_factor if reach > tol else (f"median {'+' if lower else '-'} tolerance {row.tolerance}, wider "
                                                f"than a factor of {settings.gross_factor:g}")
        rule = (f"{factor}; the gross bound: fewer than {settings.history_runs} runs, the spread of runs is not "
                "known yet")
    else:
        k = effective_k(settings.spread_k, len(row.history))
        spread = f"{k:.3g} x spread {with_unit(row.spread, row.unit)} + tolerance {row.tolerance}"
        rule = (f"{by_factor}, the gross bound, nearer than {spread}" if reach < k * (row.spread or 0.0) + tol
                else f"median {'+' if lower else '-'} ({spread})")
    bound = f"the bound {with_unit(row.bound, row.unit)} ({rule})"
    how = {"regression": f"worse than {bound}", "unchanged": f"within {bound}",
           "improvement": f"better than the median by more than {fmt(good)} {row.unit}".rstrip()
           + f" (bound on the bad side: {with_unit(row.bound, row.unit)}, {rule})"}[row.kind]
    values = ", ".join(fmt(v) for v in row.history)
    return one_line(f"{head}: {how}; history [{values}]")


@dataclass
class CompareResult:
    """A run judged against a history of earlier runs (oldest first)."""

    run_id: str
    label: str  # which runs: "#37..#41", "run-accepted", ...
    history_ids: list[str]
    profile: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # what limits the verdict; also the run's note
    wanted: int = 5
    gross_factor: float = 2.0
    fail_on_missing: bool = False

    def of(self, *kinds: str) -> list[Row]:
        return [r for r in self.rows if r.kind in kinds]

    @property
    def short(self) -> bool:
        return len(self.history_ids) < self.wanted

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "regression" or (self.fail_on_missing and r.kind == "missing")]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def counts(self) -> dict[str, int]:
        c = Counter(r.kind for r in self.rows)
        return {k: c[k] for k in KINDS if c[k]}

    def against(self) -> str:
        n = len(self.history_ids)
        text = f"{n} earlier run{'s' if n != 1 else ''} ({self.label})"
        if self.short:
            text += (f", fewer than the {self.wanted} compare.history_runs asks for: only changes by a factor of "
                     f"{self.gross_factor:g} are judged")
        return text

    def summary(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items()) or "no performance figures in common"
        n = len(self.regressions)
        head = f"{n} regression{'s' if n != 1 else ''}" if n else "no regression"
        return f"{head} vs {self.against()} ({counts})"

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "history": self.label, "history_run_ids": self.history_ids,
                "profile": self.profile, "history_runs_wanted": self.wanted, "gross_only": self.short,
                "counts": self.counts(), "exit_code": self.exit_code, "notes": self.notes,
                "rows": [r.to_dict() for r in self.rows]}


def check_compatible(past: Sequence[tuple[str, RunRecord]], run: RunRecord) -> None:
    """Earlier runs of the same profile, never the run itself; raises CompareError otherwise, naming
    the baseline as ``past`` does (its file, where it was read from one)."""
    pr = history.profile_name(run)
    for name, base in past:
        if base.run_id == run.run_id:
            raise CompareError(f"baseline {name}: is this run itself; compare with earlier runs "
                               "(fixed paths, latest or latest-accepted)")
        if history.profile_name(base) != pr:
            raise CompareError(f"baseline {name}: profile {history.profile_name(base)!r} differs from this "
                               f"run's {pr!r}; a baseline must be a run of the same profile")


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def profile_differences(base: RunRecord, run: RunRecord, limit: int = 8) -> list[str]:
    """What changed in the resolved profile (a nightly's first question: was it the config?)."""
    fb, fr = _flat(base.profile), _flat(run.profile)
    keys = sorted(k for k in set(fb) | set(fr) if fb.get(k) != fr.get(k) and not k.startswith("compare."))
    lines = [f"{k}: {json.dumps(fb.get(k))} -> {json.dumps(fr.get(k))}" for k in keys[:limit]]
    if len(keys) > limit:
        lines.append(f"... and {len(keys) - limit} more profile keys")
    return lines


def _context_notes(past: Sequence[tuple[str, RunRecord]], run: RunRecord) -> list[str]:
    notes = []
    mr = history.machine_id(run)
    other = sorted({lbl for lbl, rec in past if history.machine_id(rec) != mr})
    if other:
        notes.append(f"machines differ: {', '.join(other)} ran elsewhere than this run ({mr})")
    diffs = profile_differences(past[-1][1], run)
    if diffs:
        notes.append(f"profile differs from {past[-1][0]}: " + "; ".join(diffs))
    return notes


def _unmatched_tolerances(settings: CompareSettings, metrics: Sequence[Metric]) -> list[str]:
    """A [compare.tolerances] key that names no performance figure of these runs, said: a misspelt
    id (``weights.load_time_s`` for ``weights.load_time``) left the default to judge the figure
    it was written for, without a word."""
    ids = sorted({m.check_id for m in metrics})
    out = []
    for pattern in settings.tolerances:
        if any(match_rank(pattern, m.key, m.check_id) is not None for m in metrics):
            continue
        near = difflib.get_close_matches(pattern, ids, n=1, cutoff=0.6)
        out.append(f"compare.tolerances.{pattern} names no performance figure of these runs"
                   + (f" (did you mean {near[0]}?)" if near else "") + "; the default tolerance judged them")
    return out


def judge_history(
    past: Sequence[tuple[str, RunRecord]], run: RunRecord, settings: CompareSettings | None = None,
    label: str = "",
) -> CompareResult:
    """Judge every performance metric of ``run`` against ``past`` (label, record; oldest first)."""
    if not past:
        raise CompareError("no earlier run to compare with")
    check_compatible(past, run)
    settings = settings or settings_for(run)
    tables, notes = metrics_by_key([rec for _, rec in past] + [run])
    now, before = tables[-1], list(zip((lbl for lbl, _ in past), tables[:-1]))
    rows = [judge_metric(m, [(lbl, t[k]) for lbl, t in before if k in t], settings) for k, m in now.items()]
    gone: dict[str, Metric] = {}
    for _, t in before:
        gone.update({k: m for k, m in t.items() if k not in now})
    rows += [Row(k, m.check_id, m.title, m.unit, m.direction, "missing", value=None,
                 why=f"measured in the history ({with_unit(m.value, m.unit)} last) but not in this run")
             for k, m in gone.items()]
    rows.sort(key=lambda r: _ORDER.get(r.kind, 99))  # stable: run order within a kind
    caveats = []
    if len(past) < settings.history_runs:
        caveats.append(f"the history holds {len(past)} run{'s' if len(past) != 1 else ''}, fewer than "
                       f"compare.history_runs = {settings.history_runs}: the spread of runs is not known yet, so only "
                       f"changes by a factor of {settings.gross_factor:g} from the median are judged")
    if not any(before_t for _, before_t in before):
        caveats.append("the history's runs mark no check as a performance figure (recorded before day0 marked "
                       "them): nothing to compare until runs that do are stored")
    elif not now:
        caveats.append("this run marks no check as a performance figure: nothing to compare")
    notes += _unmatched_tolerances(settings, [m for t in tables for m in t.values()])
    return CompareResult(run.run_id, label or ", ".join(lbl for lbl, _ in past), [rec.run_id for _, rec in past],
                         history.profile_name(run), rows, caveats + notes + _context_notes(past, run), caveats,
                         settings.history_runs, settings.gross_factor, settings.fail_on_missing)
