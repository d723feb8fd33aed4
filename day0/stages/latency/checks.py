"""Stage 3's checks: one per latency limit (p99 of each metric always), errors, throughput,
goodput, the engine cross-checks, token accounting and the optional sweep."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

from day0.client.prom import pct_name
from day0.config.latency import LatencySection, SlaSection
from day0.core.record import Check, measured
from day0.core.stats import TailBursts, percentile, percentile_bounds, samples_to_bound, tail_bursts
from day0.stages.latency.agreement import frontend_overhead_check, server_agreement_check
from day0.stages.latency.capacity import capacity_check
from day0.stages.latency.measurement import CacheIntent, LatencyRun
from day0.stages.latency.metrics import DEFINITIONS, METRIC_TITLES, METRICS, SOURCE, LatencyMetrics, rounded
from day0.stages.latency.sweep import sweep_check

MAX_POOLED_SAMPLES = 20_000  # pooled ITL samples kept in evidence (stride-downsampled beyond)


def latency_checks(run: LatencyRun) -> list[Check]:
    """The stage's checks: one per latency limit (p99 of each metric always), errors,
    throughput, goodput, server agreement, token accounting and the optional sweep."""
    m, sla = run.metrics, run.sla
    checks = [warmup_check(run.warmup)] if run.warmup is not None else []
    checks += percentile_checks(m, sla)
    checks.append(error_rate_check(m, sla))
    checks += throughput_checks(m, sla, run.settings)
    checks.append(goodput_check(m, sla))
    checks.append(server_agreement_check(run))
    if run.cache is not None:
        checks.append(prefix_cache_check(run.cache))
    overhead = frontend_overhead_check(run)
    if overhead is not None:
        checks.append(overhead)
    checks.append(token_accounting_check(m))
    if run.sweep:
        checks.append(sweep_check(run))
    if run.search is not None and run.settings.search is not None:  # a search measures one point at least
        checks.append(capacity_check(run.search, sla, run.settings.search, run.devices))
    return checks


def percentile_checks(m: LatencyMetrics, sla: SlaSection) -> list[Check]:
    """One check per ``[sla]`` latency limit, judged by confidence bounds at ``sla.confidence``,
    plus p99 of every metric (recorded without a limit)."""
    note = ""
    if m.token_source == "content":
        note = " (per-message token counts from text fields, one per message: the server gave no per-chunk usage)"
    wanted: dict[tuple[str, float], float | None] = {(metric, p): lim for metric, p, lim in sla.latency_limits()}
    for metric in METRICS:
        wanted.setdefault((metric, 99.0), None)
    return [_percentile_check(m, metric, p, limit, note, sla.confidence)
            for (metric, p), limit in sorted(wanted.items(), key=lambda kv: (METRICS.index(kv[0][0]), kv[0][1]))]


def _percentile_check(m: LatencyMetrics, metric: str, p: float, limit: float | None, note: str,
                      confidence: float) -> Check:
    """A limited percentile passes only when its upper confidence bound is within the limit and
    fails only when its lower bound is past it; between, or without a bound at all (too few
    samples), it is ``error``: the sample cannot tell, and a point estimate would be a coin flip."""
    samples = m.samples[metric]
    value = percentile(samples, p) if samples else None
    evidence = _percentile_evidence(m, metric, p, limit)
    title = f"{METRIC_TITLES[metric]} {pct_name(p)}"
    cid = _check_id(metric, p)
    if value is None:
        why = m.missing.get(metric) or ("no successful request" if metric != "tpot"
                                         else "no successful request with more than one token")
        return Check(id=cid, title=title, status="error" if limit is not None else "skip",
                     limit=limit, unit="ms", direction="lower_is_better",
                     message=f"{why}; nothing to measure", evidence=evidence, source=SOURCE)
    if limit is None:
        return measured(cid, title, rounded(value), None, unit="ms", direction="lower_is_better",
                        message=f"measured {value:.4g} ms over {len(samples)} samples (no SLA limit set){note}",
                        evidence=evidence, source=SOURCE, performance=True)
    b = percentile_bounds(samples, p, confidence)
    evidence["bounds"] = {"lower": rounded(b.lower), "upper": rounded(b.upper), "confidence": confidence,
                          "samples": b.n, "needed_for_upper": samples_to_bound(p, confidence)}
    bursts = tail_bursts(samples)
    if bursts is not None:
        evidence["tail_bursts"] = {"share": bursts.share, "slow": bursts.slow, "runs": bursts.runs,
                                   "mean_run": round(bursts.mean_run, 3), "factor": round(bursts.factor, 3),
                                   "equivalent_samples": bursts.equivalent}
    interval = (f"{confidence:.0%} interval {_bound(b.lower)} .. {_bound(b.upper)} ms over {b.n} samples"
                f"{_burst_note(bursts)}")
    meets, misses = b.upper is not None and b.upper <= limit, b.lower is not None and b.lower > limit
    if meets or misses:
        return Check(id=cid, title=title, status="pass" if meets else "fail", value=rounded(value), limit=limit,
                     unit="ms", direction="lower_is_better", source=SOURCE, evidence=evidence, performance=True,
                     message=f"{value:.4g} ms {'meets' if meets else 'misses'} the limit (<= {limit:g} ms): "
                             f"{interval}{note}")
    why = (f"{b.n} requests cannot bound {pct_name(p)} within {limit:g} ms at {confidence:.0%}; "
           f"{samples_to_bound(p, confidence)} needed (latency.num_requests = 0 chooses it)" if b.upper is None else
           f"the limit {limit:g} ms lies inside the {interval}; more requests narrow it")
    evidence["point_estimate"] = rounded(value)
    return Check(id=cid, title=title, status="error", limit=limit, unit="ms", direction="lower_is_better",
                 message=f"could not measure: {why} (point estimate {value:.4g} ms){note}", evidence=evidence,
                 source=SOURCE)


def _burst_note(bursts: TailBursts | None) -> str:
    """Where the slowest requests came in runs (a queue's bursts), the interval, which assumes
    independent samples, is narrower than the truth: say so, and what the sample is worth."""
    if bursts is None or not bursts.bursty:
        return ""
    return (f", assumed independent; its slowest tenth came in runs of {bursts.mean_run:.1f} "
            f"({1.0 / (1.0 - bursts.share):.2f} if independent): worth about {bursts.equivalent} independent samples")


def _bound(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def _percentile_evidence(m: LatencyMetrics, metric: str, p: float, limit: float | None) -> dict[str, Any]:
    """Samples, the stats table, the definition and (TTFT, E2E) the per-request scatter."""
    samples = m.samples[metric]
    evidence: dict[str, Any] = {
        "samples": [round(x, 4) for x in (_downsample(samples) if metric == "itl" else samples)],
        "table": _stats_table(m, [metric] + (["itl_token"] if metric == "itl" else [])
                              + (["send_lag", "ttft_from_send"] if metric == "ttft" else [])),
        "stats": asdict(m.stats[metric]),
        "definition": DEFINITIONS[metric],
    }
    if metric == "itl" and len(samples) > MAX_POOLED_SAMPLES:
        evidence["samples_downsampled_from"] = len(samples)
    if metric in ("ttft", "e2e"):
        evidence["charts"] = [{
            "kind": "scatter", "title": f"{metric.upper()} per request over the run",
            "x_label": "scheduled send (s since start)", "y_label": f"{metric.upper()} (ms)", "x_log": False,
            # y is the samples' own rounded list (TTFT and E2E are never downsampled): one list of
            # floats a request fewer, in the check and in its record
            "series": [{"name": metric, "x": [round(x, 4) for x in m.sample_offsets_s], "y": evidence["samples"]}],
            "reference": [{"y": limit, "label": f"SLA {pct_name(p)}"}] if limit is not None else [],
        }]
    return evidence


def warmup_check(w: LatencyMetrics) -> Check:
    """The warm-up is excluded from the figures, not from scrutiny: a server that fails every
    warm-up request is broken before the measurement starts (its numbers would be of error pages),
    and a partial failure is named so nobody reads the run as clean."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(w.reasons.items(), key=lambda kv: -kv[1])[:3])
    evidence = {"sent": w.sent, "completed": w.completed, "failed": w.failed, "errors": w.errors,
                "failures": w.failures}
    if w.sent and w.failed == w.sent:
        return Check("latency.warmup", "Warm-up requests", "fail", value=w.failed, limit=w.sent - 1, unit="failed",
                     direction="lower_is_better", source=SOURCE, evidence=evidence,
                     message=f"every one of the {w.sent} warm-up requests failed ({reasons})")
    message = (f"warning: {w.failed} of {w.sent} warm-up requests failed ({reasons}); excluded from the figures"
               if w.failed else f"{w.completed} of {w.sent} warm-up requests completed (excluded from the figures)")
    return Check("latency.warmup", "Warm-up requests", "pass", value=w.failed, unit="failed",
                 direction="lower_is_better", source=SOURCE, evidence=evidence, message=message)


def error_rate_check(m: LatencyMetrics, sla: SlaSection) -> Check:
    err_rows = [[k, v] for k, v in sorted(m.reasons.items(), key=lambda kv: -kv[1])]
    err_msg = (f"{m.failed} of {m.sent} requests failed ({', '.join(f'{k}: {v}' for k, v in sorted(m.errors.items()))}); "
               f"limit {sla.max_error_rate:.4g}") if m.failed else f"0 of {m.sent} requests failed"
    check = measured("latency.error_rate", "Failed request fraction", round(m.error_rate, 6), sla.max_error_rate,
                     unit="fraction", direction="lower_is_better",
                     message=err_msg,
                     evidence={"errors": m.errors, "table": {"columns": ["reason", "count"], "rows": err_rows},
                               "failures": m.failures, "sent": m.sent, "not_sent_duration_bound": m.not_sent},
                     source=SOURCE)
    if m.sent == 0:
        check.status = "error"
        check.message = "no request was sent; check latency.duration_s and num_requests"
    return check


def throughput_checks(m: LatencyMetrics, sla: SlaSection, s: LatencySection) -> list[Check]:
    """Output tokens and completed requests per second, with the load that produced them."""
    load_table = {"columns": ["figure", "value"], "rows": [
        ["load", s.load], ["concurrency", s.concurrency], ["arrivals", s.arrivals if s.load == "rate" else "-"],
        ["load workers (processes)", m.workers],
        ["offered rate (req/s)", m.offered_rate], ["duration (s)", rounded(m.duration_s)],
        ["duration window", "t=0 of the arrivals -> end of the last measured stream, failed ones included"],
        ["completed", m.completed], ["input tokens", m.input_tokens], ["output tokens", m.output_tokens],
        ["output tokens from", m.output_tokens_source], ["per-message tokens from", m.token_source],
        ["send lag p50 (ms)", rounded(m.stats["send_lag"].percentiles.get("p50"))],
        ["send lag p99 (ms)", rounded(m.stats["send_lag"].percentiles.get("p99"))],
        ["client loop stall, longest (ms)", rounded(m.loop_stall_ms)],
        ["total token throughput (tok/s)", rounded(m.total_token_throughput)],
    ]}
    return [
        measured("latency.output_throughput", "Output token throughput", rounded(m.output_throughput),
                 sla.min_output_throughput_tok_s, unit="tok/s", direction="higher_is_better",
                 evidence={"table": load_table, "output_tokens": m.output_tokens,
                           "duration_s": m.duration_s}, source=SOURCE, performance=True),
        measured("latency.request_throughput", "Completed request throughput", rounded(m.request_throughput),
                 sla.min_request_throughput_req_s, unit="req/s", direction="higher_is_better",
                 evidence={"table": load_table, "offered_rate": m.offered_rate}, source=SOURCE,
                 performance=True),
    ]


def goodput_check(m: LatencyMetrics, sla: SlaSection) -> Check:
    if m.goodput is None:
        return Check(id="latency.goodput", title="Goodput (requests meeting every SLO per second)",
                     status="skip", unit="req/s", direction="higher_is_better",
                     message="no goodput_slo_ms and no TTFT/TPOT/E2E limit in [sla]; goodput needs a per-request SLO",
                     source=SOURCE)
    return measured(
        "latency.goodput", "Goodput (requests meeting every SLO per second)", rounded(m.goodput), sla.min_goodput_req_s,
        unit="req/s", direction="higher_is_better",
        message=(f"{m.good_requests} of {m.sent} requests met every SLO "
                 f"({', '.join(f'{k} <= {v:g} ms' for k, v in m.slo_ms.items())}"
                 f"{'' if sla.goodput_slo_ms else ', the loosest [sla] limit per metric'}): {m.goodput:.4g} req/s"
                 + (f"; limit >= {sla.min_goodput_req_s:g}" if sla.min_goodput_req_s is not None else "")),
        evidence={"good_requests": m.good_requests, "slo_ms": m.slo_ms, "sent": m.sent,
                  "slo_from": "sla.goodput_slo_ms" if sla.goodput_slo_ms else "the loosest latency limit per metric"},
        source=SOURCE,
        performance=True)


def prefix_cache_check(c: CacheIntent) -> Check:
    """TTFT measured on prompts the server already holds is a cache lookup, not prefill: a
    repeated run, a long-lived deployment's nightly, or another tool's run with the same seed
    would report it as prefill latency. The share the prefix cache served is judged against what
    the workload means to share, so a run that measured the cache fails instead of passing fast."""
    title = "Prefix-cache share of the measured prompt tokens"
    intent = (f"the workload shares {c.intended:.1%} by design + {c.allowance:.1%} allowance (one "
              f"{c.block_size}-token block per request)")
    evidence: dict[str, Any] = {"intended_share": round(c.intended, 6), "allowance": round(c.allowance, 6),
                                "block_size": c.block_size, "fresh_prompts": c.fresh,
                                "definition": "vllm:prefix_cache_hits / vllm:prefix_cache_queries, deltas over "
                                              "the measured window (docs/metrics.md)"}
    if c.workload:
        evidence["dataset_lengths"] = c.workload
    w = c.window
    if w is None or not w.queries > 0:
        why = c.why_unmeasured or "the server looked up no prompt tokens in its prefix cache (prefix caching off?)"
        return Check(id="latency.prefix_cache_share", title=title, status="skip", unit="fraction",
                     direction="lower_is_better", limit=round(c.limit, 6), evidence=evidence, source=SOURCE,
                     message=f"not measured: {why}; {intent}")
    evidence.update({"hit_tokens": w.hits, "queried_tokens": w.queries})
    verdict = ("latency figures include cache hits the workload does not intend: prefill was not measured"
               if w.share > c.limit else "prefill was measured, not the cache")
    return measured("latency.prefix_cache_share", title, round(w.share, 6), round(c.limit, 6), unit="fraction",
                    direction="lower_is_better", evidence=evidence, source=SOURCE,
                    message=f"{w.hits:g} of {w.queries:g} prompt tokens were prefix-cache hits ({w.share:.1%}); "
                            f"{intent}: {verdict}"
                            + ("" if c.fresh else " (latency.fresh_prompts = false: the seed's prompts exactly)"))


_TOKEN_SOURCE_TEXT = {
    "token_ids": "per-message token counts from token_ids on each chunk",
    "continuous_usage": "per-message token counts from cumulative usage on each chunk",
    "content": "per-message token counts fall back to one per message with a text field (empty text counts, as "
               "vLLM bench counts it); a message carrying several tokens counts one (server lacks "
               "continuous_usage_stats)",
}


def token_accounting_check(m: LatencyMetrics) -> Check:
    title = "Tokens per streamed message known exactly"
    if m.token_source == "none":
        return Check(id="latency.token_accounting", title=title, status="skip",
                     message="no successful request to account tokens for", source=SOURCE)
    msg = (_TOKEN_SOURCE_TEXT[m.token_source] + f"; output totals from {m.output_tokens_source}"
           + (f"; {m.count_mismatches} requests' per-message counts disagree with usage" if m.count_mismatches else ""))
    return measured("latency.token_accounting", title, m.token_source, None, unit="", direction="exact",
                    message=msg, evidence={"token_source": m.token_source, "output_tokens_source": m.output_tokens_source,
                                           "count_mismatches": m.count_mismatches}, source=SOURCE)


def _stats_table(metrics: LatencyMetrics, keys: Sequence[str]) -> dict[str, Any]:
    any_stats = metrics.stats[keys[0]]
    pnames = list(any_stats.percentiles)
    rows = []
    for k in keys:
        st = metrics.stats[k]
        rows.append([METRIC_TITLES.get(k, k), st.count, rounded(st.mean), rounded(st.std)]
                    + [rounded(st.percentiles[p]) for p in pnames])
    return {"columns": ["metric (ms)", "n", "mean", "std"] + pnames, "rows": rows}


def _downsample(values: list[float], cap: int = MAX_POOLED_SAMPLES) -> list[float]:
    if len(values) <= cap:
        return values
    step = len(values) / cap
    return [values[int(i * step)] for i in range(cap)]


def _check_id(metric: str, p: float) -> str:
    return f"latency.{metric}_{pct_name(p).replace('.', '_')}"
