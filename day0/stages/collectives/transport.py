"""Transport checks: every NCCL channel used the link the topology promises, inside and across nodes.

Each connection of an ``NCCL_DEBUG=INFO`` log (:mod:`day0.stages.collectives.nccl_debug`) is
placed on a node by its ``host:pid:tid`` prefix (or ``devices_per_node``), then held to
``topology.intra_node`` / ``topology.inter_node``; on NVLink the topology search's path type
must be NVLink too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from day0.core.record import Check
from day0.stages.collectives.nccl_debug import (
    NVLINK_PATH_TYPES,
    Connection,
    GraphPattern,
    NcclDebugLog,
    NcclLogError,
    parse_nccl_debug,
)

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
        a, b, _ = log.ends(c, dpn)
        if a is not None and b is not None:
            out["intra_node" if a == b else "inter_node"].append(c)
        elif c.transport in ("SHM",) or (c.transport == "P2P" and "MNNVL" not in c.via.upper()):
            out["intra_node"].append(c)  # only possible inside one node
        else:
            out["unknown"].append(c)
    return out


def _unplaced(log: NcclDebugLog, unknown: list[Connection], topo: TransportTopology, limit: int = 5) -> list[list[str]]:
    """Why connections could not be placed on a node: the first distinct reasons, each with a line it holds for."""
    out: dict[str, str] = {}
    for c in unknown:
        why = log.ends(c, topo.devices_per_node).why or "its node cannot be told"
        out.setdefault(why, c.line)
        if len(out) >= limit:
            break
    return [[why, line] for why, line in out.items()]


def _summary(conns: Iterable[Connection]) -> str:
    counts: Counter[str] = Counter()
    for c in conns:
        counts[_short_via(c)] += c.count
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


def _short_via(c: Connection) -> str:
    parts = c.via.split("/")
    return "/".join(parts[:2]).replace(" pointer", "")


def _conn_table(conns: list[Connection], limit: int = 400) -> dict[str, Any]:
    grouped: dict[tuple, list[Connection]] = defaultdict(list)
    for c in conns:
        grouped[(c.src, c.dst, c.side or "", c.via, c.host or "")].append(c)
    rows = []
    for (src, dst, side, via, host), cs in sorted(grouped.items())[:limit]:
        chs = sorted({ch for c in cs for ch in c.channel_list})
        rows.append([src, dst, side, via, host, sum(c.count for c in cs), " ".join(str(x) for x in chs[:16])])
    return {"columns": ["from", "to", "side", "via", "logged on", "connections", "channels"], "rows": rows[:limit]}


_TITLE_INTRA = "Intra-node transport matches the topology"
_TITLE_INTER = "Inter-node transport matches the topology"


def _both_error(topo: TransportTopology, msg: str, evidence: dict[str, Any]) -> list[Check]:
    return [
        Check(id=cid, title=t, status="error", limit=lim, message=msg, evidence=dict(evidence), source="nccl_debug")
        for cid, t, lim in (
            ("collectives.transport.intra_node", _TITLE_INTRA, topo.intra_node),
            ("collectives.transport.inter_node", _TITLE_INTER, topo.inter_node),
        )
    ]


def transport_checks(log_text: str, topology: Any, *, backend: str = "nccl") -> list[Check]:
    """Checks that each channel used the transport the topology promises, intra- and inter-node.

    A log that cannot be judged (two NCCL versions, a rank log that could not be read) makes
    both checks ``error`` naming the file and line: never a pass drawn from part of the job.
    """
    topo = TransportTopology.coerce(topology)
    title_intra, title_inter = _TITLE_INTRA, _TITLE_INTER
    if backend != "nccl":
        reason = f"backend {backend} has no NCCL transport log; transport verification applies to NCCL runs"
        return [
            Check(id="collectives.transport.intra_node", title=title_intra, status="skip", message=reason, source="nccl_debug"),
            Check(id="collectives.transport.inter_node", title=title_inter, status="skip", message=reason, source="nccl_debug"),
        ]
    try:
        log = parse_nccl_debug(log_text or "")
    except NcclLogError as exc:
        return _both_error(topo, f"the NCCL log cannot be judged: {exc}", {})
    return log_checks(log, topo)


def log_checks(log: NcclDebugLog, topology: Any) -> list[Check]:
    """The two transport checks of a log already read (``day0 collectives transport`` reads files)."""
    topo = TransportTopology.coerce(topology)
    base_evidence = {"nccl": log.to_dict()}
    if not log.connections:
        msg = (
            "no NCCL channel connection lines in the log: run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH "
            "and run at least one collective (connections are set up lazily)"
        )
        return _both_error(topo, msg, base_evidence)
    groups = classify(log, topo)
    return [
        _scope_check(
            "collectives.transport.intra_node", _TITLE_INTRA, "intra_node", topo.intra_node, groups, log, base_evidence,
            topo,
        ),
        _scope_check(
            "collectives.transport.inter_node", _TITLE_INTER, "inter_node", topo.inter_node, groups, log, base_evidence,
            topo,
        ),
    ]


def _scope_check(cid, title, scope, expect, groups, log, base_evidence, topo: TransportTopology) -> Check:
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
    unplaced = _unplaced(log, groups["unknown"], topo)
    if unplaced:
        evidence["unknown_why"] = unplaced
    value = _summary(conns)
    if bad or pattern_bad:
        first = bad[0][1] if bad else (
            f"NCCL's topology search chose intra-node path type {pattern_bad[0].type_intra} "
            f"(Pattern {pattern_bad[0].pattern}), not NVLink"
        )
        lines = [c.line for c, _ in bad[:20]] + [p.line for p in pattern_bad[:5]]
        evidence["log_excerpt"] = "\n".join(lines)
        offending = sum(c.count for c, _ in bad) + sum(p.count for p in pattern_bad)
        evidence["offending"] = offending
        more = f" ({offending} offending lines)" if offending > 1 else ""
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
                message=f"{sum(c.count for c in groups['unknown'])} NET connections whose node could not be told "
                f"from the log ({unplaced[0][0]}); "
                "keep the host:pid prefix and the init lines (NCCL_DEBUG_FILE, NCCL_DEBUG_SUBSYS=INIT) or set "
                "topology.devices_per_node",
                evidence=evidence, source="nccl_debug",
            )
        return Check(
            id=cid, title=title, status="skip", value=value, limit=expect, direction="exact",
            message=f"no {scope.replace('_', '-')} connections in this run", evidence=evidence, source="nccl_debug",
        )
    msg = f"{sum(c.count for c in conns)} {scope.replace('_', '-')} connections, all {expect if expect != 'any' else 'unconstrained'}: {value}"
    if unplaced:  # judged on what could be placed; what could not is said, not guessed
        msg += (f"; {sum(c.count for c in groups['unknown'])} connections not placed on a node, so not judged "
                f"({unplaced[0][0]})")
    return Check(
        id=cid, title=title, status="pass", value=value, limit=expect, direction="exact",
        message=msg, evidence=evidence, source="nccl_debug",
    )
