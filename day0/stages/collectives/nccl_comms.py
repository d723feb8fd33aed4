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

Across processes a communicator is told by its ``commId`` (``ncclCommInitRank``; NCCL >= 2.17; for a
split, 2.21-2.22 print the hash of ``"%016lx-%d"`` of the parent's commHash and the color, init.cc's
``snprintf(&job->commId, ...)``: one per parent and color, so two splits of one parent with one color
share it, and their ranks on different hosts are reported as claimed by both, not resolved), a split
printing none (2.23 on) by its parent's identity, split count and color; lacking both (NCCL < 2.17,
an excerpt without init lines) by its size and node count, and then a rank that processes on two
hosts claim is reported, not resolved. A communicator of one node (``nNodes 1``) has every rank on
its own host. A process that printed no init line at all is read as the world (its ranks are world
ranks), as logs of one communicator always were; the world's ranks it does not print are looked up
in the world-sized communicators' members, and theirs in its lines.

A process's record of a communicator ends at its ``Destroy COMPLETE`` / ``Abort COMPLETE`` line (and
at an ``Init START`` on an address whose init completed): NCCL frees the address, and the next
communicator (a split of another color, say) may be given it. Addresses and commIds are what
``%p``/``%llx`` print, at most 16 hex digits; the communicators of a process, and of one rank of a
process, are capped (a real process has tens), so the time to place a connection and the table's
memory follow the job, not what a log claims.

Lines modelled, from NCCL's src/init.cc and transport/{p2p,shm,net}.cc: ``comm %p rank %d nranks %d
cudaDev %d busId %x - Init COMPLETE`` (2.7-2.16; ``commId 0x%llx`` from 2.17), ``... nvmlDev %d busId
%lx commId 0x%llx - Init START`` / ``COMPLETE`` (2.18-2.20), prefixed ``ncclCommInitRank`` /
``ncclCommSplit ... parent %p color %d key %d commId ...`` (2.21-2.22), ``%s comm %p ...`` with the
function name and, for splits, no commId and ``parent %p [splitCount|childCount %d] color %d key %d``
(2.23-2.29; HEAD prefixes START with ``[Rank %d]``), and ``comm %p rank %d nRanks %d nNodes %d
localRanks %d localRank %d MNNVL %d`` (2.20 on).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Protocol

#: Communicators kept (one per process and communicator): a 10,000-rank job with 20 each is 200,000.
MAX_COMMS = 250_000
#: ... of one process, and of one rank of one process (vLLM: tens, with torch's and pynccl's each, and
#: the groups re-made after a destroy). Placing a line costs the communicators its process is that rank of.
MAX_COMMS_PER_PROCESS = 1024
MAX_COMMS_PER_RANK = 64
#: Trees lines name the printing rank (``->me->``), one per communicator: the ranks of one process are capped
#: as its communicators are, and all processes' together.
MAX_TREE_RANKS = 1_000_000
MAX_SPLIT_DEPTH = 16  # a split of a split of ... : deeper is a log that loops, read as unknown
MAX_MEMO = 200_000  # placed (process, ranks, device, init) questions remembered
OTHER_NODE = "<other node>"

_N = r"\d{1,10}"  # a rank or a count: an int; more digits is not NCCL's (and int() of 5,000 digits raises)
_INIT = re.compile(rf"comm\s+(?P<ptr>0x[0-9a-fA-F]+)\s+rank\s+(?P<rank>{_N})\s+nranks\s+(?P<nranks>{_N})\s+cudaDev\s+\d")
_COMM = re.compile(
    rf"comm\s+(?P<ptr>0x[0-9a-fA-F]+)\s+rank\s+(?P<rank>{_N})\s+nRanks\s+(?P<nranks>{_N})\s+nNodes\s+(?P<nnodes>{_N})"
    rf"\s+localRanks\s+(?P<lranks>{_N})\s+localRank\s+{_N}\b"
)
_COMM_ID = re.compile(r"\bcommId\s+(?P<v>0x[0-9a-fA-F]+)")
_PARENT = re.compile(r"\bparent\s+(?P<v>0x[0-9a-fA-F]+|\(nil\))")
_COLOR = re.compile(rf"\bcolor\s+(?P<v>-?{_N})\b")
_SPLIT_COUNT = re.compile(rf"\b(?:splitCount|childCount)\s+(?P<v>{_N})\b")
_NVML = re.compile(rf"\bnvmlDev\s+(?P<v>{_N})\b")
_BUS = re.compile(r"\bbusId\s+(?P<v>[0-9a-fA-F]{1,16})\b")
_ADDR = re.compile(r"0x[0-9a-fA-F]{1,16}")  # %p, 0x%llx: 64 bits


class CommLineError(ValueError):
    """An init line that NCCL cannot have printed (the caller refuses the log at its file and line)."""


@dataclass(slots=True)
class InitFacts:
    """What one init line says about one process's communicator."""

    ptr: str
    rank: int
    nranks: int
    phase: str  # "start", "comm" (the nRanks/nNodes line), "complete", "end" (Destroy/Abort), "" (TRACE)
    nnodes: int | None = None
    local_ranks: int | None = None
    comm_id: str | None = None
    parent: str | None = None
    color: int | None = None
    split_count: int | None = None
    nvml_dev: str | None = None
    bus_id: str | None = None


def _addr(v: str, what: str) -> str:
    """An address or commId as kept: refused past 64 bits, since a longer one is no NCCL line and each kept
    string would cost its length."""
    if not _ADDR.fullmatch(v):
        raise CommLineError(f"{what} {v[:40]}{'...' if len(v) > 40 else ''} has more than 16 hex digits: "
                            "NCCL prints a 64-bit value there; not an NCCL line")
    return v.lower()


def init_facts(msg: str) -> InitFacts | None:
    """The facts of an init line (``comm 0x... rank R nRanks N nNodes ...`` or ``... nranks N cudaDev ...``);
    :class:`CommLineError` for one whose address or commId NCCL cannot have printed."""
    c = _COMM.search(msg)
    if c:
        return InitFacts(_addr(c["ptr"], "comm"), int(c["rank"]), int(c["nranks"]), "comm", int(c["nnodes"]),
                         int(c["lranks"]))
    m = _INIT.search(msg)
    if m is None:
        return None
    tail = msg[-16:]
    phase = ("start" if tail.endswith("Init START") else "complete" if tail.endswith("Init COMPLETE")
             else "end" if tail.endswith(("Destroy COMPLETE", "Abort COMPLETE")) else "")

    def grab(rx: re.Pattern[str]) -> str | None:
        found = rx.search(msg, m.end())
        return found["v"] if found else None

    parent, color, count, comm_id = grab(_PARENT), grab(_COLOR), grab(_SPLIT_COUNT), grab(_COMM_ID)
    comm_id = _addr(comm_id, "commId")[2:] if comm_id is not None else None
    if comm_id is not None and int(comm_id, 16) == 0:
        comm_id = None
    return InitFacts(
        _addr(m["ptr"], "comm"), int(m["rank"]), int(m["nranks"]), phase, comm_id=comm_id,
        parent=_addr(parent, "parent") if parent and parent != "(nil)" else None,
        color=int(color) if color is not None else None,
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

    def agrees(self, f: InitFacts, parent: int | None) -> bool:
        """Whether a line about the same address is this communicator (else the address was reused): every
        identity both print is the same (a split's parent, color and count too: 2.23 on print no commId)."""
        return (self.rank == f.rank and self.nranks == f.nranks and _same(self.comm_id, f.comm_id)
                and _same(self.parent, parent) and _same(self.color, f.color)
                and _same(self.split_count, f.split_count))

    def take(self, f: InitFacts) -> None:
        for name in ("nnodes", "local_ranks", "comm_id", "color", "split_count", "nvml_dev", "bus_id"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(f, name))


def _same(a: object, b: object) -> bool:
    return a is None or b is None or a == b


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
    current: dict[tuple[str, int, str], Communicator] = field(default_factory=dict)  # (host, pid, ptr) -> live
    by_proc: dict[tuple[str, int], list[Communicator]] = field(default_factory=dict)
    by_rank: dict[tuple[str, int, int], list[Communicator]] = field(default_factory=dict)  # (host, pid, rank)
    opening: dict[tuple[str, int, int], Communicator] = field(default_factory=dict)  # (host, pid, tid) -> in init
    tree_ranks: dict[tuple[str, int], dict[int, None]] = field(default_factory=dict)  # process -> its ranks
    tree_count: int = 0
    version: int = 0
    _view: "_View | None" = field(default=None, repr=False)

    def note(self, host: str, pid: int, tid: int, f: InitFacts) -> str | None:
        """Record an init line; the reason to refuse the log when a cap is passed, else None."""
        self.version += 1
        key = (host, pid, f.ptr)
        rec = self.current.get(key)
        if f.phase == "end":  # the address is free: a later init at it is another communicator
            if rec is not None:
                self._end(rec)
            return None
        parent = self.current.get((host, pid, f.parent)) if f.parent else None
        pserial = parent.serial if parent is not None else None
        if rec is None or (rec.completed and f.phase == "start") or not rec.agrees(f, pserial):
            if rec is not None:
                self._end(rec)
            why = self._room(host, pid, f.rank)
            if why:
                return why
            rec = Communicator(len(self.records), host, pid, f.ptr, f.rank, f.nranks, parent=pserial)
            self.records.append(rec)
            self.current[key] = rec
            self.by_proc.setdefault((host, pid), []).append(rec)
            self.by_rank.setdefault((host, pid, f.rank), []).append(rec)
        rec.take(f)
        if f.phase in ("start", "comm") and not rec.completed:
            self.opening[(host, pid, tid)] = rec
            rec.open_tid = tid
        elif f.phase == "complete":
            rec.completed = True
            self._close(rec)
        return None

    def _room(self, host: str, pid: int, rank: int) -> str:
        """Why another communicator of this process (at this rank) is refused, or ''."""
        if len(self.records) >= MAX_COMMS:
            return f"more than {MAX_COMMS} communicators (processes x communicators): not one NCCL job's log"
        if len(self.by_proc.get((host, pid), ())) >= MAX_COMMS_PER_PROCESS:
            return f"more than {MAX_COMMS_PER_PROCESS} communicators in process {host}:{pid}: not one NCCL job's log"
        if len(self.by_rank.get((host, pid, rank), ())) >= MAX_COMMS_PER_RANK:
            return (f"more than {MAX_COMMS_PER_RANK} communicators in which process {host}:{pid} is rank {rank}: "
                    "not one NCCL job's log")
        return ""

    def _close(self, rec: Communicator) -> None:
        """Its init is over: lines on its thread are no longer its."""
        if rec.open_tid is not None and self.opening.get((rec.host, rec.pid, rec.open_tid)) is rec:
            del self.opening[(rec.host, rec.pid, rec.open_tid)]
        rec.open_tid = None

    def _end(self, rec: Communicator) -> None:
        """Destroyed (or its address reused): kept for the lines it printed, no longer found by its address."""
        self._close(rec)
        if self.current.get((rec.host, rec.pid, rec.ptr)) is rec:
            del self.current[(rec.host, rec.pid, rec.ptr)]

    def opened(self, host: str | None, pid: int | None, tid: int | None) -> int | None:
        """The communicator whose init the thread is running (its serial), if any."""
        if host is None or pid is None or tid is None:
            return None
        rec = self.opening.get((host, pid, tid))
        return rec.serial if rec is not None else None

    def note_tree(self, host: str | None, pid: int | None, rank: int) -> str | None:
        """A Trees line's own rank (``->me->``); the reason to refuse past the caps, else None."""
        if host is None or pid is None:
            return None
        ranks = self.tree_ranks.setdefault((host, pid), {})
        if rank in ranks:
            return None
        if len(ranks) >= MAX_COMMS_PER_PROCESS or self.tree_count >= MAX_TREE_RANKS:
            return (f"Trees lines of {host}:{pid} name more than {len(ranks)} ranks of its own (one per communicator): "
                    "not one NCCL job's log")
        ranks[rank] = None
        self.tree_count += 1
        self.version += 1
        return None

    def view(self, connections: list[Any]) -> "_View":
        """The index the questions are answered from, rebuilt only after new lines."""
        stamp = (self.version, len(connections))
        if self._view is None or self._view.stamp != stamp:
            self._view = _View(self, stamp, connections)
        return self._view

    def ends(self, conn: ConnectionLine, connections: list[Any], nnodes: int | None,
             devices_per_node: int | None) -> Ends:
        me, peer, why = self.view(connections).place(conn, nnodes, devices_per_node)
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


class _Candidates(NamedTuple):
    """One process's communicators of one rank of it (see :meth:`_View._candidates`)."""

    entries: list[tuple]  # (record, nranks, members by rank, kind), largest first
    sizes: list[int]  # -nranks of each, ascending, for bisect
    logged: set[int] | None  # every rank logged in any of them; None where too many to keep
    unlogged: dict[tuple, dict[tuple, Communicator]]  # (how many fit, init) -> kind -> a communicator of it


class _View:
    """Who is which rank of each communicator, built from every process's init lines."""

    def __init__(self, table: CommTable, stamp: tuple, connections: Iterable[Any]) -> None:
        self.table, self.stamp = table, stamp
        self._gids: dict[int, tuple] = {}
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
                                       f"rank {q} of {_label(self.gid(c))} is claimed by processes on {', '.join(hosts[:4])}")
                else:
                    unlogged.setdefault(kind, c)
        for c in unlogged.values():
            host, why = self._host_in(c, q, dpn)
            answers.setdefault(host, why)
        if len(answers) == 1:
            return next(iter(answers.items()))
        hosts = ", ".join(sorted(h or "unknown" for h in answers))
        comms = ", ".join(f"comm {x[0].ptr} ({_label(self.gid(x[0]))})" for x in fits[:4])
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
        world = c.nranks == self.world
        if world and q in self.loose:  # the world's rank, printed by a process without init lines (an excerpt)
            if q not in self.clash:
                return self.loose[q], ""
            return None, f"world rank {q} is claimed by processes on {self.loose[q]}, {self.clash[q]}"
        if self._all_local_ranks_seen(gid):
            return OTHER_NODE, ""
        if dpn and world:  # the world's ranks fill the nodes in order (torchrun, Slurm, vLLM)
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
    want = dev if nvml else _bus(dev)
    return any((m.nvml_dev if nvml else m.bus_id) in (None, want) for m in seen)
