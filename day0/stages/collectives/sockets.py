"""``collectives.transport.inter_node`` on gloo: the sockets every rank's traffic actually used.

gloo logs no transport, but each rank can read its own TCP connections: ``/proc/self/fd`` gives
its socket inodes, ``/proc/self/net/tcp{,6}`` (the rank's network namespace) the established
connections holding them. Rank 0 gathers every rank's table after the sweep. The check passes when
every pair of ranks on different nodes is connected between their node addresses (the IP of
``GLOO_SOCKET_IFNAME``, else ``DAY0_NODE_ADDR`` resolved: a Slurm node is a name) and no
inter-node pair talked over loopback.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Iterable

from day0.core.record import Check
from day0.core.sockets import Conn, node_ip, own_tcp_connections
from day0.stages.collectives.result import CollectivesResult
from day0.stages.collectives.transport import _TITLE_INTER, transport_checks

INTER_ID = "collectives.transport.inter_node"


def gather_sockets(dist: Any, rank: int, hosts: list[str]) -> list[dict[str, Any]]:
    """Every rank's node, node address and connections, on every rank (the process group still up)."""
    addr = node_ip(os.environ.get("DAY0_NODE_ADDR"), os.environ.get("GLOO_SOCKET_IFNAME"))
    mine = {"rank": rank, "node": hosts[rank], "addr": addr,
            "conns": [list(c) for c in own_tcp_connections()]}
    everyone: list[Any] = [None] * len(hosts)
    dist.all_gather_object(everyone, mine)
    return everyone


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _pairs(tables: list[dict[str, Any]]) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    for i, a in enumerate(tables):
        for b in tables[i + 1:]:
            if a.get("node") != b.get("node"):
                yield a, b


def _direct(a: dict[str, Any], b: dict[str, Any]) -> Conn | None:
    """A connection between a's and b's node addresses in either rank's table (an unknown address: any non-loopback)."""
    for x, y in ((a, b), (b, a)):
        for c in x.get("conns") or []:
            la, _, ra, _ = c
            if _loopback(la) or _loopback(ra):
                continue
            if (x.get("addr") in (None, la)) and (y.get("addr") in (None, ra)):
                return tuple(c) if x is a else (c[2], c[3], c[0], c[1])  # type: ignore[return-value]
    return None


def _over_loopback(a: dict[str, Any], b: dict[str, Any]) -> Conn | None:
    """A loopback connection whose two ends are a and b: ranks of different nodes that talked over lo."""
    ends_b = {(c[0], c[1], c[2], c[3]) for c in b.get("conns") or []}
    for la, lp, ra, rp in a.get("conns") or []:
        if (_loopback(la) or _loopback(ra)) and (ra, rp, la, lp) in ends_b:
            return (la, lp, ra, rp)
    return None


def socket_transport_check(result: CollectivesResult) -> Check:
    """Every inter-node rank pair connected between node addresses, none over loopback (gloo)."""
    src = "/proc/self/net/tcp"
    if result.nnodes <= 1 and not result.sockets:
        return Check(id=INTER_ID, title=_TITLE_INTER, status="skip", source=src,
                     message=f"single node ({result.world_size} ranks): no inter-node traffic")
    tables = [t for t in result.sockets or [] if isinstance(t, dict)]
    if len(tables) != result.world_size or not tables:
        why = result.fault.message if result.fault else f"socket tables of {len(tables)} of {result.world_size} ranks"
        return Check(id=INTER_ID, title=_TITLE_INTER, status="error", source=src,
                     message=f"inter-node sockets not recorded: {why}")
    rows, bad = [], []
    for a, b in _pairs(tables):
        lo, direct = _over_loopback(a, b), _direct(a, b)
        ok = direct is not None and lo is None
        via = f"{lo[0]}:{lo[1]} <-> {lo[2]}:{lo[3]} (loopback)" if lo else (
            f"{direct[0]}:{direct[1]} <-> {direct[2]}:{direct[3]}" if direct else "no connection between node addresses")
        rows.append([a["rank"], a.get("node"), a.get("addr"), b["rank"], b.get("node"), b.get("addr"), via,
                     "ok" if ok else "FAIL"])
        if not ok:
            bad.append((a, b, via))
    total = len(rows)
    evidence = {"table": {"columns": ["rank", "node", "node address", "peer rank", "peer node", "peer address",
                                      "connection", "verdict"], "rows": rows}}
    if total == 0:
        return Check(id=INTER_ID, title=_TITLE_INTER, status="skip", source=src, evidence=evidence,
                     message="no pair of ranks on different nodes")
    if bad:
        a, b, via = bad[0]
        msg = (f"rank {a['rank']} ({a.get('node')} {a.get('addr')}) <-> rank {b['rank']} ({b.get('node')} "
               f"{b.get('addr')}): {via}; {total - len(bad)} of {total} inter-node rank pairs verified; check "
               "GLOO_SOCKET_IFNAME / topology.socket_ifname")
        return Check(id=INTER_ID, title=_TITLE_INTER, status="fail", value=total - len(bad), limit=total,
                     direction="exact", message=msg, evidence=evidence, source=src)
    msg = (f"{total} inter-node rank pairs verified: each connected between its node addresses (e.g. {rows[0][6]}), "
           "none over loopback")
    return Check(id=INTER_ID, title=_TITLE_INTER, status="pass", value=total, limit=total, direction="exact",
                 message=msg, evidence=evidence, source=src)


def stage_transport_checks(result: CollectivesResult, log_text: str, topology: Any) -> list[Check]:
    """The two transport checks: NCCL's log on NCCL; on gloo the inter-node one from the ranks' sockets."""
    checks = transport_checks(log_text, topology, backend=result.backend)
    if result.backend == "gloo" and (result.nnodes > 1 or result.sockets):
        checks = [c for c in checks if c.id != INTER_ID] + [socket_transport_check(result)]
    return checks


ENGINE_ID = "collectives.transport.engine"
_TITLE_ENGINE = "vLLM's TP ranks talk across nodes"


def engine_cross_node_check(cross_node: list[dict[str, str]], nodes: list[str], readable: bool) -> Check:
    """The engine's own TP traffic crossed nodes: every pair of nodes holds a TCP connection between
    their addresses in the engine's socket tables (``EngineInfo.cross_node``, read at start-up). An
    engine whose ranks all landed on one node would still serve; this is what tells it apart."""
    if len(nodes) < 2:
        return Check(id=ENGINE_ID, title=_TITLE_ENGINE, status="skip", message="the engine runs on one node")
    if not readable:
        return Check(id=ENGINE_ID, title=_TITLE_ENGINE, status="skip",
                     message="the nodes' socket tables are not readable from this host (only emulated nodes' are)")
    pairs = {tuple(sorted((c["node"], c["peer"]))) for c in cross_node}
    want = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    missing = [f"{a} <-> {b}" for a, b in want if (a, b) not in pairs]
    per_pair = {f"{a} <-> {b}": sum(tuple(sorted((c["node"], c["peer"]))) == (a, b) for c in cross_node)
                for a, b in want}
    evidence = {"table": {"columns": ["node pair", "TCP connections"], "rows": [[k, v] for k, v in per_pair.items()]},
                "connections": cross_node[:200]}
    if missing:
        return Check(id=ENGINE_ID, title=_TITLE_ENGINE, status="fail", value=len(want) - len(missing),
                     limit=len(want), direction="exact", evidence=evidence, source="sockets",
                     message=f"no engine connection between {', '.join(missing)}: its ranks did not span the nodes")
    return Check(id=ENGINE_ID, title=_TITLE_ENGINE, status="pass", value=len(want), limit=len(want),
                 direction="exact", evidence=evidence, source="sockets",
                 message=f"vLLM's ranks hold {len(cross_node)} TCP connections between node addresses, "
                         f"every pair of the {len(nodes)} nodes connected")
