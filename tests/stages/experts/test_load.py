"""Tokens per expert and per EP rank, and balancedness, against hand-computed numbers; the
placement of experts on ranks against vLLM's own ``determine_expert_map``."""

from __future__ import annotations

import pytest

from day0.stages.experts import LayerLoad, LoadError, LoadSummary, Placement, balancedness, merge


def test_balancedness_is_mean_over_max():
    assert balancedness([10, 10, 10, 10]) == 1.0
    assert balancedness([40, 0, 0, 0]) == 0.25  # one of four takes everything: 1/n
    assert balancedness([1, 2, 3, 6]) == pytest.approx(3 / 6)
    assert balancedness([0, 0]) is None and balancedness([]) is None  # nothing routed: no verdict


@pytest.mark.parametrize("e, ep, strategy, ranks", [
    (8, 2, "linear", ((0, 1, 2, 3), (4, 5, 6, 7))),
    (10, 4, "linear", ((0, 1, 2), (3, 4, 5), (6, 7), (8, 9))),  # the first E % ep ranks hold one more
    (8, 2, "round_robin", ((0, 2, 4, 6), (1, 3, 5, 7))),
    (8, 1, "linear", ((0, 1, 2, 3, 4, 5, 6, 7),)),
])
def test_placement_by_hand(e, ep, strategy, ranks):
    p = Placement(e, ep, strategy)
    assert p.ranks() == ranks
    assert sorted(x for r in ranks for x in r) == list(range(e))
    assert p.rank_of(ranks[-1][-1]) == ep - 1


@pytest.mark.parametrize("e, ep", [(8, 2), (10, 4), (256, 32), (7, 3), (64, 6)])
@pytest.mark.parametrize("strategy", ["linear", "round_robin"])
def test_placement_is_vllms(e, ep, strategy):
    """The same experts on each rank as vLLM 0.32 computes its expert map."""
    expert_map_manager = pytest.importorskip("vllm.model_executor.layers.fused_moe.expert_map_manager")
    for rank, held in enumerate(Placement(e, ep, strategy).ranks()):
        _, emap, _ = expert_map_manager.determine_expert_map(ep, rank, e, strategy)
        assert tuple(i for i in range(e) if int(emap[i]) >= 0) == tuple(sorted(held)), (rank, strategy)


def test_a_bad_placement_is_refused():
    with pytest.raises(LoadError, match="strategy 'striped'"):
        Placement(8, 2, "striped")
    with pytest.raises(LoadError, match="ep_size >= 1"):
        Placement(8, 0)


def test_one_layer_by_hand():
    # 6 tokens, top-2: 12 assignments over 4 experts
    load = LayerLoad.of(3, [6, 3, 2, 1], tokens=6, num_experts=4)
    assert load.assignments == 12
    assert load.expert_balance() == pytest.approx(3 / 6)
    assert load.hottest() == (0, pytest.approx(2.0))  # 6 of 12 where 3 is fair
    two = Placement(4, 2)
    assert load.rank_loads(two) == (9, 3)
    assert load.rank_balance(two) == pytest.approx(6 / 9)
    assert load.rank_balance(Placement(4)) is None  # no expert parallelism: no ranks to compare
    assert load.rank_loads(Placement(4, 2, "round_robin")) == (8, 4)


def test_a_tie_names_the_lowest_expert():
    assert LayerLoad.of(0, [2, 5, 5, 0], 6, 4).hottest()[0] == 1


def test_counts_that_cannot_be_a_layer_are_refused():
    with pytest.raises(LoadError, match="layer 2: 3 expert counts for 4 experts"):
        LayerLoad.of(2, [1, 2, 3], 3, 4)
    with pytest.raises(LoadError, match="layer 2: negative"):
        LayerLoad.of(2, [1, -2, 3, 0], 3, 4)


def test_summary_worst_layer_hot_expert_and_vllms_aggregate():
    layers = (LayerLoad.of(0, [3, 3, 3, 3], 6, 4), LayerLoad.of(1, [9, 1, 1, 1], 6, 4))
    s = LoadSummary(layers, Placement(4))
    assert s.worst() == (1, pytest.approx(3 / 9))
    hot = s.hottest()
    assert (hot.layer, hot.expert, hot.ratio, hot.share, hot.uniform, hot.token_share) == (
        1, 0, pytest.approx(3.0), pytest.approx(0.75), 0.25, pytest.approx(1.5))
    assert "layer 1 expert 0 takes 75.0%" in hot.sentence() and "3.00x its share" in hot.sentence()
    # vLLM's logged figure: sum of per-layer means over sum of per-layer maxima
    assert s.aggregate() == pytest.approx((3 + 3) / (3 + 9))
    # under EP 2 the ranks are what is judged: layer 1's ranks carry 10 and 2
    ep = LoadSummary(layers, Placement(4, 2))
    assert ep.worst() == (1, pytest.approx(6 / 10))
    assert ep.aggregate() == pytest.approx((6 + 6) / (6 + 10))


def test_nothing_routed_measures_nothing():
    s = LoadSummary((LayerLoad.of(0, [0, 0], 0, 2),), Placement(2))
    assert not s.measured and s.worst() is None and s.hottest() is None and s.aggregate() is None


def test_merge_sums_layers_over_parts():
    a = {0: LayerLoad.of(0, [1, 2], 1, 2)}
    b = {0: LayerLoad.of(0, [3, 4], 2, 2), 5: LayerLoad.of(5, [1, 1], 1, 2)}
    out = merge([a, b])
    assert list(out) == [0, 5] and out[0] == LayerLoad(0, (4, 6), 3)
    with pytest.raises(LoadError, match="layer 0: parts disagree"):
        merge([a, {0: LayerLoad.of(0, [1, 1, 1], 1, 3)}])
