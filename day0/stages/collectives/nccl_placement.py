"""Where a connection line's two ends run: the communicators of :mod:`nccl_comms` that the line fits, and their ranks' hosts.

A connection line (``Channel 00/0 : 0[0] -> 1[1] via ...``) names its communicator's ranks without naming
the communicator, so it is given to the communicators of its process (:class:`CommTable`, from their init
lines) that fit all of what NCCL prints:

- the ranks: the process is the logging end's rank in it (the sender, the receiver for
  ``[receive]``), and it has more ranks than the line names;
- the thread: before NCCL 2.22, and with ``NCCL_RUNTIME_CONNECT=0``, rings and trees are connected
  inside ``initTransportsRank``, on the thread that printed the communicator's ``Init START`` or
  ``comm ... nRanks`` line and has not yet printed its ``Init COMPLETE``;
- the peer's GPU: connection lines print ``rank[nvmlDev]`` (NCCL >= 2.12; the busId in 2.8-2.11)
  and init lines each rank's ``nvmlDev`` (>= 2.18) and ``busId``;

and when several still fit, the peer's host is known only if they all put it on the same host.
Otherwise :class:`Ends` says why the host cannot be told (``why``): never a guess.

A rank of a communicator that processes on two hosts claim (two communicators that share one identity,
see :class:`Identities`) is reported, not resolved. A communicator of one node (``nNodes 1``) has every
rank on its own host. A process that printed no init line at all is read as the world (its ranks are world
ranks), as logs of one communicator always were; the world's ranks it does not print are looked up in the
world-sized communicators' members, and theirs in its lines.

:class:`CommView` is the index these questions are answered from, built from the whole table and rebuilt
only after new lines; it remembers each question it answered, since a log's lines repeat them.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable, NamedTuple, Protocol

from day0.stages.collectives.nccl_comms import CommTable, Communicator, Identities, comm_label, plain_bus

MAX_MEMO = 200_000  # placed (process, ranks, device, init) questions remembered
OTHER_NODE = "<other node>"


class ConnectionLine(Protocol):
    """What placing a connection reads of it (:class:`day0.stages.collectives.nccl_debug.Connection`)."""

    src: int
    dst: int
    host: str | None
    pid: int | None
    opened: int | None

    @property
    def logger_rank(self) -> int: ...

    @property
    def peer_rank(self) -> int: ...

    @property
    def peer_dev(self) -> str | None: ...


class Ends(NamedTuple):
    """The hosts of a connection's two ends (``<other node>`` / ``<node k>`` where only that is known),
    None where the log cannot tell; ``why`` says what it lacks."""

    src: str | None
    dst: str | None
    why: str = ""


class _Candidates(NamedTuple):
    """One process's communicators of one rank of it (see :meth:`CommView._candidates`)."""

    entries: list[tuple]  # (record, nranks, members by rank, kind), largest first
    sizes: list[int]  # -nranks of each, ascending, for bisect
    logged: set[int] | None  # every rank logged in any of them; None where too many to keep
    unlogged: dict[tuple, dict[tuple, Communicator]]  # (how many fit, init) -> kind -> a communicator of it


class CommView:
    """Who is which rank of each communicator, built from every process's init lines."""

    def __init__(self, table: CommTable, stamp: tuple, connections: Iterable[Any]) -> None:
        self.table, self.stamp = table, stamp
        self.gid = Identities(table.records).of  # the communicator's identity across processes
        self.members: dict[tuple, dict[int, list[Communicator]]] = {}
        for rec in table.records:
            self.members.setdefault(self.gid(rec), {}).setdefault(rec.rank, []).append(rec)
        self.world = max((r.nranks for r in table.records), default=0)
        self.world_gids = list(dict.fromkeys(self.gid(r) for r in table.records if r.nranks == self.world))
        self._complete: dict[tuple, bool] = {}
        self._nodes: dict[tuple, dict[int, str]] = {}
        self._memo: dict[tuple, tuple[str | None, str | None, str]] = {}
        self._cands: dict[tuple[str, int, int], _Candidates] = {}
        # rank -> the first host of a process that printed no init line, and rank -> a second host claiming it
        self.loose: dict[int, str] = {}
        self.clash: dict[int, str] = {}
        for conn in connections:
            if conn.host is not None and (conn.host, conn.pid) not in table.by_proc:
                self._loose(conn.logger_rank, conn.host)
        for (host, pid), ranks in table.tree_ranks.items():
            if (host, pid) not in table.by_proc:
                for rank in ranks:
                    self._loose(rank, host)
        hosts = set(self.loose.values())
        self._only_host = hosts.pop() if len(hosts) == 1 else None  # every loose line from one host
        self._loose_nodes: dict[int, dict[int, str]] = {}  # devices_per_node -> node -> its first loose host

    def _loose(self, rank: int, host: str) -> None:
        first = self.loose.setdefault(rank, host)
        if first != host and rank not in self.clash:
            self.clash[rank] = host

    def ends(self, conn: ConnectionLine, nnodes: int | None, dpn: int | None) -> Ends:
        """The hosts of the line's sender and receiver (:meth:`place` answers for the logging end and its peer)."""
        me, peer, why = self.place(conn, nnodes, dpn)
        return Ends(me, peer, why) if conn.logger_rank == conn.src else Ends(peer, me, why)

    def place(self, conn: ConnectionLine, nnodes: int | None, dpn: int | None) -> tuple[str | None, str | None, str]:
        """(logging end's host, peer's host, why), remembered per question: a log's lines repeat them."""
        key = (conn.host, conn.pid, conn.logger_rank, conn.peer_rank, conn.peer_dev, conn.opened, nnodes, dpn)
        got = self._memo.get(key)
        if got is None:
            recs = self.table.by_proc.get((conn.host, conn.pid)) if conn.host is not None and conn.pid is not None \
                else None
            if recs:
                me: str | None = conn.host
                peer, why = self.peer_host(conn, dpn)
            else:  # no init line from this process (or no prefix): its ranks are read as world ranks
                me = conn.host if conn.host is not None else self.loose_host(conn.logger_rank, nnodes, dpn)[0]
                peer, why = self.loose_host(conn.peer_rank, nnodes, dpn)
            got = (me, peer, why)
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
            self._memo[key] = got
        return got

    def _candidates(self, host: str, pid: int, me: int) -> "_Candidates":
        """The communicators the process is rank ``me`` of, largest first, each as (record, its size, its
        members by rank, what an unlogged rank of it is): a line costs look-ups, not a search of the table."""
        key = (host, pid, me)
        got = self._cands.get(key)
        if got is None:
            entries = []
            for c in sorted(self.table.by_rank.get(key, ()), key=lambda r: -r.nranks):
                gid = self.gid(c)
                every = self._all_local_ranks_seen(gid)  # then an unlogged rank is on another node
                kind = ("local",) if c.nnodes == 1 else ("world", every or gid) if c.nranks == self.world else (
                    ("other",) if every else ("none", gid))
                entries.append((c, c.nranks, self.members.get(gid, {}), kind))
            logged: set[int] | None = set()
            for x in entries:  # the ranks any of them logged, if that is a small set (then most lines skip them)
                if logged is not None and len(logged) + len(x[2]) <= 64 * len(entries):
                    logged.update(x[2])
                else:
                    logged = None
            got = self._cands[key] = _Candidates(entries, [-x[1] for x in entries], logged, {})
        return got

    def peer_host(self, conn: ConnectionLine, dpn: int | None) -> tuple[str | None, str]:
        """The host of the peer of a line printed by a process with init lines."""
        top, me, q = max(conn.src, conn.dst), conn.logger_rank, conn.peer_rank
        cands = self._candidates(conn.host, conn.pid, me)  # type: ignore[arg-type]
        count = bisect.bisect_left(cands.sizes, -top)  # those with more ranks than the line names
        if not count:
            return None, (f"{conn.host}:{conn.pid} printed no init line of a communicator in which it is rank {me} "
                          f"of more than {top} ranks")
        answers: dict[str | None, str] = {}
        fits = cands.entries[:count]
        if cands.logged is not None and q not in cands.logged:  # rank q printed nothing in any of them
            unlogged = cands.unlogged.get((count, conn.opened))
            if unlogged is None:
                within = [x for x in fits if x[0].serial == conn.opened] or fits
                unlogged = cands.unlogged[(count, conn.opened)] = {x[3]: x[0] for x in within}
        else:
            fits = [x for x in fits if x[0].serial == conn.opened] or fits  # connected inside that init, on its thread
            dev = conn.peer_dev
            if len(fits) > 1 and dev is not None:
                fits = [x for x in fits if _device_fits(x[2].get(q), dev)] or fits
            unlogged = {}  # communicators whose rank q printed nothing, by what that means
            for c, _, members, kind in fits:
                seen = members.get(q)
                if seen:
                    hosts = sorted({m.host for m in seen})
                    answers.setdefault(hosts[0] if len(hosts) == 1 else None, "" if len(hosts) == 1 else
                                       f"rank {q} of {comm_label(self.gid(c))} is claimed by processes on {', '.join(hosts[:4])}")
                else:
                    unlogged.setdefault(kind, c)
        for c in unlogged.values():
            host, why = self._host_in(c, q, dpn)
            answers.setdefault(host, why)
        if len(answers) == 1:
            return next(iter(answers.items()))
        hosts = ", ".join(sorted(h or "unknown" for h in answers))
        comms = ", ".join(f"comm {x[0].ptr} ({comm_label(self.gid(x[0]))})" for x in fits[:4])
        return None, (f"{conn.host}:{conn.pid} is rank {me} of {len(fits)} communicators ({comms}) whose rank {q} "
                      f"is on different hosts ({hosts}); NCCL names no communicator on a connection line")

    def _host_in(self, c: Communicator, q: int, dpn: int | None) -> tuple[str | None, str]:
        """The host of rank ``q`` of communicator ``c`` (a member of it runs on ``c.host``)."""
        if q == c.rank or c.nnodes == 1:
            return c.host, ""
        gid = self.gid(c)
        seen = self.members.get(gid, {}).get(q)
        if seen:
            hosts = sorted({m.host for m in seen})
            if len(hosts) == 1:
                return hosts[0], ""
            return None, f"rank {q} of {comm_label(gid)} is claimed by processes on {', '.join(hosts[:4])}"
        world = c.nranks == self.world
        if world and q in self.loose:  # the world's rank, printed by a process without init lines (an excerpt)
            if q not in self.clash:
                return self.loose[q], ""
            return None, f"world rank {q} is claimed by processes on {self.loose[q]}, {self.clash[q]}"
        if self._all_local_ranks_seen(gid):
            return OTHER_NODE, ""
        if dpn and world:  # the world's ranks fill the nodes in order (torchrun, Slurm, vLLM)
            return self._node_host(gid, q, dpn), ""
        return None, f"rank {q} of {comm_label(gid)} printed no init line (is its node's log missing?)"

    def _all_local_ranks_seen(self, gid: tuple) -> bool:
        """Every host of the communicator has as many of its ranks logged as NCCL counted local ranks."""
        done = self._complete.get(gid)
        if done is None:
            count: dict[str, set[int]] = {}
            local: dict[str, int | None] = {}
            for rank, recs in self.members.get(gid, {}).items():
                for m in recs:
                    count.setdefault(m.host, set()).add(rank)
                    local[m.host] = max(local.get(m.host) or 0, m.local_ranks or 0) or None
            done = bool(count) and all(local[h] is not None and len(count[h]) >= (local[h] or 0) for h in count)
            self._complete[gid] = done
        return done

    def _node_host(self, gid: tuple, q: int, dpn: int) -> str:
        """The world's rank ``q`` is on node ``q // devices_per_node``: that node's host, once one of its ranks logged."""
        nodes = self._nodes.get((gid, dpn))
        if nodes is None:
            nodes = {}
            for rank, recs in self.members.get(gid, {}).items():
                if len({m.host for m in recs}) == 1:
                    nodes.setdefault(rank // dpn, recs[0].host)
            self._nodes[(gid, dpn)] = nodes
        return nodes.get(q // dpn, f"<node {q // dpn}>")

    def _world_host(self, rank: int) -> tuple[set[str], str]:
        """The hosts the world-sized communicators' init lines put ``rank`` on (a log of one node whole and
        another's excerpt: the excerpt's processes name the first node's world ranks)."""
        hosts: set[str] = set()
        for gid in self.world_gids[:8]:
            for m in self.members.get(gid, {}).get(rank, ()):
                hosts.add(m.host)
        return hosts, f"world rank {rank} is claimed by processes on {', '.join(sorted(hosts)[:4])}"

    def loose_host(self, rank: int, nnodes: int | None, dpn: int | None) -> tuple[str | None, str]:
        """A world rank's host from the lines of processes that printed no init line (and the world's members)."""
        first = self.loose.get(rank)
        if first is not None:
            if rank not in self.clash:
                return first, ""
            return None, (f"rank {rank} is claimed by processes on {first}, {self.clash[rank]}: the log holds "
                          "several communicators but no init line that tells them apart")
        hosts, why = self._world_host(rank)
        if hosts:
            return (next(iter(hosts)), "") if len(hosts) == 1 else (None, why)
        if nnodes == 1 and self._only_host is not None:
            return self._only_host, ""
        if dpn:
            nodes = self._loose_nodes.get(dpn)
            if nodes is None:
                nodes = self._loose_nodes[dpn] = {}
                for r, h in self.loose.items():
                    if r not in self.clash:
                        nodes.setdefault(r // dpn, h)
            return nodes.get(rank // dpn, f"<node {rank // dpn}>"), ""
        return None, f"rank {rank} printed no line, and no init line says which node it is on"


def _device_fits(seen: list[Communicator] | None, dev: str) -> bool:
    """Whether the processes logged as a communicator's rank can have the GPU a line prints for it (unknown:
    they can): rank[nvmlDev] since NCCL 2.12, rank[busId] (e.g. 1b000) in 2.8-2.11."""
    if not seen:
        return True
    nvml = dev.isdigit() and len(dev) <= 3
    want = dev if nvml else plain_bus(dev)
    return any((m.nvml_dev if nvml else m.bus_id) in (None, want) for m in seen)
