"""Stage 3's capacity answer, from a capacity search (``search``): the sustained load per replica,
its margin to the SLA, the replicas a target load needs, and the Pareto view of the points.

A team quotes "one replica sustains X req/s (Y output tok/s per device) within the SLA, so the
launch needs N replicas", not "p99 TTFT at 4 req/s passed"; this module turns the points into
that sentence (the check ``latency.capacity`` and its ``answer``, which the first screen and the
terminal show) and into the data behind it (docs/metrics.md, Capacity).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from day0.client.prom import pct_name
from day0.config.latency import CapacitySearch, SlaSection
from day0.core.record import Check, measured
from day0.core.stats import offered_burst, samples_to_bound
from day0.stages.latency.judging import lag_text
from day0.stages.latency.measurement import (
    CLIENT_LAGGED,
    MEETS,
    MISSES,
    PROBED,
    SATURATION,
    UNDECIDED,
    SearchPoint,
    SearchResult,
)
from day0.stages.latency.metrics import SOURCE, rounded
from day0.stages.latency.spells import late_text

CHECK_ID, TITLE = "latency.capacity", "Capacity: highest load meeting the SLA (confidence-bounded)"


def point_load(result: SearchResult, x: float) -> str:
    """A load on the search's axis in words: "12.5 req/s" or "concurrency 12"."""
    return f"concurrency {x:g}" if result.axis == "concurrency" else f"{x:.4g} {result.unit}"


@dataclass(frozen=True)
class Margin:
    """How far a met point's upper bound sits under one limit: ``share`` = (limit - upper) / limit."""

    key: str
    upper: float
    limit: float

    @property
    def share(self) -> float:
        return (self.limit - self.upper) / self.limit


def margins(point: SearchPoint, sla: SlaSection) -> list[Margin]:
    """Every limited percentile's margin at ``point``, tightest first (upper bounds only: a met
    point has them all)."""
    out = []
    for metric, p, limit in sla.latency_limits():
        key = f"{metric}_{pct_name(p)}"
        upper = point.bounds.get(key, (None, None))[1]
        if upper is not None:
            out.append(Margin(key, upper, limit))
    return sorted(out, key=lambda m: m.share)


def interactivity(point: SearchPoint) -> float | None:
    """Output tok/s one user sees: 1000 / mean TPOT (ms); None without a TPOT sample."""
    tpot = point.metrics.stats.get("tpot")
    return 1000.0 / tpot.mean if tpot is not None and tpot.count and tpot.mean > 0 else None


def pareto_rows(result: SearchResult, devices: int) -> list[dict[str, Any]]:
    """Per point, by load: throughput per device against interactivity (InferenceX's axes)."""
    return [{"offered": rounded(pt.load), "achieved_req_s": rounded(pt.metrics.request_throughput),
             "output_tok_s": rounded(pt.metrics.output_throughput),
             "output_tok_s_per_device": rounded(pt.metrics.output_throughput / devices),
             "tok_s_per_user": rounded(interactivity(pt)), "verdict": pt.verdict}
            for pt in sorted(result.points, key=lambda pt: pt.load)]


def answer(result: SearchResult, sla: SlaSection, search: CapacitySearch, devices: int) -> str:
    """The first screen's sentence: per replica, margin, replicas for the target."""
    point = result.sustained_point
    if point is None:
        return ""
    best, achieved = point.load, point.metrics.request_throughput
    sat = result.saturation
    text = (f"{point_load(result, best)} per replica ("
            + (f"{achieved:.4g} req/s, " if result.axis != "rate" else "")
            + (f"{best / sat.req_s:.0%} of the {sat.req_s:.4g} req/s it completes flat out, "
               if sat is not None and sat.applies and sat.req_s else "")
            + f"{point.metrics.output_throughput / devices:.4g} output tok/s per device, {devices} device(s))")
    tight = margins(point, sla)
    if tight:
        m = tight[0]
        text += f"; margin {m.share:.0%} on {m.key} ({m.upper:.4g} of {m.limit:g} ms, upper bound)"
    per_replica = best if result.axis == "rate" else achieved
    if search.target_rate and per_replica > 0:
        text += f"; {math.ceil(search.target_rate / per_replica)} replicas for {search.target_rate:g} req/s"
    return text


def capacity_check(result: SearchResult, sla: SlaSection, search: CapacitySearch, devices: int = 1) -> Check:
    """``latency.capacity``: the sustained load (pass), no load meeting the SLA (fail), or a search
    that could not decide (error, naming the point and what to change)."""
    best, miss, top, last = result.sustained, result.first_miss, result.ceiling, result.points[-1]
    evidence = _evidence(result, sla, search, devices)
    unbounded = last.verdict == UNDECIDED and bool(last.unbounded)
    if last.verdict == CLIENT_LAGGED or unbounded or (best is None and miss is None):
        why = (f"{lag_text(last)}, twice at {point_load(result, last.load)}: add latency.workers, or run day0 on a "
               "host the engine does not share" if last.verdict == CLIENT_LAGGED else
               f"{last.metrics.sent} requests at {point_load(result, last.load)} cannot decide "
               f"{', '.join(last.undecided)} at {result.confidence:.0%} (the limit lies inside the interval, or "
               f"too few requests: {_needed(sla, result.confidence)}); " + _more_requests(last))
        return Check(CHECK_ID, TITLE, "error", unit=result.unit, direction="higher_is_better", source=SOURCE,
                     evidence=evidence, message=f"could not measure: {why}")
    if best is None and result.unheld is not None:
        return Check(CHECK_ID, TITLE, "error", unit=result.unit, direction="higher_is_better", source=SOURCE,
                     evidence=evidence, message=(
                         f"could not measure: {point_load(result, result.unheld.load)} met over a short point, but "
                         f"{result.stopped}; below a held rate that did not meet, short points overstate what "
                         "holds, so none is the answer"))
    if best is None:
        return Check(CHECK_ID, TITLE, "fail", value=0.0, unit=result.unit, direction="higher_is_better", source=SOURCE,
                     evidence=evidence,
                     message=(f"no load tried meets the SLA: the lowest, {point_load(result, miss.load)}, misses "
                              f"{', '.join(miss.misses)}" if miss else "no load tried meets the SLA"))
    probes = f", probes of {result.probe_requests} while climbing" if any(pt.verdict == PROBED for pt in result.points) else ""
    told = (f"sustains {point_load(result, best)} within the SLA ({result.confidence:.0%} bounds, "
            f"{result.requests_per_point} requests a point{probes})")
    if top is not None:
        late = late_text(top.late)
        told += (f"; {point_load(result, top.load)} misses {why_not_met(top)}" if top.verdict == MISSES else
                 f"; {point_load(result, top.load)} is the SLA's edge ({', '.join(top.undecided)}: the limit inside "
                 f"the interval{'; ' + late if late else ''})")
    if result.saturation is not None and not result.saturation.applies:
        told += f"; {result.saturation.text()}"
    told += f"; {result.stopped}"
    told += f"; {evidence['answer']}"
    return measured(CHECK_ID, TITLE, round(best, 4), None, unit=result.unit, direction="higher_is_better",
                    source=SOURCE, evidence=evidence, message=told)


def _more_requests(point: SearchPoint) -> str:
    """What gives the point more requests: at a low rate the measured phase's ``duration_s`` ends a
    point before its requests are sent (299 at 0.5 req/s take 10 minutes), and more of them would
    only be cut too."""
    if point.metrics.not_sent and not point.early:
        return (f"{point.metrics.not_sent} of its requests were not sent before latency.duration_s ended the "
                "point: raise latency.duration_s")
    return "raise latency.search.requests"


def _needed(sla: SlaSection, confidence: float) -> str:
    return ", ".join(f"{metric}_{pct_name(p)} needs {samples_to_bound(p, confidence)}"
                     for metric, p, _ in sla.latency_limits())


def burstier_share(pt: SearchPoint, axis: str) -> float | None:
    """Of fresh Poisson schedules like the point's, the share its own arrivals queue worse than
    (docs/metrics.md, "Offered bursts"): near the edge one draw's bursts can decide a p99 over a few
    hundred requests, so a miss on arrivals burstier than 97% of draws reads differently from one on
    a typical draw. Open-loop points only: a closed loop's arrivals (a concurrency search, the flat-out
    run) follow the server. None under 50 requests."""
    if axis != "rate" or SATURATION in pt.misses:
        return None
    offered = offered_burst(sorted(pt.metrics.sample_offsets_s))
    return None if offered is None else rounded(1.0 - offered.calmer)


def _evidence(result: SearchResult, sla: SlaSection, search: CapacitySearch, devices: int) -> dict[str, Any]:
    """The points as a table, the bounds chart, the Pareto data and chart, and at the sustained
    point what the cost stage prices (its output throughput) and the answer."""
    keys = [f"{metric}_{pct_name(p)}" for metric, p, _ in sla.latency_limits()]
    by_load = sorted(result.points, key=lambda pt: pt.load)
    rows = [[rounded(pt.load), rounded(pt.metrics.request_throughput), pt.metrics.completed,
             *[_interval(pt.bounds.get(k)) for k in keys], rounded(pt.metrics.error_rate), rounded(pt.lag_ms),
             rounded(pt.metrics.loop_stall_ms), burstier_share(pt, result.axis), _verdict_text(pt) + _extends_text(pt)]
            for pt in by_load]
    pareto = pareto_rows(result, devices)
    evidence: dict[str, Any] = {
        "table": {"columns": [f"offered ({result.unit})", "achieved req/s", "completed",
                              *[f"{k} (ms, {result.confidence:.0%})" for k in keys], "error rate",
                              "client lag p90 (ms)", "client loop stall (ms)",
                              "arrivals burstier than (share of Poisson draws)", "verdict"], "rows": rows},
        "charts": [_bounds_chart(result, by_load, sla), _pareto_chart(pareto, sla)],
        "pareto": pareto, "devices": devices,
        "axis": result.axis, "unit": result.unit,
        "order": [rounded(pt.load) for pt in result.points], "stopped": result.stopped,
        "requests_per_point": result.requests_per_point, "probe_requests": result.probe_requests,
        "requests_sent": result.requests_sent, "requests_by_part": result.requests_by_part,
        "late": [{"offered": rounded(pt.load), "limit": lt.key, "limit_ms": lt.limit_ms,
                  "spells": [asdict(sp) for sp in lt.spells]} for pt in result.points for lt in pt.late if lt.late],
        "confidence": result.confidence,
        "saturation": None if result.saturation is None else {**asdict(result.saturation),
                                                               "applies": result.saturation.applies,
                                                               "text": result.saturation.text()},
        "search": search.model_dump(), "answer": answer(result, sla, search, devices),
        "definition": "docs/metrics.md, Confidence and Capacity; docs/stages/latency.md, Capacity search"}
    best = result.sustained_point
    if best is not None:
        evidence["sustained"] = {"offered": rounded(best.load), "load": point_load(result, best.load),
                                 "achieved_req_s": rounded(best.metrics.request_throughput),
                                 "output_tok_s": rounded(best.metrics.output_throughput),
                                 "margins": [{"limit": m.key, "upper_ms": rounded(m.upper), "limit_ms": m.limit,
                                              "share": rounded(m.share)} for m in margins(best, sla)]}
    return evidence


def _verdict_text(pt: SearchPoint) -> str:
    if pt.verdict == MEETS:
        return MEETS
    if pt.verdict == PROBED:
        return f"{PROBED}: did not miss over {pt.metrics.sent} requests (steers the climb; never the answer)"
    if pt.verdict == CLIENT_LAGGED:
        return f"{CLIENT_LAGGED}: {lag_text(pt)}"
    return f"{pt.verdict}: {why_not_met(pt)}"


def _extends_text(pt: SearchPoint) -> str:
    if pt.held and not pt.extends:
        return (f" (held from its start, {pt.metrics.duration_s:.0f} s of load: a held rate above it did not meet, "
                "so no short point here)")
    if not pt.extends:
        return ""
    return (f" (its point's {pt.extends} requests and {pt.metrics.sent - pt.extends} more, "
            f"{pt.metrics.duration_s:.0f} s of load in all, judged as one sample)")


def why_not_met(pt: SearchPoint) -> str:
    """The limits a point missed (else those it left undecided); a queue's growth with its two
    quarters' medians, the one miss no bound in the point's row shows."""
    why = ", ".join(pt.misses or pt.undecided)
    if "error_rate" in pt.misses and pt.metrics.reasons:
        why += (f" ({pt.metrics.failed} of {pt.metrics.sent} failed: "
                + ", ".join(f"{n} {reason}" for reason, n in sorted(pt.metrics.reasons.items())) + ")")
    if SATURATION in pt.misses:
        why += " (what the server completes flat out: a rate at or past it queues without bound)"
    if "queue_growth" in pt.misses and pt.quarters_ms is not None:
        why += f" (median TTFT {pt.quarters_ms[0]:.4g} -> {pt.quarters_ms[1]:.4g} ms, first to last quarter)"
    late = late_text(pt.late)
    return why + (f" ({late})" if late else "")


def _bounds_chart(result: SearchResult, by_load: list[SearchPoint], sla: SlaSection) -> dict[str, Any]:
    """Each limited percentile's bounds against the offered load, the limits as reference lines. The
    flat-out point is left out: its bounds are a closed loop's (seconds of queue), not a rate's."""
    by_load = [pt for pt in by_load if SATURATION not in pt.misses]
    series = []
    for metric, p, _ in sla.latency_limits():
        k = f"{metric}_{pct_name(p)}"
        for side, i in (("upper", 1), ("lower", 0)):
            series.append({"name": f"{k} {side} bound", "x": [pt.load for pt in by_load],
                           "y": [rounded(pt.bounds[k][i]) for pt in by_load]})
    refs = [{"y": limit, "label": f"{metric} {pct_name(p)} limit"} for metric, p, limit in sla.latency_limits()]
    return {"kind": "line", "title": f"Latency bounds vs offered {result.axis}", "x_label": f"offered ({result.unit})",
            "y_label": "ms", "x_log": True, "series": series, "reference": refs}


def _pareto_chart(pareto: list[dict[str, Any]], sla: SlaSection) -> dict[str, Any]:
    """Interactivity against throughput per device, the points that meet the SLA apart from those
    that do not; the tightest TPOT limit as the interactivity it allows (1000 / limit)."""
    series = []
    for name, keep in (("meets the SLA", lambda v: v == MEETS), ("probe (did not miss)", lambda v: v == PROBED),
                       ("does not", lambda v: v not in (MEETS, PROBED))):
        pts = [r for r in pareto if keep(r["verdict"]) and r["tok_s_per_user"] is not None]
        if pts:
            series.append({"name": name, "x": [r["output_tok_s_per_device"] for r in pts],
                           "y": [r["tok_s_per_user"] for r in pts]})
    tpot = sorted((limit, p) for metric, p, limit in sla.latency_limits() if metric == "tpot")
    refs = [{"y": round(1000.0 / limit, 4), "label": f"tpot {pct_name(p)} limit {limit:g} ms"} for limit, p in tpot[:1]]
    return {"kind": "scatter", "title": "Interactivity vs throughput per device (one point per offered load)",
            "x_label": "output tok/s per device", "y_label": "tok/s per user (1000 / mean TPOT)", "x_log": False,
            "series": series, "reference": refs}


def _interval(bounds: tuple[float | None, float | None] | None) -> str:
    if bounds is None:
        return "-"
    lo, hi = bounds
    return f"{'?' if lo is None else rounded(lo)} .. {'?' if hi is None else rounded(hi)}"
