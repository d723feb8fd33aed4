"""Parser for ``NCCL_DEBUG=INFO`` logs: the transport of every channel connection, and the topology.

The log says which transport each channel connection used (``via P2P/CUMEM``,
``via SHM/direct/direct``, ``[send] via NET/IB/0``, ``via NET/Socket/0``), the rings and trees,
and the topology search result (``Pattern 4, ..., type NVL/PIX``). A node whose NVLink or
InfiniBand is misconfigured still runs, only slower, through SHM or sockets: the log is the only
place that says so. Formats follow NCCL's ``transport/{p2p,shm,net}.cc``, ``graph/search.cc``
and ``init.cc``, of any version since 2.7.

A job has several communicators (the world, vLLM's TP/PP/DP/EP groups), each numbering its ranks
from 0, and a connection line names its communicator's ranks only: :mod:`nccl_comms` keeps each
process's communicators from their init lines and :mod:`nccl_placement` places a connection's two ends
by them (:meth:`NcclDebugLog.ends`), saying why where the log cannot tell.

Logs come from every rank of a job, so they are big and are read without trusting them: a file
is streamed under the caps of :mod:`inputs`, connections are kept once per (ranks, side,
transport, process, communicator in init) with a count and the channels that used it, and
communicators once per process, so memory follows the ranks, links and communicators of the job,
not the lines of the file; a log that contradicts itself (two NCCL versions)
or names impossible channels is refused with its file and line, since no verdict drawn from it
could be trusted.
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

from day0.stages.collectives.inputs import UNREADABLE_LOG, InputError, iter_lines
from day0.stages.collectives.nccl_comms import CommLineError, CommTable, init_facts
from day0.stages.collectives.nccl_placement import CommView, Ends

# "host:pid:tid [dev] NCCL INFO message"; the prefix is optional (NCCL_DEBUG_FILE keeps it, a
# grep'ed excerpt may not).
_PREFIX = re.compile(r"^\s*(?P<host>[^\s:]+):(?P<pid>\d{1,10}):(?P<tid>\d{1,10})\s+\[(?P<dev>[^\]]*)\]\s+NCCL\s+(?P<level>INFO|WARN|TRACE)\s+(?P<msg>.*)$")
_BARE = re.compile(r"^\s*NCCL\s+(?P<level>INFO|WARN|TRACE)\s+(?P<msg>.*)$")
# Connection lines. NCCL >= 2.12: "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read";
# 2.8-2.11: "Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC"; <= 2.7: "Ring 00 : 0 -> 1 [send] via NET/IB/0".
_CONN = re.compile(
    r"^(?:Channel|Ring)\s+(?P<ch>\d{1,10})(?:/(?P<ci>\d{1,10}))?\s*:\s*"
    r"(?P<src>\d{1,10})(?:\[(?P<srcdev>[0-9a-fA-Fx]{1,18})\])?\s*->\s*"
    r"(?P<dst>\d{1,10})(?:\[(?P<dstdev>[0-9a-fA-Fx]{1,18})\])?"
    r"(?:\s*\[(?P<side>send|receive)\])?\s+via\s+(?P<via>.+?)\s*$"
)
# Ring order: "Channel 00/02 :    0   1   2   3" (no arrow, only ranks).
_RING = re.compile(r"^(?:Channel|Ring)\s+(?P<ch>\d{1,10})(?:/(?P<nch>\d{1,10}))?\s*:\s*"
                   r"(?P<ranks>-?\d{1,10}(?:\s+-?\d{1,10})*)\s*$")
# Trees: "Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1"
_TREE_ITEM = re.compile(r"\[(?P<ch>\d{1,10})\]\s+(?P<d0>-?\d{1,10})/(?P<d1>-?\d{1,10})/(?P<d2>-?\d{1,10})"
                        r"->(?P<me>-?\d{1,10})->(?P<up>-?\d{1,10})\b")
_PATTERN = re.compile(
    r"^Pattern\s+(?P<pattern>\d{1,10}),\s*crossNic\s+(?P<crossnic>\d{1,10}),\s*nChannels\s+(?P<nch>\d{1,10})"
    r"(?:,\s*(?:bw|speed)\s+(?P<bwi>[\d.]+)/(?P<bwo>[\d.]+))?"
    r"(?:,\s*type\s+(?P<ti>[A-Za-z0-9]+)/(?P<to>[A-Za-z0-9]+))?"
)
_VERSION = re.compile(r"^NCCL version\s+(?P<v>\S+)")
_USING_NET = re.compile(r"Using network\s+(?P<net>.+?)\s*$")

#: Path types NCCL prints in Pattern lines that mean the intra-node path is NVLink (or local).
NVLINK_PATH_TYPES = frozenset({"NVL", "NVB", "C2C", "LOC"})


#: Bounds on what one log may hold: far above a 10,000-rank job, far below what exhausts memory.
MAX_CHANNEL = 1024  # NCCL has at most 64 channels (MAXCHANNELS) today
MAX_GROUPS = 500_000  # distinct connections (rank pair, side, transport, host) and topology patterns
MAX_TREES = 256  # tree entries kept as evidence (their ranks' hosts are all kept)
MAX_RINGS, MAX_RING_RANKS = 64, 4096  # ring orders kept as evidence: channels, ranks of each
MAX_WARNINGS = 50


class NcclLogError(InputError):
    """An NCCL_DEBUG log that cannot be judged; ``str()`` names the file and line."""


@dataclass(slots=True)
class Connection:
    """One channel connection as NCCL set it up, kept once however many channels (lines) used it."""

    channel: int  # the first channel seen
    conn_index: int | None
    src: int
    dst: int
    src_dev: str | None
    dst_dev: str | None
    side: str | None  # "send" / "receive" for NET lines, None for P2P/SHM (always the sender's line)
    via: str  # everything after "via ": "P2P/CUMEM/read", "NET/IB/0/GDRDMA", "SHM/direct/direct"
    host: str | None  # the host of the process that logged the line
    line_no: int  # the first line
    line: str
    count: int = 1  # lines (channels x connection indices) that set this connection up
    channels: int = 0  # bit c set: channel c used it
    pid: int | None = None  # the process that logged it (None without a prefix)
    opened: int | None = None  # the communicator whose init its thread was running (CommTable serial)

    @property
    def transport(self) -> str:
        """P2P, SHM, NET, NVLS, COLLNET (upper case): the first component of ``via``."""
        return self.via.split("/", 1)[0].strip().upper()

    @property
    def net(self) -> str | None:
        """For NET connections the network plugin name: IB, Socket, AWS Libfabric, ..."""
        if self.transport != "NET":
            return None
        parts = self.via.split("/")
        return parts[1].strip() if len(parts) > 1 else ""

    @property
    def logger_rank(self) -> int:
        """The rank whose process printed the line: the receiver for [receive], else the sender."""
        return self.dst if self.side == "receive" else self.src

    @property
    def peer_rank(self) -> int:
        """The other end: the rank whose host the communicator must tell."""
        return self.src if self.side == "receive" else self.dst

    @property
    def peer_dev(self) -> str | None:
        """The peer's GPU as the line prints it: nvmlDev (NCCL >= 2.12) or busId (2.8-2.11)."""
        return self.src_dev if self.side == "receive" else self.dst_dev

    @property
    def channel_list(self) -> list[int]:
        return [c for c in range(self.channels.bit_length()) if self.channels >> c & 1]


@dataclass(slots=True)
class GraphPattern:
    pattern: int
    cross_nic: int
    nchannels: int
    bw_intra: float | None
    bw_inter: float | None
    type_intra: str | None
    type_inter: str | None
    host: str | None
    line_no: int
    line: str
    count: int = 1  # ranks (lines) that printed the same search result on this host


@dataclass
class NcclDebugLog:
    """Everything the transport checks need from a (possibly multi-process, multi-node) log."""

    connections: list[Connection] = field(default_factory=list)
    rings: dict[int, list[int]] = field(default_factory=dict)  # channel -> rank order
    trees: list[dict[str, Any]] = field(default_factory=list)  # {rank, channel, up, down}, the first MAX_TREES
    patterns: list[GraphPattern] = field(default_factory=list)
    comms: CommTable = field(default_factory=CommTable)  # every process's communicators
    nranks: int | None = None  # the largest communicator's (the world's), whatever printed last
    nnodes: int | None = None  # ... and its node count
    versions: list[str] = field(default_factory=list)  # distinct, in the order seen
    networks: list[str] = field(default_factory=list)  # "Using network IB", distinct
    nvls: bool = False
    warnings: list[str] = field(default_factory=list)  # the first MAX_WARNINGS
    warning_count: int = 0
    lines: int = 0
    nccl_lines: int = 0  # lines NCCL printed (INFO/WARN/TRACE)
    _index: dict[tuple, Any] = field(default_factory=dict, repr=False)  # group key -> Connection/GraphPattern
    _version_at: str = field(default="", repr=False)  # where the first version was printed
    _view: CommView | None = field(default=None, repr=False, compare=False)  # what ends() answers from

    def ends(self, conn: Connection, devices_per_node: int | None = None) -> Ends:
        """The hosts of a connection's two ends, each placed by the communicator of the line.

        The logging end is the host that printed the line; the peer is that communicator's rank, on
        the host whose process logged it, else inferred (``<other node>`` when every host of the
        communicator has all its local ranks logged, ``<node k>`` for the world's rank by
        ``devices_per_node``), else None with ``why``. A log often holds one node's processes only
        (each node writes its own NCCL_DEBUG_FILE): the other nodes' ranks never print a line.
        """
        stamp = (self.comms.version, len(self.connections))
        if self._view is None or self._view.stamp != stamp:  # rebuilt only after new lines
            self._view = CommView(self.comms, stamp, self.connections)
        return self._view.ends(conn, self.nnodes, devices_per_node)

    def to_dict(self) -> dict[str, Any]:
        return {
            "connections": sum(c.count for c in self.connections),
            "rings": {str(k): v[:1024] for k, v in sorted(self.rings.items())},
            "trees": self.trees[:MAX_TREES],
            "patterns": [asdict(p) for p in self.patterns[:64]],
            "communicators": self.comms.summary(),
            "processes": len(self.comms.by_proc),
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "versions": sorted(set(self.versions)),
            "networks": sorted(set(self.networks)),
            "nvls": self.nvls,
            "warnings": self.warnings[:MAX_WARNINGS],
            "warning_count": self.warning_count,
        }


class _Line(NamedTuple):
    """One NCCL line: the host, pid and thread of the process that logged it (None without a
    prefix), its number, the raw text, the message after ``NCCL INFO``, and the file it came from."""

    host: str | None
    n: int
    raw: str
    msg: str
    where: str
    pid: int | None = None
    tid: int | None = None


def _feed(log: NcclDebugLog, where: str, n: int, raw: str) -> None:
    """Read one line of a log into ``log`` (the first reader that knows the line takes it)."""
    log.lines += 1
    if raw.startswith(UNREADABLE_LOG):  # nccl_log_text's stand-in for a rank log it could not read
        _, path, problem = (raw.split("\t", 2) + ["", ""])[:3]
        raise NcclLogError(path, problem)
    m = _PREFIX.match(raw)
    pid = tid = None
    if m:
        host, level, msg = sys.intern(m["host"]), m["level"], m["msg"].strip()
        pid, tid = int(m["pid"]), int(m["tid"])
    else:
        b = _BARE.match(raw)
        if not b:
            return
        host, level, msg = None, b["level"], b["msg"].strip()
    log.nccl_lines += 1
    if level == "WARN":
        log.warning_count += 1
        if len(log.warnings) < MAX_WARNINGS:
            log.warnings.append(raw.strip()[:500])
        return
    line = _Line(host, n, raw, msg, where, pid, tid)
    try:
        for read in _READERS:
            if read(log, line):
                break
    except NcclLogError:
        raise
    except ValueError as exc:  # a number no NCCL prints (the regexes bound digits; this is the backstop)
        raise NcclLogError(where, f"{str(exc)[:200]}: not an NCCL line", n) from None


def parse_nccl_debug_lines(lines: Iterable[tuple[int, str]], *, where: str = "<log>",
                           log: NcclDebugLog | None = None) -> NcclDebugLog:
    """Parse numbered lines of NCCL_DEBUG=INFO output of one or many processes (interleaved is fine)."""
    log = log if log is not None else NcclDebugLog()
    for n, raw in lines:
        _feed(log, where, n, raw)
    return log


def parse_nccl_debug(text: str) -> NcclDebugLog:
    """Parse NCCL_DEBUG=INFO output held in memory (see :func:`parse_nccl_debug_lines`)."""
    return parse_nccl_debug_lines(enumerate(text.splitlines(), 1))


def read_nccl_debug(paths: Iterable[Path | str]) -> NcclDebugLog:
    """One log from the files of every node (NCCL_DEBUG_FILE per process or per node), streamed.

    Each file must hold NCCL lines: a file without any is not an NCCL_DEBUG log, and is refused
    rather than read as a log in which nothing was connected.
    """
    log = NcclDebugLog()
    for path in paths:
        before = log.nccl_lines
        parse_nccl_debug_lines(iter_lines(path), where=str(path), log=log)
        if log.nccl_lines == before:
            raise NcclLogError(path, "no 'NCCL INFO' or 'NCCL WARN' line: not an NCCL_DEBUG=INFO log")
    return log


def _group(log: NcclDebugLog, line: _Line, key: tuple) -> Any:
    """The connection or pattern already kept under ``key``, or None; refuses past MAX_GROUPS."""
    seen = log._index.get(key)
    if seen is None and len(log._index) >= MAX_GROUPS:
        raise NcclLogError(line.where, f"more than {MAX_GROUPS} distinct connections and topology patterns: not "
                                       "one NCCL job's log (split it by job)", line.n)
    return seen


def _channel(ch: str, line: _Line) -> int:
    c = int(ch)
    if c >= MAX_CHANNEL:
        raise NcclLogError(line.where, f"channel {c}: NCCL has at most {MAX_CHANNEL} channels; not an NCCL line",
                           line.n)
    return c


def _read_connection(log: NcclDebugLog, line: _Line) -> bool:
    c = _CONN.match(line.msg)
    if not c:
        return False
    ch = _channel(c["ch"], line)
    src, dst, via = int(c["src"]), int(c["dst"]), sys.intern(c["via"])
    opened = log.comms.opened(line.host, line.pid, line.tid)
    key = ("conn", src, dst, c["side"], via, line.host, line.pid, opened)
    conn = _group(log, line, key)
    if conn is None:
        conn = Connection(
            channel=ch, conn_index=int(c["ci"]) if c["ci"] is not None else None, src=src, dst=dst,
            src_dev=c["srcdev"], dst_dev=c["dstdev"], side=c["side"], via=via, host=line.host, line_no=line.n,
            line=line.raw.strip()[:300], count=0, pid=line.pid, opened=opened,
        )
        log._index[key] = conn
        log.connections.append(conn)
    conn.count += 1
    conn.channels |= 1 << ch
    return True


def _read_ring(log: NcclDebugLog, line: _Line) -> bool:
    r = _RING.match(line.msg)
    if r:
        ch = _channel(r["ch"], line)
        if ch not in log.rings and len(log.rings) < MAX_RINGS:
            log.rings[ch] = [int(x) for x in r["ranks"].split(maxsplit=MAX_RING_RANKS)[:MAX_RING_RANKS]]
    return r is not None


def _read_trees(log: NcclDebugLog, line: _Line) -> bool:
    if not line.msg.startswith("Trees"):
        return False
    for t in _TREE_ITEM.finditer(line.msg):
        me = int(t["me"])
        if len(log.trees) < MAX_TREES:
            log.trees.append(
                {
                    "rank": me,
                    "channel": int(t["ch"]),
                    "up": int(t["up"]),
                    "down": [int(t[k]) for k in ("d0", "d1", "d2") if int(t[k]) >= 0],
                }
            )
        why = log.comms.note_tree(line.host, line.pid, me)
        if why:
            raise NcclLogError(line.where, why, line.n)
    return True


def _read_pattern(log: NcclDebugLog, line: _Line) -> bool:
    p = _PATTERN.match(line.msg)
    if not p:
        return False
    key = ("pattern", p["pattern"], p["crossnic"], p["nch"], p["ti"], p["to"], line.host)
    seen = _group(log, line, key)
    if seen is not None:
        seen.count += 1
        return True
    pattern = GraphPattern(
        pattern=int(p["pattern"]),
        cross_nic=int(p["crossnic"]),
        nchannels=int(p["nch"]),
        bw_intra=float(p["bwi"]) if p["bwi"] else None,
        bw_inter=float(p["bwo"]) if p["bwo"] else None,
        type_intra=p["ti"],
        type_inter=p["to"],
        host=line.host,
        line_no=line.n,
        line=line.raw.strip()[:300],
    )
    log._index[key] = pattern
    log.patterns.append(pattern)
    return True


def _read_init(log: NcclDebugLog, line: _Line) -> bool:
    """An init line: the communicator's size for the log, and the process's member of it for the table."""
    try:
        f = init_facts(line.msg)
    except CommLineError as exc:
        raise NcclLogError(line.where, str(exc), line.n) from None
    if f is None:
        return False
    if log.nranks is None or f.nranks > log.nranks:
        log.nranks, log.nnodes = f.nranks, f.nnodes
    elif f.nranks == log.nranks and f.nnodes is not None:
        log.nnodes = max(log.nnodes or 0, f.nnodes)
    if line.host is not None and line.pid is not None and line.tid is not None:
        why = log.comms.note(line.host, line.pid, line.tid, f)
        if why:
            raise NcclLogError(line.where, f"{why} (split it by job)", line.n)
    return True


def _read_version(log: NcclDebugLog, line: _Line) -> bool:
    """NCCL's version, once per process; two different ones are two builds in one job, or two jobs."""
    v = _VERSION.match(line.msg)
    if v is None:
        return False
    version = v["v"]
    if not log.versions:
        log._version_at = f"{line.where}:{line.n}"
    elif version not in log.versions and version.split("+")[0] != log.versions[0].split("+")[0]:
        raise NcclLogError(line.where, f"NCCL version {version} contradicts version {log.versions[0]} at "
                                       f"{log._version_at}: logs of different NCCL builds (mixed nodes, or another "
                                       "job's log); judge one job with one NCCL", line.n)
    if version not in log.versions:
        log.versions.append(version)
    return True


def _read_network(log: NcclDebugLog, line: _Line) -> bool:
    u = _USING_NET.search(line.msg)
    if u and u["net"] not in log.networks and len(log.networks) < 64:
        log.networks.append(u["net"])
    return u is not None


def _read_nvls(log: NcclDebugLog, line: _Line) -> bool:
    msg = line.msg
    found = "NVLS multicast support is available" in msg or msg.startswith("Connected NVLS") or "via NVLS" in msg
    if found:
        log.nvls = True
    return found


#: In the order they are tried: a connection line is never read as a ring.
_READERS: tuple[Callable[[NcclDebugLog, _Line], bool], ...] = (
    _read_connection, _read_ring, _read_trees, _read_pattern, _read_init, _read_version, _read_network, _read_nvls,
)
