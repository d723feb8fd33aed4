"""Stage 3 on an in-process engine: the same workload, metrics and SLA judge as over HTTP.

With ``engine.mode = "inprocess"`` there is no server to stream from, so day0 drives vLLM's own
``LLMEngine`` (``add_request`` / ``step``) with ``concurrency`` requests in flight and stamps
each step's output with ``perf_counter``: a "message" is the tokens one step produced for a
request, exactly what a stream would carry. vLLM's own per-request metrics
(``RequestOutput.metrics.first_token_latency``) are the engine's view, compared with ours in
``latency.engine_agreement`` the way ``/metrics`` is compared over HTTP.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from day0.client.loadgen import PhaseResult, RequestResult
from day0.client.prom import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, PrefixCacheWindow
from day0.client.workload import Request, Vocab, build_requests, new_nonce
from day0.config.errors import SettingsError
from day0.config.latency import LatencySection, SlaSection
from day0.core.record import Check, measured
from day0.stages.latency.agreement import agreement_allowance
from day0.stages.latency.checks import latency_checks
from day0.stages.latency.measurement import LatencyRun
from day0.stages.latency.metrics import compute_metrics
from day0.stages.latency.run import cache_intent, report_percentiles
from day0.stages.latency.settings import EngineContext, dataset_lengths, load_shape, workload_spec

ENGINE_VIEW = "in-process engine: no /metrics endpoint; vLLM's per-request metrics are compared instead"


def _phase(llm: Any, reqs: Sequence[Request], settings: LatencySection, phase: str,
           engine_ttft: dict[str, list[float]]) -> PhaseResult:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    eng = llm.llm_engine
    pending = list(reqs)
    inflight: dict[str, RequestResult] = {}
    results: list[RequestResult] = []
    started = time.perf_counter()
    last_progress = started

    def submit(req: Request) -> None:
        rid = f"day0-latency-{phase}-{req.index}"
        params = SamplingParams(max_tokens=req.output_len, ignore_eos=True, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA)
        now = time.perf_counter()
        inflight[rid] = RequestResult(index=req.index, phase=phase, scheduled=now, sent=now,
                                      input_len=req.input_len, expected_output_len=req.output_len,
                                      token_source="token_ids")  # the step delta is the token ids themselves
        eng.add_request(rid, {"prompt_token_ids": list(req.prompt)}, params)

    while pending or inflight:
        while pending and len(inflight) < settings.concurrency:
            submit(pending.pop(0))
        try:
            outs = eng.step()
        except Exception as exc:  # the engine died: every request in flight failed, none averaged in
            now = time.perf_counter()
            for r in inflight.values():
                r.error, r.reason, r.finished = "server_error", f"{type(exc).__name__}: {exc}", now
                results.append(r)
            inflight.clear()
            break
        now = time.perf_counter()
        for out in outs:
            r = inflight.get(out.request_id)
            if r is None:
                continue
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            if n:
                r.msg_t.append(now - r.scheduled)
                r.msg_n.append(n)
                last_progress = now
            if out.finished:
                r.ok = bool(r.msg_n)
                r.error = None if r.ok else "no_tokens"
                r.finished = now
                r.output_tokens = sum(r.msg_n)
                r.output_tokens_source = "engine"
                r.prompt_tokens = len(out.prompt_token_ids or [])
                metrics = getattr(out, "metrics", None)
                if r.ok and metrics is not None and getattr(metrics, "first_token_latency", 0.0):
                    engine_ttft[phase].append(metrics.first_token_latency * 1000.0)
                results.append(inflight.pop(out.request_id))
        if inflight and now - last_progress > settings.stall_timeout_s:
            for rid, r in list(inflight.items()):
                eng.abort_request([rid])
                r.error, r.reason, r.finished = "timeout", f"no token for {settings.stall_timeout_s:g} s", now
                results.append(r)
            inflight.clear()
    return PhaseResult(phase, load_shape(settings), sorted(results, key=lambda r: r.index), started,
                       time.perf_counter())


def run_latency_inprocess(llm: Any, model: str, vocab: Vocab | int, settings: LatencySection | None = None,
                          sla: SlaSection | None = None, *,
                          progress: Callable[[str], None] | None = None,
                          ctx: EngineContext | None = None) -> tuple[LatencyRun, Check]:
    """The measured run and the engine-agreement check (client step times vs vLLM's own TTFT)."""
    s = settings or LatencySection()
    sla = sla or SlaSection()
    if s.endpoint != "completions":
        raise SettingsError("latency.endpoint: the in-process engine takes token ids; chat needs the HTTP view")
    if s.load != "concurrency":
        raise SettingsError("latency.load: the in-process engine is driven closed-loop; open-loop rates need "
                            "the HTTP view (engine.mode = \"server\")")
    if isinstance(vocab, int):
        vocab = Vocab(vocab, frozenset(s.special_token_ids))
    say = progress or (lambda _msg: None)
    ctx = ctx or EngineContext()
    dataset = dataset_lengths(s, ctx)
    spec = workload_spec(s, nonce=new_nonce() if s.fresh_prompts else None, dataset=dataset, ctx=ctx)
    pcts = report_percentiles(s, sla)
    engine_ttft: dict[str, list[float]] = {"warmup": [], "main": []}
    warm = None
    if s.warmup_requests:
        say(f"warm-up: {s.warmup_requests} requests (in-process)")
        wphase = _phase(llm, build_requests(spec, vocab, s.warmup_requests, stream="warmup"), s, "warmup", engine_ttft)
        warm = compute_metrics(wphase, pcts)
    count = s.measured_requests(sla)
    say(f"measure: {count} requests, concurrency {s.concurrency} (in-process)")
    main = build_requests(spec, vocab, count, stream="main")
    before = _cache_counters(llm)
    phase = _phase(llm, main, s, "main", engine_ttft)
    after = _cache_counters(llm)
    metrics = compute_metrics(phase, pcts, sla.per_request_slo())
    cache = cache_intent(main, s, ctx.block_size, dataset.counted_with if dataset else "")
    if before is None or after is None:
        cache.why_unmeasured = "the in-process engine keeps no stats (LLM(disable_log_stats=True), vLLM's default)"
    else:
        cache.window = PrefixCacheWindow(after[0] - before[0], after[1] - before[1])
    run = LatencyRun("inprocess", model, s, sla, metrics, warm, None, ENGINE_VIEW, cache=cache)
    return run, engine_agreement(metrics.samples["ttft"], engine_ttft["main"], s)


def _cache_counters(llm: Any) -> tuple[float, float] | None:
    """The scheduler's prefix-cache (hits, queries) in tokens, summed over engines; None without stats."""
    try:
        snapshot = llm.llm_engine.get_metrics()
    except Exception:  # AssertionError "Stat logging disabled", or an engine without get_metrics
        return None
    totals = {PREFIX_CACHE_HITS: 0.0, PREFIX_CACHE_QUERIES: 0.0}
    seen = set()
    for metric in snapshot:
        if metric.name in totals:
            totals[metric.name] += float(getattr(metric, "value", 0.0))
            seen.add(metric.name)
    return (totals[PREFIX_CACHE_HITS], totals[PREFIX_CACHE_QUERIES]) if len(seen) == 2 else None


def inprocess_checks(run: LatencyRun, agreement: Check) -> list[Check]:
    """The run's checks as the scheduler view's: ``latency.server_agreement`` (/metrics, which an
    in-process engine does not have) replaced by ``agreement``, every source ``scheduler``."""
    checks = [c for c in latency_checks(run) if c.id != "latency.server_agreement"] + [agreement]
    for c in checks:
        c.source = "scheduler"
    return checks


def engine_agreement(client_ttft_ms: Sequence[float], engine_ttft_ms: Sequence[float],
                     settings: LatencySection) -> Check:
    """Mean TTFT at the step output vs vLLM's first_token_latency; they time the same span
    (arrival to first token) from two sides, so a gap means one of them is wrong."""
    title = "Step-output TTFT agrees with vLLM's per-request first_token_latency"
    if not client_ttft_ms or not engine_ttft_ms:
        return Check(id="latency.engine_agreement", title=title, status="skip", source="scheduler",
                     message="vLLM reported no per-request first_token_latency (disable_log_stats?)")
    client = sum(client_ttft_ms) / len(client_ttft_ms)
    engine = sum(engine_ttft_ms) / len(engine_ttft_ms)
    std = math.sqrt(sum((x - client) ** 2 for x in client_ttft_ms) / len(client_ttft_ms))
    tol = agreement_allowance(settings.agreement_rel, client, std, len(client_ttft_ms))
    return measured(
        "latency.engine_agreement", title, round(abs(client - engine), 3), round(tol, 3), unit="ms",
        direction="lower_is_better", source="scheduler",
        message=f"TTFT mean: step output {client:.1f} ms vs vLLM {engine:.1f} ms (|diff| "
                f"{abs(client - engine):.2f} ms, tolerance {tol:.2f} ms: {settings.agreement_rel:g} x mean + 3 SE)",
        evidence={"table": {"columns": ["view", "n", "mean ms"],
                            "rows": [["step output", len(client_ttft_ms), round(client, 3)],
                                     ["vLLM first_token_latency", len(engine_ttft_ms), round(engine, 3)]]}},
    )
