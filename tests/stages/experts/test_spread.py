"""The router's spread (``experts.spread``): by hand, and on synthetic routings of the MoE presets'
own workload (its 16 requests, 5,837 forwarded tokens) at E/k = 2, 3, 4, 8 and 64: a collapsed
router fails at every E/k, where mean/max and the hot expert cannot see it when E/k <= 3, and a
random router passes every check, through both views, its counts trusted."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from day0.config.experts import ExpertsSection
from day0.config.profile import load_profile
from day0.core.verdict import run_verdict, stage_verdict
from day0.stages.experts import STAGE, LayerLoad, Observed, Placement, Target, count, judge, merge, workload
from day0.stages.experts.routed import Routed
from day0.stages.experts.views import Answer, Workers

SECTION = ExpertsSection(min_tokens_per_layer=10)
LAYERS = 2


def test_spread_by_hand():
    # every token to the same 2 of 4 experts: entropy ln 2, the least a top-2 router can have
    assert LayerLoad.of(0, [50, 50, 0, 0], 50, 4).spread() == 0.0
    # uniform: entropy ln 4, a shade over a uniform router's expected ln 4 - (4 - 2) / (2 x 100)
    assert LayerLoad.of(0, [25] * 4, 50, 4).spread() == pytest.approx(math.log(2) / (math.log(2) - 0.01))
    hot = LayerLoad.of(0, [50, 30, 10, 10], 50, 4)
    h = -sum(p * math.log(p) for p in (0.5, 0.3, 0.1, 0.1))
    assert hot.spread() == pytest.approx((h - math.log(2)) / (math.log(4) - 0.01 - math.log(2)))
    collapsed, observed, uniform = hot.entropies()
    assert (collapsed, observed, uniform) == pytest.approx((math.log(2), h, math.log(4) - 0.01))
    # the limit 0.5 is exp(H) >= sqrt(k x exp(H_uniform)): the geometric mean of the two
    assert (hot.spread() >= 0.5) == (math.exp(observed) >= math.sqrt(2 * math.exp(uniform)))


def test_where_the_spread_cannot_tell():
    assert "no choice to collapse" in LayerLoad.of(0, [10, 10], 10, 2).spread_gap()  # top-2 of 2
    few = LayerLoad.of(0, [1] * 20 + [0] * 44, 20, 64)  # 20 assignments over 64 experts
    assert few.spread() is None and "a uniform router would give each fewer than 5" in few.spread_gap()
    assert LayerLoad.of(0, [0] * 4, 0, 4).spread() is None


def test_the_spread_check_skips_without_a_choice_and_refuses_too_few_tokens():
    both = {1: LayerLoad.of(1, [20, 20], 20, 2)}
    checks = {c.id: c for c in judge(Observed([Answer(15, 6, None)], 1.0, router_missing="off", routed=both),
                                     Target(2, 2, (1,), Placement(2)), SECTION)}
    assert checks["experts.spread"].status == "skip" and "no choice to collapse" in checks["experts.spread"].message
    sparse = {1: LayerLoad.of(1, [1] * 20 + [0] * 44, 20, 64)}
    checks = {c.id: c for c in judge(Observed([Answer(15, 6, None)], 1.0, router_missing="off", routed=sparse),
                                     Target(64, 1, (1,), Placement(64)), SECTION)}
    assert checks["experts.spread"].status == "error" and "too few to tell" in checks["experts.spread"].message


@dataclass
class _Stage:
    """What run_verdict reads of a stage."""

    name: str
    checks: list
    verdict: str = ""


def test_a_top_k_of_every_expert_can_be_accepted_though_the_spread_is_required():
    """Before: the spread's skip carried no not-applicable mark, and the stage requires the spread,
    so 2 experts top-2 left every run INCOMPLETE ("required check not verified: experts.spread")."""
    both = {1: LayerLoad.of(1, [2000, 2000], 2000, 2), 3: LayerLoad.of(3, [2000, 2000], 2000, 2)}
    router = Workers(both, 1, True, False)
    checks = judge(Observed([Answer(2000, 1, None)], 1.0, router=router), Target(2, 2, (1, 3), Placement(2)),
                   ExpertsSection())
    spread = next(c for c in checks if c.id == "experts.spread")
    assert spread.status == "skip" and spread.evidence == {"not_applicable": True}
    stage = _Stage("experts", checks, stage_verdict(checks))
    assert "experts.spread" in STAGE.required
    assert run_verdict([stage], True, list(STAGE.required))[0] == "accepted"


@pytest.fixture(scope="module")
def demo():
    """The MoE presets' experts workload: (prompt, output) lengths of its 16 requests."""
    profile = load_profile("cpu-moe-2node")
    reqs, _, _ = workload(profile, profile.experts)
    return [(r.input_len, r.output_len) for r in reqs]


def _arrays(lengths, experts, top_k, pick):
    """vLLM's routed_experts of each request: ``prompt + output - 1`` rows, ``LAYERS`` layers, top-k."""
    out = []
    for prompt, output in lengths:
        rows = prompt + output - 1
        out.append(Routed([e for _ in range(rows * LAYERS) for e in pick(experts, top_k)], rows, LAYERS, top_k))
    return out


def _judge(lengths, arrays, experts, top_k):
    """Both views of one routing: the router hook's counts (as its workers report them) and vLLM's arrays."""
    loads = merge([count(a, experts, list(range(LAYERS))) for a in arrays])
    obs = Observed([Answer(p, o, a) for (p, o), a in zip(lengths, arrays)], 1.0,
                   router=Workers(loads, 1, True, False), routed=loads)
    return {c.id: c for c in judge(obs, Target(experts, top_k, tuple(range(LAYERS)), Placement(experts)), SECTION)}


SHAPES = [(4, 2), (8, 4), (6, 2), (8, 2), (16, 2), (64, 8), (64, 1), (128, 2)]  # E/k = 2, 2, 3, 4, 8, 8, 64, 64


@pytest.mark.parametrize("experts, top_k", SHAPES)
def test_a_collapsed_router_fails_at_any_ratio_of_experts_to_top_k(demo, experts, top_k):
    """Every token to the same k experts: spread 0. Before, at E/k <= 3 nothing failed (6 experts
    top-2: balance 0.333 against 0.3, hot expert 3.0x against 3.0x)."""
    chosen = random.Random(experts).sample(range(experts), top_k)
    checks = _judge(demo, _arrays(demo, experts, top_k, lambda e, k: chosen), experts, top_k)
    spread = checks["experts.spread"]
    assert spread.status == "fail" and spread.value == 0.0, spread
    assert f"a collapse onto its top-{top_k} gives {top_k}" in spread.message
    blind = experts / top_k <= 3
    assert (checks["experts.balance"].status == "pass") == blind  # k/E against 0.3
    assert (checks["experts.hot_expert"].status == "pass") == blind  # E/k against 3.0
    assert checks["experts.views_agree"].status == "pass"  # the hook's ids are trusted: they are that routing


@pytest.mark.parametrize("experts, top_k", [(4, 2), (8, 4), (6, 2)])
def test_a_router_collapsed_but_for_a_few_stray_tokens_fails_too(demo, experts, top_k):
    """One token in a hundred routed at random: every expert is chosen some time (a count of the
    experts never chosen would pass it), and the spread is still near 0."""
    rng = random.Random(experts)
    chosen = rng.sample(range(experts), top_k)
    arrays = _arrays(demo, experts, top_k, lambda e, k: rng.sample(range(e), k) if rng.random() < 0.01 else chosen)
    checks = _judge(demo, arrays, experts, top_k)
    loads = checks["experts.spread"].evidence["loads"]
    assert all(min(counts) > 0 for counts in loads.values())
    assert checks["experts.spread"].status == "fail" and checks["experts.spread"].value < 0.1


@pytest.mark.parametrize("experts, top_k", SHAPES)
def test_a_random_router_passes_every_check(demo, experts, top_k):
    rng = random.Random(experts * 100 + top_k)
    checks = _judge(demo, _arrays(demo, experts, top_k, lambda e, k: rng.sample(range(e), k)), experts, top_k)
    assert checks["experts.balance"].evidence["forwarded_tokens"] == 5837  # the demo's token count
    assert checks["experts.balance"].source == "http:router"  # the hook's counts matched the forwarded tokens
    assert {k: c.status for k, c in checks.items()} == dict.fromkeys(
        ("experts.balance", "experts.hot_expert", "experts.spread", "experts.views_agree"), "pass")
    assert checks["experts.spread"].value > 0.99
