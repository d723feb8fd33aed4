"""Stage 5 - risks: tenants are kept apart in the prefix cache, the served model is as accurate as
its reference, and serving stays within budget. Declared-only items (network and storage
isolation) are recorded as skips that say "declared, not measured" for sign-off."""

import time

import pytest

from day0.core.record import Check
from day0.engine import auth_headers, local_model_dir
from day0.stages.risks.accuracy import (
    NoReference,
    accuracy_checks,
    compare,
    fetch_prompt_logprobs,
    reference_engine,
    tokenize,
)
from day0.stages.risks.cost import (
    cost_checks,
    device_count,
    estimate,
    measure_throughput,
    throughput_from_events,
    unpriced_checks,
)
from day0.stages.risks.isolation import isolation_checks, run_evidence, run_isolation

pytestmark = [pytest.mark.day0, pytest.mark.risks]


def _model(http_engine) -> str:
    return http_engine.info.served_model_name


def test_tenant_isolation(http_engine, day0_profile, day0_checks):
    """Different cache_salt: B reuses nothing of A's prompt while A's repeat does; the declared
    salting policy with several tenants; the TTFT gap of a hit vs a miss; declared network/storage."""
    settings = day0_profile.risks.isolation
    if not settings.enabled:
        pytest.skip("[risks.isolation].enabled = false")
    run = run_isolation(http_engine.base_url, _model(http_engine), settings, headers=auth_headers(day0_profile),
                        timeout_s=day0_profile.engine.request_timeout_s)
    checks = isolation_checks(run)
    checks[0].evidence["probes"] = run_evidence(run)["probes"]
    day0_checks.extend(checks)


def _vocab(profile):
    from day0.client.workload import read_vocab

    path = local_model_dir(profile)
    return read_vocab(path) if path is not None and (path / "tokenizer.json").is_file() else None


def test_cost_within_budget(http_engine, day0_profile, day0_session, day0_checks):
    """Cost per 1M output tokens and per hour from this run's measured throughput and the
    profile's price per device-hour, against the budget."""
    settings = day0_profile.risks.cost
    if not settings.enabled:
        pytest.skip("[risks.cost].enabled = false")
    if settings.price_per_device_hour is None:
        day0_checks.extend(unpriced_checks(settings))
        return
    throughput = throughput_from_events(day0_session.events.path)
    if throughput is None:
        vocab = _vocab(day0_profile)
        if vocab is None:
            pytest.skip("stage latency recorded no throughput in this run and the model has no local "
                        "tokenizer.json to build prompts from; run stage latency first")
        throughput = measure_throughput(http_engine.base_url, _model(http_engine), vocab, day0_profile.latency,
                                        settings.measure_requests, progress=day0_session.log)
    topo = day0_profile.topology
    devices_from = ("[risks.cost].devices" if settings.devices else
                    f"topology: {topo.nodes} node(s) x {topo.devices_per_node} device(s)")
    est = estimate(throughput.tok_s, device_count(settings, topo.nodes, topo.devices_per_node),
                   settings.price_per_device_hour, settings.utilization, settings.currency)
    checks = cost_checks(est, settings, throughput.source, devices_from)
    checks[0].evidence["throughput_detail"] = throughput.detail
    day0_checks.extend(checks)


def test_quantization_accuracy(http_engine, day0_profile, day0_session, day0_checks):
    """Perplexity, top-1 agreement and top-k KL of the deployed model against its reference on a
    fixed text, from prompt log-probabilities."""
    settings = day0_profile.risks.accuracy
    if not settings.enabled:
        pytest.skip("[risks.accuracy].enabled = false")
    base, model, headers = http_engine.base_url, _model(http_engine), auth_headers(day0_profile)
    timeout = day0_profile.engine.request_timeout_s
    ids = tokenize(base, model, settings.text, headers=headers)[: settings.max_tokens]
    t0 = time.perf_counter()
    deployed = fetch_prompt_logprobs(base, model, ids, settings.top_k, timeout=timeout, headers=headers)
    deployed_s = time.perf_counter() - t0
    try:
        with reference_engine(day0_profile, settings, day0_session.run_dir, day0_session.log,
                              on_start=day0_session.engines.on_start) as ref:
            ref_ids = tokenize(ref.base_url, ref.model, settings.text)[: settings.max_tokens]
            t0 = time.perf_counter()
            reference = fetch_prompt_logprobs(ref.base_url, ref.model, ids, settings.top_k, timeout=timeout)
            reference_s = time.perf_counter() - t0
    except NoReference as exc:
        for cid in ("ppl_delta", "top1_agreement", "mean_kl"):
            day0_checks.add(Check(id=f"risks.accuracy.{cid}", title=f"Accuracy vs reference: {cid}", status="skip",
                                  message=str(exc), source="profile"))
        return
    assert ref_ids == ids, (f"the reference tokenizes the evaluation text differently ({ref.description}); "
                            "compare models that share a tokenizer")
    evidence = {"engine_seconds": {"deployed": round(deployed_s, 3), "reference": round(reference_s, 3)},
                "reference_attempts": ref.attempts, "token_ids": ids}
    day0_checks.extend(accuracy_checks(compare(deployed, reference), settings, ref.description, evidence))
