"""Parser for ``NCCL_DEBUG=INFO`` logs: the transport of every channel connection, and the topology.

The log says which transport each channel connection used (``via P2P/CUMEM``,
``via SHM/direct/direct``, ``[send] via NET/IB/0``, ``via NET/Socket/0``), the rings and trees,
and the topology search result (``Pattern 4, ..., type NVL/PIX``). A node whose NVLink or
InfiniBand is misconfigured still runs, only slower, through SHM or sockets: the log is the only
place that says so. Formats follow NCCL's ``transport/{p2p,shm,net}.cc``, ``graph/search.cc``
and ``init.cc``, of any version since 2.7.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, NamedTuple

# "host:pid:tid [dev] NCCL INFO message"; the prefix is optional (NCCL_DEBUG_FILE keeps it, a
# grep'ed excerpt may not).
_PREFIX = re.compile(r"^\s*(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>[^\]]*)\]\s+NCCL\s+(?P<level>INFO|WARN|TRACE)\s+(?P<msg>.*)$")
_BARE = re.compile(r"^\s*NCCL\s+(?P<level>INFO|WARN|TRACE)\s+(?P<msg>.*)$")
# Connection lines. NCCL >= 2.12: "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read";
# 2.8-2.11: "Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC"; <= 2.7: "Ring 00 : 0 -> 1 [send] via NET/IB/0".
_CONN = re.compile(
    r"^(?:Channel|Ring)\s+(?P<ch>\d+)(?:/(?P<ci>\d+))?\s*:\s*"
    r"(?P<src>\d+)(?:\[(?P<srcdev>[0-9a-fA-Fx]+)\])?\s*->\s*"
    r"(?P<dst>\d+)(?:\[(?P<dstdev>[0-9a-fA-Fx]+)\])?"
    r"(?:\s*\[(?P<side>send|receive)\])?\s+via\s+(?P<via>.+?)\s*$"
)
# Ring order: "Channel 00/02 :    0   1   2   3" (no arrow, only ranks).
_RING = re.compile(r"^(?:Channel|Ring)\s+(?P<ch>\d+)(?:/(?P<nch>\d+))?\s*:\s*(?P<ranks>-?\d+(?:\s+-?\d+)*)\s*$")
# Trees: "Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1"
_TREE_ITEM = re.compile(r"\[(?P<ch>\d+)\]\s+(?P<d0>-?\d+)/(?P<d1>-?\d+)/(?P<d2>-?\d+)->(?P<me>-?\d+)->(?P<up>-?\d+)")
_PATTERN = re.compile(
    r"^Pattern\s+(?P<pattern>\d+),\s*crossNic\s+(?P<crossnic>\d+),\s*nChannels\s+(?P<nch>\d+)"
    r"(?:,\s*(?:bw|speed)\s+(?P<bwi>[\d.]+)/(?P<bwo>[\d.]+))?"
    r"(?:,\s*type\s+(?P<ti>[A-Za-z0-9]+)/(?P<to>[A-Za-z0-9]+))?"
)
_COMM = re.compile(
    r"comm\s+0x[0-9a-fA-F]+\s+rank\s+(?P<rank>\d+)\s+nRanks\s+(?P<nranks>\d+)\s+nNodes\s+(?P<nnodes>\d+)"
    r"\s+localRanks\s+(?P<lranks>\d+)\s+localRank\s+(?P<lrank>\d+)"
)
_INIT = re.compile(r"comm\s+0x[0-9a-fA-F]+\s+rank\s+(?P<rank>\d+)\s+nranks\s+(?P<nranks>\d+)\s+cudaDev\s+(?P<dev>\d+)")
_VERSION = re.compile(r"NCCL version\s+(?P<v>\S+)")
_USING_NET = re.compile(r"Using network\s+(?P<net>.+?)\s*$")

#: Path types NCCL prints in Pattern lines that mean the intra-node path is NVLink (or local).
NVLINK_PATH_TYPES = frozenset({"NVL", "NVB", "C2C", "LOC"})


@dataclass
class Connection:
    """One channel connection as NCCL set it up, from one log line."""

    channel: int
    conn_index: int | None
    src: int
    dst: int
    src_dev: str | None
    dst_dev: str | None
    side: str | None  # "send" / "receive" for NET lines, None for P2P/SHM (always the sender's line)
    via: str  # everything after "via ": "P2P/CUMEM/read", "NET/IB/0/GDRDMA", "SHM/direct/direct"
    host: str | None  # the host of the process that logged the line
    line_no: int
    line: str

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


@dataclass
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


@dataclass
class NcclDebugLog:
    """Everything the transport checks need from a (possibly multi-process, multi-node) log."""

    connections: list[Connection] = field(default_factory=list)
    rings: dict[int, list[int]] = field(default_factory=dict)  # channel -> rank order
    trees: list[dict[str, Any]] = field(default_factory=list)  # {rank, channel, up, down}
    patterns: list[GraphPattern] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    local_ranks: dict[str, int] = field(default_factory=dict)  # host -> localRanks NCCL reported
    nranks: int | None = None
    nnodes: int | None = None
    versions: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)  # "Using network IB"
    nvls: bool = False
    warnings: list[str] = field(default_factory=list)
    lines: int = 0

    def host_of(self, rank: int, devices_per_node: int | None = None) -> str | None:
        """The host of a rank: seen in the log, else inferred, else None when it cannot be known.

        A log often holds one node's processes only (each node writes its own NCCL_DEBUG_FILE):
        then ranks of the other nodes never print a line, and are placed by what is known.
        """
        if rank in self.rank_hosts:
            return self.rank_hosts[rank]
        hosts = set(self.rank_hosts.values())
        if self.nnodes == 1 and len(hosts) == 1:
            return next(iter(hosts))
        if devices_per_node:
            node = rank // devices_per_node
            for r, h in self.rank_hosts.items():
                if r // devices_per_node == node:
                    return h
            return f"<node {node}>"
        if hosts and all(
            sum(1 for v in self.rank_hosts.values() if v == h) >= self.local_ranks.get(h, 1 << 30) for h in hosts
        ):
            return "<other node>"  # every known host has all its local ranks accounted for
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "connections": len(self.connections),
            "rings": {str(k): v for k, v in sorted(self.rings.items())},
            "trees": self.trees[:256],
            "patterns": [asdict(p) for p in self.patterns],
            "rank_hosts": {str(k): v for k, v in sorted(self.rank_hosts.items())},
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "versions": sorted(set(self.versions)),
            "networks": sorted(set(self.networks)),
            "nvls": self.nvls,
            "warnings": self.warnings[:50],
        }


class _Line(NamedTuple):
    """One NCCL line: the host of the process that logged it (None without a prefix), its number,
    the raw text, and the message after ``NCCL INFO``."""

    host: str | None
    n: int
    raw: str
    msg: str


def parse_nccl_debug(text: str) -> NcclDebugLog:
    """Parse NCCL_DEBUG=INFO output of one or many processes (interleaved lines are fine)."""
    log = NcclDebugLog()
    for n, raw in enumerate(text.splitlines(), 1):
        log.lines = n
        m = _PREFIX.match(raw)
        if m:
            host, level, msg = m["host"], m["level"], m["msg"].strip()
        else:
            b = _BARE.match(raw)
            if not b:
                continue
            host, level, msg = None, b["level"], b["msg"].strip()
        if level == "WARN":
            log.warnings.append(raw.strip())
            continue
        line = _Line(host, n, raw, msg)
        for read in _READERS:  # the first reader that knows the line takes it
            if read(log, line):
                break
    return log


def _read_connection(log: NcclDebugLog, line: _Line) -> bool:
    c = _CONN.match(line.msg)
    if not c:
        return False
    conn = Connection(
        channel=int(c["ch"]),
        conn_index=int(c["ci"]) if c["ci"] is not None else None,
        src=int(c["src"]),
        dst=int(c["dst"]),
        src_dev=c["srcdev"],
        dst_dev=c["dstdev"],
        side=c["side"],
        via=c["via"],
        host=line.host,
        line_no=line.n,
        line=line.raw.strip(),
    )
    log.connections.append(conn)
    if line.host is not None:
        log.rank_hosts.setdefault(conn.logger_rank, line.host)
    return True


def _read_ring(log: NcclDebugLog, line: _Line) -> bool:
    r = _RING.match(line.msg)
    if r:
        log.rings.setdefault(int(r["ch"]), [int(x) for x in r["ranks"].split()])
    return r is not None


def _read_trees(log: NcclDebugLog, line: _Line) -> bool:
    if not line.msg.startswith("Trees"):
        return False
    for t in _TREE_ITEM.finditer(line.msg):
        me = int(t["me"])
        log.trees.append(
            {
                "rank": me,
                "channel": int(t["ch"]),
                "up": int(t["up"]),
                "down": [int(t[k]) for k in ("d0", "d1", "d2") if int(t[k]) >= 0],
            }
        )
        if line.host is not None:
            log.rank_hosts.setdefault(me, line.host)
    return True


def _read_pattern(log: NcclDebugLog, line: _Line) -> bool:
    p = _PATTERN.match(line.msg)
    if not p:
        return False
    log.patterns.append(
        GraphPattern(
            pattern=int(p["pattern"]),
            cross_nic=int(p["crossnic"]),
            nchannels=int(p["nch"]),
            bw_intra=float(p["bwi"]) if p["bwi"] else None,
            bw_inter=float(p["bwo"]) if p["bwo"] else None,
            type_intra=p["ti"],
            type_inter=p["to"],
            host=line.host,
            line_no=line.n,
            line=line.raw.strip(),
        )
    )
    return True


def _read_comm(log: NcclDebugLog, line: _Line) -> bool:
    cm = _COMM.search(line.msg)
    if not cm:
        return False
    log.nranks = int(cm["nranks"])
    log.nnodes = int(cm["nnodes"])
    if line.host is not None:
        log.rank_hosts.setdefault(int(cm["rank"]), line.host)
        log.local_ranks[line.host] = int(cm["lranks"])
    return True


def _read_init(log: NcclDebugLog, line: _Line) -> bool:
    im = _INIT.search(line.msg)
    if not im:
        return False
    log.nranks = log.nranks or int(im["nranks"])
    if line.host is not None:
        log.rank_hosts.setdefault(int(im["rank"]), line.host)
    return True


def _read_version(log: NcclDebugLog, line: _Line) -> bool:
    v = _VERSION.search(line.msg)
    if v:
        log.versions.append(v["v"])
    return v is not None


def _read_network(log: NcclDebugLog, line: _Line) -> bool:
    u = _USING_NET.search(line.msg)
    if u:
        log.networks.append(u["net"])
    return u is not None


def _read_nvls(log: NcclDebugLog, line: _Line) -> bool:
    msg = line.msg
    found = "NVLS multicast support is available" in msg or msg.startswith("Connected NVLS") or "via NVLS" in msg
    if found:
        log.nvls = True
    return found


#: In the order they are tried: a connection line is never read as a ring, an init line is a comm line first.
_READERS: tuple[Callable[[NcclDebugLog, _Line], bool], ...] = (
    _read_connection, _read_ring, _read_trees, _read_pattern, _read_comm, _read_init, _read_version, _read_network,
    _read_nvls,
)
