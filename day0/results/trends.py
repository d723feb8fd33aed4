"""Headline figures over the last runs of the same profile and machine: small multiples.

A figure on its own says whether a run is inside its limit; beside the last runs it also says
whether the system moved. The runs come from the history (day0.results.history), never from a
re-measurement, and the baseline the regression stage compared against is marked, so the chart
and the regression verdict point at the same run.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

from day0.core.record import RunRecord
from day0.results.compare import SUMMARY_ID
from day0.results.history import HistoryError, default_root, folder_for, recent
from day0.results.summary import Headline, fmt

TREND_RUNS = 10
W, H, PAD = 168, 40, 5
LINE, BASE, NOW = "#0072B2", "#E69F00", "#1f2328"


def baseline_run_id(record: RunRecord) -> str:
    """The newest history run the regression stage compared against ('' when not compared)."""
    for s in record.stages:
        for c in s.checks:
            if c.id == SUMMARY_ID and isinstance(c.evidence, dict):
                base = c.evidence.get("baseline")
                ids = base.get("run_ids") if isinstance(base, dict) else None
                if isinstance(ids, list) and ids and isinstance(ids[-1], str):
                    return ids[-1]
    return ""


def history_runs(record: RunRecord, run_file: Path, n: int = TREND_RUNS,
                 root: Path | None = None) -> tuple[list[RunRecord], list[str]]:
    """Earlier stored runs of this profile and machine, oldest first (this run excluded), from
    ``root`` (the local profile's history, which the run passes) or else the default beside the
    run folders; never a folder the record names. None there means no trend. Beside them, the
    entries that did not load, named: a trend with a run missing says why, as the nightly does."""
    skipped: list[str] = []
    try:
        root = root if root is not None else default_root(run_file)
        found = recent(folder_for(root, record), n - 1, exclude_run_id=record.run_id, skipped=skipped,
                       before=record.started_at)
    except (OSError, HistoryError):
        return [], skipped
    return [r for _, r in found], skipped


def sparkline(h: Headline) -> str:
    """One small multiple: the figure's values, oldest left, the baseline ringed, this run dark.
    No text inside (the value and limit stand beside it), so nothing can overlap."""
    pts = h.trend
    if len(pts) < 2:
        return ""
    ys = [v for _, v in pts]
    lo, hi = min(ys), max(ys)
    if max(abs(lo), abs(hi)) > 1e300:  # as charts' axes: the span would overflow and every point be nan
        return ""
    span = (hi - lo) or (abs(hi) * 0.1 or 1.0)
    lo -= span * 0.1
    hi = lo + span * 1.2

    def xy(i: int, v: float) -> tuple[float, float]:
        x = PAD + i * (W - 2 * PAD) / (len(pts) - 1)
        return round(x, 1), round(H - PAD - (v - lo) / (hi - lo) * (H - 2 * PAD), 1)

    coords = [xy(i, v) for i, (_, v) in enumerate(pts)]
    line = " ".join(f"{x},{y}" for x, y in coords)
    parts = [f'<polyline fill="none" stroke="{LINE}" stroke-width="1.5" points="{line}"/>']
    if h.baseline_index is not None:
        bx, by = coords[h.baseline_index]
        parts.append(f'<circle class="baseline" cx="{bx}" cy="{by}" r="4" fill="none" stroke="{BASE}" stroke-width="2"/>')
    if h.value is not None:  # the last point is this run's only when it has one (a run without it leaves a gap)
        nx, ny = coords[-1]
        parts.append(f'<circle cx="{nx}" cy="{ny}" r="3" fill="{NOW}"/>')
    title = f"{h.label} over the last {len(pts)} runs: " + ", ".join(fmt(v) for v in ys)
    if h.baseline_index is not None:
        title += f" (baseline: run {pts[h.baseline_index][0]})"
    return (f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" '
            f'height="{H}" role="img"><title>{escape(title)}</title>{"".join(parts)}</svg>')


def sparklines(heads: Sequence[Headline]) -> dict[str, str]:
    """key -> SVG for each headline with at least two runs."""
    return {h.key: s for h in heads if (s := sparkline(h))}
