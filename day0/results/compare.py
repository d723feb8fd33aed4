"""The nightly comparison as the run record, the report and CI see it.

``day0.results.regression`` judges a run's performance figures against the spread of the last N runs
of the same profile on the same machine; this module finds those runs (the history, or
baseline files named on the command line), turns the judgement into checks of a
``regression`` stage (a summary ``regression.baseline`` first, then one check per compared
metric), draws the trend charts with the history's band, and runs ``day0 compare``.

It reads run records only and returns checks; the session adds them to the run (so this
module never calls back into the session). The ``regression`` stage is kept out of
:data:`day0.core.stages.STAGES`: it is not a Day-0 stage, has no marker and gates nothing, but a
failed check there rejects the run like any other.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from day0.core.events import export_path
from day0.core.inputs import InputError, refusal, term_safe
from day0.core.numbers import whole_number
from day0.core.outputs import write_file
from day0.core.record import Check, RecordError, RunRecord, load, one_line, record_file
from day0.core.stages import REGRESSION_STAGE
from day0.core.terminal import Terminal
from day0.results import history
from day0.results.regression import (
    CompareError,
    CompareResult,
    CompareSettings,
    Row,
    check_compatible,
    fmt,
    is_number,
    judge_history,
    match_rank,
    metrics_by_key,
    settings_for,
    with_unit,
)

SUMMARY_ID = "regression.baseline"
MAX_TREND_CHARTS = 8
CHECK_KINDS = ("regression", "improvement", "unchanged")  # rows that become regression.<key> checks


# --------------------------------------------------------------------------- which runs


@dataclass
class Baselines:
    """The earlier runs a run is judged against, oldest first, as (label, record)."""

    label: str
    runs: list[tuple[str, RunRecord]]
    paths: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # history entries that did not load, named


def resolve_baselines(specs: Sequence[str], run: RunRecord, folder: Path, n: int) -> Baselines:
    """``latest`` (the last ``n`` runs in ``folder``), ``latest-accepted`` (the last ``n``
    accepted ones) or run files/folders (a history of that many runs). No ``runs`` when the history
    has no such run yet, or none that loads: its ``skipped`` names those that did not, and a history
    of corrupt files is then said to be one, not taken for an empty one."""
    specs = [str(s) for s in specs]
    if not specs:
        raise CompareError("no baseline given")
    keywords = [s for s in specs if s in history.BASELINE_KEYWORDS]
    if keywords and len(specs) > 1:
        raise CompareError(f"--baseline {keywords[0]} reads the history; it cannot be combined with other baselines")
    if keywords:
        verdict = "accepted" if keywords[0] == history.LATEST_ACCEPTED else ""
        skipped: list[str] = []
        found = history.recent(folder, n, run.run_id, verdict=verdict, skipped=skipped, before=run.started_at)
        if not found:
            return Baselines(keywords[0], [], skipped=skipped)
        first, last = found[0][0].label, found[-1][0].label
        label = (first if first == last else f"{first}..{last}") + f", {keywords[0]}"
        return Baselines(label, [(e.label, rec) for e, rec in found], [str(e.path) for e, _ in found], skipped)
    loaded = sorted(((str(record_file(Path(spec))), load(Path(spec))) for spec in specs),
                    key=lambda pr: str(pr[1].started_at))  # paths in the runs' order
    check_compatible([(f"{path} (run {rec.run_id})", rec) for path, rec in loaded], run)  # here, where the file is known
    return Baselines(", ".join(rec.run_id for _, rec in loaded), [(rec.run_id, rec) for _, rec in loaded],
                     [path for path, _ in loaded])


# --------------------------------------------------------------------------- output


def _change(r: Row) -> str:
    return f"{r.relative * 100:+.1f}%" if r.relative is not None else ""


def format_table(result: CompareResult, show_all: bool = False) -> str:
    """The table the CLI prints: changes first; unchanged rows only with ``show_all``."""
    lines = [f"day0 compare: run {result.run_id} vs {result.against()} (profile {result.profile})"]
    lines += [f"  note: {n}" for n in result.notes]
    shown = [r for r in result.rows if show_all or r.kind != "unchanged"]
    if shown:
        head = ("KIND", "CHECK", "THIS RUN", "MEDIAN", "SPREAD", "BOUND", "CHANGE", "RUNS", "WHY")
        table = [head]
        for r in shown:
            kind = r.kind.upper() if r.kind in ("regression", "improvement") else r.kind
            table.append((kind, r.key, with_unit(r.value, r.unit), with_unit(r.centre, r.unit), fmt(r.spread),
                          with_unit(r.bound, r.unit), _change(r), str(len(r.history)), r.why))
        widths = [min(48, max(len(str(row[i])) for row in table)) for i in range(len(head) - 1)]
        for row in table:
            cells = [str(c)[: w].ljust(w) for c, w in zip(row, widths)]
            lines.append("  " + "  ".join(cells) + "  " + str(row[-1]))
    unchanged = len(result.of("unchanged"))
    if unchanged and not show_all:
        lines.append(f"  ({unchanged} checks unchanged within the history's spread; --all lists them)")
    lines.append(f"result: {result.summary()}")
    return "\n".join(term_safe(line) for line in lines)  # run ids, keys and notes are record text


def _table(result: CompareResult) -> dict[str, Any]:
    rows = [[r.key, r.kind, fmt(r.value), fmt(r.centre), fmt(r.spread), fmt(r.bound), r.unit, _change(r),
             len(r.history), ", ".join(fmt(v) for v in r.history), r.why] for r in result.rows]
    return {"columns": ["check", "kind", "this run", "history median", "spread", "bound", "unit", "change",
                        "runs", "history", "why"], "rows": rows}


def trend_charts(
    past: Sequence[tuple[str, RunRecord]], run: RunRecord, result: CompareResult, settings: CompareSettings,
) -> list[dict[str, Any]]:
    """Line charts (evidence chart specs) of the compared metrics over the last runs plus this
    one, with the history's median and bound as reference lines: the band the run was judged by.

    Which metrics: ``compare.trend_checks`` patterns, else every compared one, regressions
    first, at most MAX_TREND_CHARTS."""
    runs = list(past)[-max(1, settings.trend_runs - 1):] + [("this run", run)]
    candidates = [r for r in result.rows if r.kind in (*CHECK_KINDS, "failed") and r.centre is not None]
    if settings.trend_checks:
        candidates = [r for r in candidates if any(match_rank(p, r.key, r.check_id) is not None
                                                   for p in settings.trend_checks)]
    tables, _ = metrics_by_key([rec for _, rec in runs])
    labels = [lbl for lbl, _ in runs]
    limits = {c.id: c.limit for c in run.checks()}
    charts = []
    for row in candidates[:MAX_TREND_CHARTS]:
        ys = [t[row.key].value if row.key in t else None for t in tables]
        ref: list[dict[str, Any]] = [{"y": row.centre, "label": "history median"}]
        if row.bound is not None:
            ref.append({"y": row.bound, "label": "gross bound" if row.gross else "bound"})
        seen = [float(y) for y in ys if y is not None] + [float(x["y"]) for x in ref]
        limit = limits.get(row.check_id)
        if is_number(limit) and seen and min(seen) / 2 <= limit <= 2 * max(seen):
            ref.append({"y": float(limit), "label": "limit"})  # a far-off limit would flatten the trend
        charts.append({
            "kind": "line", "title": f"{row.key} over the last {len(runs)} runs ({row.kind})",
            "x_label": "run (history number)", "y_label": row.unit or "value", "x_log": False,
            "series": [{"name": row.key, "x": labels, "y": ys}], "reference": ref,
        })
    return charts


def _where(paths: Sequence[str]) -> str:
    """The baseline file, or the one history folder several came from (the report shows it)."""
    parents = {str(Path(p).parent) for p in paths}
    return paths[0] if len(paths) == 1 else parents.pop() if len(parents) == 1 else "; ".join(paths)


def regression_checks(
    result: CompareResult, paths: Sequence[str] = (), charts: list[dict[str, Any]] | None = None,
) -> list[Check]:
    """The judgement as run-record checks: a summary first (its message becomes the run's
    reason when it rejects), then one check per compared metric with its evidence."""
    regs = result.regressions
    first = f": first {regs[0].key}: {regs[0].why}" if regs else ""
    summary = Check(
        id=SUMMARY_ID, title=f"No regression against {result.against()}",
        status="fail" if regs else "pass", value=len(regs), limit=0, unit="regressions", direction="exact",
        message=one_line(result.summary() + first), source="compare",
        evidence={"baseline": {"label": result.against(), "path": _where(paths), "run_ids": result.history_ids,
                               "paths": list(paths), "runs": len(result.history_ids), "wanted": result.wanted},
                  "counts": result.counts(), "notes": result.notes, "table": _table(result),
                  "trend_charts": charts or []},
    )
    out = [summary]
    for r in result.rows:
        failing = r in regs
        if r.kind not in CHECK_KINDS and not failing:
            continue
        out.append(Check(
            id=f"regression.{r.key}", title=f"{r.title or r.check_id} vs the history",
            status="fail" if failing else "pass", value=r.value, limit=r.bound, unit=r.unit,
            direction=r.direction,  # type: ignore[arg-type]
            message=r.why, source="compare",
            evidence={"kind": r.kind, "median": r.centre, "spread": r.spread, "bound": r.bound,
                      "tolerance": str(r.tolerance) if r.tolerance else None, "gross": r.gross,
                      "history": r.history, "history_runs": r.runs, "runs": len(r.history), "repeats": r.repeats},
        ))
    return out


# --------------------------------------------------------------------------- end of a run


def _error_check(message: str, evidence: dict[str, Any] | None = None) -> Check:
    return Check(id=SUMMARY_ID, title="No regression against the history", status="error",
                 message=message, evidence=evidence or {}, source="compare")


def nightly_checks(
    record: RunRecord, out_dir: Path, spec: str | Sequence[str], log: Callable[[str], None],
    profile: Mapping[str, Any] | None = None,
) -> tuple[list[Check], str | None]:
    """The regression stage's checks for a finished run, and a note for the run record (what
    limits the verdict, or why nothing was compared). The history is the one ``profile`` (the
    run's local profile, resolved; the defaults when None) names, never the record's copy.
    Never raises: a comparison that cannot be made is an ``error`` check (the job asked for
    it), a bug in it too."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    try:
        settings = settings_for(record)
        folder = history.folder_for(history.history_root(profile, Path(out_dir)), record,
                                    str(history.compare_section(profile).get("machine") or ""))
        found = resolve_baselines(specs, record, folder, settings.history_runs)
        if not found.runs and found.skipped:  # stored runs that cannot be read: the job asked for a comparison
            return [_error_check(f"baseline {specs[0]}: {_unreadable(specs[0], folder, found)}",
                                 {"skipped": found.skipped})], None
        if not found.runs:
            msg = f"no {specs[0]} run in {folder} yet; nothing compared (this run starts the history)"
            log(f"regression: {msg}")
            return [], msg
        result = judge_history(found.runs, record, settings, found.label)
        result.notes += found.skipped
        shown = {rec.run_id for _, rec in found.runs}
        recent = [(e.label, rec) for e, rec in history.recent(folder, max(0, settings.trend_runs - 1), record.run_id,
                                                                  before=record.started_at)]
        past = sorted(found.runs + [lr for lr in recent if lr[1].run_id not in shown],
                      key=lambda lr: str(lr[1].started_at))
        checks = regression_checks(result, found.paths, trend_charts(past, record, result, settings))
        log(f"regression: {result.summary()}")
        return checks, "; ".join(result.caveats) or None
    except (CompareError, RecordError, history.HistoryError, OSError) as exc:
        return [_error_check(f"baseline {', '.join(specs)}: {exc}")], None
    except Exception as exc:  # a comparison bug must not cost the run record
        return [_error_check(f"comparison failed: {type(exc).__name__}: {exc} (a day0 bug; the measurements stand)",
                             {"traceback": traceback.format_exc()[-8000:]})], None


def _unreadable(spec: str, folder: Path, found: Baselines) -> str:
    """Why a history of stored runs gave no baseline, for the nightly and ``day0 compare`` alike: none
    of them loads (each named, as every reader of the history names them)."""
    return f"no {spec} run in {folder} could be read ({'; '.join(found.skipped)}); repair or remove those entries"


def regressed(record: RunRecord | None) -> bool:
    """Whether the regression stage failed the run (the plugin turns this into a failing exit)."""
    if record is None:
        return False
    return any(c.failed for s in record.stages if s.name == REGRESSION_STAGE.name for c in s.checks)


# --------------------------------------------------------------------------- CLI


def _cmd_compare(args: argparse.Namespace) -> int:
    run_path = Path(args.run)
    run = load(run_path)
    settings = settings_for(run, str(record_file(run_path))).with_overrides(args.tolerance or [])
    if args.fail_on_missing:
        settings = settings.model_copy(update={"fail_on_missing": True})
    if args.runs is not None:
        if args.runs < 2:
            raise CompareError(f"--runs {args.runs}: expected a number of runs >= 2")
        settings = settings.model_copy(update={"history_runs": args.runs})
    folder = Path(".")
    if any(b in history.BASELINE_KEYWORDS for b in args.baseline):
        root = Path(args.history) if args.history else history.default_root(run_path)  # never the record's
        if args.history and root.exists() and not root.is_dir():  # else read as a history with no run yet
            raise CompareError(f"--history {root}: not a directory (the folder `day0 history add` stores runs in)")
        folder = history.folder_for(root, run, args.machine or "")
    if args.json:
        export_path(args.json, "--json")
    found = resolve_baselines(args.baseline, run, folder, settings.history_runs)
    if not found.runs and found.skipped:
        raise CompareError(f"{_unreadable(args.baseline[0], folder, found)}, or give --baseline PATH")
    if not found.runs:
        raise CompareError(f"no {args.baseline[0]} run in {folder}; give --baseline PATH, or store a run first")
    result = judge_history(found.runs, run, settings, found.label)
    result.notes += found.skipped
    term = Terminal()  # records may come from anywhere (an older day0, another site): redacted again
    term.block(format_table(result, show_all=args.all))
    if args.json:
        write_file(args.json, term.json(result.to_dict(), indent=1, by_key=False) + "\n")
    return result.exit_code


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (CompareError, InputError, OSError) as exc:  # RecordError, HistoryError: unusable input
            print(refusal(exc), file=sys.stderr)
            return 2
        except Exception as exc:  # a fault of day0's own: exit 1 would read as a regression to the nightly
            print(refusal(RuntimeError(f"could not compare ({type(exc).__name__}: {exc}); a fault of day0's own, "
                                       "please report it")), file=sys.stderr)
            return 2

    return run


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``compare`` and ``history``; each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser(
        "compare", help="judge a run against earlier runs: exit 1 on a regression, 2 on unusable input")
    p.add_argument("run", help="run folder or run.json")
    p.add_argument("--baseline", required=True, action="append", metavar="PATH|latest-accepted|latest",
                   help="earlier run folder or run.json (repeatable: a history of that many runs), or the last "
                        "compare.history_runs (accepted) runs in the history")
    p.add_argument("--history", help="history folder (default: history/ beside the run's folder; never the "
                                     "folder the record names)")
    p.add_argument("--machine", help="history machine folder (default: derived from the recorded devices)")
    p.add_argument("--runs", type=whole_number(1), help="history runs to judge against (default: the profile's "
                                            "compare.history_runs, 5); fewer: gross changes only")
    p.add_argument("--tolerance", action="append", metavar="PATTERN=TOL",
                   help="tolerance for checks matching PATTERN, e.g. ttft_p99=5%% or 'collectives.*.busbw=20%%' "
                        "(repeatable; wins over the profile)")
    p.add_argument("--fail-on-missing", action="store_true",
                   help="a performance figure missing from the run is a regression")
    p.add_argument("--all", action="store_true", help="also list unchanged checks")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    p.set_defaults(func=_guard(_cmd_compare))
    history.add_cli(subparsers)
