"""Parsers for what NCCL and nccl-tests print, so their numbers and facts feed the same checks.

Two sources, both text a site already has:

- ``NCCL_DEBUG=INFO`` logs: which transport each channel connection used (``via P2P/CUMEM``,
  ``via SHM/direct/direct``, ``[send] via NET/IB/0``, ``via NET/Socket/0``), the rings and trees,
  and the topology search result (``Pattern 4, ..., type NVL/PIX``). A node whose NVLink or
  InfiniBand is misconfigured still runs, only slower, through SHM or sockets: the log is the
  only place that says so.
- nccl-tests output (the text table, in both the current ``#wrong`` and the older ``error``
  layouts, and the ``-J`` JSON file), so a site that already ran nccl-tests gets the same checks.

Formats follow NCCL's ``transport/{p2p,shm,net}.cc``, ``graph/search.cc``, ``init.cc`` and
nccl-tests' ``src/common.cu`` / ``src/util.cu`` (JSON file version 2).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from day0.stages.collectives.busbw import UnknownCollective, canonical_op


class NcclParseError(ValueError):
    """Input that is not the format it claims to be; the message names the file and line."""


# --------------------------------------------------------------------------- NCCL_DEBUG logs

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


def parse_nccl_debug(text: str) -> NcclDebugLog:
    """Parse NCCL_DEBUG=INFO output of one or many processes (interleaved lines are fine)."""
    log = NcclDebugLog()
    dev_hosts: dict[int, str] = {}
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
        c = _CONN.match(msg)
        if c:
            conn = Connection(
                channel=int(c["ch"]),
                conn_index=int(c["ci"]) if c["ci"] is not None else None,
                src=int(c["src"]),
                dst=int(c["dst"]),
                src_dev=c["srcdev"],
                dst_dev=c["dstdev"],
                side=c["side"],
                via=c["via"],
                host=host,
                line_no=n,
                line=raw.strip(),
            )
            log.connections.append(conn)
            if host is not None:
                log.rank_hosts.setdefault(conn.logger_rank, host)
            continue
        r = _RING.match(msg)
        if r:
            log.rings.setdefault(int(r["ch"]), [int(x) for x in r["ranks"].split()])
            continue
        if msg.startswith("Trees"):
            for t in _TREE_ITEM.finditer(msg):
                me = int(t["me"])
                log.trees.append(
                    {
                        "rank": me,
                        "channel": int(t["ch"]),
                        "up": int(t["up"]),
                        "down": [int(t[k]) for k in ("d0", "d1", "d2") if int(t[k]) >= 0],
                    }
                )
                if host is not None:
                    log.rank_hosts.setdefault(me, host)
            continue
        p = _PATTERN.match(msg)
        if p:
            log.patterns.append(
                GraphPattern(
                    pattern=int(p["pattern"]),
                    cross_nic=int(p["crossnic"]),
                    nchannels=int(p["nch"]),
                    bw_intra=float(p["bwi"]) if p["bwi"] else None,
                    bw_inter=float(p["bwo"]) if p["bwo"] else None,
                    type_intra=p["ti"],
                    type_inter=p["to"],
                    host=host,
                    line_no=n,
                    line=raw.strip(),
                )
            )
            continue
        cm = _COMM.search(msg)
        if cm:
            log.nranks = int(cm["nranks"])
            log.nnodes = int(cm["nnodes"])
            if host is not None:
                log.rank_hosts.setdefault(int(cm["rank"]), host)
                log.local_ranks[host] = int(cm["lranks"])
            continue
        im = _INIT.search(msg)
        if im:
            log.nranks = log.nranks or int(im["nranks"])
            if host is not None:
                log.rank_hosts.setdefault(int(im["rank"]), host)
                dev_hosts[int(im["dev"])] = host
            continue
        v = _VERSION.search(msg)
        if v:
            log.versions.append(v["v"])
            continue
        u = _USING_NET.search(msg)
        if u:
            log.networks.append(u["net"])
            continue
        if "NVLS multicast support is available" in msg or msg.startswith("Connected NVLS") or "via NVLS" in msg:
            log.nvls = True
    return log


# --------------------------------------------------------------------------- transport expectations

_INTRA_ALIASES = {"nvswitch": "nvlink", "nvl": "nvlink", "pci": "pcie", "p2p": "pcie", "none": "any", "": "any"}
_INTER_ALIASES = {
    "ib": "infiniband",
    "eth": "ethernet",
    "tcp": "ethernet",
    "socket": "ethernet",
    "sockets": "ethernet",
    "mnnvl": "nvlink",
    "nvl": "nvlink",
    "libfabric": "efa",
    "": "none",
}
INTRA_LINKS = ("nvlink", "pcie", "shm", "any")
INTER_LINKS = ("none", "infiniband", "roce", "efa", "ethernet", "nvlink", "any")


@dataclass(frozen=True)
class TransportTopology:
    """What the profile promises about links: the transport checks hold NCCL to it.

    intra_node: nvlink (P2P over NVLink/NVSwitch, or NVLS), pcie (P2P), shm (host memory is
    fine), any. inter_node: infiniband / roce (NET/IB), efa (NET/AWS Libfabric or OFI),
    ethernet (sockets are fine), nvlink (multi-node NVLink: P2P/MNNVL or NVLS), none (one node),
    any.
    """

    intra_node: str = "any"
    inter_node: str = "any"
    nodes: int | None = None
    devices_per_node: int | None = None

    def __post_init__(self) -> None:
        intra = _INTRA_ALIASES.get(self.intra_node.lower(), self.intra_node.lower())
        inter = _INTER_ALIASES.get(self.inter_node.lower(), self.inter_node.lower())
        if intra not in INTRA_LINKS:
            raise ValueError(f"topology.intra_node: {self.intra_node!r} is not one of {', '.join(INTRA_LINKS)}")
        if inter not in INTER_LINKS:
            raise ValueError(f"topology.inter_node: {self.inter_node!r} is not one of {', '.join(INTER_LINKS)}")
        object.__setattr__(self, "intra_node", intra)
        object.__setattr__(self, "inter_node", inter)

    @classmethod
    def coerce(cls, topology: Any) -> "TransportTopology":
        """Accept this class, a mapping, or any object with the same attribute names (a profile section)."""
        if isinstance(topology, cls):
            return topology
        get = topology.get if isinstance(topology, Mapping) else (lambda k, d=None: getattr(topology, k, d))
        return cls(
            intra_node=str(get("intra_node", "any") or "any"),
            inter_node=str(get("inter_node", "any") or "any"),
            nodes=get("nodes", None),
            devices_per_node=get("devices_per_node", None),
        )


def _allowed(conn: Connection, scope: str, expect: str) -> tuple[bool, str]:
    """(ok, why-not) for one connection in a scope, given what the topology promises there."""
    t, net = conn.transport, (conn.net or "").lower()
    if expect in ("any",):
        return True, ""
    if scope == "intra_node":
        if expect == "nvlink":
            ok = t in ("P2P", "NVLS")
        elif expect == "pcie":
            ok = t == "P2P"
        else:  # shm
            ok = t in ("P2P", "SHM", "NVLS")
        return ok, "" if ok else f"intra-node {conn.src}->{conn.dst} used {conn.via} where the topology promises {expect}"
    if expect == "none":
        return False, f"{conn.src}->{conn.dst} crosses nodes but the topology says one node"
    if expect in ("infiniband", "roce"):
        ok = t == "NET" and net.startswith("ib")
    elif expect == "efa":
        ok = t == "NET" and ("libfabric" in net or "ofi" in net)
    elif expect == "nvlink":
        ok = t in ("P2P", "NVLS")
    else:  # ethernet: anything that works
        ok = True
    return ok, "" if ok else f"inter-node {conn.src}->{conn.dst} used {conn.via} where the topology promises {expect}"


def classify(log: NcclDebugLog, topology: TransportTopology) -> dict[str, list[Connection]]:
    """Split connections into intra_node / inter_node / unknown by the hosts of both ends."""
    out: dict[str, list[Connection]] = {"intra_node": [], "inter_node": [], "unknown": []}
    dpn = topology.devices_per_node
    for c in log.connections:
        a, b = log.host_of(c.src, dpn), log.host_of(c.dst, dpn)
        if a is not None and b is not None:
            out["intra_node" if a == b else "inter_node"].append(c)
        elif c.transport in ("SHM",) or (c.transport == "P2P" and "MNNVL" not in c.via.upper()):
            out["intra_node"].append(c)  # only possible inside one node
        else:
            out["unknown"].append(c)
    return out


def _summary(conns: Iterable[Connection]) -> str:
    counts = Counter(_short_via(c) for c in conns)
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


def _short_via(c: Connection) -> str:
    parts = c.via.split("/")
    return "/".join(parts[:2]).replace(" pointer", "")


def _conn_table(conns: list[Connection], limit: int = 400) -> dict[str, Any]:
    grouped: dict[tuple, list[int]] = defaultdict(list)
    for c in conns:
        grouped[(c.src, c.dst, c.side or "", c.via, c.host or "")].append(c.channel)
    rows = [
        [src, dst, side, via, host, len(chs), " ".join(str(x) for x in sorted(set(chs))[:16])]
        for (src, dst, side, via, host), chs in sorted(grouped.items())
    ]
    return {"columns": ["from", "to", "side", "via", "logged on", "connections", "channels"], "rows": rows[:limit]}


def transport_checks(log_text: str, topology: Any, *, backend: str = "nccl") -> list["Check"]:
    """Checks that each channel used the transport the topology promises, intra- and inter-node."""
    from day0.core.record import Check

    topo = TransportTopology.coerce(topology)
    title_intra = "Intra-node transport matches the topology"
    title_inter = "Inter-node transport matches the topology"
    if backend != "nccl":
        reason = f"backend {backend} has no NCCL transport log; transport verification applies to NCCL runs"
        return [
            Check(id="collectives.transport.intra_node", title=title_intra, status="skip", message=reason, source="nccl_debug"),
            Check(id="collectives.transport.inter_node", title=title_inter, status="skip", message=reason, source="nccl_debug"),
        ]
    log = parse_nccl_debug(log_text or "")
    base_evidence = {"nccl": log.to_dict()}
    if not log.connections:
        msg = (
            "no NCCL channel connection lines in the log: run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH "
            "and run at least one collective (connections are set up lazily)"
        )
        return [
            Check(id=cid, title=t, status="error", limit=lim, message=msg, evidence=base_evidence, source="nccl_debug")
            for cid, t, lim in (
                ("collectives.transport.intra_node", title_intra, topo.intra_node),
                ("collectives.transport.inter_node", title_inter, topo.inter_node),
            )
        ]
    groups = classify(log, topo)
    checks = [
        _scope_check(
            "collectives.transport.intra_node", title_intra, "intra_node", topo.intra_node, groups, log, base_evidence, topo
        ),
        _scope_check(
            "collectives.transport.inter_node", title_inter, "inter_node", topo.inter_node, groups, log, base_evidence, topo
        ),
    ]
    return checks


def _scope_check(cid, title, scope, expect, groups, log, base_evidence, topo: TransportTopology) -> "Check":
    from day0.core.record import Check

    conns: list[Connection] = groups[scope]
    bad: list[tuple[Connection, str]] = []
    for c in conns:
        ok, why = _allowed(c, scope, expect)
        if not ok:
            bad.append((c, why))
    pattern_bad: list[GraphPattern] = []
    if scope == "intra_node" and expect == "nvlink":
        pattern_bad = [
            p for p in log.patterns if p.type_intra and p.type_intra.upper() not in NVLINK_PATH_TYPES and p.nchannels > 0
        ]
    evidence = dict(base_evidence)
    evidence["table"] = _conn_table(conns)
    evidence["unknown_scope"] = len(groups["unknown"])
    value = _summary(conns)
    if bad or pattern_bad:
        first = bad[0][1] if bad else (
            f"NCCL's topology search chose intra-node path type {pattern_bad[0].type_intra} "
            f"(Pattern {pattern_bad[0].pattern}), not NVLink"
        )
        lines = [c.line for c, _ in bad[:20]] + [p.line for p in pattern_bad[:5]]
        evidence["log_excerpt"] = "\n".join(lines)
        evidence["offending"] = len(bad) + len(pattern_bad)
        more = f" ({len(bad) + len(pattern_bad)} offending lines)" if len(bad) + len(pattern_bad) > 1 else ""
        return Check(
            id=cid, title=title, status="fail", value=value, limit=expect, direction="exact",
            message=f"{first}{more}; check NVLink/IB health (nvidia-smi topo -m, ibstat) and NCCL_P2P/NET settings",
            evidence=evidence, source="nccl_debug",
        )
    if not conns:
        nodes = topo.nodes if topo.nodes is not None else log.nnodes
        if scope == "inter_node" and expect not in ("none", "any") and not groups["unknown"] and (nodes or 1) > 1:
            return Check(
                id=cid, title=title, status="error", value=value, limit=expect, direction="exact",
                message=f"topology promises {expect} between nodes but the log shows no inter-node connection; "
                "collect the log of a multi-node run (all nodes' NCCL_DEBUG_FILE)",
                evidence=evidence, source="nccl_debug",
            )
        if groups["unknown"]:
            evidence["log_excerpt"] = "\n".join(c.line for c in groups["unknown"][:20])
            return Check(
                id=cid, title=title, status="error", value=value, limit=expect, direction="exact",
                message=f"{len(groups['unknown'])} NET connections whose node could not be told from the log; "
                "keep the host:pid prefix (NCCL_DEBUG_FILE) or set topology.devices_per_node",
                evidence=evidence, source="nccl_debug",
            )
        return Check(
            id=cid, title=title, status="skip", value=value, limit=expect, direction="exact",
            message=f"no {scope.replace('_', '-')} connections in this run", evidence=evidence, source="nccl_debug",
        )
    msg = f"{len(conns)} {scope.replace('_', '-')} connections, all {expect if expect != 'any' else 'unconstrained'}: {value}"
    return Check(
        id=cid, title=title, status="pass", value=value, limit=expect, direction="exact",
        message=msg, evidence=evidence, source="nccl_debug",
    )


# --------------------------------------------------------------------------- nccl-tests output


@dataclass
class NcclTestsRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    mode: str  # out_of_place | in_place
    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None  # the #wrong column (None: not checked, or the older "error" layout)
    max_error: float | None = None  # the older layout's "error" column (max abs deviation)
    per_iter: dict[str, float] | None = None  # i_min/i_max/i_p99 (us) and i_cv% when printed


@dataclass
class NcclTestsRun:
    """One nccl-tests program's output: e.g. all_reduce_perf with its sweep and footers."""

    op: str
    program: str | None
    rows: list[NcclTestsRow] = field(default_factory=list)
    world_size: int | None = None
    hosts: list[str] = field(default_factory=list)  # per rank, from the "Using devices" list
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    avg_busbw_gbps: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    layout: str = "wrong"  # "wrong" (#wrong column) | "error" (older max-error column) | "json"

    @property
    def validated(self) -> bool:
        """Whether nccl-tests checked results (-c 1): its out-of-bounds footer means nothing otherwise."""
        if str(self.config.get("validation", 1)) in ("0", "false"):
            return False
        if self.layout == "error":
            return any(r.max_error is not None for r in self.rows)
        return any(r.wrong is not None for r in self.rows) or not self.rows


_STARTING = re.compile(r"^#\s*Collective test starting:\s*(?P<prog>\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\s+(?P<nt>\d+)\s+nGpus\s+(?P<ng>\d+)\s+minBytes\s+(?P<min>\d+)\s+maxBytes\s+(?P<max>\d+)")
_DEVLINE = re.compile(r"^#\s+Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<ok>OK|FAILED)?")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<bw>[-+0-9.eEnaNinf]+)")
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+")


def _num(tok: str) -> float | None:
    if tok in ("N/A", "-", "nan", "-nan"):
        return None
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _header_columns(line: str) -> list[str]:
    return line.lstrip("#").split()


def _guess_op(program: str | None, path: Path | None, default: str | None) -> str:
    for cand in (program, path.stem if path else None, default):
        if not cand:
            continue
        try:
            return canonical_op(cand)
        except UnknownCollective:
            stem = re.sub(r"[._-]?(log|out|txt|json)$", "", cand)
            m = re.search(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv|reduce|gather|scatter|hypercube)", stem)
            if m:
                return canonical_op(m.group(1))
    where = f"{path}" if path else "<text>"
    raise NcclParseError(f"{where}: cannot tell which collective this nccl-tests output is (no '# Collective test starting' line); pass op=")


def parse_nccl_tests_text(text: str, *, path: Path | None = None, op: str | None = None) -> list[NcclTestsRun]:
    """Parse nccl-tests stdout; several programs' outputs concatenated give several runs."""
    runs: list[NcclTestsRun] = []
    cur: NcclTestsRun | None = None
    program: str | None = None
    columns: list[str] | None = None
    pending_devices: list[tuple[int, str]] = []
    pending_config: dict[str, Any] = {}
    where = str(path) if path else "<text>"

    def start(prog: str | None) -> NcclTestsRun:
        run = NcclTestsRun(op=_guess_op(prog, path, op), program=prog)
        runs.append(run)
        return run

    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        m = _STARTING.match(s)
        if m:
            program, cur, columns = m["prog"], None, None
            pending_devices, pending_config = [], {}
            continue
        m = _NTHREAD.match(s)
        if m:
            if cur is not None and cur.rows:  # a second program without a "starting" line
                cur, columns, program = None, None, None
            pending_devices = []
            pending_config = {
                "nthreads": int(m["nt"]), "ngpus": int(m["ng"]),
                "minimum_bytes": int(m["min"]), "maximum_bytes": int(m["max"]),
            }
            v = re.search(r"validation:\s*(\d+)", s)
            if v:
                pending_config["validation"] = int(v.group(1))
            continue
        m = _DEVLINE.match(s)
        if m:
            pending_devices.append((int(m["rank"]), m["host"]))
            continue
        if s.startswith("#") and "size" in s and ("busbw" in s or "algbw" in s):
            columns = _header_columns(s)
            if cur is None:
                cur = start(program)
                cur.config = pending_config
                if pending_devices:
                    cur.world_size = len(pending_devices)
                    cur.hosts = [h for _, h in sorted(pending_devices)]
            continue
        m = _OOB.match(s)
        if m and cur is not None:
            cur.out_of_bounds = int(m["n"])
            cur.out_of_bounds_ok = (m["ok"] or ("OK" if int(m["n"]) == 0 else "FAILED")) == "OK"
            continue
        m = _AVG.match(s)
        if m and cur is not None:
            cur.avg_busbw_gbps = _num(m["bw"])
            continue
        if s.startswith("#"):
            if cur is not None and s.lower().startswith("# error:"):
                cur.errors.append(s[1:].strip())
            continue
        if columns is not None and cur is not None and _ROW.match(s):
            cur.rows.extend(_parse_row(s, columns, where, n, cur))
            continue
        if cur is not None and re.search(r"Test (?:NCCL |CUDA )?failure|Test failure", s):
            cur.errors.append(s)
    if not runs:
        raise NcclParseError(f"{where}: no nccl-tests result table found (expected a '#  size  count  type ...' header)")
    return runs


def _parse_row(s: str, columns: list[str], where: str, n: int, run: NcclTestsRun) -> list[NcclTestsRow]:
    toks = s.split()
    # The head columns come before the first time column; the rest splits into two sides.
    time_names = ("time", "cputime")
    try:
        first_time = next(i for i, c in enumerate(columns) if c in time_names)
    except StopIteration:
        raise NcclParseError(f"{where}:{n}: header has no time column") from None
    head = columns[:first_time]
    side_cols = columns[first_time:]
    try:
        second_time = next(i for i, c in enumerate(side_cols) if c in time_names and i > 0)
    except StopIteration:
        second_time = len(side_cols)
    left, right = side_cols[:second_time], side_cols[second_time:]
    if right and right[-1] == "timestamp":
        right = right[:-1]
    if len(toks) < len(head):
        raise NcclParseError(f"{where}:{n}: row has {len(toks)} fields, header needs at least {len(head)}")
    hv = dict(zip(head, toks[: len(head)]))
    try:
        size = int(hv.get("size", toks[0]))
        count = int(hv.get("count", toks[1]))
    except ValueError:
        raise NcclParseError(f"{where}:{n}: size/count are not integers: {s!r}") from None
    root_tok = hv.get("root")
    root = int(root_tok) if root_tok not in (None, "-1") and root_tok.lstrip("-").isdigit() else None
    rest = toks[len(head):]
    rows: list[NcclTestsRow] = []
    for mode, cols, vals in (
        ("out_of_place", left, rest[: len(left)]),
        ("in_place", right, rest[len(left): len(left) + len(right)]),
    ):
        if not cols or len(vals) < min(3, len(cols)):
            continue
        d = dict(zip(cols, vals))
        if all(_num(d.get(k, "N/A")) is None for k in ("time", "cputime", "algbw", "busbw")):
            continue  # nothing measured on this side (N/A columns)
        wrong: int | None = None
        max_error: float | None = None
        if "#wrong" in d:
            w = _num(d["#wrong"])
            wrong = int(w) if w is not None else None
        elif "error" in d:
            run.layout = "error"
            max_error = _num(d["error"])
        per_iter = {k: v for k in ("i_min", "i_max", "i_p99", "i_cv%") if (v := _num(d.get(k, "N/A"))) is not None}
        rows.append(
            NcclTestsRow(
                size_bytes=size, count=count, dtype=hv.get("type", ""), redop=hv.get("redop", ""), root=root,
                mode=mode, time_us=_num(d.get("time", d.get("cputime", "N/A"))),
                algbw_gbps=_num(d.get("algbw", "N/A")), busbw_gbps=_num(d.get("busbw", "N/A")),
                wrong=wrong, max_error=max_error, per_iter=per_iter or None,
            )
        )
    return rows


def parse_nccl_tests_json(data: Mapping[str, Any], *, path: Path | None = None, op: str | None = None) -> NcclTestsRun:
    """Parse the ``-J`` JSON of nccl-tests (file version 2: config, results, out_of_bounds, ...)."""
    where = str(path) if path else "<json>"
    if not isinstance(data, Mapping) or "results" not in data:
        raise NcclParseError(f"{where}: not an nccl-tests JSON file (no 'results' key)")
    results = data.get("results") or []
    if not isinstance(results, list):
        raise NcclParseError(f"{where}: 'results' is not a list")
    prog = None
    for r in results:
        if isinstance(r, Mapping) and r.get("experiment_name"):
            prog = str(r["experiment_name"])
            break
    args = data.get("args") or []
    if prog is None and args:
        prog = Path(str(args[0])).name
    run = NcclTestsRun(op=_guess_op(prog, path, op), program=prog, layout="json")
    config = data.get("config") or {}
    devices = config.get("devices") or data.get("devices") or []
    run.config = {k: v for k, v in config.items() if k != "devices"}
    if devices:
        run.world_size = len(devices)
        ranked = sorted((int(d.get("rank", i)), str(d.get("hostname", ""))) for i, d in enumerate(devices) if isinstance(d, Mapping))
        run.hosts = [h for _, h in ranked]
    for i, r in enumerate(results):
        if not isinstance(r, Mapping):
            raise NcclParseError(f"{where}: results[{i}] is not an object")
        try:
            size, count = int(r["size"]), int(r["count"])
        except (KeyError, TypeError, ValueError):
            raise NcclParseError(f"{where}: results[{i}] lacks an integer size/count") from None
        root_s = str(r.get("root", "")).strip()
        root = int(root_s) if root_s.lstrip("-").isdigit() and int(root_s) >= 0 else None
        for mode in ("out_of_place", "in_place"):
            side = r.get(mode)
            if not isinstance(side, Mapping):
                continue
            nw = side.get("nwrong")
            per = r.get(f"{mode}_per_iter")
            rows_time = side.get("time", side.get("cpu_time"))
            run.rows.append(
                NcclTestsRow(
                    size_bytes=size, count=count, dtype=str(r.get("type", "")), redop=str(r.get("redop", "")),
                    root=root, mode=mode, time_us=_json_num(rows_time), algbw_gbps=_json_num(side.get("alg_bw")),
                    busbw_gbps=_json_num(side.get("bus_bw")), wrong=int(nw) if _json_num(nw) is not None else None,
                    per_iter={k: float(v) for k, v in per.items() if k.endswith("_us") and _json_num(v) is not None}
                    if isinstance(per, Mapping) else None,
                )
            )
    oob = data.get("out_of_bounds")
    if isinstance(oob, Mapping):
        run.out_of_bounds = int(oob.get("count", 0))
        run.out_of_bounds_ok = str(oob.get("okay", "")).lower() == "true"
    avg = data.get("average_bus_bandwidth")
    if isinstance(avg, Mapping):
        run.avg_busbw_gbps = _json_num(avg.get("bandwidth"))
    run.errors = [str(e) for e in (data.get("errors") or []) if str(e).strip()]
    return run


def _json_num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)  # "nan" strings too
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def read_nccl_tests(path: Path, *, op: str | None = None) -> list[NcclTestsRun]:
    """Read an nccl-tests output file, JSON (-J) or text, deciding by content, not by name."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NcclParseError(f"{path}: cannot read ({exc.strerror})") from None
    head = text.lstrip()[:1]
    if head == "{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NcclParseError(f"{path}: JSON error at line {exc.lineno}: {exc.msg}") from None
        return [parse_nccl_tests_json(data, path=path, op=op)]
    return parse_nccl_tests_text(text, path=path, op=op)
