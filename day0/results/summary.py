"""The figures a signer decides on, drawn from a run record as plain data (no HTML here).

The report's first screen, the terminal's closing lines and ``day0 verify`` all show the same
verdict line and headline figures; building them once, apart from any template (as pytest-html
keeps its data model apart from its pages), keeps the three in agreement and lets them be tested
without a browser. Every figure names the check it comes from, so a reader can follow it down
to its evidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from day0.core.globs import Names
from day0.core.record import Check, RunRecord, required_checks
from day0.core.stages import Figure, StageInfo
from day0.core.verdict import NOT_APPLICABLE, not_applicable, stood_in_checks, waiver_for, waivers_of

NOT_VERIFIED = ("skip", "blocked", "error")
SIGN = {"lower_is_better": "≤", "higher_is_better": "≥", "exact": "="}

# Stage 0's answer to "does this model need a supernode", by the plan's verdict (day0.model.ranks.scope).
ANSWERS = {
    "fits_one_device": "Fits one device",
    "fits_one_node": "Needs several devices on one node",
    "needs_supernode": "Needs a supernode (more than one node)",
    "does_not_fit": "Does not fit the target topology",
}


def num(v: Any) -> float | None:
    """A finite number, or None (bools and strings are not figures)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def fmt(v: Any) -> str:
    """A figure as a person reads it: 4 significant digits, thousands separated."""
    x = num(v)
    if x is None:  # an infinity or NaN is no figure either: a dash, never "inf"
        return "—" if v is None or isinstance(v, float) else str(v)
    if x == 0:
        return "0"
    if abs(x) >= 1e12:  # as textview.fmt_value: 1e300 written out is 400 characters
        return f"{x:.3e}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 1e-3:
        return f"{x:.4g}"
    return f"{x:.2e}"


# --------------------------------------------------------------------------- verdict line


def not_verified_ids(record: RunRecord) -> list[str]:
    """Distinct ids of checks that did not verify anything (skip, blocked, error), in run order;
    a check repeated across repeats counts once."""
    return list(dict.fromkeys(c.id for c in record.checks() if c.status in NOT_VERIFIED))


def verdict_line(record: RunRecord) -> str:
    """The verdict as every place prints it: "ACCEPTED, 7 checks not verified". An ACCEPTED that
    rests on skipped checks must say so wherever the word ACCEPTED appears."""
    n = len(not_verified_ids(record))
    label = str(record.verdict).upper()
    return f"{label}, {n} check{'s' if n != 1 else ''} not verified" if n else label


# --------------------------------------------------------------------------- headline figures


@dataclass
class Headline:
    """One figure against its limit; ``status`` is the check's, or ``absent`` when none ran."""

    key: str
    label: str
    value: float | None
    text: str
    limit: str
    status: str
    check_id: str
    note: str = ""
    direction: str = ""
    trend: list[tuple[str, float]] = field(default_factory=list)  # (run id, value), oldest first
    baseline_index: int | None = None  # which trend point the regression baseline is
    waived: bool = False  # a fail the profile's [report] waivers accept: shown as such
    answer: str = ""  # the figure's answer in words (Figure.answer_key), under the terminal's table


def _worst(checks: Sequence[Check]) -> Check:
    """The worst of a repeated check: a fail first, then the value farthest on the wrong side."""
    failed = [c for c in checks if c.status == "fail"]
    pool = failed or [c for c in checks if num(c.value) is not None] or list(checks)
    if len(pool) == 1 or num(pool[0].value) is None:
        return pool[0]
    key: Callable[[Check], float] = lambda c: num(c.value) or 0.0  # noqa: E731
    return min(pool, key=key) if pool[0].direction == "higher_is_better" else max(pool, key=key)


def _limit(c: Check, scale: float = 1.0, unit: str | None = None) -> str:
    x = num(c.limit)
    if x is None:
        return "no limit set"
    return f"{SIGN.get(c.direction, '')} {fmt(x * scale)} {c.unit if unit is None else unit}".strip()


def _vs_expected(checks: list[Check]) -> Check:
    """The collective furthest below (or least above) its expected bandwidth."""
    scored = []
    for c in checks:
        v = num(c.value)
        ev = c.evidence if isinstance(c.evidence, dict) else {}
        exp = num(ev.get("expected_gbps")) or num(c.limit)
        if c.status == "fail" or (v is not None and exp):
            scored.append((0 if c.status == "fail" else 1, (v or 0.0) / exp if v is not None and exp else 0.0, c))
    return min(scored, key=lambda t: (t[0], t[1]))[2] if scored else checks[0]


PICKERS: dict[str, Callable[[list[Check]], Check]] = {"worst": _worst, "vs_expected": _vs_expected}


class CheckIndex:
    """The run's checks by id, each glob matched once against the distinct ids (and only against
    those sharing its literal prefix): the first screen asks many globs of many checks (figures,
    required, history runs), and matching each glob against every check each time took 100 s on
    20,000 checks and 2,000 figures."""

    def __init__(self, checks: Iterable[Check]) -> None:
        self.by_id: dict[str, list[tuple[int, Check]]] = {}
        for n, c in enumerate(checks):
            self.by_id.setdefault(c.id, []).append((n, c))
        self.names = Names(self.by_id)

    def ids(self, glob: str) -> list[str]:
        """The distinct check ids ``glob`` matches (fnmatch); ValueError for a glob past ``MAX_GLOB``."""
        return self.names.matching(glob)

    def checks(self, glob: str) -> list[Check]:
        """The checks ``glob`` matches, in run order."""
        return [c for _, c in sorted((p for i in self.ids(glob) for p in self.by_id[i]), key=lambda p: p[0])]


def _index(checks: list[Check] | CheckIndex) -> CheckIndex:
    return checks if isinstance(checks, CheckIndex) else CheckIndex(checks)


def _hits(fig: Figure, index: CheckIndex, key: str = "") -> list[Check]:
    """The checks of the first of the figure's globs that measured a value (pass or fail), else of
    the first that has any check: a figure two methods can measure shows the one that did. A glob
    no check id could be is refused naming ``key`` (its place in the record)."""
    per_glob = []
    for k, g in enumerate(fig.check_ids):
        try:
            per_glob.append(index.checks(g))
        except ValueError as exc:
            raise ValueError(f"{key or fig.key}.check_ids[{k}]: {exc}") from None
    measured = [h for h in per_glob if any(c.status in ("pass", "fail") for c in h)]
    return (measured or [h for h in per_glob if h] or [[]])[0]


def headline(fig: Figure, checks: list[Check] | CheckIndex, hits: list[Check] | None = None) -> Headline:
    """The figure from the checks of this run (its globs tried in order; ``hits`` when already found)."""
    hits = _hits(fig, _index(checks)) if hits is None else hits
    if not hits:
        return Headline(fig.key, fig.label, None, "—", "", "absent", ", ".join(fig.check_ids),
                        "not measured in this run")
    c = PICKERS[fig.pick](hits)
    v = num(c.value)
    scaled = num(v * fig.scale) if v is not None else None  # None past a float's range: 1e300 x 1e300
    unit = c.unit if fig.unit is None else fig.unit
    text = f"{fmt(scaled)} {unit}".strip() if scaled is not None else "—"
    note = "" if len(hits) == 1 else f"worst of {len(hits)}"
    if v is not None and scaled is None:
        note = (note + "; " if note else "") + f"{fmt(v)} {c.unit} x {fig.scale:g} is past a float's range".strip()
    ev = c.evidence if isinstance(c.evidence, dict) else {}
    if fig.pick == "vs_expected":
        exp = num(ev.get("expected_gbps"))
        what = c.id.split(".")[1] if c.id.count(".") >= 2 else c.id
        note = f"{what}" + (f"; expected {fmt(exp)} {c.unit}, {fmt(v / exp)}x" if exp and v is not None else "")
    elif fig.need:
        note = (note + "; " if note else "") + f"needs {fmt(c.limit)} {c.unit}".strip()
    if c.status in NOT_VERIFIED:
        note = (note + "; " if note else "") + c.message
    told = ev.get(fig.answer_key) if fig.answer_key else None
    answer = told if isinstance(told, str) else ""
    if answer:
        note = (note + "; " if note else "") + answer
    return Headline(fig.key, fig.label, scaled, text, _limit(c, fig.scale, fig.unit),
                    c.status, c.id, note, c.direction, answer=answer)


def stage_infos(record: RunRecord) -> dict[str, StageInfo]:
    """Each stage's declaration as the record keeps it. A record made before stages declared
    themselves in it gets today's built-in declarations (titles, questions, figures)."""
    if any(s.info is not None and s.info.origin for s in record.stages):
        return {s.name: s.info for s in record.stages if s.info is not None}
    from day0.stages.registry import builtin  # only for older records: imports the stage packages

    known = {st.name: st.info for st in builtin()}
    return {s.name: s.info or known.get(s.name) or StageInfo(s.name) for s in record.stages}


def figures(record: RunRecord) -> list[Figure]:
    """The headline figures the record's stages declared, in stage order."""
    return [f for info in stage_infos(record).values() for f in info.figures]


def headlines(record: RunRecord, index: CheckIndex | None = None) -> list[Headline]:
    """The declared figures, less those that do not apply to this target: a stage that is not
    applicable (expert load on a dense model), a figure whose checks all say they do not apply
    (speculative acceptance with speculation not in force), or an opt-in figure the run did not
    ask for (capacity without a search). A figure the run should have measured and did not still
    shows as absent."""
    index = index or CheckIndex(record.checks())
    idle = {s.name for s in record.stages if s.verdict == NOT_APPLICABLE}
    place = {s.name: i for i, s in enumerate(record.stages)}
    waivers = waivers_of(record.profile)
    out = []
    for stage, info in stage_infos(record).items():
        if stage in idle:
            continue
        for j, fig in enumerate(info.figures):
            hits = _hits(fig, index, f"stages[{place.get(stage, '?')}].figures[{j}]")
            if (hits and all(not_applicable(c) for c in hits)) or (fig.opt_in and not hits):
                continue
            h = headline(fig, index, hits)
            picked = next((c for c in hits if c.id == h.check_id and c.status == h.status), None)
            h.waived = picked is not None and waiver_for(picked, waivers, record.started_at) is not None
            out.append(h)
    return out


# --------------------------------------------------------------------------- stage 0's answer


@dataclass
class Adaptation:
    """Does this model need a supernode: the plan's answer and the smallest layout that fits."""

    verdict: str
    answer: str
    smallest: str
    planned: str
    status: str
    message: str


def adaptation(record: RunRecord) -> Adaptation | None:
    """From the preflight plan (check ``preflight.plan.verdict``); None when no plan was made."""
    c = next((c for c in record.checks() if c.id == "preflight.plan.verdict"), None)
    if c is None:
        return None
    ev = c.evidence if isinstance(c.evidence, dict) else {}
    plan = ev.get("plan") if isinstance(ev.get("plan"), dict) else {}
    smallest_verdict = str(plan.get("smallest_verdict") or plan.get("verdict") or c.value or "")
    tp, pp = plan.get("smallest_tp"), plan.get("smallest_pp")
    smallest = f"TP={tp} x PP={pp}" if tp and pp else "none fits"
    ranks = (plan.get("tp") or 0) * (plan.get("pp") or 0) if num(plan.get("tp")) and num(plan.get("pp")) else 0
    planned = (f"TP={plan.get('tp')} x PP={plan.get('pp')} = {ranks} ranks on {plan.get('nodes', '?')} node(s)"
               if ranks else "—")
    answer = ANSWERS.get(smallest_verdict, smallest_verdict or "no answer recorded")
    return Adaptation(str(plan.get("verdict") or c.value or ""), answer, smallest, planned, c.status, c.message)


# --------------------------------------------------------------------------- what was not verified


@dataclass(frozen=True)
class Unverified:
    check_id: str
    status: str  # skip, blocked, error, or absent (a required check that never ran)
    reason: str
    required: bool
    times: int = 1


def unverified(record: RunRecord, index: CheckIndex | None = None) -> list[Unverified]:
    """Every check that verified nothing, each once with its reason; required ones first. A
    required glob is matched once against the distinct ids (as day0.core.verdict.unverified_required
    judges it: a glob no check matches is absent, unless its stage did not apply to this target)."""
    req, excused = required_checks(record.profile), stood_in_checks(record.profile)
    index = index or CheckIndex(record.checks())
    required: set[str] = set()
    absent = []
    idle = {s.name for s in record.stages if s.verdict == NOT_APPLICABLE}
    for g in req:  # a glob past the length limit is not among them (day0.core.verdict.bad_patterns names it)
        ids = index.ids(g)
        required.update(ids)
        if not ids and g.split(".", 1)[0] not in idle:
            absent.append(Unverified(g, "absent", "required, but no such check ran", True))
    by_id: dict[str, list[Check]] = {}
    for c in record.checks():
        if c.status in NOT_VERIFIED:
            by_id.setdefault(c.id, []).append(c)
    out = [Unverified(i, cs[0].status, cs[0].message, i not in excused and i in required, len(cs))
           for i, cs in by_id.items()]
    return sorted(absent + out, key=lambda u: not u.required)


def failed(record: RunRecord) -> list[Check]:
    """Failed checks, each id once (the first failure of a repeated check)."""
    seen: dict[str, Check] = {}
    for c in record.checks():
        if c.status == "fail":
            seen.setdefault(c.id, c)
    return list(seen.values())


# --------------------------------------------------------------------------- the whole summary


@dataclass
class Summary:
    verdict: str
    verdict_line: str
    reason: str
    adaptation: Adaptation | None
    headlines: list[Headline]
    failed: list[Check]
    unverified: list[Unverified]
    required: list[str]
    trend_runs: int = 0
    baseline_run: str = ""
    trend_notes: list[str] = field(default_factory=list)  # history runs passed over for the trends, and why


def summarize(record: RunRecord, history: Iterable[RunRecord] = (), baseline_run_id: str = "",
              unloaded: Sequence[str] = ()) -> Summary:
    """The first screen's data. ``history`` is earlier runs of the same profile and machine
    (oldest first); each headline then carries its values over those runs and this one.
    ``unloaded``: the history entries that did not load, named, noted before the trends' own."""
    index = CheckIndex(record.checks())
    heads = headlines(record, index)
    past = [r for r in history if r.run_id != record.run_id]
    notes = add_trends(heads, [*past, record], baseline_run_id, {h.key: h.value for h in heads}) if past else []
    return Summary(record.verdict, verdict_line(record), record.reason, adaptation(record), heads,
                   failed(record), unverified(record, index), required_checks(record.profile),
                   len(past) + 1 - len(notes) if past else 0, baseline_run_id, [*unloaded, *notes])


def add_trends(heads: list[Headline], runs: Sequence[RunRecord], baseline_run_id: str = "",
               last: dict[str, float | None] | None = None) -> list[str]:
    """Each headline's value in each run (runs without the figure leave a gap, not a zero). ``last``:
    the last run's values when already worked out (this run's, from :func:`summarize`). An earlier
    run whose figures cannot be read (a glob past ``MAX_GLOB``, stored by an older day0) is passed
    over, one note each returned: history is another run's file, and must never stop this run's report."""
    per_run, notes = [], []
    for n, r in enumerate(runs):
        if last is not None and n == len(runs) - 1:
            per_run.append((r.run_id, last))
            continue
        try:
            per_run.append((r.run_id, {h.key: h.value for h in headlines(r)}))
        except ValueError as exc:
            notes.append(f"history run {r.run_id} passed over for the trends: {exc}")
    for h in heads:
        h.trend = [(rid, vals[h.key]) for rid, vals in per_run if vals.get(h.key) is not None]  # type: ignore[misc]
        ids = [rid for rid, _ in h.trend]
        h.baseline_index = ids.index(baseline_run_id) if baseline_run_id in ids else None
    return notes


def answer_lines(s: Summary) -> list[str]:
    """The figures' answers in words, one line each, for under the terminal's table; then a note for
    each history run the trends passed over (so a gap in a trend is explained, not silent)."""
    return [f"{h.label}: {h.answer}" for h in s.headlines if h.answer and h.status != "absent"] + \
        [f"note: {n}" for n in s.trend_notes]


def headline_rows(s: Summary) -> list[tuple[str, str, str, str]]:
    """(metric, value, limit, status) rows, like vLLM bench's result block, for the terminal."""
    return [(h.label, h.text, h.limit, h.status.upper() + (" (waived)" if h.waived else ""))
            for h in s.headlines if h.status != "absent"]
