"""The communicators of an ``NCCL_DEBUG=INFO`` log, from their init lines: each process's, and each one's identity across processes.

A job has several NCCL communicators (vLLM: the world, TP, PP, DP and EP groups, made once by torch and
once more by vLLM's pynccl), each numbering its ranks from 0, and a connection line
(``Channel 00/0 : 0[0] -> 1[1] via ...``) names its communicator's ranks without naming the
communicator. A rank therefore means a host only inside one communicator: rank 0 of node B's TP group
is not world rank 0 on node A, and reading it as such turns an inter-node link into an intra-node one.

So the log is read per process (``host:pid``, NCCL's line prefix), keeping each communicator that
process's init lines describe (:class:`Communicator`, in a :class:`CommTable`, with the thread its init
runs on); :mod:`nccl_placement` gives a connection line to the communicators of its process that fit it,
and so tells where its peer runs.

Across processes a communicator is told by its ``commId`` (``ncclCommInitRank``; NCCL >= 2.17; for a
split, 2.21-2.22 print the hash of ``"%016lx-%d"`` of the parent's commHash and the color, init.cc's
``snprintf(&job->commId, ...)``: one per parent and color, so two splits of one parent with one color
share it, and their ranks on different hosts are reported as claimed by both, not resolved), a split
printing none (2.23 on) by its parent's identity, split count and color; lacking both (NCCL < 2.17,
an excerpt without init lines) by its size and node count, and then a rank that processes on two
hosts claim is reported, not resolved (:class:`Identities`).

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

import re
from dataclasses import dataclass, field

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
        split_count=int(count) if count is not None else None, nvml_dev=grab(_NVML), bus_id=plain_bus(grab(_BUS)),
    )


def plain_bus(v: str | None) -> str | None:
    """A busId as kept, so that init and connection lines compare: lower case, no leading zeros."""
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
    _groups: tuple[tuple[int, int, int], dict[tuple, list[Communicator]]] | None = field(
        default=None, init=False, repr=False, compare=False)

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

    def groups(self) -> dict[tuple, list[Communicator]]:
        """Each communicator across processes (by its identity): its members, in the order they were printed.
        Kept until the next line: ``day0 collectives transport`` counts them in its header and lists them in
        its evidence (:meth:`summary`), each time over every record. Shared, so read it, never change it.
        Kept by the table's version and its records list (which a copy may share, or replace)."""
        key = (self.version, id(self.records), len(self.records))
        if self._groups is None or self._groups[0] != key:
            out: dict[tuple, list[Communicator]] = {}
            identity = Identities(self.records).of
            for rec in self.records:
                out.setdefault(identity(rec), []).append(rec)
            self._groups = (key, out)
        return self._groups[1]

    def summary(self, limit: int = 64) -> list[dict[str, object]]:
        """Each communicator (across processes): its identity, size, and the hosts its ranks printed from."""
        out = []
        for gid, recs in list(self.groups().items())[:limit]:
            out.append({"communicator": comm_label(gid), "nranks": recs[0].nranks, "nnodes": recs[0].nnodes,
                        "ranks_logged": len({r.rank for r in recs}), "hosts": sorted({r.host for r in recs})[:64]})
        return out


class Identities:
    """Each communicator's identity across processes (:meth:`of`), remembered per record: a split's holds
    its parent's, so a chain of splits is walked once, not once per member and question."""

    def __init__(self, records: list[Communicator]) -> None:
        self.records = records
        self._gids: dict[int, tuple] = {}

    def of(self, rec: Communicator, depth: int = 0) -> tuple:
        """The communicator's identity across processes."""
        seen = self._gids.get(rec.serial)
        if seen is not None:
            return seen
        if rec.comm_id is not None:
            gid: tuple = ("id", rec.comm_id)
        elif rec.parent is not None and rec.color is not None and depth < MAX_SPLIT_DEPTH:
            gid = ("split", self.of(self.records[rec.parent], depth + 1), rec.split_count, rec.color)
        elif rec.parent is not None or rec.color is not None:  # a split whose parent printed no init line
            gid = ("ptr", f"{rec.host}:{rec.pid}", rec.ptr)
        else:
            gid = ("anon", rec.nranks, rec.nnodes)
        self._gids[rec.serial] = gid
        return gid


def comm_label(gid: tuple) -> str:
    """An identity (:meth:`Identities.of`) as a report names the communicator."""
    if gid[0] == "id":
        return f"commId 0x{gid[1]}"
    if gid[0] == "split":
        return f"split (count {gid[2]}, color {gid[3]}) of {comm_label(gid[1])}"
    if gid[0] == "ptr":
        return f"comm {gid[2]} of {gid[1]}"
    return f"a communicator of {gid[1]} ranks" + (f" on {gid[2]} nodes" if gid[2] is not None else "")
