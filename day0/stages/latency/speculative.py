"""Stage 3's speculative-decoding checks: acceptance over the measured workload.

The parity stage proves speculation keeps the output right and that it accepts something on three
prompts built to be easy for a drafter. What the deployment gains from speculation is decided by
the traffic it serves, so here the ``vllm:spec_decode_*`` counters are read over the latency
stage's own measured window (the same two /metrics scrapes as ``latency.server_agreement``) and
held to the ``[parity]`` limits, the one place those limits are set. The figures are
``day0.client.spec_decode``'s (vLLM's arithmetic; docs/metrics.md, "Speculative decoding").

Only a profile that turns speculation on gets these checks, as only a profile with
``sweep_rates`` gets ``latency.sla_sweep``: a default run carries no skip for a feature it does
not use.
"""

from __future__ import annotations

import math
from typing import Any

from day0.client.prom import pct_name
from day0.client.spec_decode import LABEL, Acceptance
from day0.config.parity import ParitySection
from day0.core.record import Check, measured
from day0.stages.latency.measurement import LatencyRun
from day0.stages.latency.metrics import LatencyMetrics

RATE_ID, LENGTH_ID = "latency.spec_acceptance_rate", "latency.spec_mean_acceptance_length"
RATE_TITLE = "Speculative decoding: acceptance rate over the measured workload"
LENGTH_TITLE = "Speculative decoding: mean acceptance length over the measured workload"
SPEC_SOURCE = "http+metrics"
SPEEDUP_ID = "latency.spec_speedup"
SPEEDUP_TITLE = "Speculative decoding: decode speedup at equal load (mean TPOT without / with)"
NOT_MEASURED = ("ITL/TPOT with vs without speculation is not measured: vLLM cannot turn speculation off per "
                "request, so it needs a second engine without speculative_config (latency.spec_baseline)")
# What the speedup's evidence sets side by side: (metric, percentile or None for the mean) in ms,
# then output throughput
COMPARED: tuple[tuple[str, float | None], ...] = (
    ("tpot", None), ("tpot", 50.0), ("tpot", 99.0), ("itl", 50.0), ("itl", 99.0), ("ttft", 50.0), ("e2e", 50.0))


def speculating(engine_args: dict[str, Any]) -> bool:
    """Whether the profile turns speculation on (vLLM's default: off), read as the parity stage reads it."""
    return bool(engine_args.get("speculative_config"))


def spec_checks(run: LatencyRun, limits: ParitySection) -> list[Check]:
    """``latency.spec_acceptance_rate`` and ``latency.spec_mean_acceptance_length`` for a profile
    that speculates. A window that could not be read, or in which nothing was drafted, is an
    ``error`` for both (a run that never speculated says nothing about acceptance: never a pass);
    a view without /metrics (in-process) or ``server_metrics = false`` is one skip that says so."""
    w = run.spec
    if w is None or not run.settings.server_metrics:
        why = ("latency.server_metrics = false" if w is not None else
               "the in-process engine has no /metrics (acceptance over the workload is read over HTTP)")
        return [Check(id=RATE_ID, title=RATE_TITLE, status="skip", source=SPEC_SOURCE if w else "scheduler",
                      message=f"{LABEL}: not measured: {why}")]
    acc = w.acceptance
    if acc is None or acc.drafts <= 0:
        why = w.why_unmeasured or ("no draft was proposed during the measured window: nothing was speculated"
                                   if acc is not None else "/metrics has no vllm:spec_decode_* counters")
        evidence = acc.describe() if acc is not None else {}
        return [Check(id=i, title=t, status="error", source=SPEC_SOURCE, evidence=evidence,
                      message=f"{LABEL}: could not measure: {why}")
                for i, t in ((RATE_ID, RATE_TITLE), (LENGTH_ID, LENGTH_TITLE))]
    evidence = _evidence(acc, run, limits)
    counts = acc.summary()
    return [
        measured(RATE_ID, RATE_TITLE, acc.rate, limits.min_acceptance_rate, direction="higher_is_better",
                 source=SPEC_SOURCE, evidence=evidence,
                 message=(f"{LABEL}: acceptance rate {acc.rate:.3f} over the measured workload (limit >= "
                          f"{limits.min_acceptance_rate:g}, parity.min_acceptance_rate); {counts}")),
        measured(LENGTH_ID, LENGTH_TITLE, acc.mean_length, limits.min_mean_acceptance_length, unit="tokens",
                 direction="higher_is_better", source=SPEC_SOURCE, evidence=evidence,
                 message=(f"{LABEL}: mean acceptance length {acc.mean_length:.3f} tokens per step over the "
                          f"measured workload (limit >= {limits.min_mean_acceptance_length:g}, "
                          f"parity.min_mean_acceptance_length); {counts}")),
    ]


def _evidence(acc: Acceptance, run: LatencyRun, limits: ParitySection) -> dict[str, Any]:
    """The counts, the per-position table (a collapse after position 0 is the known Day-0 failure,
    vLLM #33497 and #51009), the window and where the limits come from."""
    rates = acc.per_position_rate()
    rows = [[k, acc.per_position.get(k, 0.0), round(r, 6)] for k, r in rates.items()]
    m = run.metrics
    return {**acc.describe(),
            "table": {"columns": ["position", "accepted tokens", "accepted / drafts"], "rows": rows},
            "window": (f"the latency stage's measured phase: {m.completed} completed requests, "
                       f"{m.output_tokens} output tokens (/metrics scraped before and after it)"),
            "limits": {"min_acceptance_rate": limits.min_acceptance_rate,
                       "min_mean_acceptance_length": limits.min_mean_acceptance_length, "from": "[parity]"},
            "definition": "docs/metrics.md, Speculative decoding (vLLM's v1/spec_decode/metrics.py)",
            **({} if run.settings.spec_baseline else {"not_measured": NOT_MEASURED})}


def speedup_check(with_spec: LatencyMetrics, without: LatencyMetrics | None, limit: float | None, *,
                  why: str = "") -> Check:
    """``latency.spec_speedup``: mean TPOT of the same workload at the same load on an engine
    without speculation, over mean TPOT with it. TPOT, not ITL: a speculating engine streams
    several tokens per chunk, so its ITL grows as its decoding gets faster. The mean, not the
    median: drafts split requests into ones that speed up and ones that stall (cpu-tiny-spec: a
    better median, a p99 four to eight times worse, less throughput), and the mean is what the
    fleet pays; the evidence has both. ``without`` None: the baseline engine gave no figures,
    ``why`` says why (an error: a speedup nobody measured is never a pass)."""
    def error(reason: str) -> Check:
        return Check(SPEEDUP_ID, SPEEDUP_TITLE, "error", unit="x", direction="higher_is_better",
                     source=SPEC_SOURCE, message=f"{LABEL}: speedup not measured: {reason}")

    if without is None:
        return error(why or "no baseline run")
    fast, slow = _ms(with_spec, "tpot", None), _ms(without, "tpot", None)
    if not (fast and slow):
        return error("mean TPOT missing on one side (every request failed, or each returned one token)")
    value = round(slow / fast, 4)
    rows = [[f"{metric.upper()} {'mean' if q is None else pct_name(q)} (ms)", _ms(with_spec, metric, q),
             _ms(without, metric, q)] for metric, q in COMPARED]
    rows.append(["output throughput (tok/s)", round(with_spec.output_throughput, 3),
                 round(without.output_throughput, 3)])
    judged = (f"limit >= {limit:g}x, latency.min_spec_speedup" if limit is not None
              else "reported, not judged: latency.min_spec_speedup is unset")
    return measured(
        SPEEDUP_ID, SPEEDUP_TITLE, value, limit, unit="x", direction="higher_is_better", source=SPEC_SOURCE,
        message=(f"{LABEL}: mean TPOT {fast:.2f} ms with speculation, {slow:.2f} ms without, same workload "
                 f"and load: {value:.2f}x ({judged}); TPOT p50 {rows[1][1]} vs {rows[1][2]} ms, p99 "
                 f"{rows[2][1]} vs {rows[2][2]} ms; output {rows[-1][1]:g} vs {rows[-1][2]:g} tok/s"),
        evidence={"table": {"columns": ["figure", "with speculation", "without"], "rows": rows},
                  "requests": [with_spec.completed, without.completed],
                  "baseline": "a second engine: the profile's engine args without speculative_config, "
                              "started after the measured run and stopped after its own",
                  "definition": "docs/metrics.md, Speculative decoding: speedup"})


def _ms(m: LatencyMetrics, metric: str, q: float | None) -> float | None:
    """A percentile (``q``; None: the mean) in ms rounded for the record; None when the phase has
    no finite sample of it."""
    stats = m.stats.get(metric)
    if stats is None or not stats.count:
        return None
    value = stats.mean if q is None else stats.get(q)
    return round(value, 3) if math.isfinite(value) and value > 0 else None
