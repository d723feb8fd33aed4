"""The collective-op registry (day0/core/collective_ops.py): one spec per op, read by the sweep, the
checks, the busbw formulas, the nccl-tests importers, the profile and the device check.

The acceptance test registers a toy op, a reduce to rank 0, and runs it on two gloo ranks: the
sweep, the exact check and busbw pick it up with no edit anywhere else.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from day0.config.collectives import CollectivesSection
from day0.config.errors import SettingsError
from day0.core.collective_ops import OPS, BusFactor, OpCall, OpContext, OpRegistry, OpSpec, UnknownCollective
from day0.core.sockets import free_port
from day0.stages.collectives import load_result, result_checks
from day0.stages.collectives.busbw import bus_factor, busbw_gbps
from day0.stages.collectives.nccl_format import op_from_name
from day0.stages.collectives.rank import run_rank
from day0.stages.collectives.rank_env import RankEnv
from day0.stages.collectives.subgroup import GroupDist

ROOT = Path(__file__).resolve().parents[3]

# --------------------------------------------------------------------------- a toy op, declared as any op is


def _reduce_to_root(x: OpContext, mode: str) -> OpCall:
    """torch.distributed.reduce: the sum lands on rank 0; the other ranks hold nothing defined."""
    buf = x.zeros(x.elements)
    return OpCall(lambda: buf.copy_(x.summed(x.rank, 0, x.elements)), lambda: x.dist.reduce(buf, dst=0), buf,
                  buf if x.rank == 0 else None, idempotent=False)


TOY = OpSpec("toy_reduce", BusFactor(), "toy_reduce_perf", aliases=("toyreduce",), modes=("in_place",),
             build=_reduce_to_root, expect=lambda x, start, count: x.sums(start, count))
#: The same op held to a wrong oracle: the exact check must be the spec's, so this one fails.
TOY_WRONG = dataclasses.replace(TOY, name="toy_reduce_off", nccl_tests=None, aliases=(),
                                expect=lambda x, start, count: x.sums(start, count) + 1)
SWEEP = {"backend": "gloo", "ops": ["toy_reduce", "toy_reduce_off"], "min_bytes": "1K", "max_bytes": "16K",
         "step_factor": 4, "warmup_iters": 1, "iters": 3, "timeout_s": 30.0}


@contextmanager
def toys() -> Iterator[None]:
    """Both toy ops registered in the process-wide registry for the block, and gone after it."""
    with ExitStack() as stack:
        stack.enter_context(OPS.registered(TOY))
        stack.enter_context(OPS.registered(TOY_WRONG))
        yield


def _rank_main(rank: int, port: int, out: str) -> None:
    """One rank, in a fresh interpreter: it registers the toys itself (the registry is per process),
    then runs the stage's own per-rank main, as the launcher's forked ranks do."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with toys():
        run_rank(CollectivesSection.from_mapping(SWEEP), RankEnv(rank, 2, rank, 2), Path(out))


def test_a_registered_op_is_swept_checked_and_given_its_busbw_with_no_other_edit(tmp_path):
    with pytest.raises(SettingsError, match="unknown collective 'toy_reduce'"):
        CollectivesSection.from_mapping(SWEEP)  # not an op until registered
    port = free_port()
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter per rank: nothing inherited by accident
    ranks = [spawn.Process(target=_rank_main, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(180)
    alive = [p for p in ranks if p.is_alive()]
    for p in alive:
        p.kill()
    errors = {f.name: f.read_text()[:2000] for f in (tmp_path / "ranks").glob("*.error.txt")}
    assert not alive and [p.exitcode for p in ranks] == [0, 0], errors

    result = load_result(tmp_path)
    assert result.complete and {op: o.status for op, o in result.ops.items()} == {"toy_reduce": "ok", "toy_reduce_off": "ok"}
    rows = result.rows_for("toy_reduce")
    assert [r.size_bytes for r in rows] == [1024, 4096, 16384] and {r.mode for r in rows} == {"in_place"}
    assert all(r.wrong == 0 for r in rows)  # rank 0 holds the exact sums; rank 1 holds no defined output
    assert all(r.wrong == r.count for r in result.rows_for("toy_reduce_off"))  # every element off by one
    with toys():
        assert all(r.busbw_gbps == pytest.approx(busbw_gbps("toy_reduce", r.size_bytes, r.time_us / 1e6, 2)) for r in rows)
        assert bus_factor("toyreduce", 2) == TOY.bus(2) == 1.0
        settings = CollectivesSection.from_mapping({**SWEEP, "expected_busbw": {"intra_node": {"toy_reduce": 1e-6}}})
        checks = {c.id: c for c in result_checks(result, settings)}
    assert checks["collectives.toy_reduce.correct"].status == "pass"
    assert checks["collectives.toy_reduce.correct"].title == "toy_reduce: exact results"
    busbw = checks["collectives.toy_reduce.busbw"]
    assert busbw.status == "pass" and busbw.evidence["bus_factor"] == 1.0 and len(busbw.evidence["samples"]) == 3
    off = checks["collectives.toy_reduce_off.correct"]
    assert off.status == "fail" and off.value == sum(r.count for r in result.rows_for("toy_reduce_off"))
    assert "toy_reduce" not in OPS and "toy_reduce" not in CollectivesSection().ops  # and gone again


def test_a_registered_op_is_read_from_nccl_tests_names_and_the_profile():
    with toys():
        assert OPS.resolve("toy_reduce_perf") is TOY and OPS.resolve("Toy-Reduce") is TOY
        assert op_from_name("run-toy_reduce_perf.txt") == "toy_reduce"
        assert CollectivesSection(ops=["toyreduce"]).ops == ["toy_reduce"]
    with pytest.raises(UnknownCollective):
        OPS.resolve("toy_reduce_perf")
    assert op_from_name("run-toy_reduce_perf.txt") == "reduce"  # the word left when the toy is gone


# --------------------------------------------------------------------------- the registry itself


def test_the_registry_refuses_a_spelling_two_ops_claim_and_restores_what_it_replaced():
    reg = OpRegistry([OPS["all_reduce"], OPS["reduce"]])
    with pytest.raises(ValueError, match="registered already"):
        reg.register(OPS["reduce"])
    with pytest.raises(ValueError, match="'allreduce' names 'all_reduce' already"):
        reg.register(OpSpec("mine", BusFactor(), aliases=("allreduce",)))
    with pytest.raises(ValueError, match="'reduce' names 'reduce' already"):
        reg.register(OpSpec("mine", BusFactor(), aliases=("reduce",)))
    with pytest.raises(ValueError, match="reduce_perf is 'reduce'"):
        reg.register(OpSpec("mine", BusFactor(), "reduce_perf"))
    assert list(reg) == ["all_reduce", "reduce"]  # nothing half-registered
    runnable_reduce = dataclasses.replace(TOY, name="reduce", nccl_tests="reduce_perf", aliases=())
    with reg.registered(runnable_reduce, replace=True):
        assert reg.runnable() == ("all_reduce", "reduce") and list(reg) == ["all_reduce", "reduce"]
    assert reg["reduce"] is OPS["reduce"] and reg.runnable() == ("all_reduce",)


@pytest.mark.parametrize("spec, message", [
    (dict(name="All-Reduce"), "not a lower-case name"),
    (dict(build=_reduce_to_root), "build and expect come together"),
    (dict(build=_reduce_to_root, expect=lambda x, s, k: None), "a swept op needs modes"),
    (dict(modes=("both",)), "mode 'both'"),
    (dict(nccl_tests="toy"), "end in _perf"),
    (dict(split=True, uneven_splits=True), "exclude each other"),
])
def test_a_spec_that_cannot_work_is_refused_when_declared(spec, message):
    with pytest.raises(ValueError, match=message):
        OpSpec(**{"name": "toy", "bus": BusFactor(), **spec})


def test_unknown_names_list_every_op_in_order():
    with pytest.raises(UnknownCollective) as err:
        OPS.resolve("allfoo")
    assert str(err.value) == ("unknown collective 'allfoo' (known: all_reduce, all_gather, reduce_scatter, all_to_all, "
                              "expert_dispatch, expert_combine, broadcast, sendrecv, reduce, gather, scatter, hypercube)")


@pytest.mark.parametrize("name, op", [
    ("all_reduce_perf.out", "all_reduce"), ("nccl-allreduce-8gpu.txt", "all_reduce"), ("reduce_scatter.log", "reduce_scatter"),
    ("a2a-all2all.txt", "all_to_all"), ("bcast.txt", "broadcast"), ("send_recv.json", "sendrecv"), ("reducer.txt", None),
    ("p2p-run.txt", None),  # p2p is also NCCL's transport: read from --op and the profile, never from a file name
])
def test_file_names_are_read_with_the_registrys_spellings(name, op):
    assert op_from_name(name) == op


def test_every_swept_op_declares_what_the_sweep_and_the_checks_need():
    for name in OPS.runnable():
        spec = OPS[name]
        assert spec.modes and spec.expect is not None
        # nccl-tests has a program for every even op; alltoall_perf sends even splits only
        assert (spec.nccl_tests is None) if spec.uneven_splits else OPS.resolve(spec.nccl_tests or "?") is spec
    assert [n for n in OPS if OPS[n].uneven_splits] == ["expert_dispatch", "expert_combine"]
    assert OPS.resolve("p2p").name == "sendrecv" and OPS["sendrecv"].min_ranks == 2


def test_the_metrics_doc_lists_every_op_with_its_factor():
    """docs/metrics.md's busbw table is the registry's, factor for factor."""
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| (\w+) \| [^|]+\| ([^|]+?) \|$", text, flags=re.MULTILINE))
    assert {op: str(OPS[op].bus) for op in OPS.runnable()} == {op: table.get(op) for op in OPS.runnable()}


# --------------------------------------------------------------------------- the subgroup's dist


class _FakeDist:
    """Records the calls, with torch.distributed's keywords."""

    ReduceOp = SimpleNamespace(SUM="sum", MAX="max")

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def isend(self, t: Any, dst: int | None = None, group: Any = None, tag: int = 0) -> None: ...

    def irecv(self, t: Any, src: int | None = None, group: Any = None, tag: int = 0) -> None: ...

    def reduce(self, tensor: Any, dst: int | None = None, op: Any = None, group: Any = None,
               async_op: bool = False, group_dst: int | None = None) -> None:
        self.calls.append(("reduce", (tensor,), {"op": op, "group": group, "group_dst": group_dst}))

    def get_rank(self) -> int:  # takes no group: not bound
        return 0


def test_the_subgroup_binds_any_call_that_takes_a_group_and_reads_peers_as_group_ranks():
    fake = _FakeDist()
    g = GroupDist(fake, "node-group")
    g.reduce("t", dst=1)
    assert fake.calls == [("reduce", ("t",), {"op": None, "group": "node-group", "group_dst": 1})]
    assert g.isend == fake.isend and g.ReduceOp is fake.ReduceOp  # handed to P2POp as torch's own
    assert getattr(g, "all_gather_single", None) is None  # torch lacks it: the spec's fallback applies
    with pytest.raises(AttributeError, match="takes no group"):
        g.get_rank()
