"""Intra-node figures of a multi-node run: the ops again, on each node's own ranks.

When the ranks span nodes the world sweep measures the inter-node fabric; with more than one rank
per node, each node's ranks then form a subgroup and measure every op that ran at the largest
size, so the record separates intra-node from inter-node busbw. Rows carry ``scope =
"intra_node"`` and their node; rank 0 gathers every node's rows.
"""

from __future__ import annotations

import datetime as _dt
import inspect
from dataclasses import asdict
from typing import Any, Callable

from day0.stages.collectives.rank_env import RankEnv, RankProgress
from day0.stages.collectives.result import CollectivesResult, SweepRow
from day0.stages.collectives.sweep import Sweeper

#: A peer named by keyword, as the op specs name them, is a rank of the group: torch's group_* keywords.
_GROUP_RANKS = {"src": "group_src", "dst": "group_dst", "peer": "group_peer"}


class GroupDist:
    """``torch.distributed`` bound to one process group, whatever op the sweep runs through it.

    Every call that takes a ``group`` gets this one, with the ranks passed as ``src=`` / ``dst=`` /
    ``peer=`` read as the group's (``group_src=`` ...), so a registered op runs on a subgroup with no
    edit here. ``isend``/``irecv`` stay torch's own (a ``P2POp`` made here carries the group), and a
    name that takes no group fails loudly rather than running on the whole world.
    """

    def __init__(self, dist: Any, group: Any) -> None:
        self._d, self._g = dist, group
        self.ReduceOp, self.isend, self.irecv = dist.ReduceOp, dist.isend, dist.irecv

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._d, name)  # torch lacks it (all_gather_single): AttributeError, the caller's fallback
        try:
            takes_group = callable(fn) and "group" in inspect.signature(fn).parameters
        except (TypeError, ValueError):  # no signature to read
            takes_group = False
        if not takes_group:
            raise AttributeError(f"torch.distributed.{name} takes no group: GroupDist cannot bind it to one")

        def bound(*args: Any, **kwargs: Any) -> Any:
            kwargs = {_GROUP_RANKS.get(k, k): v for k, v in kwargs.items()}
            return fn(*args, group=self._g, **kwargs)

        self.__dict__[name] = bound  # read once: the timed loop finds it as a plain attribute
        return bound

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        return self._d.batch_isend_irecv(ops)  # each P2POp carries the group already


def intra_node_rows(dist: Any, settings: Any, env: RankEnv, hosts: list[str], result: CollectivesResult,
                    progress: RankProgress) -> list[SweepRow]:
    """Every node's rows at the largest size (on every rank); call on all ranks, nodes of one rank included."""
    nodes = list(dict.fromkeys(hosts))
    mine: tuple[Any, list[int]] | None = None
    for name in nodes:
        members = [r for r, h in enumerate(hosts) if h == name]
        # every rank creates every group, in the same order; the world's timeout holds here too (torch's
        # own default, 30 min on gloo, would let a stuck intra-node phase outwait every other bound)
        pg = dist.new_group(members, timeout=_dt.timedelta(seconds=float(settings.timeout_s)))
        if env.rank in members:
            mine = (pg, members)
    rows: list[dict[str, Any]] = []
    if mine is not None and len(mine[1]) > 1:
        pg, members = mine
        genv = RankEnv(members.index(env.rank), len(members), env.local_rank, env.local_world_size)
        sw = Sweeper(settings, genv, dist=GroupDist(dist, pg))
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
