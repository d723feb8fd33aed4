"""The run's stages and checks as the report page shows them: plain view objects, built once.

The templates hold no logic beyond loops and blocks (a site template overrides blocks, not
code), so each check's evidence is worked out here into what the page draws: its statistics,
its charts, its table, its log excerpt, and whatever else it recorded as JSON. Odd evidence
becomes a visible note on its own check, never a crash of the page: the record is data, and a
report that cannot be rendered cannot be signed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import quote

from markupsafe import Markup

from day0.core.record import Check, RunRecord
from day0.core.stages import REGRESSION_STAGE, StageInfo
from day0.core.verdict import waiver_for, waivers_of
from day0.results import charts, summary, trends
from day0.results.anchors import Anchors
from day0.results.compare import SUMMARY_ID
from day0.results.textview import TableView, fmt_value, table_view

REPORT_FILE = "report.html"  # the page's name in every run folder: a baseline's is ../<run id>/report.html
KNOWN_EVIDENCE = ("samples", "charts", "table", "log_excerpt", "trend_charts")
MAX_LOG_CHARS = 20_000
MAX_JSON_CHARS = 16_000
DRAW_ERRORS = (ValueError, ArithmeticError, TypeError)  # what odd evidence can raise while drawn


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


@dataclass
class ChartView:
    svg: Markup | None = None
    problem: str | None = None


@dataclass
class CheckView:
    check: Check
    stage: str
    anchor: str
    value: str
    limit: str
    stats: list[tuple[str, str]] = field(default_factory=list)
    charts: list[ChartView] = field(default_factory=list)
    table: TableView | None = None
    table_problem: str | None = None
    log_excerpt: str | None = None
    other_json: str | None = None
    waiver: str | None = None  # the reason of the profile's waiver that covers this failure

    @property
    def has_details(self) -> bool:
        return bool(self.stats or self.charts or self.table or self.table_problem or self.log_excerpt or self.other_json)


@dataclass
class StageView:
    name: str
    title: str
    question: str
    verdict: str
    counts: dict[str, int]
    checks: list[CheckView]
    duration: str = ""  # its tests' wall time, "1.2 s" ("" when the record has none)
    origin: str = ""  # the distribution that declared a site stage ("" for day0's own)


def _limit_text(c: Check) -> str:
    if c.limit is None:
        return "—"
    return f"{summary.SIGN.get(c.direction, '')} {fmt_value(c.limit)}".strip()


def check_view(stage: str, c: Check, anchor: str) -> CheckView:
    """The check as the page shows it; odd evidence becomes a visible note, never a crash."""
    try:
        return _check_view(stage, c, anchor)
    except DRAW_ERRORS as exc:  # each part is caught on its own inside: this is the last resort
        view = CheckView(c, stage, anchor, fmt_value(c.value), _limit_text(c))
        view.charts.append(ChartView(problem=f"{c.id} evidence: could not be drawn ({type(exc).__name__}: {exc})"))
        return view


def _problem(where: str, exc: Exception) -> str:
    """One line naming the evidence key: a ChartError already says what is wrong, anything else
    (an overflow in a sum of samples near 1e308) names its kind."""
    msg = str(exc) if isinstance(exc, charts.ChartError) else f"could not be drawn ({type(exc).__name__}: {exc})"
    return msg if msg.startswith(where) else f"{where}: {msg}"


def _check_view(stage: str, c: Check, anchor: str) -> CheckView:
    view = CheckView(c, stage, anchor, fmt_value(c.value), _limit_text(c))
    ev = c.evidence if isinstance(c.evidence, dict) else {"value": c.evidence}
    limit = float(c.limit) if charts.is_number(c.limit) and c.direction != "exact" else None
    shown: set[str] = set()  # conventional keys that could not be drawn: shown as recorded
    if "samples" in ev:
        try:
            xs = sorted(charts.clean_samples(ev["samples"], f"{c.id} evidence.samples"))
            st = charts.sample_stats(xs)
            view.stats = [(k, fmt_value(int(v)) if k == "count" else fmt_value(v)) for k, v in st.items()]
            if xs:
                view.charts.append(ChartView(Markup(charts.cdf_chart(xs, c.unit, f"{c.title}: CDF", limit))))
                view.charts.append(
                    ChartView(Markup(charts.percentile_chart(xs, c.unit, f"{c.title}: percentiles", limit)))
                )
        except (charts.ChartError, *DRAW_ERRORS) as exc:  # named, and the list still shown (below) as recorded
            view.charts.append(ChartView(problem=_problem(f"{c.id} evidence.samples", exc)))
            shown.add("samples")
    specs = ev.get("charts")
    if specs is not None:
        if not isinstance(specs, list):
            view.charts.append(ChartView(problem=f"{c.id} evidence.charts: expected a list of chart specs"))
            specs = []
        for i, raw in enumerate(specs):
            where = f"{c.id} evidence.charts[{i}]"
            try:
                view.charts.append(ChartView(Markup(charts.render_spec(charts.parse_spec(raw, where)))))
            except (charts.ChartError, *DRAW_ERRORS) as exc:  # this chart only: the others, the table and log stay
                view.charts.append(ChartView(problem=_problem(where, exc)))
    if "table" in ev:
        view.table, view.table_problem = table_view(ev["table"], f"{c.id} evidence.table")
    excerpt = ev.get("log_excerpt")
    if isinstance(excerpt, str) and excerpt.strip():
        view.log_excerpt = excerpt if len(excerpt) <= MAX_LOG_CHARS else "…\n" + excerpt[-MAX_LOG_CHARS:]
    other = {k: v for k, v in ev.items() if k not in KNOWN_EVIDENCE or k in shown}
    if other:
        text = json.dumps(other, indent=1, ensure_ascii=False, default=str)
        if len(text) > MAX_JSON_CHARS:
            text = text[:MAX_JSON_CHARS] + f"\n… ({len(text) - MAX_JSON_CHARS:,} more characters in run.json)"
        view.other_json = text
    return view


def stage_views(record: RunRecord) -> list[StageView]:
    infos = summary.stage_infos(record)
    anchors = Anchors()
    waivers = waivers_of(record.profile)
    out = []
    for s in record.stages:
        views = []
        for c in s.checks:
            view = check_view(s.name, c, anchors.claim("check-" + _slug(c.id)))
            waiver = waiver_for(c, waivers, record.started_at)
            view.waiver = waiver.reason if waiver else None
            views.append(view)
        counts = {k: sum(c.status == k for c in s.checks) for k in ("pass", "fail", "error", "skip", "blocked")}
        info = infos.get(s.name) or StageInfo(s.name)
        origin = info.origin if info.origin not in ("", "day0") else ""
        out.append(StageView(s.name, info.title or s.name, info.question, s.verdict, counts, views,
                             f"{s.duration_s:.1f} s" if s.duration_s is not None else "", origin))
    return out


@dataclass
class RegressionView:
    """The comparison with the baseline, from the record's regression stage (day0.results.compare)."""

    verdict: str
    message: str
    baseline: list[tuple[str, str]]
    counts: list[tuple[str, int]]
    table: TableView | None
    charts: list[ChartView]
    notes: list[str]
    baseline_link: str = ""


def regression_view(record: RunRecord) -> RegressionView | None:
    """None when the run was not compared; changes first in the table, unchanged rows last."""
    stage = next((s for s in record.stages if s.name == REGRESSION_STAGE.name), None)
    found = next((c for c in stage.checks if c.id == SUMMARY_ID), None) if stage else None
    if stage is None or found is None:
        return None
    ev = found.evidence  # an object (the record's shape is checked on load); its contents are not
    base = ev.get("baseline") if isinstance(ev.get("baseline"), dict) else {}
    facts = [(k, fmt_value(base.get(key))) for k, key in (("Baseline", "label"), ("Baseline file", "path")) if base.get(key)]
    counts = ev.get("counts") if isinstance(ev.get("counts"), dict) else {}
    table, _ = table_view(ev["table"], f"{SUMMARY_ID} evidence.table") if "table" in ev else (None, None)
    charts_out: list[ChartView] = []
    specs = ev.get("trend_charts")
    for i, raw in enumerate(specs if isinstance(specs, list) else []):
        where = f"{SUMMARY_ID} evidence.trend_charts[{i}]"
        try:
            charts_out.append(ChartView(Markup(charts.render_spec(charts.parse_spec(raw, where)))))
        except (charts.ChartError, *DRAW_ERRORS) as exc:
            charts_out.append(ChartView(problem=f"{where}: {exc}"))
    notes = [fmt_value(n, 500) for n in ev.get("notes")] if isinstance(ev.get("notes"), list) else []
    rid = trends.baseline_run_id(record)  # run folders sit side by side: ../<run id>/report.html
    return RegressionView(stage.verdict, found.message, facts,
                          [(str(k), v) for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)],
                          table, charts_out, notes, f"../{quote(rid)}/{REPORT_FILE}" if rid else "")
