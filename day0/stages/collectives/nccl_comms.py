"""The communicators of an ``NCCL_DEBUG=INFO`` log: which one a connection line belongs to, and where its peer runs.

A job has several NCCL communicators (vLLM: the world, TP, PP, DP and EP groups, made once by torch and
once more by vLLM's pynccl), each numbering its ranks from 0, and a connection line
(``Channel 00/0 : 0[0] -> 1[1] via ...``) names its communicator's ranks without naming the
communicator. A rank therefore means a host only inside one communicator: rank 0 of node B's TP group
is not world rank 0 on node A, and reading it as such turns an inter-node link into an intra-node one.

So the log is read per process (``host:pid``, NCCL's line prefix), keeping each communicator that
process's init lines describe (:class:`Communicator`). A connection line is then given to the
communicators of its process that fit all of what NCCL prints:

- the ranks: the process is the logging end's rank in it (the sender, the receiver for
  ``[receive]``), and it has more ranks than the line names;
- the thread: before NCCL 2.22, and with ``NCCL_RUNTIME_CONNECT=0``, rings and trees are connected
  inside ``initTransportsRank``, on the thread that printed the communicator's ``Init START`` or
  ``comm ... nRanks`` line and has not yet printed its ``Init COMPLETE``;
- the peer's GPU: connection lines print ``rank[nvmlDev]`` (NCCL >= 2.12; the busId in 2.8-2.11)
  and init lines each rank's ``nvmlDev`` (>= 2.18) and ``busId``;

and when several still fit, the peer's host is known only if they all put it on the same host.
Otherwise :class:`Ends` says why the host cannot be told (``why``): never a guess.

Across processes a communicator is told by its ``commId`` (``ncclCommInitRank``; NCCL >= 2.17), a
split by its parent's identity, split count and color (``ncclCommSplit``; the commId that 2.21-2.22
print for a split is hashed from an all-zero id, the same for every split, so it is ignored); lacking
both (NCCL < 2.17, an excerpt without init lines) by its size and node count, and then a rank that
processes on two hosts claim is reported, not resolved. A communicator of one node (``nNodes 1``)
has every rank on its own host. A process that printed no init line at all is read as the world
(its ranks are world ranks), as logs of one communicator always were.

Lines modelled, from NCCL's src/init.cc and transport/{p2p,shm,net}.cc: ``comm %p rank %d nranks %d
cudaDev %d busId %x - Init COMPLETE`` (2.7-2.16; ``commId 0x%llx`` from 2.17), ``... nvmlDev %d busId
%lx commId 0x%llx - Init START`` / ``COMPLETE`` (2.18-2.20), prefixed ``ncclCommInitRank`` /
``ncclCommSplit ... parent %p color %d key %d commId ...`` (2.21-2.22), ``%s comm %p ...`` with the
function name and, for splits, no commId and ``parent %p [splitCount|childCount %d] color %d key %d``
(2.23-2.29; HEAD prefixes START with ``[Rank %d]``), and ``comm %p rank %d nRanks %d nNodes %d
localRanks %d localRank %d MNNVL %d`` (2.20 on).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Protocol

#: Communicators kept (one per process and communicator): a 10,000-rank job with 20 each is 200,000.
MAX_COMMS = 250_000
MAX_TREE_RANKS = 1_000_000  # (process, rank) pairs of Trees lines, placing ranks of processes with no init line
MAX_SPLIT_DEPTH = 16  # a split of a split of ... : deeper is a log that loops, read as unknown
OTHER_NODE = "<other node>"

_INIT = re.compile(r"comm\s+(?P<ptr>0x[0-9a-fA-F]+)\s+rank\s+(?P<rank>\d+)\s+nranks\s+(?P<nranks>\d+)\s+cudaDev\s+\d+")
_COMM = re.compile(
    r"comm\s+(?P<ptr>0x[0-9a-fA-F]+)\s+rank\s+(?P<rank>\d+)\s+nRanks\s+(?P<nranks>\d+)\s+nNodes\s+(?P<nnodes>\d+)"
    r"\s+localRanks\s+(?P<lranks>\d+)\s+localRank\s+(?P<lrank>\d+)"
)
_COMM_ID = re.compile(r"\bcommId\s+0x(?P<v>[0-9a-fA-F]+)")
_PARENT = re.compile(r"\bparent\s+(?P<v>0x[0-9a-fA-F]+|\(nil\))")
_COLOR = re.compile(r"\bcolor\s+(?P<v>-?\d+)")
_SPLIT_COUNT = re.compile(r"\b(?:splitCount|childCount)\s+(?P<v>\d+)")
_NVML = re.compile(r"\bnvmlDev\s+(?P<v>\d+)")
_BUS = re.compile(r"\bbusId\s+(?P<v>[0-9a-fA-F]+)")


@dataclass(slots=True)
class InitFacts:
    """What one init line says about one process's communicator."""

    ptr: str
    rank: int
    nranks: int
    phase: str  # "start", "comm" (the nRanks/nNodes line), "complete", "" (Destroy/Abort, TRACE)
    nnodes: int | None = None
    local_ranks: int | None = None
    comm_id: str | None = None
    parent: str | None = None
    color: int | None = None
    split_count: int | None = None
    nvml_dev: str | None = None
    bus_id: str | None = None


def init_facts(msg: str) -> InitFacts | None:
    """The facts of an init line (``comm 0x... rank R nRanks N nNodes ...`` or ``... nranks N cudaDev ...``)."""
    c = _COMM.search(msg)
    if c:
        return InitFacts(c["ptr"].lower(), int(c["rank"]), int(c["nranks"]), "comm", int(c["nnodes"]), int(c["lranks"]))
    m = _INIT.search(msg)
    if m is None:
        return None
    phase = "start" if msg.endswith("Init START") else "complete" if msg.endswith("Init COMPLETE") else ""

    def grab(rx: re.Pattern[str]) -> str | None:
        found = rx.search(msg, m.end())
        return found["v"] if found else None

    parent, color, count = grab(_PARENT), grab(_COLOR), grab(_SPLIT_COUNT)
    comm_id = None if parent is not None else grab(_COMM_ID)  # a split's commId is the same for every split
    if comm_id is not None and int(comm_id, 16) == 0:
        comm_id = None
    return InitFacts(
        m["ptr"].lower(), int(m["rank"]), int(m["nranks"]), phase, comm_id=comm_id,
        parent=parent.lower() if parent else None, color=int(color) if color is not None else None,
        split_count=int(count) if count is not None else None, nvml_dev=grab(_NVML), bus_id=_bus(grab(_BUS)),
    )


def _bus(v: str | None) -> str | None:
    return v.lower().lstrip("0") or "0" if v is not None else None


@dataclass(slots=True, eq=False)
class Communicator:
    """One process's member of one communicator, as its init lines describe it."""

    serial: int  # its index in CommTable.records
    host: str
    pid: int
    ptr: str  # "comm 0x...": the communicator's address, unique within the process while it lives
    rank: int
    nranks: int
    nnodes: int | None = None
    local_ranks: int | None = None
    comm_id: str | None = None
    parent: int | None = None  # ncclCommSplit: the serial of the parent communicator in this process
    color: int | None = None
    split_count: int | None = None
    nvml_dev: str | None = None
    bus_id: str | None = None
    where: str = ""  # file:line of its first init line
    completed: bool = False
    open_tid: int | None = None  # the thread its init runs on, until Init COMPLETE

    def agrees(self, f: InitFacts) -> bool:
        """Whether a line about the same address is this communicator (else the address was reused)."""
        return self.rank == f.rank and self.nranks == f.nranks and (f.comm_id is None or self.comm_id in (None, f.comm_id))

    def take(self, f: InitFacts) -> None:
        for name in ("nnodes", "local_ranks", "comm_id", "color", "split_count", "nvml_dev", "bus_id"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(f, name))


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


@dataclass
class CommTable:
    """Every process's communicators, and the thread each one's init is running on."""

    records: list[Communicator] = field(default_factory=list)
    current: dict[tuple[str, int, str], Communicator] = field(default_factory=dict)  # (host, pid, ptr) -> latest
    by_proc: dict[tuple[str, int], list[Communicator]] = field(default_factory=dict)
    opening: dict[tuple[str, int, int], Communicator] = field(default_factory=dict)  # (host, pid, tid) -> in init
    tree_ranks: dict[tuple[str, int, int], None] = field(default_factory=dict)  # (host, pid, rank), in order
    version: int = 0
    _view: "_View | None" = field(default=None, repr=False)

    def note(self, host: str, pid: int, tid: int, f: InitFacts, where: str) -> Communicator | None:
        """Record an init line; None when the table is full (the caller refuses the log)."""
        rec = self.current.get((host, pid, f.ptr))
        if rec is None or not rec.agrees(f):
            if len(self.records) >= MAX_COMMS:
                return None
            parent = self.current.get((host, pid, f.parent)) if f.parent else None
            rec = Communicator(len(self.records), host, pid, f.ptr, f.rank, f.nranks, where=where,
                               parent=parent.serial if parent is not None else None)
            self.records.append(rec)
            self.current[(host, pid, f.ptr)] = rec
            self.by_proc.setdefault((host, pid), []).append(rec)
        rec.take(f)
        if f.phase in ("start", "comm") and not rec.completed:
            self.opening[(host, pid, tid)] = rec
            rec.open_tid = tid
        elif f.phase == "complete":
            rec.completed = True
            if rec.open_tid is not None and self.opening.get((host, pid, rec.open_tid)) is rec:
                del self.opening[(host, pid, rec.open_tid)]
            rec.open_tid = None
        self.version += 1
        return rec

    def opened(self, host: str | None, pid: int | None, tid: int | None) -> int | None:
        """The communicator whose init the thread is running (its serial), if any."""
        if host is None or pid is None or tid is None:
            return None
        rec = self.opening.get((host, pid, tid))
        return rec.serial if rec is not None else None

    def note_tree(self, host: str | None, pid: int | None, rank: int) -> None:
        if host is not None and pid is not None and len(self.tree_ranks) < MAX_TREE_RANKS:
            self.tree_ranks[(host, pid, rank)] = None
            self.version += 1

    def view(self, connections: list[Any]) -> "_View":
        """The index the questions are answered from, rebuilt only after new lines."""
        stamp = (self.version, len(connections))
        if self._view is None or self._view.stamp != stamp:
            self._view = _View(self, stamp, connections)
        return self._view

    def ends(self, conn: ConnectionLine, connections: list[Any], nnodes: int | None,
             devices_per_node: int | None) -> Ends:
        view = self.view(connections)
        recs = self.by_proc.get((conn.host, conn.pid)) if conn.host is not None and conn.pid is not None else None
        if recs:
            me: str | None = conn.host
            peer, why = view.peer_host(conn, recs, devices_per_node)
        else:  # no init line from this process (or no prefix): its ranks are read as world ranks
            me = conn.host if conn.host is not None else view.loose_host(conn.logger_rank, nnodes, devices_per_node)[0]
            peer, why = view.loose_host(conn.peer_rank, nnodes, devices_per_node)
        return Ends(me, peer, why) if conn.logger_rank == conn.src else Ends(peer, me, why)

    def groups(self) -> dict[tuple, list[Communicator]]:
        """Each communicator across processes (by its identity): its members, in the order they were printed."""
        out: dict[tuple, list[Communicator]] = {}
        view = _View(self, (), [])
        for rec in self.records:
            out.setdefault(view.gid(rec), []).append(rec)
        return out

    def summary(self, limit: int = 64) -> list[dict[str, object]]:
        """Each communicator (across processes): its identity, size, and the hosts its ranks printed from."""
        out = []
        for gid, recs in list(self.groups().items())[:limit]:
            out.append({"communicator": _label(gid), "nranks": recs[0].nranks, "nnodes": recs[0].nnodes,
                        "ranks_logged": len({r.rank for r in recs}), "hosts": sorted({r.host for r in recs})[:64]})
        return out


def _label(gid: tuple) -> str:
    if gid[0] == "id":
        return f"commId 0x{gid[1]}"
    if gid[0] == "split":
        return f"split (count {gid[2]}, color {gid[3]}) of {_label(gid[1])}"
    if gid[0] == "ptr":
        return f"comm {gid[2]} of {gid[1]}"
    return f"a communicator of {gid[1]} ranks" + (f" on {gid[2]} nodes" if gid[2] is not None else "")


class _View:
    """Who is which rank of each communicator, built from every process's init lines."""

    def __init__(self, table: CommTable, stamp: tuple, connections: Iterable[Any]) -> None:
        self.table, self.stamp = table, stamp
        self._gids: dict[int, tuple] = {}
        self.members: dict[tuple, dict[int, list[Communicator]]] = {}
        for rec in table.records:
            self.members.setdefault(self.gid(rec), {}).setdefault(rec.rank, []).append(rec)
        self.world = max((r.nranks for r in table.records), default=0)
        self._complete: dict[tuple, bool] = {}
        self._nodes: dict[tuple, dict[int, str]] = {}
        self.loose: dict[int, set[str]] = {}  # rank -> hosts, from processes that printed no init line
        for conn in connections:
            if conn.host is not None and (conn.host, conn.pid) not in table.by_proc:
                self._loose(conn.logger_rank, conn.host)
        for host, pid, rank in table.tree_ranks:
            if (host, pid) not in table.by_proc:
                self._loose(rank, host)

    def _loose(self, rank: int, host: str) -> None:
        hosts = self.loose.setdefault(rank, set())
        if len(hosts) < 4:
            hosts.add(host)

    def gid(self, rec: Communicator, depth: int = 0) -> tuple:
        """The communicator's identity across processes."""
        seen = self._gids.get(rec.serial)
        if seen is not None:
            return seen
        if rec.comm_id is not None:
            gid: tuple = ("id", rec.comm_id)
        elif rec.parent is not None and rec.color is not None and depth < MAX_SPLIT_DEPTH:
            gid = ("split", self.gid(self.table.records[rec.parent], depth + 1), rec.split_count, rec.color)
        elif rec.parent is not None or rec.color is not None:  # a split whose parent printed no init line
            gid = ("ptr", f"{rec.host}:{rec.pid}", rec.ptr)
        else:
            gid = ("anon", rec.nranks, rec.nnodes)
        self._gids[rec.serial] = gid
        return gid

    def peer_host(self, conn: ConnectionLine, recs: list[Communicator], dpn: int | None) -> tuple[str | None, str]:
        """The host of the peer of a line printed by a process with these communicators."""
        top, me, q = max(conn.src, conn.dst), conn.logger_rank, conn.peer_rank
        fits = [c for c in recs if c.rank == me and c.nranks > top]
        if not fits:
            return None, (f"{conn.host}:{conn.pid} printed no init line of a communicator in which it is rank {me} "
                          f"of more than {top} ranks")
        fits = [c for c in fits if c.serial == conn.opened] or fits  # connected inside that init, on its thread
        if len(fits) > 1:
            fits = [c for c in fits if self._device_fits(c, q, conn.peer_dev)] or fits
        answers: dict[str | None, str] = {}
        for c in fits:
            host, why = self._host_in(c, q, dpn)
            answers.setdefault(host, why)
        if len(answers) == 1:
            return next(iter(answers.items()))
        hosts = ", ".join(sorted(h or "unknown" for h in answers))
        comms = ", ".join(f"comm {c.ptr} ({_label(self.gid(c))})" for c in fits[:4])
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
            return None, f"rank {q} of {_label(gid)} is claimed by processes on {', '.join(hosts[:4])}"
        if self._all_local_ranks_seen(gid):
            return OTHER_NODE, ""
        if dpn and c.nranks == self.world:  # the world's ranks fill the nodes in order (torchrun, Slurm, vLLM)
            return self._node_host(gid, q, dpn), ""
        return None, f"rank {q} of {_label(gid)} printed no init line (is its node's log missing?)"

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

    def _device_fits(self, c: Communicator, q: int, dev: str | None) -> bool:
        """Whether rank ``q`` of ``c`` can have the GPU the line prints for the peer (unknown: it can)."""
        seen = self.members.get(self.gid(c), {}).get(q)
        if dev is None or not seen:
            return True
        nvml = dev.isdigit() and len(dev) <= 3  # rank[nvmlDev] since 2.12, rank[busId] (e.g. 1b000) in 2.8-2.11
        want = dev if nvml else _bus(dev)
        return any((m.nvml_dev if nvml else m.bus_id) in (None, want) for m in seen)

    def loose_host(self, rank: int, nnodes: int | None, dpn: int | None) -> tuple[str | None, str]:
        """A world rank's host from the lines of processes that printed no init line."""
        hosts = self.loose.get(rank)
        if hosts:
            if len(hosts) == 1:
                return next(iter(hosts)), ""
            return None, (f"rank {rank} is claimed by processes on {', '.join(sorted(hosts))}: the log holds several "
                          "communicators but no init line that tells them apart")
        every = {h for hs in self.loose.values() for h in hs}
        if nnodes == 1 and len(every) == 1:
            return next(iter(every)), ""
        if dpn:
            node = rank // dpn
            for r, hs in self.loose.items():
                if r // dpn == node and len(hs) == 1:
                    return next(iter(hs)), ""
            return f"<node {node}>", ""
        return None, f"rank {rank} printed no line, and no init line says which node it is on"
