"""Stage 3's SLA sweep: the same workload at ascending offered rates until one does not meet the
SLA, and the highest rate that met it (the capacity search's judgement, at fixed rates)."""

from __future__ import annotations

from typing import Awaitable, Callable

from day0.client.prom import pct_name
from day0.config.latency import LatencySection, SlaSection
from day0.core.record import Check, measured
from day0.core.stats import percentile
from day0.stages.latency.judging import judge_point
from day0.stages.latency.measurement import CLIENT_LAGGED, MEETS, UNDECIDED, LatencyRun, SweepPoint
from day0.stages.latency.metrics import SOURCE, LatencyMetrics, rounded
from day0.stages.latency.spells import late_text


async def run_sweep(measure_at: Callable[[float, int], Awaitable[LatencyMetrics]], settings: LatencySection,
                    sla: SlaSection, say: Callable[[str], None]) -> list[SweepPoint]:
    """Each of ``sweep_rates`` in turn (``sweep_requests`` requests, ``measure_at(rate, n)``)
    until one does not meet the SLA, each judged as a capacity-search point is (confidence
    bounds, queue growth, the client's lag)."""
    points: list[SweepPoint] = []
    for rate in settings.sweep_rates:
        n = settings.sweep_requests or settings.measured_requests(sla)
        say(f"sweep: {rate:g} req/s, {n} requests")
        point = judge_point(rate, await measure_at(rate, n), sla, gap_ms=1000.0 / rate)
        failing = point.misses + [f"{key} undecided" for key in point.undecided]
        unmeasured = ""
        if point.verdict == CLIENT_LAGGED:
            failing.append(f"client lagged {point.lag_ms:.1f} ms (p90)")
            unmeasured = f"the load generator lagged {point.lag_ms:.1f} ms (p90) behind its schedule"
        elif point.verdict == UNDECIDED and point.unbounded:
            unmeasured = (f"{n} requests cannot bound {', '.join(point.unbounded)} from above at "
                          f"{sla.confidence:.0%} ({sla.requests_to_bound()} needed): raise latency.sweep_requests")
        points.append(SweepPoint(rate, point.metrics, point.verdict == MEETS, failing, point.late, unmeasured))
        if point.verdict != MEETS:
            break
    return points


def sweep_check(run: LatencyRun) -> Check:
    """The highest swept rate that met the SLA, with latency vs offered rate as a chart."""
    sla = run.sla
    passing = [p.rate for p in run.sweep if p.meets_sla]
    best = max(passing) if passing else 0.0
    lims = sla.latency_limits()
    series = []
    refs = []
    for metric, p, limit in lims or [("ttft", 99.0, None), ("tpot", 99.0, None)]:  # type: ignore[list-item]
        series.append({"name": f"{metric} {pct_name(p)}", "x": [pt.rate for pt in run.sweep],
                       "y": [rounded(percentile(pt.metrics.samples[metric], p)) for pt in run.sweep]})
        if limit is not None:
            refs.append({"y": limit, "label": f"{metric} {pct_name(p)} limit"})
    rows = [[pt.rate, rounded(pt.metrics.request_throughput), rounded(percentile(pt.metrics.samples["ttft"], 99)),
             rounded(percentile(pt.metrics.samples["tpot"], 99)), rounded(pt.metrics.error_rate),
             "meets" if pt.meets_sla else "misses: " + _failing(pt)] for pt in run.sweep]
    last = run.sweep[-1]
    evidence = {"charts": [{"kind": "line", "title": "Latency vs offered request rate", "x_label": "offered rate (req/s)",
                            "y_label": "ms", "x_log": False, "series": series, "reference": refs}],
                "table": {"columns": ["offered req/s", "achieved req/s", "ttft p99", "tpot p99", "error rate", "SLA"],
                          "rows": rows}}
    if last.unmeasured:  # the sweep stopped at a step that decided nothing: its rate neither met nor missed
        return Check("latency.sla_sweep", "Highest request rate meeting the SLA", "error", unit="req/s",
                     direction="higher_is_better", source=SOURCE, evidence=evidence,
                     message=f"could not measure: at {last.rate:g} req/s {last.unmeasured}"
                             + (f" (the highest step below it met: {best:g} req/s)" if passing else ""))
    msg = (f"highest swept rate meeting the SLA: {best:g} req/s" +
           ("" if last.meets_sla else f"; {last.rate:g} req/s does not meet it ({_failing(last)})")
           + ("" if lims else " (no latency limit set: only errors judged)"))
    return measured("latency.sla_sweep", "Highest request rate meeting the SLA", best, None, unit="req/s",
                    direction="higher_is_better", message=msg, evidence=evidence, source=SOURCE)


def _failing(pt: SweepPoint) -> str:
    """What a step did not meet, with its late requests spell by spell (``spells``)."""
    late = late_text(pt.late)
    return ", ".join(pt.failing) + (f"; {late}" if late else "")
