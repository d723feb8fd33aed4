"""The collectives sweep: exact data, settings, fault diagnosis, and real gloo runs over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.stages.collectives import (
    OPS,
    CollectivesResult,
    CollectivesSection,
    ExactPattern,
    RankEnv,
    RankState,
    SettingsError,
    diagnose,
    load_result,
    parse_size,
    result_checks,
    run_local,
    tp_equivalence_check,
)
from day0.stages.collectives.busbw import bus_factor, peak_offrank
from day0.stages.collectives.routing import route
from day0.stages.collectives.sweep import Sweeper, nearest_rank
from day0.stages.collectives.tp_equivalence import TP_PROMPTS

# --------------------------------------------------------------------------- settings


def test_settings_read_a_toml_table_and_normalise():
    s = CollectivesSection.from_mapping({"min_bytes": "1K", "max_bytes": "1M", "step_factor": 8, "dtype": "bf16",
                                          "ops": ["allreduce", "alltoall"], "expected_busbw": {"intra_node": {"allreduce": 370}}})
    assert s.sizes() == [1024, 8192, 65536, 524288]
    assert s.dtype == "bfloat16" and s.ops == ["all_reduce", "all_to_all"]
    assert s.expected_busbw == {"intra_node": {"all_reduce": 370.0}}
    assert parse_size("8G") == 8 << 30 and parse_size(4096) == 4096


@pytest.mark.parametrize(
    "table,key",
    [({"min_byte": 1}, "collectives.min_byte"), ({"dtype": "int4"}, "collectives.dtype"),
     ({"max_bytes": "lots"}, "collectives.max_bytes"), ({"ops": ["all_reduce", "gather"]}, "collectives.ops"),
     ({"expected_busbw": {"rack": {"all_reduce": 1}}}, "collectives.expected_busbw.rack"),
     ({"expected_busbw": {"intra_node": {"all_reduce": "fast"}}}, "collectives.expected_busbw.intra_node.all_reduce"),
     ({"min_bytes": 4096, "max_bytes": 1024}, "collectives.max_bytes"), ({"step_factor": 1}, "collectives.step_factor")],
)
def test_bad_settings_name_the_key(table, key):
    with pytest.raises(SettingsError) as err:
        CollectivesSection.from_mapping(table)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_the_profile_table_is_the_settings_and_survives_the_ranks_json():
    """One definition: the profile's [collectives] is what the ranks get, through a JSON file."""
    from day0.config.profile import load_profile
    from day0.stages.collectives import coerce_settings

    p = load_profile("cpu-tiny", overrides={"collectives": {"max_bytes": "64K", "dtype": "fp16", "results_file": "r.json",
                                                            "large_message_bytes": "16K"}})
    s = p.collectives
    assert coerce_settings(s) is s and (s.max_bytes, s.large_message_bytes, s.dtype) == (65536, 16384, "float16")
    back = CollectivesSection.from_mapping(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.sizes() == s.sizes() == [1024, 4096, 16384, 65536]
    assert coerce_settings(None) == CollectivesSection() and coerce_settings({"iters": 2}).iters == 2
    with pytest.raises(ValueError):  # frozen, like every profile section
        s.iters = 3  # type: ignore[misc]


@pytest.mark.parametrize("table,message", [
    ({"step_fator": 2}, "collectives.step_fator: unknown key; did you mean 'step_factor'?"),
    ({"in_place": False, "out_of_place": False}, "collectives: out_of_place and in_place are both false; nothing would run"),
    ({"expected_busbw": {"intra_node": {"gather_all": 1}}}, "collectives.expected_busbw.intra_node.gather_all: unknown collective"),
    ({"timeout_s": "60"}, "collectives.timeout_s: expected a number"),
])
def test_bad_settings_read_like_the_profile_errors(table, message):
    with pytest.raises(SettingsError) as err:
        CollectivesSection.from_mapping(table)
    assert str(err.value) == message


# --------------------------------------------------------------------------- exact data

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@given(dtype=st.sampled_from(sorted(DTYPES)), n=st.one_of(st.integers(1, 16), st.integers(200, 300)),
       start=st.integers(0, 1 << 40), seed=st.integers(0, 10**6), tree=st.booleans())
@settings(max_examples=40, deadline=None)
def test_any_reduction_order_gives_the_same_bits(dtype, n, start, seed, tree):
    """Sums of the crafted inputs over any rank subset, in any order or tree, are exact in the dtype."""
    pat, td = ExactPattern.for_dtype(dtype, n), DTYPES[dtype]
    rng = random.Random(seed)
    parts = [pat.values(torch, r, start, 64, td, "cpu") for r in range(n)]
    rng.shuffle(parts)
    while len(parts) > 1:  # combine random pairs (a random tree) or left to right (a ring)
        i = rng.randrange(len(parts) - 1) if tree else 0
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    exact = pat.sums(torch, start, 64, torch.float64, "cpu")
    assert torch.equal(parts[0].to(torch.float64), exact)
    assert torch.equal(pat.sums(torch, start, 64, td, "cpu").to(torch.float64), exact)
    moved = ExactPattern.for_dtype(dtype, n, reduce=False)  # data only copied: each value exact, ranks differ
    vals = [moved.values(torch, r, start, 64, td, "cpu").to(torch.float64) for r in range(min(n, 3))]
    assert all(torch.equal(v, moved.values(torch, r, start, 64, torch.float64, "cpu")) for r, v in enumerate(vals))
    assert len({tuple(v.tolist()) for v in vals}) == len(vals)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_chunk_delivered_to_the_wrong_place_is_wrong_in_every_dtype(dtype):
    """Chunks and blocks are powers of two long: with bfloat16's even period (16 and 128) a chunk in
    the wrong place held exactly the expected values, and rotated all_reduce chunks, another rank's
    reduce_scatter chunk or all_to_all blocks meant for another rank all passed with 0 wrong."""
    sw = Sweeper(CollectivesSection.from_mapping({"dtype": dtype}), RankEnv(1, 8, 1, 8))
    pt = sw.build("all_reduce", "in_place", 1 << 20)
    good = pt.expected(0, pt.plan.elements)
    assert sw.count_wrong(good, pt.expected) == 0
    assert sw.count_wrong(torch.roll(good, pt.plan.elements // 8), pt.expected) > 0
    rs = sw.build("reduce_scatter", "out_of_place", 1 << 20)
    assert sw.count_wrong(sw.pattern.sums(torch, 0, rs.plan.chunk, sw.tdtype, "cpu"), rs.expected) > 0  # rank 0's
    a2 = sw.build("all_to_all", "out_of_place", 1 << 20)
    ch = a2.plan.chunk
    meant_for_2 = torch.cat([sw.moved.values(torch, j, 2 * ch, ch, sw.tdtype, "cpu") for j in range(8)])
    assert sw.count_wrong(meant_for_2, a2.expected) > 0


def _sweepers(n: int, dtype: str = "float32") -> list[Sweeper]:
    s = CollectivesSection(backend="gloo", dtype=dtype, root=n - 1)
    return [Sweeper(s, RankEnv(r, n, r, n)) for r in range(n)]


def _reference(op: str, inputs: list[torch.Tensor], r: int, n: int, c: int, root: int, traffic=None) -> torch.Tensor:
    """What each collective means, independent of how day0 crafts data or computes expectations."""
    if op in ("expert_dispatch", "expert_combine"):  # all_to_all_single with the routing's splits (back: transposed)
        m = traffic if op == "expert_dispatch" else tuple(zip(*traffic))
        return torch.cat([torch.split(inputs[j], list(m[j]))[r] for j in range(n)])
    if op == "all_reduce":
        return sum(inputs[1:], inputs[0].clone())
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "reduce_scatter":
        return sum(inputs[1:], inputs[0].clone())[r * c:(r + 1) * c]
    if op == "all_to_all":
        return torch.cat([inputs[j][r * c:(r + 1) * c] for j in range(n)])
    if op == "broadcast":
        return inputs[root].clone()
    return inputs[(r - 1) % n].clone()  # sendrecv along the ring


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("op,mode", [(op, m) for op in OPS.runnable() for m in OPS[op].modes])
def test_expected_outputs_match_collective_semantics_and_catch_one_bad_element(op, mode, n):
    if op == "sendrecv" and n == 1:
        pytest.skip("send/recv needs two ranks")
    sws = _sweepers(n)
    pts = [sw.build(op, mode, max(4 * 7 * n * 5, 5 * sws[0].smallest_size(op))) for sw in sws]
    for pt in pts:
        pt.fill()
    inputs = [pt.inp.clone() for pt in pts]  # snapshot: in-place outputs alias their inputs
    c = pts[0].plan.chunk
    for r, pt in enumerate(pts):
        pt.out.copy_(_reference(op, inputs, r, n, c, root=n - 1, traffic=pt.plan.traffic))
    for sw, pt in zip(sws, pts):
        assert sw.count_wrong(pt.out, pt.expected) == 0
    victim = pts[n // 2]
    victim.out.view(-1)[victim.out.numel() // 2] += 1
    assert sws[n // 2].count_wrong(victim.out, victim.expected) == 1


# --------------------------------------------------------------------------- fault diagnosis


def _st(rank, rc, *, error=None, killed=False, hb=0.5, op="all_reduce"):
    return RankState(rank=rank, pid=100 + rank, returncode=rc, killed_by_harness=killed, heartbeat_age_s=hb,
                     step={"phase": "sweep", "op": op, "mode": "in_place", "size": 4096}, error=error)


PEER = "RuntimeError: Read error [127.0.0.1]:35202: Connection reset by peer."
TIMEOUT = "RuntimeError: Timed out waiting 3000ms for recv operation to complete"


def test_diagnose_blames_the_killed_rank_not_its_victims():
    f = diagnose([_st(0, 1, error=PEER), _st(1, -9), _st(2, None, killed=True)], timeout_s=10)
    assert f.kind == "died" and f.ranks == [1]
    assert f.message.startswith("rank 1 died (SIGKILL) during all_reduce in_place 4 KiB")
    assert "ranks 0,2 failed after it" in f.message


def test_diagnose_frozen_rank_by_heartbeat_and_straggler_by_survival():
    frozen = diagnose([_st(0, 1, error=TIMEOUT), _st(1, None, killed=True, hb=12.0)], timeout_s=3)
    assert frozen.kind == "hung" and frozen.ranks == [1] and "no heartbeat" in frozen.message
    busy = diagnose([_st(0, 1, error=TIMEOUT), _st(1, None, killed=True, hb=0.2), _st(2, 1, error=TIMEOUT)], timeout_s=3)
    assert busy.kind == "hung" and busy.ranks == [1] and "still running after its peers" in busy.message


def test_diagnose_own_error_silent_exit_and_clean_run():
    own = diagnose([_st(0, 1, error="ValueError: bad buffer size"), _st(1, 1, error=PEER)], timeout_s=3)
    assert own.kind == "error" and own.ranks == [0] and "bad buffer size" in own.message
    silent = diagnose([_st(0, 1, error=PEER), _st(1, 3)], timeout_s=3)
    assert silent.kind == "died" and silent.ranks == [1] and "code 3" in silent.message
    assert diagnose([_st(0, 0), _st(1, 0)], timeout_s=3) is None


# --------------------------------------------------------------------------- real gloo runs

SMALL = dict(min_bytes="1K", max_bytes="64K", step_factor=8, warmup_iters=1, iters=3, timeout_s=30.0, backend="gloo")


def _pids_gone(result: CollectivesResult, out: Path) -> list[int]:
    alive = []
    pids = [json.loads(f.read_text())["pid"] for f in (out / "ranks").glob("rank*.step.json")]
    pids.append(int((out / "ranks" / "launcher.pid").read_text()))
    assert len(pids) >= 3
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def _routed_factor(s: CollectivesSection, n: int) -> float:
    """busbw / algbw of an uneven op on n ranks: the routing's busiest rank (docs/metrics.md)."""
    r = s.expert_routing
    routing = route(n, tokens=r.tokens, top_k=r.top_k, experts=r.experts, skew=r.skew, seed=r.seed)
    return peak_offrank(routing.rows) / routing.per_rank


def test_gloo_two_ranks_every_op_exact(tmp_path):
    s = CollectivesSection(**SMALL)
    result = run_local(s, 2, tmp_path)
    assert result.fault is None and result.complete, result.fault
    assert result.backend == "gloo" and result.world_size == 2 and result.nnodes == 1
    assert {op: o.status for op, o in result.ops.items()} == {op: "ok" for op in OPS.runnable()}
    for op in OPS.runnable():
        rows = result.rows_for(op)
        assert len(rows) == 3 * len(OPS[op].modes), op
        factor = _routed_factor(s, 2) if OPS[op].uneven_splits else bus_factor(op, 2)
        for r in rows:
            assert r.wrong == 0 and r.busbw_gbps > 0 and len(r.times_us) == 3
            assert r.busbw_gbps == pytest.approx(r.algbw_gbps * factor)
            assert r.min_us <= r.p50_us <= r.p99_us <= r.max_us
    assert load_result(tmp_path).to_dict() == result.to_dict()
    lenient = CollectivesSection(**SMALL, expected_busbw={"intra_node": {"all_reduce": 1e-6}})
    strict = CollectivesSection(**SMALL, expected_busbw={"intra_node": {"all_reduce": 1e6}})
    ok = {c.id: c for c in result_checks(result, lenient)}
    bad = {c.id: c for c in result_checks(result, strict)}
    assert ok["collectives.ranks"].status == "pass"
    assert all(ok[f"collectives.{op}.correct"].status == "pass" for op in OPS.runnable())
    assert ok["collectives.all_reduce.busbw"].status == "pass" and bad["collectives.all_reduce.busbw"].status == "fail"
    assert len(ok["collectives.all_reduce.busbw"].evidence["samples"]) == 3
    assert {c.source for c in ok.values()} == {"torch.distributed/gloo"}  # the stage names the source itself
    assert _pids_gone(result, tmp_path) == []


def test_gloo_four_ranks_split_ops(tmp_path):
    s = CollectivesSection(**dict(SMALL, min_bytes="4K", step_factor=16))
    result = run_local(s, 4, tmp_path)
    assert result.fault is None, result.fault
    assert sorted({(r.op, r.mode) for r in result.rows}) == sorted((op, m) for op in OPS.runnable() for m in OPS[op].modes)
    assert all(r.wrong == 0 and r.nranks == 4 for r in result.rows)
    ag = [r for r in result.rows if r.op == "all_gather"]
    assert {r.count for r in ag} == {4096 // 4 // 4, 65536 // 4 // 4}  # per-rank elements, like nccl-tests
    assert _pids_gone(result, tmp_path) == []


def _run_and_signal(tmp_path: Path, n: int, victim: int, sig: int, s: CollectivesSection):
    box: dict = {}
    th = threading.Thread(target=lambda: box.setdefault("result", run_local(s, n, tmp_path)), daemon=True)
    th.start()
    step = tmp_path / "ranks" / f"rank{victim}.step.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            info = json.loads(step.read_text())
            if info.get("phase") == "sweep":
                break
        except (OSError, json.JSONDecodeError):
            pass
        time.sleep(0.02)
    else:
        pytest.fail("the ranks never reached the sweep")
    t0 = time.monotonic()
    os.kill(info["pid"], sig)
    th.join(60)
    assert not th.is_alive(), "run_local did not return"
    return box["result"], time.monotonic() - t0


def test_killed_rank_is_named_fast_and_nothing_is_left(tmp_path):
    s = CollectivesSection(**dict(SMALL, ops=["all_reduce", "all_gather"], iters=100000, grace_s=2.0))
    result, after = _run_and_signal(tmp_path, 3, 1, signal.SIGKILL, s)
    assert result.fault is not None and result.fault.kind == "died" and result.fault.ranks == [1]
    assert result.fault.message.startswith("rank 1 died (SIGKILL) during all_reduce")
    assert after < s.grace_s + 8  # bounded by the grace period, not by the 30 s collective timeout
    checks = {c.id: c for c in result_checks(result, s)}
    assert checks["collectives.ranks"].status == "fail" and "rank 1" in checks["collectives.ranks"].message
    assert checks["collectives.all_reduce.correct"].status == "error"
    assert checks["collectives.all_gather.busbw"].status == "error"
    assert _pids_gone(result, tmp_path) == []


def test_frozen_rank_is_named_within_the_timeout(tmp_path):
    s = CollectivesSection(**dict(SMALL, ops=["all_reduce"], iters=100000, timeout_s=2.0, grace_s=1.0))
    result, after = _run_and_signal(tmp_path, 2, 1, signal.SIGSTOP, s)
    assert result.fault is not None and result.fault.kind == "hung" and result.fault.ranks == [1], result.fault
    assert after < s.timeout_s + s.grace_s + 6
    assert _pids_gone(result, tmp_path) == []


def test_diagnose_nccl_watchdog_abort_is_a_victim_not_the_culprit():
    watchdog = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 300000 ms"
    f = diagnose([_st(0, -6, error=watchdog), _st(1, None, killed=True, hb=0.3)], timeout_s=300)
    assert f.kind == "hung" and f.ranks == [1]


def test_per_iteration_percentiles_use_the_nearest_rank_rule():
    """nccl-tests' rule, not the linear interpolation of day0.core.stats.percentile (latency)."""
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and nearest_rank([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert nearest_rank([5.0], 0) == 5.0 and nearest_rank([], 50) is None


# --------------------------------------------------------------------------- vLLM's TP path


class _FakeEngine:
    view = "http"

    def __init__(self, tokens: dict[str, list[int]]):
        self.tokens = tokens

    def greedy(self, prompts, max_tokens):
        return [SimpleNamespace(token_ids=self.tokens.get(p, [1, 2, 3])[:max_tokens]) for p in prompts]


class _FakeEngines:
    def __init__(self, other: _FakeEngine):
        self.other, self.started, self.stopped = other, [], 0

    @contextlib.contextmanager
    def variant(self, name, args, env=None):
        self.started.append((name, args, env))
        try:
            yield self.other
        finally:
            self.stopped += 1


def test_tp_equivalence_starts_the_other_tp_and_names_the_differing_prompts():
    same = _FakeEngines(_FakeEngine({}))
    ok = tp_equivalence_check(_FakeEngine({}), same, 1)
    assert (ok.id, ok.status, ok.value, ok.source) == ("collectives.engine_tp2_matches_tp1", "pass", 0, "http")
    assert same.started == [("tp2", {"tensor_parallel_size": 2}, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"})]
    assert same.stopped == 1 and ok.evidence["tp1"] == ok.evidence["tp2"]
    other = _FakeEngines(_FakeEngine({TP_PROMPTS[1]: [9, 9]}))
    bad = tp_equivalence_check(_FakeEngine({}), other, 2)
    assert (bad.id, bad.status, bad.value) == ("collectives.engine_tp1_matches_tp2", "fail", 1)
    assert other.started == [("tp1", {"tensor_parallel_size": 1}, None)] and repr(TP_PROMPTS[1]) in bad.message


def test_the_intra_node_groups_are_bounded_by_the_worlds_timeout():
    """dist.new_group without timeout= takes torch's own default (30 min on gloo), so a rank stuck
    in an intra-node phase outwaited timeout_s. A labelled fake of torch.distributed records the
    groups asked for; the world has one rank per node, so no group sweeps."""
    import datetime

    from day0.stages.collectives.subgroup import intra_node_rows

    class RecordingDist:
        def __init__(self) -> None:
            self.groups: list[tuple[list[int], object]] = []

        def new_group(self, members, timeout=None):
            self.groups.append((members, timeout))
            return object()

        def all_gather_object(self, out, obj):
            out[:] = [obj] * len(out)

    fake = RecordingDist()
    settings = CollectivesSection(backend="gloo", timeout_s=7.0)
    assert intra_node_rows(fake, settings, RankEnv(0, 2, 0, 1), ["node0", "node1"], None, None) == []
    assert fake.groups == [([0], datetime.timedelta(seconds=7)), ([1], datetime.timedelta(seconds=7))]
