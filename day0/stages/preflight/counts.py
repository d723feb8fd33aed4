"""Request counts that cannot decide the SLA, said before any engine work.

A limited percentile is judged by its confidence bounds (docs/metrics.md, Confidence): below
``samples_to_bound`` requests no upper bound exists, so the limit can only be "could not
measure" and the run INCOMPLETE. A profile that fixes such a count learns it at stage 0, in one
line, not after the latency stage has spent its minutes.
"""

from __future__ import annotations

from day0.client.prom import pct_name
from day0.config.latency import LatencySection, SlaSection
from day0.core.stats import samples_to_bound
from day0.stages.preflight.findings import Finding


def request_count_findings(latency: LatencySection, sla: SlaSection) -> list[Finding]:
    """One warning per explicit count (measured phase, sweep step, search point) too small to
    bound the highest limited percentile from above at ``sla.confidence``."""
    limits = sla.latency_limits()
    if not limits:
        return []
    metric, p, limit = max(limits, key=lambda lim: samples_to_bound(lim[1], sla.confidence))
    needed = samples_to_bound(p, sla.confidence)
    counts = [("latency.num_requests", latency.num_requests),
              ("latency.sweep_requests", latency.sweep_requests if latency.sweep_rates else 0),
              ("latency.search.requests", latency.search.requests if latency.search else 0)]
    return [Finding("warning", "request_count", key, count,
                    f"{count} requests cannot bound {metric} {pct_name(p)} (limit {limit:g} ms) at "
                    f"{sla.confidence:.0%}: {needed} needed, so that limit can only be 'could not measure' "
                    "and the run INCOMPLETE",
                    f"unset {key.rsplit('.', 1)[-1]} (0 chooses {needed}), or set a lower percentile limit")
            for key, count in counts if 0 < count < needed]
