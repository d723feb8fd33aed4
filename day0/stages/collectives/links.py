"""``collectives.links``: point-to-point bandwidth between every pair of nodes, both directions.

Measured by the ranks after the sweep when they span several nodes: one leader rank per node
(its first rank, local rank 0) sends ``links_bytes`` to every other leader, which answers with a
tiny ack; bandwidth = bytes / time of one transfer and its ack, in ``links_rounds`` rounds over
all the links (a warm-up first, as many repeats as fit in ``links_time_s`` in all, at least one
per round); the figure is the median over rounds of each round's fastest repeat
(:func:`link_figure`). Every other rank waits
at a barrier, so each link is measured alone. The check fails a pair of nodes when either
direction is below ``pass_fraction`` x the expected link bandwidth, or below half the median link
(each link at its slower direction: a slow link is caught with no expectation set), and names the pair.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from day0.core.record import Check
from day0.stages.collectives.result import CollectivesResult
from day0.stages.collectives.settings import CollectivesSection, coerce_settings, human_bytes

LINKS_ID = "collectives.links"
LINKS_TITLE = "Every node-to-node link carries its share (point-to-point, both directions)"
MEDIAN_FRACTION = 0.5
MAX_REPEATS = 20


def measure_links(dist: Any, torch: Any, s: CollectivesSection, rank: int, hosts: list[str],
                  device: Any = "cpu") -> dict[str, Any]:
    """Every directed leader-to-leader link, one at a time, in ``links_rounds`` rounds over all the
    links; the matrix (MB/s) returned on every rank. ``device``: where the group's backend takes
    tensors (a GPU under NCCL, which has no CPU backend: CPU tensors raised on every multi-node GPU
    run; not yet run on GPUs)."""
    nodes = list(dict.fromkeys(hosts))
    leaders = [hosts.index(n) for n in nodes]
    buf = torch.ones(max(1, int(s.links_bytes) // 4), dtype=torch.float32, device=device)
    nbytes = buf.numel() * 4
    rounds = max(1, int(s.links_rounds))
    budget = float(s.links_time_s) / rounds
    mine: dict[str, list[list[float]]] = {}  # "i,j" -> one list of repeat times per round
    for r in range(rounds):
        for i, src in enumerate(leaders):
            for j, dst in enumerate(leaders):
                if i == j:
                    continue
                dist.barrier()
                if rank == src:
                    mine.setdefault(f"{i},{j}", []).append(_send_side(dist, torch, buf, dst, budget, warm_up=r == 0))
                elif rank == dst:
                    _recv_side(dist, torch, buf, src)
    everyone: list[Any] = [None] * len(hosts)
    dist.all_gather_object(everyone, mine)
    seconds: dict[str, list[list[float]]] = {}
    for d in everyone:
        seconds.update(d or {})
    n = len(nodes)
    mbps: list[list[float | None]] = [[None] * n for _ in range(n)]
    samples: list[list[list[float]]] = [[[] for _ in range(n)] for _ in range(n)]
    for key, per_round in seconds.items():
        i, j = (int(x) for x in key.split(","))
        samples[i][j] = [round(nbytes / t / 1e6, 3) for times in per_round for t in times if t > 0]
        mbps[i][j] = link_figure(nbytes, per_round)
    return {"nodes": nodes, "leaders": leaders, "bytes": nbytes, "mbps": mbps, "samples_mbps": samples}


def link_figure(nbytes: int, per_round: list[list[float]]) -> float | None:
    """MB/s: the median over rounds of each round's fastest repeat. Noise on a shared host only ever
    slows a transfer, so a round's fastest repeat is its best view of the link; the median over
    rounds ignores a round that a busy moment spoiled whole."""
    bests = [nbytes / min(t for t in times if t > 0) / 1e6 for times in per_round if any(t > 0 for t in times)]
    return round(statistics.median(bests), 3) if bests else None


def _send_side(dist: Any, torch: Any, buf: Any, dst: int, budget_s: float, warm_up: bool) -> list[float]:
    """Timed transfers to ``dst``, each until its ack: the first sizes how many fit in ``budget_s``
    (and is only a warm-up in the first round: connection, socket buffers, TCP's window)."""
    ack = torch.zeros(1, dtype=torch.int64, device=buf.device)

    def once() -> float:
        t0 = time.perf_counter()
        dist.send(buf, dst)
        dist.recv(ack, dst)
        ack.item()  # a GPU's recv only enqueues: reading the ack waits for it (a no-op wait on CPU)
        return time.perf_counter() - t0

    first = once()
    times = [] if warm_up else [first]
    more = min(MAX_REPEATS, int(budget_s / max(first, 1e-6))) - len(times)
    more = max(more, 1 if warm_up else 0)
    dist.send(torch.tensor([more], dtype=torch.int64, device=buf.device), dst)
    times += [once() for _ in range(more)]
    return times


def _recv_side(dist: Any, torch: Any, buf: Any, src: int) -> None:
    ack = torch.ones(1, dtype=torch.int64, device=buf.device)
    ctl = torch.zeros(1, dtype=torch.int64, device=buf.device)
    dist.recv(buf, src)
    dist.send(ack, src)
    dist.recv(ctl, src)
    for _ in range(int(ctl.item())):
        dist.recv(buf, src)
        dist.send(ack, src)


# -- the check ------------------------------------------------------------------------------


def mb(x: float) -> str:
    """MB/s as people read them: 610, 12.3, 2.4, 0.05."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def pair_values(mbps: list[list[float | None]]) -> list[float]:
    """One figure per link (unordered pair of nodes): its slower measured direction."""
    n = len(mbps)
    out = []
    for i in range(n):
        for j in range(i + 1, n):
            both = [x for x in (mbps[i][j], mbps[j][i]) if x is not None]
            if both:
                out.append(min(both))
    return out


def link_floor(mbps: list[list[float | None]], expected_mbps: float | None, pass_fraction: float) -> tuple[float, float]:
    """(floor, median) in MB/s: the larger of pass_fraction x expected and half the median link.

    The median is over links (pairs of nodes, each at its slower direction), not directions: with
    two nodes there is one link, which the median rule cannot hold against itself (its two
    directions differ 3x when the 2 cores are busy), so only the expectation judges it."""
    values = pair_values(mbps)
    median = statistics.median(values) if values else 0.0
    floor = MEDIAN_FRACTION * median
    if expected_mbps is not None:
        floor = max(floor, expected_mbps * pass_fraction)
    return floor, median


def _expected_mbps(s: CollectivesSection) -> float | None:
    gbps = s.expected_link_gbps
    if gbps is None:
        gbps = s.expected_busbw.get("inter_node", {}).get("sendrecv")
    return None if gbps is None else float(gbps) * 1000.0


def links_check(result: CollectivesResult, settings: Any = None, nodes: int | None = None) -> Check:
    """Fail every pair of nodes with a direction below the floor; a table and a heat map as evidence.
    ``nodes``: the topology's node count, when known (one node: skip, even for a run that failed)."""
    s = coerce_settings(settings if settings is not None else result.settings or None)
    links = result.links
    if not links or not links.get("nodes"):
        if result.source == "nccl-tests":
            return Check(id=LINKS_ID, title=LINKS_TITLE, status="skip", source="nccl-tests",
                         message="an imported nccl-tests result measures no node-to-node links; run day0's sweep")
        if (nodes if nodes is not None else result.nnodes) <= 1 and (nodes is not None or result.fault is None):
            return Check(id=LINKS_ID, title=LINKS_TITLE, status="skip", source="torch.distributed",
                         message=f"single node ({result.world_size} ranks on {result.nnodes} node): no node-to-node links")
        why = result.fault.message if result.fault else "the ranks recorded no link matrix"
        return Check(id=LINKS_ID, title=LINKS_TITLE, status="error", source="torch.distributed",
                     message=f"links not measured: {why}")
    nodes: list[str] = list(links["nodes"])
    mbps: list[list[float | None]] = links["mbps"]
    expected = _expected_mbps(s)
    floor, median = link_floor(mbps, expected, float(s.pass_fraction))
    n = len(nodes)
    missing = [(i, j) for i in range(n) for j in range(n) if i != j and mbps[i][j] is None]
    marked = [[i, j] for i in range(n) for j in range(n) if i != j and mbps[i][j] is not None and mbps[i][j] < floor]
    bad_pairs = sorted({(min(i, j), max(i, j)) for i, j in marked + [list(m) for m in missing]})
    evidence = _links_evidence(links, nodes, mbps, marked, floor, median, expected, s)
    evidence["failing_pairs"] = [[nodes[i], nodes[j]] for i, j in bad_pairs]
    values = [v for row in mbps for v in row if v is not None]
    # the slowest link is unknown while one was not measured: no value, so the fail its limit cannot
    # contradict (a record re-judges every status from value and limit: docs/record.md)
    value = round(min(values), 3) if values and not missing else None
    src = f"torch.distributed/{result.backend or '?'}"
    if bad_pairs:
        parts = []
        for i, j in bad_pairs:
            both = [x for x in (mbps[i][j], mbps[j][i]) if x is not None]
            slow = f"{mb(min(both))} MB/s" if len(both) == 2 else "not measured"
            parts.append(f"{nodes[i]} <-> {nodes[j]}: {slow}")
        msg = f"{'; '.join(parts)}, median link {mb(median)} MB/s (floor {mb(floor)} MB/s"
        msg += f" = max(0.5 x median, {s.pass_fraction:g} x expected {mb(expected)} MB/s))" if expected else " = 0.5 x median)"
        return Check(id=LINKS_ID, title=LINKS_TITLE, status="fail", value=value, limit=round(floor, 3), unit="MB/s",
                     direction="higher_is_better", message=msg, evidence=evidence, source=src)
    msg = (f"{len(values)} directed links between {n} nodes at {human_bytes(int(links.get('bytes', 0)))}: min "
           f"{mb(min(values))} MB/s, median link {mb(median)} MB/s, all above the floor {mb(floor)} MB/s")
    return Check(id=LINKS_ID, title=LINKS_TITLE, status="pass", value=value, limit=round(floor, 3), unit="MB/s",
                 direction="higher_is_better", message=msg, evidence=evidence, source=src)


def _links_evidence(links: dict[str, Any], nodes: list[str], mbps: list[list[float | None]], marked: list[list[int]],
                    floor: float, median: float, expected: float | None, s: CollectivesSection) -> dict[str, Any]:
    samples = links.get("samples_mbps") or []
    rows = []
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            if i != j:
                reps = len(samples[i][j]) if i < len(samples) and j < len(samples[i]) else None
                rows.append([a, b, mbps[i][j], reps, round(floor, 3), "slow" if [i, j] in marked else "ok"])
    return {
        "table": {"columns": ["sender", "receiver", "MB/s", "repeats", "floor MB/s", "verdict"], "rows": rows},
        "charts": [{"kind": "heatmap", "title": f"node-to-node bandwidth, {human_bytes(int(links.get('bytes', 0)))} "
                                                "point-to-point (MB/s)",
                    "x_label": "receiver", "y_label": "sender", "rows": nodes, "cols": nodes,
                    "values": mbps, "unit": "MB/s", "marked": marked}],
        "floor_mbps": round(floor, 3), "median_mbps": round(median, 3), "expected_mbps": expected,
        "pass_fraction": float(s.pass_fraction), "median_fraction": MEDIAN_FRACTION, "bytes": links.get("bytes"),
        "samples_mbps": samples,
    }
