"""Expert-parallel traffic: the routing model (day0/stages/collectives/routing.py), the uneven
all-to-all ops built on it (expert_dispatch, expert_combine), their busbw, and their exact check on
real gloo ranks, including planted faults the check must catch."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

from day0.config.collectives import CollectivesSection
from day0.config.errors import SettingsError
from day0.core.collective_ops import OPS, OpCall, OpContext, transpose
from day0.core.sockets import free_port
from day0.stages.collectives import load_result, result_checks
from day0.stages.collectives.busbw import bus_factor, peak_offrank, plan, size_from_count
from day0.stages.collectives.rank import run_rank
from day0.stages.collectives.rank_env import RankEnv
from day0.stages.collectives.routing import draw_experts, expert_owners, route
from day0.stages.collectives.sweep import Sweeper

ROOT = Path(__file__).resolve().parents[3]

# --------------------------------------------------------------------------- the routing


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("skew", [0.0, 1.0, 3.0])
def test_every_rank_sends_tokens_x_top_k_rows_and_the_matrix_adds_up(n, skew):
    r = route(n, tokens=50, top_k=3, experts=12, skew=skew, seed=7)
    assert r.n == n and len(r.rows) == n and all(len(row) == n for row in r.rows)
    assert [r.sent(i) for i in range(n)] == [150] * n == [r.per_rank] * n
    assert sum(r.received(j) for j in range(n)) == 150 * n
    assert transpose(transpose(r.rows)) == r.rows
    assert [sum(row) for row in transpose(r.rows)] == [r.received(j) for j in range(n)]  # combine sends back all
    assert r.elements(5) == tuple(tuple(5 * c for c in row) for row in r.rows)


def test_each_ranks_draws_are_its_own_distinct_experts_and_a_pure_function_of_seed_and_rank():
    a = draw_experts(3, tokens=200, top_k=4, experts=10, skew=1.0, seed=11)
    assert a.shape == (200, 4) and a.min() >= 0 and a.max() < 10
    assert all(len(set(row)) == 4 for row in a.tolist())  # without replacement
    assert np.array_equal(a, draw_experts(3, tokens=200, top_k=4, experts=10, skew=1.0, seed=11))
    assert not np.array_equal(a, draw_experts(4, tokens=200, top_k=4, experts=10, skew=1.0, seed=11))
    assert not np.array_equal(a, draw_experts(3, tokens=200, top_k=4, experts=10, skew=1.0, seed=12))
    # A rank's row of the matrix is its own draws counted by owner, whatever the other ranks drew.
    r = route(4, tokens=200, top_k=4, experts=10, skew=1.0, seed=11)
    assert r.rows[3] == tuple(np.bincount(expert_owners(10, 4)[a].ravel(), minlength=4).tolist())
    # More tokens than one block of keys holds: the draws of the first tokens do not change.
    many = draw_experts(3, tokens=120_000, top_k=4, experts=10, skew=1.0, seed=11)
    assert np.array_equal(many[:200], a)


def test_another_process_draws_the_same_routing():
    """No state shared, no hash randomisation: a fresh interpreter (another PYTHONHASHSEED) agrees."""
    code = ("import json; from day0.stages.collectives.routing import route; "
            "print(json.dumps(route(5, tokens=64, top_k=2, experts=16, skew=1.5, seed=3).rows))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    here = route(5, tokens=64, top_k=2, experts=16, skew=1.5, seed=3).rows
    assert [tuple(row) for row in json.loads(out.stdout)] == list(here)


def test_experts_sit_contiguously_and_ranks_past_the_experts_hold_none():
    assert expert_owners(8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert expert_owners(7, 3).tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert expert_owners(2, 3).tolist() == [0, 1]  # rank 2 holds no expert
    r = route(3, tokens=40, top_k=1, experts=2, skew=0.0, seed=0)
    assert [row[2] for row in r.rows] == [0, 0, 0] and r.received(2) == 0
    every = route(4, tokens=10, top_k=8, experts=8, skew=2.0, seed=0)  # top_k = E: every token to every expert
    assert every.rows == ((20, 20, 20, 20),) * 4


def test_skew_zero_is_near_uniform():
    r = route(4, tokens=20_000, top_k=2, experts=16, skew=0.0, seed=1)
    assert max(abs(s - 0.25) for s in r.received_shares()) < 0.01
    picks = np.bincount(draw_experts(0, tokens=20_000, top_k=2, experts=16, skew=0.0, seed=1).ravel(), minlength=16)
    assert picks.max() / picks.min() < 1.1  # 2,500 expected per expert


def test_top_1_picks_follow_the_zipf_weights():
    """With one expert per token the draw is a plain weighted choice: frequency ~ (e+1)^-skew."""
    picks = np.bincount(draw_experts(2, tokens=50_000, top_k=1, experts=8, skew=1.0, seed=5).ravel(), minlength=8)
    w = 1.0 / np.arange(1, 9)
    assert np.abs(picks / picks.sum() - w / w.sum()).max() < 0.01


def test_skew_concentrates_the_traffic_on_the_hot_experts_rank():
    shares = [route(4, tokens=2_000, top_k=2, experts=16, skew=s, seed=2).received_shares() for s in (0, 0.5, 1, 2, 4)]
    hot = [s[0] for s in shares]
    assert hot == sorted(hot) and hot[0] < 0.27 and hot[2] > 0.5 and hot[-1] > 0.95
    assert all(s[0] == max(s) for s in shares[1:])
    picks = np.bincount(draw_experts(0, tokens=2_000, top_k=2, experts=16, skew=1.0, seed=2).ravel(), minlength=16)
    assert picks.argmax() == 0 and picks[0] > picks[15] * 4


@pytest.mark.parametrize("kw, message", [
    (dict(top_k=5, experts=4), "top_k"), (dict(skew=-1.0), "skew"), (dict(skew=float("inf")), "skew"),
])
def test_draws_refuse_what_cannot_be_drawn(kw, message):
    with pytest.raises(ValueError, match=message):
        draw_experts(0, **{"tokens": 4, "top_k": 2, "experts": 8, "skew": 1.0, "seed": 0, **kw})


# --------------------------------------------------------------------------- settings


def test_the_routing_settings_travel_with_the_section_and_refuse_bad_values():
    s = CollectivesSection.from_mapping({"expert_routing": {"tokens": 64, "experts": 8, "top_k": 2, "skew": 0}})
    assert (s.expert_routing.tokens, s.expert_routing.skew, s.expert_routing.seed) == (64, 0.0, 0)
    assert CollectivesSection.from_mapping(json.loads(json.dumps(s.to_dict()))) == s
    assert {"expert_dispatch", "expert_combine"} <= set(CollectivesSection().ops)
    assert CollectivesSection(ops=["moe_dispatch", "ep_combine"]).ops == ["expert_dispatch", "expert_combine"]
    for table, key in [({"top_k": 9, "experts": 8}, "collectives.expert_routing.top_k: 9 is more than experts (8)"),
                       ({"skw": 1}, "collectives.expert_routing.skw: unknown key; did you mean 'skew'?"),
                       ({"skew": -0.5}, "collectives.expert_routing.skew:"), ({"tokens": 0}, "collectives.expert_routing.tokens:")]:
        with pytest.raises(SettingsError) as err:
            CollectivesSection.from_mapping({"expert_routing": table})
        assert str(err.value).startswith(key), str(err.value)


def test_the_command_line_sets_one_routing_key_and_keeps_the_files_others(tmp_path):
    import argparse

    from day0.stages.collectives.cli import _settings_from_args

    (tmp_path / "s.toml").write_text("[collectives]\niters = 4\n[collectives.expert_routing]\ntokens = 64\ntop_k = 4\n")
    args = argparse.Namespace(settings=str(tmp_path / "s.toml"), set=["expert_routing.skew=0", "iters=2"])
    s = _settings_from_args(args)
    assert (s.iters, s.expert_routing.tokens, s.expert_routing.top_k, s.expert_routing.skew) == (2, 64, 4, 0.0)
    with pytest.raises(SettingsError, match="collectives.expert_routing.skw: unknown key"):
        _settings_from_args(argparse.Namespace(settings=None, set=["expert_routing.skw=1"]))


# --------------------------------------------------------------------------- busbw for uneven splits


def test_even_splits_give_nccl_tests_all_to_all_factor():
    for n in (1, 2, 3, 8):
        even = tuple(tuple([5] * n) for _ in range(n))
        assert peak_offrank(even) == 5 * (n - 1)
        p = dataclasses.replace(plan("all_to_all", 5 * n * 4, 4, n), op="expert_dispatch", traffic=even)
        assert p.bus_factor == pytest.approx(bus_factor("all_to_all", n))


def test_uneven_busbw_counts_the_busiest_ranks_busier_direction():
    m = ((12, 3, 0), (12, 3, 0), (6, 9, 0))  # rank 0 receives 12 + 6 off-rank; rank 2 sends 15 and receives none
    assert peak_offrank(m) == 18 and peak_offrank(transpose(m)) == 18  # dispatch and combine alike
    assert peak_offrank(((7,),)) == 0  # one rank: nothing crosses a link


def test_an_uneven_point_is_whole_rows_of_the_routing():
    r = route(3, tokens=10, top_k=2, experts=6, skew=1.0, seed=0)
    p = plan("expert_combine", 1000, 4, 3, r)  # 250 elements: 20 rows of 12
    assert (p.elements, p.count, p.size_bytes) == (240, 240, 960) and p.traffic == r.elements(12)
    assert size_from_count("expert_combine", p.count, 4, 3) == p.size_bytes
    assert p.bus_factor == pytest.approx(peak_offrank(r.rows) / r.per_rank)
    assert plan("expert_dispatch", 79, 4, 3, r).elements == 0  # under one element per row: no point
    with pytest.raises(ValueError, match="expert routing of 3 ranks"):
        plan("expert_dispatch", 1000, 4, 3)
    with pytest.raises(ValueError, match="expert routing of 2 ranks"):
        plan("expert_dispatch", 1000, 4, 2, r)


# --------------------------------------------------------------------------- the oracle, in one process


def _points(op: str, n: int, size: int, **routing):
    s = CollectivesSection(backend="gloo", expert_routing=routing or {})
    sws = [Sweeper(s, RankEnv(r, n, r, n)) for r in range(n)]
    return sws, [sw.build(op, "out_of_place", size) for sw in sws]


def _exchange(pts, m) -> None:
    """What all_to_all_single with these splits means, written with torch.split, not day0's oracle."""
    inputs = [pt.inp.clone() for pt in pts]
    for r, pt in enumerate(pts):
        pt.out.copy_(torch.cat([torch.split(inputs[i], list(m[i]))[r] for i in range(len(pts))]))


@pytest.mark.parametrize("op", ["expert_dispatch", "expert_combine"])
def test_the_oracle_is_the_exchange_and_catches_one_wrong_element_or_wrong_splits(op):
    sws, pts = _points(op, 3, 4 * 24 * 5, tokens=12, experts=6, top_k=2, skew=1.5)
    for pt in pts:
        pt.fill()
    m = pts[0].plan.traffic if op == "expert_dispatch" else transpose(pts[0].plan.traffic)
    assert len(set(m)) == 3  # every rank's splits differ, so a rank with another's splits is caught
    _exchange(pts, m)
    assert [sw.count_wrong(pt.out, pt.expected) for sw, pt in zip(sws, pts)] == [0, 0, 0]
    victim = max(range(3), key=lambda r: pts[r].out.numel())
    pts[victim].out.view(-1)[pts[victim].out.numel() // 2] += 1
    assert sws[victim].count_wrong(pts[victim].out, pts[victim].expected) == 1
    # Splits the ranks agree on but the routing does not, with every buffer's total kept: dispatch's
    # ranks each take the next rank's splits; combine's send each peer what the next peer was owed.
    rotated = m[1:] + m[:1] if op == "expert_dispatch" else tuple(row[1:] + row[:1] for row in m)
    _exchange(pts, rotated)
    assert sum(sw.count_wrong(pt.out, pt.expected) for sw, pt in zip(sws, pts)) > 0


# --------------------------------------------------------------------------- real gloo ranks, planted faults


def _shifted(x: OpContext, mode: str) -> OpCall:
    """expert_dispatch whose sender writes its tokens one element off (a permutation bug)."""
    call = OPS["expert_dispatch"].build(x, mode)  # type: ignore[misc]

    def fill() -> None:
        call.fill()
        call.inp.copy_(x.moved(x.rank, 1, call.inp.numel()))

    return dataclasses.replace(call, fill=fill)


def _wrong_splits(x: OpContext, mode: str) -> OpCall:
    """expert_dispatch where every rank sends with the next rank's splits: the ranks agree with one
    another, so the collective runs, but not with the routing."""
    m = x.traffic
    assert m is not None
    rotated = m[1:] + m[:1]
    send, recv = list(rotated[x.rank]), [row[x.rank] for row in rotated]
    inp, out = x.zeros(sum(send)), x.zeros(sum(recv))

    def fill() -> None:
        inp.copy_(x.moved(x.rank, 0, inp.numel()))
        out.zero_()

    return OpCall(fill, lambda: x.dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send),
                  inp, out)


SHIFTED = dataclasses.replace(OPS["expert_dispatch"], name="ep_shifted", aliases=(), build=_shifted)
WRONG_SPLITS = dataclasses.replace(OPS["expert_dispatch"], name="ep_wrong_splits", aliases=(), build=_wrong_splits)
#: Three ranks, two experts: rank 2 holds none, so every rank sends it nothing in dispatch and it
#: sends nothing at all in combine; a rank's splits differ from the next rank's (checked below).
ROUTING = {"tokens": 8, "experts": 2, "top_k": 1, "skew": 1.0, "seed": 4}
SWEEP = {"backend": "gloo", "ops": ["expert_dispatch", "expert_combine", "ep_shifted", "ep_wrong_splits"],
         "min_bytes": "1K", "max_bytes": "16K", "step_factor": 4, "warmup_iters": 1, "iters": 3, "timeout_s": 30.0,
         "expert_routing": ROUTING}


def _rank_main(rank: int, port: int, out: str) -> None:
    """One of three ranks in a fresh interpreter, the planted ops registered in it (the registry is per process)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with ExitStack() as stack:
        stack.enter_context(OPS.registered(SHIFTED))
        stack.enter_context(OPS.registered(WRONG_SPLITS))
        run_rank(CollectivesSection.from_mapping(SWEEP), RankEnv(rank, 3, rank, 3), Path(out))


def test_three_gloo_ranks_exact_with_empty_splits_and_planted_faults_fail(tmp_path):
    r = route(3, **ROUTING)
    assert r.received(2) == 0 and len(set(r.rows)) == 3, r.rows  # the case this test is about
    port = free_port()
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=_rank_main, args=(k, port, str(tmp_path))) for k in range(3)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(240)
    for p in ranks:
        if p.is_alive():
            p.kill()
    errors = {f.name: f.read_text()[:2000] for f in (tmp_path / "ranks").glob("*.error.txt")}
    assert [p.exitcode for p in ranks] == [0, 0, 0], errors

    result = load_result(tmp_path)
    assert result.complete and all(o.status == "ok" for o in result.ops.values()), result.ops
    factor = peak_offrank(r.rows) / r.per_rank
    for op in ("expert_dispatch", "expert_combine"):
        rows = result.rows_for(op)
        assert [x.size_bytes for x in rows] == [1024, 4096, 16384] and [x.count for x in rows] == [256, 1024, 4096]
        assert all(x.wrong == 0 and x.nranks == 3 for x in rows)
        assert all(x.busbw_gbps == pytest.approx(x.algbw_gbps * factor) for x in rows)
    assert all(x.wrong == 3 * x.count for x in result.rows_for("ep_shifted"))  # every element each rank received
    assert all(x.wrong and x.wrong > 0 for x in result.rows_for("ep_wrong_splits"))
    with OPS.registered(SHIFTED), OPS.registered(WRONG_SPLITS):
        checks = {c.id: c for c in result_checks(result, CollectivesSection.from_mapping(SWEEP))}
    assert checks["collectives.expert_dispatch.correct"].status == "pass"
    assert checks["collectives.expert_combine.correct"].status == "pass"
    assert checks["collectives.ep_shifted.correct"].status == "fail"
    assert checks["collectives.ep_wrong_splits.correct"].status == "fail"
    busbw = checks["collectives.expert_dispatch.busbw"]
    assert busbw.evidence["bus_factor"] == pytest.approx(factor) and len(busbw.evidence["samples"]) == 3
