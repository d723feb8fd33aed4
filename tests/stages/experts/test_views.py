"""Combining the workers' counts, reading a refused view, and the checks judged from what each
view saw (no engine: the views' answers are written out here as vLLM's workers give them)."""

from __future__ import annotations

import pytest

from day0.client.workload import Request, WorkloadSpec, build_requests
from day0.config.experts import ExpertsSection
from day0.config.profile import load_profile
from day0.stages.experts import (
    LayerLoad,
    Observed,
    Placement,
    Target,
    ViewMissing,
    agreement_check,
    combine,
    judge,
    not_applicable,
    observe,
    placement_of,
    rpc_refusal,
    workload,
)
from day0.stages.experts.views import Answer, HttpDriver, Workers

SECTION = ExpertsSection(min_tokens_per_layer=10)


def worker(tp=0, dp=0, pp=0, counts=None, tokens=None, sp=False):
    counts = counts or {"0": [4, 2, 1, 1]}
    return {"rank": tp, "tp_rank": tp, "dp_rank": dp, "pp_rank": pp, "num_experts": 4, "skipped": [],
            "sequence_parallel": sp, "counts": counts,
            "tokens": tokens or {k: sum(v) // 2 for k, v in counts.items()}}


def test_tp_ranks_route_the_same_tokens_and_count_once():
    w = combine([worker(0), worker(1)])
    assert w.loads == {0: LayerLoad(0, (4, 2, 1, 1), 4)} and w.tp_agree and not w.sharded and w.workers == 2


def test_tp_ranks_that_disagree_are_flagged():
    w = combine([worker(0), worker(1, counts={"0": [3, 3, 1, 1]})])
    assert not w.tp_agree and w.loads[0].experts == (4, 2, 1, 1)  # the lowest TP rank's


def test_sequence_parallel_shards_are_summed_and_data_parallel_groups_too():
    shards = [worker(0, counts={"0": [2, 0, 0, 0]}, tokens={"0": 1}, sp=True),
              worker(1, counts={"0": [1, 1, 0, 0]}, tokens={"0": 1}, sp=True)]
    w = combine([*shards, worker(0, dp=1, sp=True)])
    assert w.sharded and w.loads[0] == LayerLoad(0, (3 + 4, 1 + 2, 1, 1), 2 + 4)


def test_pipeline_stages_hold_different_layers():
    w = combine([worker(0, pp=0, counts={"0": [2, 0, 0, 0]}), worker(0, pp=1, counts={"1": [0, 0, 0, 2]})])
    assert sorted(w.loads) == [0, 1]


def test_a_worker_without_counts_is_named():
    with pytest.raises(ViewMissing, match="not armed"):
        combine([{"error": "not armed: call day0_experts_reset first"}])


def test_a_refused_collective_rpc_says_which_setting_turns_it_on():
    assert "VLLM_SERVER_DEV_MODE=1" in rpc_refusal(404, '{"detail":"Not Found"}')
    body = ('{"error":{"message":"Call to collective_rpc method failed: Worker failed with error '
            "''CPUWorker' object has no attribute 'day0_experts_reset''\"}}")
    assert 'worker_extension_cls = "day0.stages.experts.router_hook.ExpertCounter"' in rpc_refusal(500, body)
    assert rpc_refusal(500, '{"error": {"message": "boom"}}') == "POST /collective_rpc answered HTTP 500: boom"


def _obs(router=None, routed=None, router_missing=None, routed_missing=None, answer=Answer(45, 6, None)):
    """One request of 45 prompt + 6 output tokens: 50 forwarded, as the layers below routed."""
    return Observed([answer], 1.0, router=router, router_missing=router_missing, routed=routed,
                    routed_missing=routed_missing)


BALANCED = {1: LayerLoad.of(1, [25, 25, 25, 25], 50, 4)}
HOT = {1: LayerLoad.of(1, [50, 30, 10, 10], 50, 4)}
TARGET = Target(4, 2, (1,), Placement(4))


def test_neither_view_is_could_not_measure_with_both_reasons():
    checks = judge(_obs(router_missing="404 dev mode", routed_missing="no field"), TARGET, SECTION)
    assert [(c.id, c.status) for c in checks] == [("experts.balance", "error"), ("experts.hot_expert", "error"),
                                                  ("experts.spread", "error")]
    assert checks[0].message == "could not measure: router view: 404 dev mode; vLLM's routed_experts: no field"


def test_a_balanced_router_passes_and_the_missing_view_is_said():
    checks = {c.id: c for c in judge(_obs(Workers(BALANCED, 1, True, False), routed_missing="no field"),
                                     TARGET, SECTION)}
    assert checks["experts.balance"].status == "pass" and checks["experts.balance"].value == 1.0
    assert checks["experts.hot_expert"].status == "pass" and checks["experts.hot_expert"].value == 1.0
    assert checks["experts.views_agree"].status == "skip" and "no field" in checks["experts.views_agree"].message
    assert checks["experts.balance"].source == "http:router"


def test_tp_ranks_that_routed_differently_fail_though_rank_0_is_balanced():
    """A replicated router's ranks must count the same experts; that they did not was evidence only,
    and the balance checks judged rank 0's counts and passed."""
    checks = {c.id: c for c in judge(_obs(Workers(BALANCED, 2, False, False), routed_missing="no field"),
                                     TARGET, SECTION)}
    assert checks["experts.balance"].status == "pass"
    assert checks["experts.tp_ranks_agree"].status == "fail" and "routed the same tokens to different experts" \
        in checks["experts.tp_ranks_agree"].message
    agreeing = judge(_obs(Workers(BALANCED, 2, True, False), routed_missing="no field"), TARGET, SECTION)
    assert "experts.tp_ranks_agree" not in {c.id for c in agreeing}


def test_a_hot_expert_fails_naming_it_when_over_its_limit():
    checks = {c.id: c for c in judge(_obs(Workers(HOT, 1, True, False)), TARGET, SECTION)}
    hot = checks["experts.hot_expert"]
    assert hot.status == "pass" and hot.value == 2.0 and hot.limit == 3.0  # 2x its share: within the default
    strict = ExpertsSection(min_tokens_per_layer=10, max_hot_expert_ratio=1.5, min_balancedness=0.6)
    checks = {c.id: c for c in judge(_obs(Workers(HOT, 1, True, False)), TARGET, strict)}
    assert checks["experts.hot_expert"].status == "fail"
    assert "layer 1 expert 0 takes 50.0%" in checks["experts.hot_expert"].message
    assert checks["experts.balance"].status == "fail" and checks["experts.balance"].value == 0.5
    assert checks["experts.balance"].evidence["charts"][0]["marked"] == [[0, 0]]


def test_under_expert_parallelism_the_ranks_are_judged():
    ep = Target(4, 2, (1,), Placement(4, 2))
    strict = ExpertsSection(min_tokens_per_layer=10, min_balancedness=0.7)
    balance = judge(_obs(Workers(HOT, 1, True, False)), ep, strict)[0]
    assert balance.value == pytest.approx(0.625) and balance.status == "fail"  # ranks carry 80 and 20
    assert "over 2 EP ranks" in balance.message and balance.evidence["ranks"] == [[0, 1], [2, 3]]


def test_both_views_are_compared():
    same = judge(_obs(Workers(HOT, 1, True, False), routed=HOT), TARGET, SECTION)[-1]
    assert (same.id, same.status, same.value) == ("experts.views_agree", "pass", 0.0)
    other = {1: LayerLoad.of(1, [30, 50, 10, 10], 50, 4)}
    off = judge(_obs(Workers(HOT, 1, True, False), routed=other), TARGET, SECTION)[-1]
    assert off.status == "fail" and "layer 1, expert 0" in off.message


def test_the_routed_view_alone_is_judged_when_it_is_the_only_one():
    checks = judge(_obs(router_missing="404", routed=HOT), TARGET, SECTION)
    assert checks[0].source == "http:routed_experts" and checks[0].evidence["view"] == "routed_experts"


def test_too_few_tokens_is_could_not_measure():
    section = ExpertsSection()  # 1000 tokens per layer
    checks = judge(_obs(Workers(HOT, 1, True, False)), TARGET, section)
    assert checks[0].status == "error" and "routed 50 tokens, under experts.min_tokens_per_layer = 1000" in checks[0].message


def test_a_view_asked_for_by_name_is_the_only_one_used():
    section = ExpertsSection(min_tokens_per_layer=10, view="routed")
    checks = judge(_obs(Workers(HOT, 1, True, False), routed_missing="no field"), TARGET, section)
    assert checks[0].status == "error" and checks[0].message == "could not measure: vLLM's routed_experts: no field"


def test_placement_from_the_engine_args():
    assert placement_of({"tensor_parallel_size": 2}, 8) == (Placement(8, 1), False)
    assert placement_of({"tensor_parallel_size": 2, "data_parallel_size": 2, "enable_expert_parallel": True,
                         "expert_placement_strategy": "round_robin", "enable_eplb": True}, 8) == (
        Placement(8, 4, "round_robin"), True)


def test_a_dense_model_does_not_apply_and_an_moe_does():
    why = not_applicable(load_profile("cpu-tiny"))
    assert why and why.startswith("not applicable: LlamaForCausalLM") and "dense" in why
    assert not_applicable(load_profile("cpu-deepseek-v3")) is None


def test_the_workload_is_the_latency_shape_without_the_nonce():
    profile = load_profile("cpu-deepseek-v3")
    reqs, extra, concurrency = workload(profile, profile.experts)
    again, extra2, _ = workload(profile, profile.experts)
    assert len(reqs) == profile.experts.num_requests and concurrency == profile.latency.concurrency
    assert [r.prompt for r in reqs] == [r.prompt for r in again]  # the seed's prompts, run after run
    lo, hi = profile.latency.input_len
    assert all(lo <= r.input_len <= hi and r.output_len == profile.latency.output_len for r in reqs)
    assert extra["temperature"] == 0.0 and extra["cache_salt"] != extra2["cache_salt"]


def test_a_router_hook_that_counted_nothing_says_what_can_bypass_it():
    silent = Workers({1: LayerLoad.of(1, [0, 0, 0, 0], 0, 4)}, 1, True, False)
    checks = judge(_obs(silent, routed_missing="no field"), TARGET, SECTION)
    assert checks[0].status == "error" and "saw 0 of the 50 tokens" in checks[0].message
    assert "without the router's capture callback" in checks[0].message


def test_a_router_hook_that_missed_decode_steps_is_not_trusted():
    # 100 prompt + 10 output tokens: 109 forwarded; a hook that saw the prefill only (100) was bypassed
    partial = Workers({1: LayerLoad.of(1, [50, 50, 50, 50], 100, 4)}, 1, True, False)
    checks = judge(_obs(partial, routed_missing="no field", answer=Answer(100, 10, None)), TARGET, SECTION)
    assert checks[0].status == "error" and "saw 100 of the 109 tokens" in checks[0].message
    # up to the prompt tokens the requests share may come from the prefix cache instead
    shared = _obs(partial, routed_missing="no field", answer=Answer(100, 10, None))
    shared.cacheable_tokens = 9
    assert judge(shared, TARGET, SECTION)[0].status == "pass"


def test_a_router_hook_that_dropped_or_duplicated_top_k_ids_is_not_trusted():
    """50 tokens at top-2 are 100 expert ids; a view whose shares look even but hold 60 (ids lost) or
    150 (a step's ids counted twice) is not the router's routing. Before: both passed, balance 1.0."""
    for ids, counts in ((60, [15, 15, 15, 15]), (150, [40, 40, 35, 35])):
        hook = Workers({1: LayerLoad.of(1, counts, 50, 4)}, 1, True, False)
        checks = judge(_obs(hook, routed_missing="no field"), TARGET, SECTION)
        assert {c.status for c in checks} == {"error"}, checks
        assert f"layer 1 counted {ids} expert ids for 50 tokens, not top-2 x 50 = 100" in checks[0].message
        assert "dropped or duplicated" in checks[0].message


def test_a_router_hook_that_counted_more_tokens_than_were_forwarded_is_not_trusted():
    """Every token counted twice (tokens and ids alike): the ids-per-token test holds, the upper bound
    does not. Before: a count above the forwarded tokens passed."""
    twice = Workers({1: LayerLoad.of(1, [50, 50, 50, 50], 100, 4)}, 1, True, False)
    checks = judge(_obs(twice, routed_missing="no field"), TARGET, SECTION)
    assert checks[0].status == "error" and "saw 100 tokens in layer 1, more than the 50 the workload forwarded" \
        in checks[0].message
    # with vLLM's routed_experts there, that view is judged instead and the comparison says why not both
    checks = {c.id: c for c in judge(_obs(twice, routed=BALANCED), TARGET, SECTION)}
    assert checks["experts.balance"].status == "pass" and checks["experts.balance"].source == "http:routed_experts"
    assert checks["experts.views_agree"].status == "skip" and "more than the 50" in checks["experts.views_agree"].message


def test_with_top_k_unknown_every_layer_must_count_one_whole_number_of_ids_a_token():
    ok = Workers({1: LayerLoad.of(1, [25] * 4, 50, 4), 2: LayerLoad.of(2, [25] * 4, 50, 4)}, 1, True, False)
    assert judge(_obs(ok, routed_missing="no field"), None, SECTION)[0].status == "pass"
    ragged = Workers({1: LayerLoad.of(1, [20] * 4, 50, 4)}, 1, True, False)
    msg = judge(_obs(ragged, routed_missing="no field"), None, SECTION)[0].message
    assert "layer 1 counted 80 expert ids for 50 tokens, not a whole number per token" in msg
    mixed = Workers({1: LayerLoad.of(1, [25] * 4, 50, 4), 2: LayerLoad.of(2, [50] * 4, 50, 4)}, 1, True, False)
    msg = judge(_obs(mixed, routed_missing="no field"), None, SECTION)[0].message
    assert "layer 1 counted 2 expert ids a token and layer 2 4" in msg


class _Endpoint:
    """A server's /v1/completions answer with what ``usage`` it is given (None: no usage at all)."""

    model = "m"

    def __init__(self, usage):
        self.usage = usage

    def json(self, path, body):
        return {"choices": [{"text": "x"}], **({} if self.usage is None else {"usage": self.usage})}


def test_a_response_without_usage_leaves_the_router_view_unverified():
    """Before: a response without usage read as 0 prompt and 0 output tokens, so nothing was
    forwarded and a hook that saw 10 of the 50 tokens passed."""
    req = Request(index=0, prompt=[1] * 45, input_len=45, output_len=6)
    for usage in (None, {}, {"prompt_tokens": 45}, {"prompt_tokens": "45", "completion_tokens": 6},
                  {"prompt_tokens": -1, "completion_tokens": 6}, {"prompt_tokens": True, "completion_tokens": 6},
                  {"prompt_tokens": 10**400, "completion_tokens": 6}, {"prompt_tokens": 45, "completion_tokens": 1e300}):
        answer = HttpDriver(_Endpoint(usage)).complete(req, {})
        partial = Workers({1: LayerLoad.of(1, [5, 5, 5, 5], 10, 4)}, 1, True, False)
        checks = judge(_obs(partial, routed_missing="no field", answer=answer), TARGET, SECTION)
        assert {c.status for c in checks} == {"error"}, (usage, checks)
        assert checks[0].message.startswith("could not measure: router view: not verified: 1 of 1 responses gave "
                                            "no usage.prompt_tokens and usage.completion_tokens"), checks[0].message
        assert answer.forwarded is None, usage
    counted = HttpDriver(_Endpoint({"prompt_tokens": 45, "completion_tokens": 6.0})).complete(req, {})
    assert (counted.prompt_tokens, counted.completion_tokens, counted.forwarded) == (45, 6, 50)



class _Routing(_Endpoint):
    """An answer whose ``routed_experts`` is what it is given."""

    def __init__(self, routed):
        super().__init__({"prompt_tokens": 45, "completion_tokens": 6})
        self.routed = routed

    def json(self, path, body):
        out = super().json(path, body)
        out["choices"][0]["routed_experts"] = self.routed
        return out


def test_one_unreadable_routed_experts_answer_is_that_views_could_not_measure_not_a_traceback():
    """Before: HttpDriver decoded each answer where it came, so one bad array ended the stage."""
    from day0.stages.experts.views import _routed

    req = Request(index=0, prompt=[1] * 45, input_len=45, output_len=6)
    bad = HttpDriver(_Routing("not base64!")).complete(req, {})
    assert bad.routed is None and bad.prompt_tokens == 45 and "not base64" in bad.routed_error
    assert _routed([bad], 4, None) == (None, bad.routed_error)


def test_a_router_view_without_every_moe_layer_is_not_trusted():
    """config.json's MoE layers are 1 and 2; the hook counted layer 1 only (layer 2 ran a monolithic
    kernel, or was never hooked). Before: the view was trusted and balance, hot expert and spread
    passed on layer 1 alone, though layer 2 could have collapsed."""
    two = Target(4, 2, (1, 2), Placement(4))
    monolithic = ["layer 2: FusedMoE (monolithic kernel: no router callback)"]
    for skipped in (monolithic, []):
        hook = Workers(BALANCED, 1, True, False, skipped=skipped)
        checks = judge(_obs(hook, routed_missing="no field"), two, SECTION)
        assert {c.status for c in checks} == {"error"}, (skipped, checks)
        assert checks[0].message.startswith("could not measure: router view: the router hook did not count MoE "
                                            "layer(s) 2 (config.json's MoE layers: 1, 2"), checks[0].message
        assert ("monolithic kernel" in checks[0].message) == bool(skipped)
    # a layer config.json holds no experts in is no MoE layer of this model either
    extra = Workers({**BALANCED, 3: LayerLoad.of(3, [25] * 4, 50, 4)}, 1, True, False)
    msg = judge(_obs(extra, routed_missing="no field"), TARGET, SECTION)[0].message
    assert "counted layer(s) 3, which hold no routed experts" in msg
    # without a config.json the layers are unknown, but a layer the hook reports skipping still is one
    hook = Workers(BALANCED, 1, True, False, skipped=monolithic)
    checks = judge(_obs(hook, routed_missing="no field"), None, SECTION)
    assert checks[0].status == "error" and "the router hook skipped layer 2: FusedMoE" in checks[0].message
    # with vLLM's routed_experts there, that view is judged instead
    routed = {1: LayerLoad.of(1, [25] * 4, 50, 4), 2: LayerLoad.of(2, [25] * 4, 50, 4)}
    checks = {c.id: c for c in judge(_obs(hook, routed=routed), two, SECTION)}
    assert checks["experts.balance"].status == "pass" and checks["experts.balance"].source == "http:routed_experts"
    assert "did not count MoE layer(s) 2" in checks["experts.views_agree"].message


class _Driver:
    """Answers each request in full and reads back a hook that saw ``seen`` tokens in layer 1."""

    source = "http"

    def __init__(self, seen):
        self.seen = seen

    def rpc(self, method):
        if method.endswith("reset"):
            return [{}]
        return [worker(counts={"1": [self.seen // 2] * 4}, tokens={"1": self.seen})]

    def run(self, reqs, extra, concurrency):
        return [Answer(r.input_len, r.output_len, None) for r in reqs]


def test_only_requests_after_the_first_of_their_prefix_group_can_hit_the_prefix_cache():
    """16 requests of 1200 prompt tokens, each its own 1000-token prefix: no request can be served
    from the cache (a fresh cache_salt per run), so a hook that missed every prefix token (16,000
    of 20,208 forwarded) was bypassed. Before: C was every request's shared prefix, 16,000, and the
    hook's 4,208 tokens were trusted and judged."""
    spec = WorkloadSpec(input_len=1200, output_len=64, prefix_len=1000, num_prefixes=16, seed=0)
    alone = build_requests(spec, 32000, 16)
    forwarded = sum(r.input_len + r.output_len - 1 for r in alone)
    obs = observe(_Driver(forwarded - 16_000), alone, {}, 4, 4, (1,))
    assert obs.cacheable_tokens == 0 and forwarded == 20_208
    checks = judge(obs, TARGET, SECTION)
    assert checks[0].status == "error" and "saw 4208 of the 20208 tokens" in checks[0].message
    # 4 prefixes over 16 requests: the 12 after the first of each group may hit, 12 x 1000 tokens
    shared = build_requests(WorkloadSpec(1200, 64, 1000, 4, 0), 32000, 16)
    assert observe(_Driver(0), shared, {}, 4, 4, (1,)).cacheable_tokens == 12_000
    assert judge(observe(_Driver(forwarded - 12_000), shared, {}, 4, 4, (1,)), TARGET, SECTION)[0].status == "pass"
    missed = judge(observe(_Driver(forwarded - 12_002), shared, {}, 4, 4, (1,)), TARGET, SECTION)[0]
    assert missed.status == "error" and "at least 8208 must pass it" in missed.message


def test_each_figure_is_judged_before_it_is_rounded():
    """Each figure a hair on the wrong side of its limit, within the rounding the record used (4 places
    for balance and spread, 3 for the hot expert, 5 for agreement). Before: each was judged on its
    rounded figure, so a spread of 0.49999727 was a pass of 0.5 whose message said "below the limit"."""
    section = ExpertsSection(min_tokens_per_layer=10, min_balancedness=0.5, max_hot_expert_ratio=2.0)
    skewed = {1: LayerLoad.of(1, [20001, 5000, 5000, 9999], 20000, 4)}  # mean/max 0.499975, hot 2.0001x
    checks = {c.id: c for c in judge(_obs(router_missing="off", routed=skewed, answer=Answer(20000, 1, None)),
                                     TARGET, section)}
    balance, hot = checks["experts.balance"], checks["experts.hot_expert"]
    assert (balance.status, balance.value) == ("fail", 0.49998) and "is 0.49998 (below the limit 0.5)" in balance.message
    assert (hot.status, hot.value) == ("fail", 2.0001) and "2.0001x its share (over the limit 2x)" in hot.message
    spread_counts = [2562, 2438, 2500, 2500, 0, 0, 0, 0]  # the reviewer's: spread 0.4999972757715258
    eight = {1: LayerLoad.of(1, spread_counts, 5000, 8)}
    spread = {c.id: c for c in judge(_obs(router_missing="off", routed=eight, answer=Answer(5000, 1, None)),
                                     Target(8, 2, (1,), Placement(8)), SECTION)}["experts.spread"]
    assert spread.status == "fail" and spread.value == 0.499997 and "0.499997 of the way" in spread.message
    routed = {1: LayerLoad.of(1, [384017, 100000, 100000, 215983], 400000, 4)}  # share 0.48002125 vs 0.500025
    agree = agreement_check(list(skewed.values()), list(routed.values()), SECTION)
    assert agree.status == "fail" and agree.value == 0.020004 and "2.0004 pp" in agree.message
    # a figure rounded within its limit keeps the usual places
    assert judge(_obs(Workers(HOT, 1, True, False)), TARGET, SECTION)[0].value == 0.5


@pytest.mark.parametrize("answer, why", [
    ({"counts": {"1": [float("nan"), 4]}, "tokens": {"1": 2}}, "worker 1: counts[1][0] is nan, not a count"),
    ({"counts": {"1": [float("inf"), 4]}, "tokens": {"1": 2}}, "worker 1: counts[1][0] is inf, not a count"),
    ({"counts": {"1": [3, "3"]}, "tokens": {"1": 2}}, "worker 1: counts[1][1] is '3', not a count"),
    ({"counts": {"1": [3.7, 0.3]}, "tokens": {"1": 2}}, "worker 1: counts[1][0] is 3.7, not a count"),
    ({"counts": {"1": [3, -1]}, "tokens": {"1": 2}}, "worker 1: counts[1][1] is -1, not a count"),
    ({"counts": {"1": [3, 1]}, "tokens": {}}, "worker 1: tokens[1] is missing, not a count"),
    ({"counts": {"1": [3, 1]}, "tokens": {"1": True}}, "worker 1: tokens[1] is True, not a count"),
    ({"counts": {"1": 4}, "tokens": {"1": 2}}, "worker 1: counts[1] is 4, not a list of counts"),
    ({"counts": {"x": [3, 1]}, "tokens": {"x": 2}}, "worker 1: counts key 'x' is not a layer number"),
    ({"counts": [3, 1], "tokens": {"1": 2}}, "worker 1: counts is [3, 1], not an object of layers"),
    ({"counts": {"1": [3, 1]}, "tokens": {"1": 2}, "dp_rank": 0.5}, "worker 1: dp_rank is 0.5, not a count"),
])
def test_a_worker_answer_that_is_no_count_is_one_line_naming_the_worker_and_field(answer, why):
    """Before: int() of each number let NaN (ValueError), Infinity (OverflowError), "3" (TypeError) and a
    missing token count (KeyError) escape observe(), which catches ViewMissing, and cut 3.7 to 3."""
    with pytest.raises(ViewMissing) as exc:
        combine([{"counts": {"1": [3, 1]}, "tokens": {"1": 2}}, answer])
    assert str(exc.value) == why

    class Driver(_Driver):
        def rpc(self, method):
            return [{}] if method.endswith("reset") else [worker(), answer]

    obs = observe(Driver(0), [Request(0, [1] * 45, 45, 6)], {}, 1, 4, (1,))
    assert obs.router is None and obs.router_missing == why


def test_sequence_parallel_shards_of_different_lengths_are_named():
    """Before: summing the shards indexed the shorter one past its end (IndexError out of observe)."""
    shards = [worker(0, counts={"0": [2, 0, 0, 0]}, tokens={"0": 1}, sp=True),
              worker(1, counts={"0": [1, 1, 0]}, tokens={"0": 1}, sp=True)]
    with pytest.raises(ViewMissing, match=r"layer 0: the TP ranks' shards hold \[3, 4\] expert counts"):
        combine(shards)
