"""weights.rank_memory and weights.rank_balance: the ranks' memory read beside the engine, held to
the plan's weights plus the runtime allowance (day0/stages/weights/beside.py)."""

from __future__ import annotations

import pytest

from day0.config.profile import deep_merge, load_profile, parse_override
from day0.engine.ranks import RankProcess, RanksUnavailable
from day0.model.config import model_config
from day0.model.sizing import config_kv_bytes_per_token
from day0.stages.weights.beside import Beside, allowance_gib, pool_bytes_per_rank, rank_memory_checks
from day0.stages.weights.memory import planned

GIB = 2**30
INFO = ('# TYPE vllm:cache_config_info gauge\n'
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="8192"%s} 1.0\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.0\n')


def profile(*overrides: str):
    merged: dict = {}
    for o in overrides:
        merged = deep_merge(merged, parse_override(o))
    return load_profile("cpu-tiny", overrides=merged or None)


def seen(*beyond_gib: float, pool: int = GIB) -> Beside:
    return Beside([RankProcess(100 + i, f"VLLM::Worker_TP{i}", pool + int(b * GIB), "USS")
                   for i, b in enumerate(beyond_gib)], pool, "test")


def test_the_pool_is_the_engines_own_figure_when_it_reports_one() -> None:
    p = profile()
    assert pool_bytes_per_rank(INFO % ',kv_cache_memory_bytes="1073741824"', p)[0] == GIB


def test_else_the_pool_is_its_blocks_priced_from_config_json() -> None:
    p = profile()
    per_token = config_kv_bytes_per_token(model_config(p)[0], p.engine.args)
    pool, basis = pool_bytes_per_rank(INFO % ',kv_cache_memory_bytes="None"', p)
    assert pool == 8192 * 32 * per_token and "config.json" in basis


def test_no_cache_config_on_metrics_is_said_in_one_line() -> None:
    with pytest.raises(RanksUnavailable, match="no vllm:kv_cache_usage_perc"):
        pool_bytes_per_rank("# TYPE up gauge\nup 1\n", profile())


def test_a_rank_within_weights_plus_allowance_passes_and_one_past_it_fails() -> None:
    p = profile()
    plan_gib = planned(p)[0].weight_bytes_per_rank / GIB
    limit = plan_gib * 1.1 + allowance_gib(p)
    ok = rank_memory_checks(seen(limit - 0.05), p)
    assert [c.id for c in ok] == ["weights.rank_memory"] and ok[0].status == "pass"
    assert ok[0].limit == pytest.approx(limit, abs=1e-3) and "not their exact bytes" in ok[0].message
    bad = rank_memory_checks(seen(limit + 0.05), p)
    assert bad[0].status == "fail"


def test_the_allowance_is_the_profiles_when_set() -> None:
    assert allowance_gib(profile()) == 2.0
    assert allowance_gib(profile("weights.runtime_allowance_gib=0.25")) == 0.25
    assert allowance_gib(profile('topology.device="cuda"')) == 4.0


def test_tp_ranks_are_held_to_one_another() -> None:
    p = profile()
    even = {c.id: c for c in rank_memory_checks(seen(0.50, 0.52), p)}
    assert even["weights.rank_balance"].status == "pass"
    lopsided = {c.id: c for c in rank_memory_checks(seen(0.50, 0.80), p)}
    assert lopsided["weights.rank_balance"].status == "fail"
    assert lopsided["weights.rank_balance"].value == pytest.approx(0.375)


def test_no_plan_is_a_skip_that_keeps_the_figure() -> None:
    p = profile('model.source="path"', 'model.path="/nonexistent/model"')
    [c] = rank_memory_checks(seen(0.5), p)
    assert c.status == "skip" and c.value == pytest.approx(0.5) and "no plan" in c.message


class DeadEngines:
    """Engines whose HTTP engine's process is gone: its ranks cannot be read."""

    def http(self):
        from types import SimpleNamespace

        return SimpleNamespace(info=SimpleNamespace(pid=2**22 + 7, base_url="http://127.0.0.1:9"))


@pytest.mark.parametrize("overrides, status", [
    ((), "skip"),  # cpu-tiny's server: the exact figure came through the scheduler view; this is extra
    (('engine.mode="external"', 'engine.url="http://127.0.0.1:9"'), "error"),  # the stand-in: unreadable
    (('engine.mode="external"', 'engine.url="http://192.0.2.5:9"'), "skip"),  # not this host: said at stage 0
])
def test_unreadable_ranks_cost_the_run_only_where_they_stand_in(overrides, status) -> None:
    from day0.stages.weights.beside import beside_checks

    [c] = beside_checks(DeadEngines(), profile(*overrides))
    assert c.id == "weights.rank_memory" and c.status == status, c.message
