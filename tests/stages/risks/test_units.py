"""Stage risks without an engine: the formulas (PPL, top-k KL, agreement, cost), the parsers
(vLLM prompt_logprobs, Prometheus counters, the event log) and how measurements become checks."""

import math
import random
import sys
import time

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from day0.client.prom import PromError
from day0.config.profile import ProfileError, load_profile, validate
from day0.config.risks import AccuracySettings, CostSettings, IsolationSettings
from day0.core.record import Check, measured
from day0.engine import Endpoint
from day0.stages.risks.accuracy import (
    AccuracyError,
    PromptLogprobs,
    accuracy_checks,
    cell_kl,
    compare,
    no_reference_checks,
    parse_prompt_logprobs,
    perplexity,
    relative_delta,
    top1_agreement,
)
from day0.stages.risks.cost import (
    CostEstimate,
    Throughput,
    budget_checks,
    cost_checks,
    device_count,
    estimate,
    recorded_throughput,
    unpriced_checks,
)
from day0.stages.risks.isolation import (
    IsolationRun,
    Probe,
    counter_delta,
    counter_total,
    declared_checks,
    fresh_prompt,
    isolation_checks,
    median,
    separability,
    tenant_salt,
)
from tests.support import REPO

# --------------------------------------------------------------------------- distributions


def softmax_logprobs(logits: list[float]) -> list[float]:
    m = max(logits)
    z = m + math.log(math.fsum(math.exp(x - m) for x in logits))
    return [x - z for x in logits]


def full_kl(p: list[float], q: list[float]) -> float:
    return math.fsum(math.exp(a) * (a - b) for a, b in zip(p, q))


def top(lp: list[float], k: int, extra: int | None = None) -> dict[int, float]:
    order = sorted(range(len(lp)), key=lambda i: -lp[i])[:k]
    keep = set(order) | ({extra} if extra is not None else set())
    return {i: lp[i] for i in keep}


logit_lists = st.integers(2, 40).flatmap(
    lambda v: st.tuples(st.lists(st.floats(-8, 8), min_size=v, max_size=v),
                        st.lists(st.floats(-8, 8), min_size=v, max_size=v)))


@given(logit_lists, st.integers(1, 40), st.data())
def test_cell_kl_is_a_lower_bound_of_the_full_kl(pair, k, data):
    p, q = softmax_logprobs(pair[0]), softmax_logprobs(pair[1])
    actual = data.draw(st.integers(0, len(p) - 1))
    kl, mass = cell_kl(top(p, k, actual), top(q, k, actual), actual)
    assert kl >= 0
    assert kl <= full_kl(p, q) + 1e-9
    assert 0 <= mass <= 1 + 1e-12


@given(logit_lists)
def test_cell_kl_over_the_whole_vocabulary_is_the_kl(pair):
    p, q = softmax_logprobs(pair[0]), softmax_logprobs(pair[1])
    full = dict(enumerate(p)), dict(enumerate(q))
    kl, mass = cell_kl(*full)
    assert kl == pytest.approx(full_kl(p, q), abs=1e-7)
    assert mass == pytest.approx(1.0)


def test_a_near_certain_token_rounded_to_logprob_zero_keeps_the_kl_finite():
    """float32 logprobs round a near-certain top-1 to exactly 0.0: the deployed cells then sum to
    1 or more and the rest cell to nothing, which read as an infinite KL (a good model failed)."""
    kl, mass = cell_kl({5: -1e-6, 7: -16.0, 9: -17.0}, {5: 0.0, 7: -16.0, 9: -17.0})
    assert math.isfinite(kl) and kl < 1e-4 and mass == pytest.approx(1.0, abs=1e-5)


@given(st.lists(st.floats(-8, 8), min_size=2, max_size=40), st.integers(1, 40))
def test_cell_kl_of_identical_distributions_is_zero(logits, k):
    p = softmax_logprobs(logits)
    assert cell_kl(top(p, k), top(p, k))[0] == pytest.approx(0.0, abs=1e-9)


def test_cell_kl_grows_with_the_difference():
    p = softmax_logprobs([2.0, 1.0, 0.0, -1.0])
    near = softmax_logprobs([2.0, 1.1, 0.0, -1.0])
    far = softmax_logprobs([-1.0, 0.0, 1.0, 2.0])
    assert 0 < cell_kl(top(p, 2), top(near, 2))[0] < cell_kl(dict(enumerate(p)), dict(enumerate(far)))[0]


@given(st.floats(0.0, 20.0), st.integers(1, 300))
def test_perplexity_of_a_constant_logprob(c, n):
    assert perplexity([-c] * n) == pytest.approx(math.exp(c))


@given(st.lists(st.floats(-30, 0), min_size=1, max_size=200), st.randoms())
def test_perplexity_is_at_least_one_and_order_free(lps, rnd):
    shuffled = list(lps)
    rnd.shuffle(shuffled)
    assert perplexity(lps) >= 1.0 - 1e-12
    assert perplexity(shuffled) == pytest.approx(perplexity(lps))


@given(st.integers(2, 5000))
def test_perplexity_of_a_uniform_model_is_the_vocabulary_size(v):
    assert perplexity([-math.log(v)] * 7) == pytest.approx(v)


@given(st.floats(0.01, 1e6), st.floats(0.01, 1e6))
def test_relative_delta(a, b):
    d = relative_delta(a, b)
    assert b * (1 + d) == pytest.approx(a)
    assert (d > 0) == (a > b) or a == pytest.approx(b)


def test_relative_delta_needs_a_positive_reference():
    with pytest.raises(ValueError, match="positive"):
        relative_delta(1.0, 0.0)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=50), st.data())
def test_top1_agreement_counts_matches(a, data):
    b = data.draw(st.lists(st.integers(0, 5), min_size=len(a), max_size=len(a)))
    assert top1_agreement(a, b) == sum(x == y for x, y in zip(a, b)) / len(a)
    assert top1_agreement(a, a) == 1.0


def test_top1_agreement_needs_equal_lengths():
    with pytest.raises(ValueError, match="different or zero length"):
        top1_agreement([1, 2], [1])


# --------------------------------------------------------------------------- vLLM prompt_logprobs

# The shape of a real answer from vLLM 0.32's /v1/completions (prompt_logprobs=2, trimmed).
REAL_CHOICE = {
    "prompt_token_ids": [85, 262, 282, 338],
    "prompt_logprobs": [
        None,
        {"262": {"logprob": -5.6506, "rank": 55, "decoded_token": "he"},
         "210": {"logprob": -5.1724, "rank": 1, "decoded_token": "\u0014"},
         "320": {"logprob": -5.1974, "rank": 2, "decoded_token": " ba"}},
        {"282": {"logprob": -6.5856, "rank": 371, "decoded_token": " m"},
         "324": {"logprob": -5.1652, "rank": 1, "decoded_token": "nightly"},
         "138": {"logprob": -5.2160, "rank": 2, "decoded_token": ""}},
        {"338": {"logprob": -5.1000, "rank": 1, "decoded_token": "odel"},
         "331": {"logprob": -5.1064, "rank": 2, "decoded_token": "es"}},
    ],
}


def test_parse_real_prompt_logprobs():
    lp = parse_prompt_logprobs(REAL_CHOICE)
    assert lp.token_ids == [85, 262, 282, 338]
    assert lp.actual == [-5.6506, -6.5856, -5.1000]
    assert lp.top1 == [210, 324, 338]
    assert lp.top[0] == {262: -5.6506, 210: -5.1724, 320: -5.1974}


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c.pop("prompt_logprobs"), "no prompt_token_ids/prompt_logprobs"),
    (lambda c: c["prompt_logprobs"].pop(), "3 prompt_logprobs for 4 prompt tokens"),
    (lambda c: c["prompt_logprobs"][2].pop("282"), "position 2 lacks the prompt token 282"),
    (lambda c: c["prompt_logprobs"].__setitem__(3, None), "position 3 has no logprobs"),
])
def test_parse_rejects_answers_it_cannot_score(mutate, match):
    import copy

    choice = copy.deepcopy(REAL_CHOICE)
    mutate(choice)
    with pytest.raises(AccuracyError, match=match) as exc:
        parse_prompt_logprobs(choice, where="http://ref")
    assert str(exc.value).startswith("http://ref: ")


def _model_logprobs(logits_per_pos: list[list[float]], ids: list[int], k: int) -> PromptLogprobs:
    actual, tops, top1 = [], [], []
    for i, logits in enumerate(logits_per_pos, start=1):
        lp = softmax_logprobs(logits)
        actual.append(lp[ids[i]])
        tops.append(top(lp, k, ids[i]))
        top1.append(max(range(len(lp)), key=lambda t: lp[t]))
    return PromptLogprobs(ids, actual, tops, top1)


def test_compare_identical_models_gives_zero_and_passes():
    rng = random.Random(1)
    ids = [rng.randrange(16) for _ in range(12)]
    logits = [[rng.gauss(0, 2) for _ in range(16)] for _ in ids[1:]]
    a = _model_logprobs(logits, ids, 4)
    cmp = compare(a, a)
    assert cmp.ppl_delta == 0 and cmp.top1_agreement == 1.0 and cmp.mean_kl == pytest.approx(0, abs=1e-12)
    assert all(c.status == "pass" for c in accuracy_checks(cmp, AccuracySettings(), "itself"))


def test_compare_a_perturbed_model_fails_agreement_and_kl():
    rng = random.Random(2)
    ids = [rng.randrange(16) for _ in range(40)]
    logits = [[rng.gauss(0, 2) for _ in range(16)] for _ in ids[1:]]
    other = [[rng.gauss(0, 2) for _ in range(16)] for _ in ids[1:]]
    cmp = compare(_model_logprobs(other, ids, 4), _model_logprobs(logits, ids, 4))
    checks = {c.id: c for c in accuracy_checks(cmp, AccuracySettings(), "random")}
    assert checks["risks.accuracy.top1_agreement"].status == "fail"
    assert checks["risks.accuracy.mean_kl"].status == "fail"
    assert checks["risks.accuracy.ppl_delta"].value == pytest.approx(abs(cmp.ppl_delta), rel=1e-4)
    assert "perplexity" in checks["risks.accuracy.ppl_delta"].message
    assert checks["risks.accuracy.mean_kl"].evidence["samples"] == cmp.kl_per_position


def test_compare_refuses_different_token_ids():
    a = PromptLogprobs([1, 2, 3], [-1.0, -1.0], [{2: -1.0}, {3: -1.0}], [2, 3])
    b = PromptLogprobs([1, 2, 4], [-1.0, -1.0], [{2: -1.0}, {4: -1.0}], [2, 4])
    with pytest.raises(AccuracyError, match="different token ids"):
        compare(a, b)


def test_ppl_limit_is_symmetric():
    base = PromptLogprobs([0, 1], [-2.0], [{1: -2.0}], [1])
    for lp in (-2.0 - 0.05, -2.0 + 0.05):  # ~5 % higher and lower perplexity
        other = PromptLogprobs([0, 1], [lp], [{1: lp}], [1])
        (ppl, _, _) = accuracy_checks(compare(other, base), AccuracySettings(max_ppl_delta=0.02), "x")
        assert ppl.status == "fail"
        (ppl, _, _) = accuracy_checks(compare(other, base), AccuracySettings(max_ppl_delta=0.06), "x")
        assert ppl.status == "pass"


# --------------------------------------------------------------------------- /metrics counters

EXPOSITION = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="day0-tiny"}} {h0}
vllm:prefix_cache_hits_total{{engine="1",model_name="day0-tiny"}} {h1}
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="day0-tiny"}} {q}
"""


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**6), st.integers(0, 10**6))
def test_counter_total_sums_engines_and_delta_subtracts(h0, h1, d0, d1):
    before = EXPOSITION.format(h0=float(h0), h1=float(h1), q=1.0)
    after = EXPOSITION.format(h0=float(h0 + d0), h1=float(h1 + d1), q=2.0)
    assert counter_total(before, "vllm:prefix_cache_hits") == h0 + h1
    assert counter_delta(before, after, "vllm:prefix_cache_hits") == d0 + d1
    assert counter_delta(before, after, "vllm:prefix_cache_queries") == 1.0


def test_counter_absent_or_reset():
    text = EXPOSITION.format(h0=5.0, h1=0.0, q=1.0)
    assert counter_total(text, "vllm:no_such_counter") is None
    assert counter_delta(text, text, "vllm:no_such_counter") is None
    with pytest.raises(PromError, match="went down between scrapes"):
        counter_delta(text, EXPOSITION.format(h0=1.0, h1=0.0, q=1.0), "vllm:prefix_cache_hits")
    with pytest.raises(PromError, match="not a Prometheus exposition"):
        counter_total("vllm:x{ 1\n", "vllm:x")


# --------------------------------------------------------------------------- isolation judging


@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=20), st.lists(st.floats(0, 1e4), min_size=1, max_size=20))
def test_separability_is_an_auc(a, b):
    assert 0 <= separability(a, b) <= 1
    assert separability(a, b) + separability(b, a) == pytest.approx(1.0)
    assert separability(a, a) == pytest.approx(0.5)
    shift = max(a) + 1
    assert separability(a, [x + shift for x in b]) == 1.0


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50))
def test_median_splits_the_sample(xs):
    m = median(xs)
    assert sum(x < m for x in xs) <= len(xs) / 2 and sum(x > m for x in xs) <= len(xs) / 2


def test_fresh_prompts_use_only_pool_ids_and_differ():
    rng = random.Random("n")
    pool = [3, 7, 11, 19]
    a, b = fresh_prompt(pool, 64, rng), fresh_prompt(pool, 64, rng)
    assert set(a) <= set(pool) and len(a) == 64 and a != b
    assert tenant_salt("abc", "tenant-a") != tenant_salt("abc", "tenant-b")


def _run(settings: IsolationSettings, *, repeat: int | None, b: int | None, policy_b: int | None = None,
         hit_ms=(40.0, 42.0), miss_ms=(300.0, 310.0)) -> IsolationRun:
    src = "/metrics" if b is not None else "none"
    run = IsolationRun(settings, "n")
    run.salted = [Probe("A cold", "tenant-a", "sa", 1024, 0 if b is not None else None, src, 300.0),
                  Probe("A repeat", "tenant-a", "sa", 1024, repeat, src, 40.0),
                  Probe("B same prompt", "tenant-b", "sb", 1024, b, src, 300.0)]
    if policy_b is not None:
        run.policy = [Probe("A (policy)", "tenant-a", None, 1024, 0, src, 300.0),
                      Probe("B (policy)", "tenant-b", None, 1024, policy_b, src, 40.0)]
    run.hits = [Probe(f"hit {i}", "timing", "h", 1024, repeat, src, t) for i, t in enumerate(hit_ms)]
    run.misses = [Probe(f"miss {i}", "timing", f"m{i}", 1024, 0, src, t) for i, t in enumerate(miss_ms)]
    return run


def _by_id(checks: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in checks}


def test_salted_tenants_pass_and_declared_items_are_skips():
    s = IsolationSettings(tenants=2, salt="per_tenant", network="VPC per tenant", storage="no KV offload")
    checks = _by_id(isolation_checks(_run(s, repeat=992, b=0)))
    assert checks["risks.isolation.cache_salt"].status == "pass"
    assert "A's repeat reused 992" in checks["risks.isolation.cache_salt"].message
    assert checks["risks.isolation.tenant_policy"].status == "pass"
    net = checks["risks.isolation.network"]
    assert net.status == "skip" and net.message.startswith("declared, not measured: VPC per tenant")
    assert net.evidence["declared"] is True
    timing = checks["risks.isolation.timing_signal"]
    assert timing.value == pytest.approx(median([300.0, 310.0]) - median([40.0, 42.0]))
    assert timing.evidence["separability"] == 1.0 and timing.status == "pass"


def test_a_shared_block_across_salts_fails():
    checks = _by_id(isolation_checks(_run(IsolationSettings(), repeat=992, b=992)))
    c = checks["risks.isolation.cache_salt"]
    assert c.status == "fail" and c.value == 992 and "despite a different cache_salt" in c.message


def test_unsalted_multi_tenant_policy_fails_with_the_reason():
    s = IsolationSettings(tenants=3, salt="none", network="n", storage="s")
    c = _by_id(isolation_checks(_run(s, repeat=992, b=0, policy_b=992)))["risks.isolation.tenant_policy"]
    assert c.status == "fail" and c.value == 992
    assert "requests carry no cache_salt" in c.message and "3 tenants" in c.message


def test_unsalted_policy_passes_when_nothing_is_shared():
    s = IsolationSettings(tenants=2, salt="none", network="n", storage="s")
    c = _by_id(isolation_checks(_run(s, repeat=0, b=0, policy_b=0)))["risks.isolation.tenant_policy"]
    assert c.status == "pass" and "prefix caching off" in c.message


def test_single_tenant_and_missing_counts_are_skips():
    checks = _by_id(isolation_checks(_run(IsolationSettings(tenants=1), repeat=None, b=None)))
    assert checks["risks.isolation.tenant_policy"].status == "skip"
    assert checks["risks.isolation.cache_salt"].status == "skip"
    assert "--enable-prompt-tokens-details" in checks["risks.isolation.cache_salt"].message
    assert checks["risks.isolation.network"].status == "skip"
    assert checks["risks.isolation.network"].evidence["declared"] is False


def test_undeclared_isolation_with_several_tenants_fails():
    checks = _by_id(declared_checks(IsolationSettings(tenants=2, network="per-tenant VLAN")))
    assert checks["risks.isolation.network"].status == "skip"
    assert checks["risks.isolation.storage"].status == "fail"
    assert "[risks.isolation].storage is empty" in checks["risks.isolation.storage"].message


def test_a_failed_probe_is_an_error_naming_it():
    run = _run(IsolationSettings(), repeat=992, b=0)
    run.salted[2].error = "http://x/v1/completions: HTTP 400: cache_salt rejected"
    c = _by_id(isolation_checks(run))["risks.isolation.cache_salt"]
    assert c.status == "error" and c.message.startswith("B same prompt: http://x")


# --------------------------------------------------------------------------- cost


@given(st.floats(0.01, 1e6), st.integers(1, 4096), st.floats(0, 100), st.floats(0.01, 1.0))
def test_cost_arithmetic(tok_s, devices, price, util):
    est = estimate(tok_s, devices, price, util)
    assert est.per_hour == pytest.approx(devices * price)
    assert est.tokens_per_hour == pytest.approx(tok_s * 3600 * util)
    assert est.per_million_output_tokens * est.tokens_per_hour / 1e6 == pytest.approx(est.per_hour)
    double = estimate(tok_s * 2, devices, price, util)
    assert double.per_million_output_tokens == pytest.approx(est.per_million_output_tokens / 2)


@given(st.floats(0.1, 1e4), st.floats(0.01, 50), st.floats(1.01, 10))
def test_budget_above_passes_and_below_fails(tok_s, price, factor):
    est = estimate(tok_s, 8, price)
    cost = est.per_million_output_tokens
    assume(cost > 1e-3)
    above = _by_id(cost_checks(est, CostSettings(max_per_million_output_tokens=cost * factor), "src", "topology"))
    below = _by_id(cost_checks(est, CostSettings(max_per_million_output_tokens=cost / factor,
                                                 max_per_hour=est.per_hour / factor), "src", "topology"))
    assert above["risks.cost.per_million_output_tokens"].status == "pass"
    assert below["risks.cost.per_million_output_tokens"].status == "fail"
    assert "over budget" in below["risks.cost.per_million_output_tokens"].message
    assert below["risks.cost.per_hour"].status == "fail"


def test_cost_table_shows_the_assumptions():
    est = CostEstimate(100.0, 8, 3.0, 0.5, "EUR")
    (per_m, per_h) = cost_checks(est, CostSettings(), "stage latency: latency.output_throughput", "topology: 1 x 8")
    rows = {r[0]: r for r in per_m.evidence["table"]["rows"]}
    assert rows["price per device-hour"][2].startswith("assumed")
    assert rows["output throughput"][2] == "measured: stage latency: latency.output_throughput"
    assert per_m.unit == "EUR/Mtok" and per_h.value == 24.0
    assert per_m.value == pytest.approx(24.0 / (100 * 3600 * 0.5) * 1e6)


def test_estimate_rejects_impossible_inputs():
    with pytest.raises(ValueError, match="devices"):
        estimate(1.0, 0, 1.0)
    with pytest.raises(ValueError, match="utilization"):
        estimate(1.0, 1, 1.0, 0.0)
    assert estimate(0.0, 1, 1.0).per_million_output_tokens == math.inf


def test_unpriced_cost_is_a_skip_naming_the_key():
    assert {c.status for c in unpriced_checks(CostSettings())} == {"skip"}
    assert "price_per_device_hour" in unpriced_checks(CostSettings())[0].message
    assert device_count(CostSettings(), 4, 8) == 32 and device_count(CostSettings(devices=3), 4, 8) == 3


def test_budget_checks_price_the_throughput_handed_over():
    tput = Throughput(100.0, "own measurement: 8 requests", {"requests": 8})
    per_m, per_h = budget_checks(tput, CostSettings(price_per_device_hour=3.0), 2, 4)
    assert per_m.evidence["assumptions"]["devices_from"] == "topology: 2 node(s) x 4 device(s)"
    assert per_m.evidence["throughput_detail"] == {"requests": 8} and per_m.evidence["throughput_source"] == tput.source
    assert per_h.value == 24.0 and per_m.value == pytest.approx(24.0 / (100 * 3600) * 1e6)
    (per_m, _) = budget_checks(tput, CostSettings(price_per_device_hour=3.0, devices=1), 2, 4)
    assert per_m.evidence["assumptions"]["devices_from"] == "[risks.cost].devices"
    assert [c.status for c in budget_checks(tput, CostSettings(), 2, 4)] == ["skip", "skip"]


def test_no_reference_is_three_skips_saying_why():
    checks = no_reference_checks("no reference declared")
    assert [c.id for c in checks] == ["risks.accuracy.ppl_delta", "risks.accuracy.top1_agreement",
                                      "risks.accuracy.mean_kl"]
    assert {(c.status, c.message, c.source) for c in checks} == {("skip", "no reference declared", "profile")}


def test_throughput_comes_from_the_record_so_far():
    from day0.stages.context import RecordSoFar

    checks: list[Check] = []
    record = RecordSoFar(lambda: tuple(checks))
    assert recorded_throughput(record.checks()) is None
    checks.append(measured("latency.ttft_p99", "TTFT", 10.0, 100.0))
    assert recorded_throughput(record.checks()) is None
    checks.append(measured("latency.output_throughput", "tput", 12.5, 20.0, direction="higher_is_better"))
    checks.append(Check(id="latency.output_throughput", title="t", status="error", value=None))
    for c in checks:
        c.stage = "latency"
    found = recorded_throughput(record.checks())
    assert found.tok_s == 12.5 and found.detail["status"] == "fail" and "stage latency" in found.source
    record.checks()[0].value = 1e9  # copies: a stage cannot change what an earlier stage recorded
    assert checks[0].value == 10.0


# --------------------------------------------------------------------------- profile


def test_presets_carry_risk_tables():
    cpu = load_profile("cpu-tiny").risks
    assert cpu.isolation.tenants >= 1 and cpu.accuracy.reference == "transformers"
    assert cpu.cost.price_per_device_hour is not None and cpu.cost.max_per_million_output_tokens is not None
    assert load_profile("h200x8").risks.accuracy.reference == "none"


@pytest.mark.parametrize("table, where", [
    ({"isolation": {"tenant": 2}}, "risks.isolation.tenant: unknown key"),
    ({"isolation": {"salt": "sometimes"}}, "risks.isolation.salt: expected"),
    ({"cost": {"utilization": 1.5}}, "risks.cost.utilization"),
    ({"accuracy": {"reference_args": [], "reference": "variant"}}, "risks.accuracy.reference_args"),
])
def test_bad_risk_settings_name_the_key(table, where):
    with pytest.raises(ProfileError, match=where.replace(".", r"\.")):
        validate({"name": "x", "risks": table}, origin="x.toml")


def test_transformers_reference_settings_are_validated():
    assert AccuracySettings(reference="transformers").reference == "transformers"
    with pytest.raises(ValueError, match="reference_url: only read with reference"):
        AccuracySettings(reference="transformers", reference_url="http://x")
    with pytest.raises(ValueError, match="reference_model: empty"):
        AccuracySettings(reference="transformers", reference_model=" ")
    assert load_profile("cpu-tiny").risks.accuracy.reference == "transformers"


def test_task_accuracy_fails_on_a_drop_beyond_the_limit_and_never_on_a_gain():
    from day0.stages.risks.task_accuracy import judge_tasks

    ok = judge_tasks({"a": 0.50, "b": 0.9}, {"a": 0.52, "b": 0.8}, 0.05, {})
    assert (ok.id, ok.status, ok.value) == ("risks.accuracy.task_delta", "pass", 0.02)
    bad = judge_tasks({"a": 0.40}, {"a": 0.52}, 0.05, {})
    assert bad.status == "fail" and bad.message.startswith("largest accuracy drop +12.0% on a (40.0% deployed")


def test_task_accuracy_without_lm_eval_is_a_skip_naming_the_extra(monkeypatch, tmp_path):
    import day0.stages.risks.task_accuracy as tasks

    monkeypatch.setattr(tasks, "find_spec", lambda name: None)
    profile = load_profile("cpu-tiny", overrides={"risks": {"accuracy": {"tasks": ["day0_tiny_qa"]}}})
    check = tasks.check_tasks(Endpoint("http://127.0.0.1:1", "m"), profile, tmp_path)
    assert check.status == "skip" and "pip install 'day0[eval]'" in check.message


def test_the_shipped_task_files_are_package_data_and_name_their_data(tmp_path):
    import tomllib

    from day0.stages.risks.task_accuracy import TASK_DIR, include_dir

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["day0"]
    assert "stages/risks/task_data/*.yaml" in data and "stages/risks/task_data/*.jsonl" in data
    written = include_dir(AccuracySettings(), tmp_path / "t")
    yaml = (written / "day0_tiny_qa.yaml").read_text()
    assert f"test: {TASK_DIR / 'day0_tiny_qa.jsonl'}" in yaml and "DATA_FILE" not in yaml
    assert len((TASK_DIR / "day0_tiny_qa.jsonl").read_text().splitlines()) >= 30


def test_task_paths_join_the_shipped_tasks_in_the_one_folder_lm_eval_reads(tmp_path):
    """lm-eval's CLI keeps only the last --include_path (a hunt parsed day0's argv with it): the
    shipped task and all but the last task folder vanished. Each folder is now mirrored under one
    include folder, its helpers beside its YAML; a task path that is no folder is named by its key."""
    from day0.stages.risks.task_accuracy import LmEval, TaskError, include_dir

    sites = [tmp_path / "a", tmp_path / "b" / "deep"]
    for i, site in enumerate(sites):
        site.mkdir(parents=True)
        (site / f"task{i}.yaml").write_text(f"task: site_task_{i}\n")
        (site / "utils.py").write_text("def f(x):\n    return x\n")
    settings = AccuracySettings(task_paths=[str(s) for s in sites])
    folder = include_dir(settings, tmp_path / "t")
    assert sorted(str(p.relative_to(folder)) for p in folder.glob("**/*.yaml")) == [
        "day0_tiny_qa.yaml", "site-0/task0.yaml", "site-1/task1.yaml"]
    assert (folder / "site-1" / "utils.py").read_text().startswith("def f")
    cmd = LmEval("hf", "pretrained=m", tmp_path / "o").command(["t"], [folder])
    assert cmd.count("--include_path") == 1
    (tmp_path / "file.yaml").write_text("task: x\n")
    with pytest.raises(TaskError, match=r"^risks.accuracy.task_paths\[1\]: .*file.yaml is not a folder"):
        include_dir(AccuracySettings(task_paths=[str(sites[0]), str(tmp_path / "file.yaml")]), tmp_path / "t2")


def test_a_tasks_score_is_read_under_the_key_its_task_reports():
    """Only exact_match,none was read: gsm8k reports exact_match,strict-match and an acc task acc,none,
    and either was a KeyError traceback instead of a check."""
    from day0.stages.risks.task_accuracy import TaskError, task_score

    doc = {"results": {"day0_tiny_qa": {"exact_match,none": 0.5},
                       "gsm8k": {"exact_match,strict-match": 0.25, "exact_match,flexible-extract": 0.3, "alias": "gsm8k"},
                       "piqa": {"acc,none": 0.7, "acc_stderr,none": 0.01},
                       "odd": {"bleu,none": 3.0}}}
    assert [task_score(doc, t, "vllm") for t in ("day0_tiny_qa", "gsm8k", "piqa")] == [0.5, 0.3, 0.7]
    with pytest.raises(TaskError, match=r"no exact_match or acc for task 'odd' \(it reported bleu,none\)"):
        task_score(doc, "odd", "vllm")
    with pytest.raises(TaskError, match="no results for task 'gone'"):
        task_score(doc, "gone", "vllm")


def test_a_probe_answered_by_a_line_without_end_is_that_probes_error(monkeypatch):
    """The isolation prober parses the stream itself: a line that never ends is refused at the
    parser's cap (here lowered to 64 KiB) as the probe's error, not a ValueError out of the stage."""
    import asyncio
    import socket

    import aiohttp

    from day0.client import sse
    from day0.stages.risks.isolation import Prober
    from tests.support.raw_server import raw_server

    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: ")
        for _ in range(64):
            conn.sendall(b"x" * 4096)

    monkeypatch.setattr(sse, "EVENT_MAX_BYTES", 64 << 10)
    listener, url = raw_server(endless)

    async def probe():
        async with aiohttp.ClientSession() as session:
            return await Prober(session, url, "m", settle_s=0).send("A cold", "A", [1, 2, 3], None)
    try:
        result = asyncio.run(probe())
    finally:
        listener.close()
    assert result.error == f"{url}/v1/completions: SSEError: a line of the event stream goes on past 65,536 bytes " \
                           "without an end", result.error


def _side(script: str, out, **kw):
    """An lm-eval side whose process is ``script`` (a labelled fake: day0's own run of the real lm-eval
    is tests/core/test_secrets.py's keyed run)."""
    from day0.stages.risks.task_accuracy import LmEval

    class Scripted(LmEval):
        def command(self, tasks, include):
            return [sys.executable, "-c", script, str(self.out)]

    return Scripted("fake", "", out, **kw)


SCORES = ("import json, os, sys, pathlib; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True, exist_ok=True); "
          "print('key', os.environ.get('OPENAI_API_KEY'), 'vllm', os.environ.get('VLLM_API_KEY')); "
          "(p / 'results_1.json').write_text(json.dumps({'results': {'t': {'exact_match,none': 0.5}}}))")


def test_both_sides_run_at_once_and_each_log_is_scrubbed(tmp_path, monkeypatch):
    from day0.stages.risks.task_accuracy import run_sides

    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient")  # day0's own environment's: never passed on
    monkeypatch.setenv("VLLM_API_KEY", "sk-server")  # the engine's, which lm-eval never reads
    slow = "import time; time.sleep(1.0); " + SCORES
    scrub = lambda t: t.replace("sk-topsecret", "<redacted>")  # noqa: E731
    deployed = _side(slow, tmp_path / "d", api_key="sk-topsecret", scrub=scrub)
    reference = _side(slow, tmp_path / "r", scrub=scrub)
    t0 = time.monotonic()
    (d, d_s), (r, r_s) = run_sides([deployed, reference], ["t"], [], timeout=60)
    both = time.monotonic() - t0
    assert d == r == {"t": 0.5}
    assert both < d_s + r_s, (both, d_s, r_s)  # at once, not one after the other
    assert "key <redacted> vllm None" in (tmp_path / "d" / "lm-eval-fake.log").read_text()
    assert "key None vllm None" in (tmp_path / "r" / "lm-eval-fake.log").read_text()  # the key goes to the deployed side only


@pytest.mark.parametrize("order", ["endless first", "failing first"])
def test_the_first_side_to_fail_stops_the_other_and_its_log_is_kept(tmp_path, order):
    """A side that fails at once (HTTP 401, a server gone) no longer waits for the other's whole run,
    whichever side it is, and no lm-eval outlives the check; the stopped side's output so far is
    kept, saying so."""
    from day0.stages.risks.task_accuracy import TaskError, run_sides

    ready = tmp_path / "e" / "ready"  # the endless side has written something before the other fails
    failing = _side(f"import sys, time, pathlib\nwhile not pathlib.Path({str(ready)!r}).exists(): time.sleep(0.05)\n"
                    "print('boom: HTTP 401'); sys.exit(3)", tmp_path / "f")
    endless = _side("import time, sys, pathlib; print('loading', flush=True); p = pathlib.Path(sys.argv[1]); "
                    "p.mkdir(parents=True, exist_ok=True); (p / 'ready').touch(); time.sleep(600)", tmp_path / "e")
    sides = [endless, failing] if order == "endless first" else [failing, endless]
    # waited on in turn, the endless side would have been "ran past 60 s" first
    with pytest.raises(TaskError, match=r"lm-eval \(fake\) exited 3: boom: HTTP 401"):
        run_sides(sides, ["t"], [], timeout=60)
    assert endless.proc.returncode is not None and endless.proc.returncode < 0  # killed, not left running
    kept = (tmp_path / "e" / "lm-eval-fake.log").read_text()
    assert "loading" in kept and "[day0: stopped after" in kept


def test_a_side_past_the_timeout_is_named_and_killed_with_its_children(tmp_path):
    """lm-eval runs its work in child processes too: the side's whole group goes, not its leader only
    (a leader killed alone leaves its child holding the endpoint and the cores)."""
    from day0.engine.process import group_alive
    from day0.stages.risks.task_accuracy import TaskError, run_sides

    endless = _side("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
                    "time.sleep(600)']); time.sleep(600)", tmp_path / "r")
    quick = _side(SCORES, tmp_path / "d")
    with pytest.raises(TaskError, match=r"lm-eval \(fake\) ran past 2 s"):
        run_sides([endless, quick], ["t"], [], timeout=2)
    assert endless.proc.returncode is not None and endless.proc.returncode < 0
    assert not group_alive(endless.proc.pid)


def test_a_log_that_cannot_be_kept_never_hides_the_sides_outcome(tmp_path):
    """The run folder's lm-eval folder is a file here: the side's own failure is still the error."""
    from day0.stages.risks.task_accuracy import TaskError, run_sides

    (tmp_path / "f").write_text("not a folder")
    with pytest.raises(TaskError, match=r"exited 3: boom"):
        run_sides([_side("import sys; print('boom'); sys.exit(3)", tmp_path / "f")], ["t"], [], timeout=60)
