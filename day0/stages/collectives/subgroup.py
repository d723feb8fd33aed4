"""Intra-node figures of a multi-node run: the ops again, on each node's own ranks.

When the ranks span nodes the world sweep measures the inter-node fabric; with more than one rank
per node, each node's ranks then form a subgroup and measure every op that ran at the largest
size, so the record separates intra-node from inter-node busbw. Rows carry ``scope =
"intra_node"`` and their node; rank 0 gathers every node's rows.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from day0.stages.collectives.result import CollectivesResult, SweepRow
from day0.stages.collectives.sweep import _Sweeper

if TYPE_CHECKING:
    from day0.stages.collectives.rank import RankEnv, _Progress


class GroupDist:
    """``torch.distributed`` bound to one process group: the sweep's calls, with ranks of the group."""

    def __init__(self, dist: Any, group: Any) -> None:
        self._d, self._g = dist, group
        self.ReduceOp, self.isend, self.irecv = dist.ReduceOp, dist.isend, dist.irecv

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)  # a call the sweep makes that this wrapper does not bind: fail loudly

    def barrier(self) -> None:
        self._d.barrier(group=self._g)

    def all_reduce(self, t: Any, op: Any = None) -> None:
        self._d.all_reduce(t, op=op if op is not None else self._d.ReduceOp.SUM, group=self._g)

    def all_gather_into_tensor(self, out: Any, inp: Any) -> None:
        self._d.all_gather_into_tensor(out, inp, group=self._g)

    def reduce_scatter_tensor(self, out: Any, inp: Any) -> None:
        self._d.reduce_scatter_tensor(out, inp, group=self._g)

    def all_to_all_single(self, out: Any, inp: Any) -> None:
        self._d.all_to_all_single(out, inp, group=self._g)

    def broadcast(self, t: Any, src: int) -> None:
        self._d.broadcast(t, group=self._g, group_src=src)

    def P2POp(self, op: Any, t: Any, peer: int) -> Any:  # noqa: N802 - torch's name
        return self._d.P2POp(op, t, group=self._g, group_peer=peer)

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        return self._d.batch_isend_irecv(ops)


def intra_node_rows(dist: Any, settings: Any, env: "RankEnv", hosts: list[str], result: CollectivesResult,
                    out_dir: Any, progress: "_Progress") -> list[SweepRow]:
    """Every node's rows at the largest size (on every rank); call on all ranks, nodes of one rank included."""
    nodes = list(dict.fromkeys(hosts))
    mine: tuple[Any, list[int]] | None = None
    for name in nodes:
        members = [r for r, h in enumerate(hosts) if h == name]
        pg = dist.new_group(members)  # every rank creates every group, in the same order
        if env.rank in members:
            mine = (pg, members)
    rows: list[dict[str, Any]] = []
    if mine is not None and len(mine[1]) > 1:
        pg, members = mine
        genv = type(env)(members.index(env.rank), len(members), env.local_rank, env.local_world_size)
        sw = _Sweeper(settings, genv, out_dir, progress, dist=GroupDist(dist, pg))
        size = max(settings.sizes())
        for op in settings.ops:
            outcome = result.ops.get(op)
            if outcome is None or outcome.status != "ok" or not outcome.modes:
                continue
            progress.step(phase="intra_node", op=op, mode=outcome.modes[0], size=size)
            row = sw.measure(op, outcome.modes[0], size)
            if row is not None and genv.rank == 0:
                row.scope, row.node = "intra_node", hosts[env.rank]
                rows.append(asdict(row))
    everyone: list[Any] = [None] * len(hosts)
    dist.all_gather_object(everyone, rows)
    return [SweepRow(**r) for part in everyone for r in (part or [])]
