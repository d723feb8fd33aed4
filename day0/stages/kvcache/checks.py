"""Every kvcache check: what each view measured, judged against the profile's limits, with its evidence."""

from __future__ import annotations

from typing import Any, Sequence

from day0.core.record import Check, measured
from day0.engine import EngineError, ViewUnavailable
from day0.stages.kvcache.blackbox import BlackBoxRun
from day0.stages.kvcache.capacity import Capacity
from day0.stages.kvcache.errors import WorkloadRejected
from day0.stages.kvcache.exact import ExactRun, RequestRecord
from day0.stages.kvcache.fragmentation import FragSummary, KvSample, fragmentation, summarize
from day0.stages.kvcache.prefix import PrefixProbe
from day0.stages.kvcache.workload import KvRequest


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 4)


def rejected_check(stage_id: str, rejected: WorkloadRejected, source: str) -> Check:
    return Check(id=stage_id, title="Workload fits the engine's max_model_len", status="fail",
                 value=rejected.context, limit=rejected.max_model_len, unit="tokens", direction="lower_is_better",
                 message=str(rejected), source=source,
                 evidence={"context": rejected.context, "max_model_len": rejected.max_model_len,
                           "engine_message": rejected.detail})


def _series_chart(title: str, y_label: str, series: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "line", "title": title, "x_label": "time since workload start (s)", "y_label": y_label,
            "x_log": False, "series": series, "reference": reference}


def workload_table(workload: Sequence[KvRequest], records: Sequence[RequestRecord] | None = None) -> dict[str, Any]:
    cols = ["#", "kind", "prompt tokens", "output tokens", "context"]
    records = records if records and len(records) == len(workload) else None
    if records:
        cols += ["cached tokens", "preemptions"]
    rows = []
    for i, r in enumerate(workload):
        row: list[Any] = [r.index, r.kind + (f" (prefix {r.prefix_len})" if r.prefix_len else ""), r.prompt_len,
                          r.max_tokens, r.context]
        if records:
            row += [records[i].cached_tokens, records[i].preemptions]
        rows.append(row)
    return {"columns": cols, "rows": rows}


def exact_checks(run: ExactRun, workload: Sequence[KvRequest], settings: Any) -> list[Check]:
    """``kvcache.fragmentation`` (token-weighted mean), ``fragmentation_peak``, preemptions, usage, hits."""
    src = "scheduler"
    if run.rejected is not None:
        return [rejected_check("kvcache.workload_fits", run.rejected, src)]
    limit = _pct(settings.fragmentation_limit)
    long_tokens = min((r.context for r in workload if r.kind == "long"), default=0)
    summ = summarize(run.samples, long_context_tokens=long_tokens)
    steady = summarize(run.samples, steady_only=True)
    evidence = _exact_evidence(run, workload, summ, steady, long_tokens, limit)
    partial = f" (engine stopped after {len(run.samples)} samples: {run.error})" if run.error else ""
    checks: list[Check] = []
    if summ.mean is None:
        checks.append(Check(id="kvcache.fragmentation", title="PagedAttention fragmentation (token-weighted mean)",
                            status="error", unit="%", limit=limit, direction="lower_is_better",
                            source=src, evidence=evidence,
                            message=f"no engine step held any KV block{partial}"))
    else:
        checks.append(measured(
            "kvcache.fragmentation", "PagedAttention fragmentation (token-weighted mean)", _pct(summ.mean), limit,
            unit="%", direction="lower_is_better", source=src, evidence=evidence, performance=True,
            message=(f"{_pct(summ.mean):.3g}% of allocated KV slots unused (token-weighted over {summ.samples} steps, "
                     f"block size {run.block_size}); limit {limit:g}%" + partial
                     + ("" if summ.mean <= settings.fragmentation_limit else
                        ": lower block_size, or check for lookahead/speculative slots")),
        ))
    if summ.peak is not None:
        checks.append(measured(
            "kvcache.fragmentation_peak", "PagedAttention fragmentation, worst step at long context", _pct(summ.peak),
            limit, unit="%", direction="lower_is_better", source=src,
            evidence={"t_s": summ.peak_t, "long_context_tokens": long_tokens, "samples_at_long_context": summ.peak_samples},
            message=(f"worst step {_pct(summ.peak):.3g}% at t={summ.peak_t:.2f} s among {summ.peak_samples} steps "
                     f"holding >= {long_tokens} tokens; limit {limit:g}%" + partial),
        ))
    if run.error:  # counters of a run cut short say nothing about the workload; the samples above stay
        checks.append(Check(id="kvcache.engine_alive", title="Engine survived the long-context workload",
                            status="error", message=run.error, source=src,
                            evidence={"samples_taken": len(run.samples), "steps": run.steps,
                                      "preemptions": run.preemptions}))
        return checks
    return checks + _exact_counter_checks(run, workload, settings, src)


def _exact_evidence(run: ExactRun, workload: Sequence[KvRequest], summ: FragSummary, steady: FragSummary,
                    long_tokens: int, limit: float | None) -> dict[str, Any]:
    """The exact check's evidence: every step's figures, three charts, a summary and the per-request table."""
    s = run.samples
    series = {
        "t_s": [round(x.t, 4) for x in s], "step": [x.step for x in s],
        "allocated_tokens": [x.allocated_tokens for x in s], "stored_tokens": [x.stored_tokens for x in s],
        "usage": [round(x.usage, 6) for x in s], "running": [x.running for x in s], "waiting": [x.waiting for x in s],
        "steady": [x.steady for x in s],
    }
    frag_pct = [_pct(x.fragmentation) if x.allocated_tokens else None for x in s]
    ts = series["t_s"]
    charts = [
        _series_chart("Internal fragmentation per engine step (exact, scheduler)", "fragmentation (%)",
                      [{"name": "fragmentation", "x": ts, "y": frag_pct}],
                      [{"y": limit, "label": f"limit {limit:g}%"}]),
        _series_chart("KV slots allocated (blocks x block size) vs tokens stored", "tokens",
                      [{"name": "allocated", "x": ts, "y": series["allocated_tokens"]},
                       {"name": "stored", "x": ts, "y": series["stored_tokens"]}], []),
        _series_chart("KV pool usage", "usage (%)",
                      [{"name": "kv_cache_usage", "x": ts, "y": [_pct(u) for u in series["usage"]]}], []),
    ]
    table = {"columns": ["figure", "value"], "rows": [
        ["samples (engine steps with blocks held)", summ.samples],
        ["token-weighted mean", f"{_pct(summ.mean)}%"],
        [f"peak at long context (>= {long_tokens} tokens stored)",
         f"{_pct(summ.peak)}% at t={summ.peak_t:.2f} s" if summ.peak_t is not None else "-"],
        ["steady-state mean (every request decoding)", f"{_pct(steady.mean)}% over {steady.samples} samples"],
        ["block size / pool blocks", f"{run.block_size} / {run.num_blocks}"],
        ["wall time / sampling time", f"{run.wall_s:.2f} s / {run.sampling_s * 1000:.1f} ms"],
    ]}
    return {"samples": [v for v in frag_pct if v is not None], "charts": charts, "table": table,
            "time_series": series, "workload": workload_table(workload, run.requests),
            "block_size": run.block_size, "num_blocks": run.num_blocks, "steady_mean_pct": _pct(steady.mean),
            "steady_samples": steady.samples, "stored_tokens_sum": summ.stored_tokens,
            "allocated_tokens_sum": summ.allocated_tokens, "error": run.error}


def _exact_counter_checks(run: ExactRun, workload: Sequence[KvRequest], settings: Any, src: str) -> list[Check]:
    """Preemptions, peak usage and prefix-cache hits of a run that finished (its counters are whole)."""
    peak_usage = max((x.usage for x in run.samples), default=0.0)
    return [
        measured(
            "kvcache.preemptions", "Requests preempted during the long-context workload", run.preemptions,
            settings.max_preemptions, unit="preemptions", direction="lower_is_better", source=src,
            evidence={"per_request": [r.preemptions for r in run.requests]},
            message=(f"{run.preemptions} preemptions (allowed {settings.max_preemptions})" +
                     ("" if run.preemptions <= settings.max_preemptions else
                      ": the pool ran out of blocks; lower max_num_seqs or the context, or add KV memory")),
        ),
        measured("kvcache.usage_peak", "Peak KV pool usage during the workload", _pct(peak_usage), None,
                 unit="%", direction="lower_is_better", source=src,
                 message=f"peak KV pool usage {_pct(peak_usage):.3g}% of {run.num_blocks} blocks"),
        hit_rate_check(run.prefix_hit_rate, workload, src, block_size=run.block_size,
                       evidence={"cached_tokens": [r.cached_tokens for r in run.requests]}),
    ]


def expected_hit_tokens(workload: Sequence[KvRequest], block_size: int) -> int:
    """Prefix-cache hits the shared-prefix group must produce: every member after the first reuses
    the prefix's full blocks."""
    groups: dict[int, list[KvRequest]] = {}
    for r in workload:
        if r.prefix_group is not None:
            groups.setdefault(r.prefix_group, []).append(r)
    return sum((len(g) - 1) * (g[0].prefix_len // block_size) * block_size for g in groups.values())


def hit_rate_check(rate: float | None, workload: Sequence[KvRequest], source: str, *, block_size: int | None = None,
                   evidence: dict[str, Any] | None = None, check_id: str = "kvcache.prefix_cache_hit_rate") -> Check:
    prompt_total = sum(r.prompt_len for r in workload)
    ev = dict(evidence or {})
    if rate is None:
        return Check(id=check_id, title="Prefix-cache hit rate over the workload", status="skip",
                     unit="%", source=source, evidence=ev,
                     message="no prefix-cache counters (prefix caching off, or the engine exports none)")
    floor = None
    if block_size:
        floor = _pct(expected_hit_tokens(workload, block_size) / prompt_total) if prompt_total else None
        ev["expected_hit_tokens"] = expected_hit_tokens(workload, block_size)
    return measured(check_id, "Prefix-cache hit rate over the workload", _pct(rate), floor,
                    unit="%", direction="higher_is_better", source=source, evidence=ev,
                    message=(f"{_pct(rate):.3g}% of prompt tokens served from the prefix cache"
                             + (f" (the shared-prefix group alone gives {floor:.3g}%)" if floor is not None else "")))


def blackbox_checks(run: BlackBoxRun, workload: Sequence[KvRequest], settings: Any) -> list[Check]:
    src = "http"
    if run.rejected is not None:
        return [rejected_check("kvcache.blackbox_workload_fits", run.rejected, src)]
    limit = _pct(settings.fragmentation_limit)
    usable = run.kv_samples()
    summ = summarize(usable)
    reasons: dict[str, int] = {}
    for s in run.samples:
        if not s.usable:
            key = s.reason or "no blocks held"
            reasons[key] = reasons.get(key, 0) + 1
    ts = [round(s.t, 4) for s in run.samples]
    est = [_pct(fragmentation(min(s.stored_tokens, s.used_blocks * s.block_size), s.used_blocks * s.block_size))
           if s.usable else None for s in run.samples]
    evidence = {
        "samples": [v for v in est if v is not None],
        "charts": [_series_chart("Fragmentation estimated from /metrics (resolved scrapes)", "fragmentation (%)",
                                 [{"name": "estimate", "x": ts, "y": est}], [{"y": limit, "label": f"limit {limit:g}%"}]),
                   _series_chart("KV pool usage from /metrics", "usage (%)",
                                 [{"name": "vllm:kv_cache_usage_perc", "x": ts,
                                   "y": [_pct(s.usage) for s in run.samples]}], [])],
        "table": {"columns": ["scrapes", "resolved", "unresolved: reason", "count"],
                  "rows": [[run.scrapes, len(usable), k, v] for k, v in reasons.items()] or [[run.scrapes, len(usable), "-", 0]]},
        "time_series": {"t_s": ts, "used_blocks": [s.used_blocks for s in run.samples],
                        "stored_tokens_estimate": [s.stored_tokens for s in run.samples],
                        "running": [s.running for s in run.samples], "usage": [s.usage for s in run.samples]},
        "block_size": run.block_size, "num_blocks": run.num_blocks, "failed_requests": run.failed_requests,
        "error": run.error, "passes": run.passes,
    }
    partial = f" (stopped: {run.error})" if run.error else ""
    checks: list[Check] = []
    if summ.mean is None:
        # Not a verdict on the deployment: the method did not resolve (harness error -> INCOMPLETE).
        checks.append(Check(id="kvcache.blackbox_fragmentation", title="Fragmentation estimated from /metrics",
                            status="error", unit="%", limit=limit, direction="lower_is_better",
                            source=src, evidence=evidence,
                            message=(f"the workload stopped before any of {run.scrapes} /metrics scrapes could be "
                                     f"resolved: {run.error}" if run.error else
                                     f"could not measure: none of {run.scrapes} /metrics scrapes in {run.passes} "
                                     "pass(es) of the workload landed in its steady decode window; raise "
                                     "kvcache.output_tokens (a longer window) or kvcache.blackbox_passes")))
    else:
        checks.append(measured(
            "kvcache.blackbox_fragmentation", "Fragmentation estimated from /metrics", _pct(summ.mean), limit,
            unit="%", direction="lower_is_better", source=src, evidence=evidence,
            message=(f"{_pct(summ.mean):.3g}% estimated (token-weighted over {summ.samples} of {run.scrapes} scrapes "
                     f"in {run.passes} pass(es), block size {run.block_size}); limit {limit:g}%" + partial)))
    pre = run.counter_delta("preemptions")
    if pre is not None and not run.error:
        checks.append(measured("kvcache.blackbox_preemptions", "Preemptions during the workload (/metrics)", int(pre),
                               settings.max_preemptions, unit="preemptions", direction="lower_is_better", source=src))
    if not run.error:  # counters of a run cut short say nothing about the workload
        checks.append(hit_rate_check(run.prefix_hit_rate, workload, src, block_size=run.block_size or None,
                                     check_id="kvcache.blackbox_prefix_cache_hit_rate"))
    else:
        checks.append(Check(id="kvcache.blackbox_engine_alive", title="Engine survived the workload (HTTP)",
                            status="error", message=run.error, source=src,
                            evidence={"scrapes": run.scrapes, "failed_requests": run.failed_requests}))
    return checks


def _steady_series(name: str, samples: Sequence[KvSample]) -> dict[str, Any]:
    """The two views run on their own clocks: align them at their first steady sample."""
    t0 = samples[0].t if samples else 0.0
    return {"name": name, "x": [round(s.t - t0, 4) for s in samples], "y": [_pct(s.fragmentation) for s in samples]}


def agreement_check(exact: ExactRun, blackbox: BlackBoxRun, settings: Any) -> Check:
    """Steady-state means of both views on the same workload, within ``agreement_limit``."""
    limit_pp = round(100.0 * settings.agreement_limit, 4)
    exact_steady = [s for s in exact.samples if s.steady and s.allocated_tokens]
    bb_steady = blackbox.kv_samples()
    a = summarize(exact_steady)
    b = summarize(bb_steady)
    ev: dict[str, Any] = {
        "exact_steady_mean_pct": _pct(a.mean), "exact_steady_samples": a.samples,
        "blackbox_mean_pct": _pct(b.mean), "blackbox_samples": b.samples,
        "exact_all_steps_mean_pct": _pct(summarize(exact.samples).mean),
        "charts": [{**_series_chart("Exact (scheduler) vs black-box (/metrics) fragmentation, steady samples",
                                    "fragmentation (%)", [_steady_series("exact", exact_steady),
                                                          _steady_series("black box", bb_steady)], []),
                    "x_label": "seconds since the view's first steady sample"}],
    }
    title = "Exact and /metrics fragmentation agree"
    if a.mean is None or b.mean is None:
        side = "scheduler" if a.mean is None else "/metrics"
        return Check(id="kvcache.methods_agree", title=title, status="error", unit="pp", limit=limit_pp,
                     direction="lower_is_better", source="scheduler+http", evidence=ev,
                     message=f"could not compare: no steady-state samples from the {side} view; "
                             "raise kvcache.output_tokens")
    diff = round(abs(a.mean - b.mean) * 100.0, 4)
    return measured("kvcache.methods_agree", title, diff, limit_pp, unit="pp", direction="lower_is_better",
                    source="scheduler+http", evidence=ev,
                    message=(f"exact {_pct(a.mean):.3g}% ({a.samples} steady steps) vs /metrics estimate "
                             f"{_pct(b.mean):.3g}% ({b.samples} scrapes): {diff:.3g} pp apart (limit {limit_pp:g} pp)"))


def capacity_checks(cap: Capacity, plan: Any | None, source: str) -> list[Check]:
    """Pool tokens vs target_context x concurrency (with margin), and the plan beside the engine."""
    margin_pct = round(cap.margin * 100.0, 2)
    plan_rows: list[list[Any]] = []

    def row(name: str, measured_v: Any, plan_v: Any) -> None:
        plan_rows.append([name, measured_v, plan_v if plan is not None else "-"])

    row("KV bytes per token per rank (config.json)", cap.kv_bytes_per_token, getattr(plan, "kv_bytes_per_token", None))
    if cap.engine_kv_bytes_per_token is not None:
        row("KV bytes per token per rank (engine's KV spec)", cap.engine_kv_bytes_per_token,
            getattr(plan, "kv_bytes_per_token", None))
    row("block size", cap.block_size, getattr(plan, "block_size", None))
    row("KV blocks", cap.num_blocks, getattr(plan, "kv_blocks", None))
    row("KV tokens held", cap.pool_tokens, getattr(plan, "kv_tokens", None))
    row("KV pool bytes per rank", cap.pool_bytes, getattr(plan, "kv_pool_bytes", None))
    row("needed: concurrency x context", cap.needed_tokens, getattr(plan, "tokens_needed", None))
    evidence = {"table": {"columns": ["figure", "engine (measured)", "stage-0 plan"], "rows": plan_rows},
                "margin": cap.margin, "min_margin": cap.min_margin,
                "charts": [{"kind": "bar", "title": "KV pool vs what the target needs", "x_label": "", "y_label": "tokens",
                            "x_log": False, "series": [
                                {"name": "engine pool", "x": ["tokens"], "y": [cap.pool_tokens]},
                                {"name": "plan pool", "x": ["tokens"], "y": [getattr(plan, "kv_tokens", 0) or 0]},
                                {"name": "needed", "x": ["tokens"], "y": [cap.needed_tokens]}],
                            "reference": [{"y": cap.required_tokens, "label": "needed x (1 + min margin)"}]}]}
    ok = cap.pool_tokens >= cap.required_tokens
    per_engine = f" per engine, of {cap.engines} data-parallel engines" if cap.engines > 1 else ""
    checks = [measured(
        "kvcache.capacity", "KV pool holds target_context x target_concurrency", cap.pool_tokens, cap.required_tokens,
        unit="tokens", direction="higher_is_better", source=source, evidence=evidence,
        message=(f"pool holds {cap.pool_tokens} tokens ({cap.num_blocks // cap.engines - 1} usable blocks x "
                 f"{cap.block_size}){per_engine}; {cap.target_concurrency} x {cap.target_context} needs "
                 f"{cap.needed_tokens}{per_engine}: margin {margin_pct:g}% "
                 f"(min {cap.min_margin * 100:g}%)"
                 + ("" if ok else "; add KV memory (gpu_memory_utilization / VLLM_CPU_KVCACHE_SPACE), "
                                  "use kv_cache_dtype=fp8, or raise tp/pp")),
    )]
    if cap.engine_kv_bytes_per_token is not None:
        checks.append(measured(
            "kvcache.kv_bytes_per_token", "KV bytes per token: config.json x TP x PP equals the engine's KV spec",
            cap.engine_kv_bytes_per_token, cap.kv_bytes_per_token, unit="bytes", direction="exact", source=source,
            message=(f"engine {cap.engine_kv_bytes_per_token} B/token per rank, config.json gives {cap.kv_bytes_per_token}"),
        ))
    if plan is not None and getattr(plan, "kv_tokens", None):
        dev = cap.pool_tokens / plan.kv_tokens - 1.0
        checks.append(measured(
            "kvcache.capacity_vs_plan", "Engine KV pool vs the stage-0 plan", round(dev * 100.0, 2), None,
            unit="% of plan", direction="exact", source=source, evidence={"table": evidence["table"]},
            message=f"engine pool {cap.pool_tokens} tokens vs plan {plan.kv_tokens} ({dev * 100:+.2f}%)"))
    return checks


def prefix_check(probe: PrefixProbe, source: str) -> list[Check]:
    ev = {"prompt_tokens": probe.prompt_len, "cold_cached_tokens": probe.cold_cached,
          "warm_cached_tokens": probe.warm_cached, "cold_tokens": probe.cold_tokens, "warm_tokens": probe.warm_tokens}
    diff = probe.first_difference
    checks = [measured(
        "kvcache.prefix_cache_correctness", "Greedy output with a warm prefix cache equals a cold one",
        0 if probe.identical else 1, 0, unit="mismatching prompts", direction="exact", source=source, evidence=ev,
        message=(f"{len(probe.warm_tokens)} greedy tokens identical for a {probe.prompt_len}-token prompt, cold "
                 f"({probe.cold_cached} cached) and warm ({probe.warm_cached} cached)" if probe.identical else
                 f"warm-cache output differs from cold from token {diff}: cached KV blocks do not reproduce "
                 "the computed ones (block hashing, kv_cache_dtype or attention backend)")),
    ]
    if probe.warm_cached is not None:
        engaged = probe.warm_cached > 0 and (probe.cold_cached or 0) == 0
        checks.append(Check(
            id="kvcache.prefix_cache_engaged", title="The warm request was served from the prefix cache",
            status="pass" if engaged else "fail", value=probe.warm_cached, unit="tokens", direction="higher_is_better",
            source=source, evidence=ev,
            message=(f"warm request reused {probe.warm_cached} of {probe.prompt_len} prompt tokens, cold reused "
                     f"{probe.cold_cached}" + ("" if engaged else
                                               ": the comparison did not exercise the cache (is enable_prefix_caching on?)"))))
    return checks


def failed_view_check(exc: BaseException, check_id: str) -> Check:
    """A view that gave no run: skip when this target does not offer it, error when its engine failed."""
    if isinstance(exc, ViewUnavailable):
        return Check(id=check_id, title="PagedAttention fragmentation", status="skip", message=str(exc))
    if isinstance(exc, EngineError):
        return Check(id=check_id, title="PagedAttention fragmentation", status="error", message=f"engine failed: {exc}",
                     evidence={"log_excerpt": exc.log_excerpt, "log_path": exc.log_path})
    return Check(id=check_id, title="PagedAttention fragmentation", status="error",
                 message=f"{type(exc).__name__}: {exc}")
