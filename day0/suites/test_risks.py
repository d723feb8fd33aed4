"""Stage 5 - risks: tenants are kept apart in the prefix cache, the served model is as accurate as
its reference, and serving stays within budget. Declared-only items (network and storage
isolation) are recorded as skips that say "declared, not measured" for sign-off."""

import pytest

from day0.stages import latency
from day0.stages.risks import accuracy, cost, isolation, task_accuracy

pytestmark = [pytest.mark.day0, pytest.mark.risks]


@pytest.fixture
def endpoint(day0_http_engine):
    """The engine's HTTP API (started beside an in-process engine on CPU targets)."""
    return day0_http_engine.endpoint


def test_tenant_isolation(endpoint, day0_profile, day0_checks):
    """Different cache_salt: B reuses nothing of A's prompt while A's repeat does; the declared
    salting policy with several tenants; the TTFT gap of a hit vs a miss; declared network/storage."""
    if not day0_profile.risks.isolation.enabled:
        pytest.skip("[risks.isolation].enabled = false")
    day0_checks.extend(isolation.check_isolation(endpoint, day0_profile))


def test_cost_within_budget(day0_context, day0_checks):
    """Cost per 1M output tokens and per hour from this run's measured throughput (at the
    sustained load when the capacity search ran) and the profile's price per device-hour,
    against the budget."""
    settings = day0_context.section.cost
    if not settings.enabled:
        pytest.skip("[risks.cost].enabled = false")
    if settings.price_per_device_hour is None:
        day0_checks.extend(cost.unpriced_checks(settings))
        return
    sustained = cost.sustained_throughput(day0_context.record.checks())
    topo = day0_context.profile.topology
    day0_checks.extend(cost.priced_checks(_stage3_throughput(day0_context), sustained, settings, topo.nodes,
                                          topo.devices_per_node))


def _stage3_throughput(ctx) -> cost.Throughput:
    """Stage 3's output throughput as this run recorded it (the record so far), or (stage 3 did
    not run) a short run of stage 3's workload, handed to the cost stage."""
    recorded = cost.recorded_throughput(ctx.record.checks())
    if recorded is not None:
        return recorded
    profile = ctx.profile
    try:
        vocab = latency.workload_vocab(profile)
    except latency.NoTokenizer:
        pytest.skip("stage latency recorded no throughput in this run and the model has no local "
                    "tokenizer.json to build prompts from; run stage latency first")
    ep = ctx.endpoint
    own = latency.measure_throughput(ep.base_url, ep.model, vocab, profile.latency,
                                     profile.risks.cost.measure_requests, progress=ctx.progress, headers=ep.headers)
    return cost.Throughput(own.tok_s, own.source, own.detail)


def test_quantization_accuracy(endpoint, day0_profile, day0_session, day0_checks):
    """Perplexity, top-1 agreement and top-k KL of the deployed model against its reference on a
    fixed text, from prompt log-probabilities."""
    if not day0_profile.risks.accuracy.enabled:
        pytest.skip("[risks.accuracy].enabled = false")
    day0_checks.extend(accuracy.check_accuracy(endpoint, day0_profile, day0_session.run_dir, day0_session.log,
                                               on_start=day0_session.engines.on_start))


def test_task_accuracy(endpoint, day0_profile, day0_session, day0_checks):
    """Downstream task accuracy (lm-eval, local task files) of the deployment against the
    transformers reference: the drop in accuracy within its limit."""
    if not day0_profile.risks.accuracy.enabled:
        pytest.skip("[risks.accuracy].enabled = false")
    day0_checks.add(task_accuracy.check_tasks(endpoint, day0_profile, day0_session.run_dir))
