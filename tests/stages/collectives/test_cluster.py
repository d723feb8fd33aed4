"""Collectives across emulated nodes: one torchrun per node through the cluster's launcher, the
node-to-node link check that localises a slowed link, and gloo's inter-node transport from the
ranks' own sockets. The real runs need root (network namespaces: ``@pytest.mark.host("root")``);
the check logic is tested on synthetic results everywhere."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Iterator

import pytest

from day0.config.profile import load_profile
from day0.core.sockets import own_tcp_connections, parse_proc_tcp
from day0.engine.cluster.netns import netns_pids
from day0.stages.collectives import (
    CollectivesResult,
    CollectivesSection,
    links_check,
    result_checks,
    run_cluster,
    socket_transport_check,
    stage_transport_checks,
)
from day0.stages.collectives.busbw import peak_offrank
from day0.stages.collectives.result import Fault
from day0.stages.collectives.routing import route

SMALL = dict(min_bytes="1K", max_bytes="16K", step_factor=16, warmup_iters=1, iters=2, timeout_s=30.0,
             backend="gloo", links_bytes="256K", links_time_s=0.5)


@contextlib.contextmanager
def emulated(nodes: int, degrade: dict[str, str] | None = None) -> Iterator:
    """Emulated nodes whose links all run at a nominal 200 Mbit/s (25 MB/s): unshaped veths move
    data as fast as the 2 cores copy it, which a busy CI box varies 3x from one link to the next;
    a shaped link measures the link."""
    from day0.engine.cluster.nodes import open_cluster

    emulate = {"link_rate": "200mbit", "degrade": degrade or {}}
    p = load_profile("cpu-tiny", overrides={"topology": {"nodes": nodes, "emulate": emulate}})
    cluster = open_cluster(p.topology)
    try:
        yield cluster
    finally:
        cluster.close()
    ours = [ln for ln in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
            if ln.startswith(f"day0-{os.getpid()}-")]
    assert ours == [], f"namespaces left behind: {ours}"


def _netns_pids(cluster) -> list[int]:
    """Processes still running in the cluster's namespaces (nothing may outlive run_cluster)."""
    return [pid for nd in cluster.nodes for pid in netns_pids(nd.netns)]


# --------------------------------------------------------------------------- real runs on emulated nodes


@pytest.mark.host("root")
def test_two_nodes_exact_hosts_links_and_sockets(tmp_path):
    s = CollectivesSection(**SMALL, ops=["all_reduce", "sendrecv"])
    with emulated(2) as cluster:
        result = run_cluster(s, cluster, tmp_path)
        assert _netns_pids(cluster) == []
    assert result.fault is None and result.complete, result.fault
    assert result.hosts == ["node0", "node1"] and result.nnodes == 2 and result.world_size == 2
    assert result.rows and all(r.wrong == 0 and r.scope == "inter_node" for r in result.rows)
    checks = {c.id: c for c in result_checks(result, s)}
    assert checks["collectives.ranks"].status == "pass" and "2 node(s)" in checks["collectives.ranks"].message
    assert checks["collectives.all_reduce.correct"].status == "pass"
    assert "inter_node" in checks["collectives.all_reduce.busbw"].message
    links = links_check(result, s)
    assert links.status == "pass", links.message
    assert links.evidence["charts"][0]["rows"] == ["node0", "node1"]
    transport = {c.id: c for c in stage_transport_checks(result, "", {"nodes": 2, "inter_node": "ethernet"})}
    inter = transport["collectives.transport.inter_node"]
    assert inter.status == "pass" and inter.message.startswith("1 inter-node rank pairs verified"), inter.message
    assert "198.18." in inter.message


@pytest.mark.host("root")
def test_two_ranks_per_node_separate_intra_from_inter_node(tmp_path):
    s = CollectivesSection(**dict(SMALL, ops=["all_reduce", "sendrecv", "expert_dispatch"], max_bytes="4K", step_factor=4))
    with emulated(2) as cluster:
        result = run_cluster(s, cluster, tmp_path, devices_per_node=2)
    assert result.fault is None and result.complete, result.fault
    assert result.hosts == ["node0", "node0", "node1", "node1"] and result.nnodes == 2
    inter = [r for r in result.rows if r.scope == "inter_node"]
    intra = [r for r in result.rows if r.scope == "intra_node"]
    assert inter and all(r.nranks == 4 and r.wrong == 0 for r in inter)
    assert sorted((r.op, r.node) for r in intra) == [("all_reduce", "node0"), ("all_reduce", "node1"),
                                                     ("expert_dispatch", "node0"), ("expert_dispatch", "node1"),
                                                     ("sendrecv", "node0"), ("sendrecv", "node1")]
    # Expert traffic is routed over the group that ran it: all four ranks across the nodes, or a node's two.
    routings = {n: route(n, **s.expert_routing.model_dump()) for n in (2, 4)}
    routed = {n: peak_offrank(rt.rows) / rt.per_rank for n, rt in routings.items()}
    ep = [r for r in result.rows if r.op == "expert_dispatch"]
    assert ep and all(r.busbw_gbps == pytest.approx(r.algbw_gbps * routed[r.nranks]) for r in ep)
    assert all(r.nranks == 2 and r.wrong == 0 and r.size_bytes == 4096 for r in intra)
    checks = {c.id: c for c in result_checks(result, s)}
    assert checks["collectives.intra_node.all_reduce.correct"].status == "pass"
    assert checks["collectives.intra_node.expert_dispatch.correct"].status == "pass"
    assert checks["collectives.expert_dispatch.correct"].status == "pass"
    busbw = checks["collectives.intra_node.sendrecv.busbw"]
    assert busbw.status == "pass" and "intra_node" in busbw.message and " on node" in busbw.message
    assert "inter_node" in checks["collectives.sendrecv.busbw"].message
    assert all(r.nranks == 4 for r in result.rows if r.op == "all_reduce" and r.scope == "inter_node")
    inter_t = socket_transport_check(result)
    assert inter_t.status == "pass" and inter_t.message.startswith("4 inter-node rank pairs verified"), inter_t.message
    assert links_check(result, s).status == "pass"


@pytest.mark.host("root")
def test_degraded_node_is_localised_and_nominal_links_pass(tmp_path):
    s = CollectivesSection(**dict(SMALL, ops=["sendrecv"], max_bytes="1K"))
    with emulated(4, {"node2": "20mbit"}) as cluster:
        slow = run_cluster(s, cluster, tmp_path / "slow")
    with emulated(4) as cluster:
        fast = run_cluster(s, cluster, tmp_path / "fast")
    assert slow.fault is None and fast.fault is None, (slow.fault, fast.fault)
    bad = links_check(slow, s)
    assert bad.status == "fail", bad.message
    assert bad.evidence["failing_pairs"] == [["node0", "node2"], ["node1", "node2"], ["node2", "node3"]]
    marked = {tuple(c) for c in bad.evidence["charts"][0]["marked"]}
    assert marked == {(0, 2), (2, 0), (1, 2), (2, 1), (2, 3), (3, 2)}
    assert bad.message.startswith("node0 <-> node2: ") and "node1 <-> node2" in bad.message
    assert "node0 <-> node1" not in bad.message and "median" in bad.message
    mbps = slow.links["mbps"]
    # 20 mbit/s = 2.5 MB/s; tbf's 64 KB bucket refills between transfers, so a 1 MiB one can beat it by ~25%
    assert 1.0 < mbps[0][2] < 3.5 and 1.0 < mbps[2][3] < 3.5
    good = links_check(fast, s)
    assert good.status == "pass", good.message
    # 200 vs 20 mbit/s: every nominal link far above the degraded ones (25 vs 3.1 MB/s measured)
    assert min(v for row in fast.links["mbps"] for v in row if v is not None) > 5 * max(mbps[0][2], mbps[2][0])


@pytest.mark.host("root")
def test_killed_rank_on_a_node_is_named_and_nothing_is_left(tmp_path):
    s = CollectivesSection(**dict(SMALL, ops=["all_reduce"], iters=100000, grace_s=2.0))
    box: dict = {}
    with emulated(2) as cluster:
        th = threading.Thread(target=lambda: box.setdefault("r", run_cluster(s, cluster, tmp_path)), daemon=True)
        th.start()
        step = tmp_path / "ranks" / "rank1.step.json"
        deadline = time.monotonic() + 90
        info: dict = {}
        while time.monotonic() < deadline and info.get("phase") != "sweep":
            with contextlib.suppress(OSError, json.JSONDecodeError):
                info = json.loads(step.read_text())
            time.sleep(0.05)
        assert info.get("phase") == "sweep", "the ranks never reached the sweep"
        assert info["host"] == "node1"
        os.kill(info["pid"], signal.SIGKILL)
        th.join(60)
        assert not th.is_alive(), "run_cluster did not return"
        assert _netns_pids(cluster) == []
    result = box["r"]
    assert result.fault is not None and result.fault.kind == "died" and result.fault.ranks == [1], result.fault
    assert result.fault.message.startswith("rank 1 on node1 died (SIGKILL) during all_reduce"), result.fault.message
    ranks = result_checks(result, s)[0]
    assert ranks.status == "fail" and "node1" in ranks.message
    assert links_check(result, s).status == "error"


# --------------------------------------------------------------------------- the links check's floor


def _links_result(nodes: int, slow: dict[tuple[int, int], float], fast: float = 610.0) -> CollectivesResult:
    names = [f"node{i}" for i in range(nodes)]
    mbps = [[None if i == j else slow.get((i, j), fast) for j in range(nodes)] for i in range(nodes)]
    return CollectivesResult(backend="gloo", world_size=nodes, hosts=names,
                             links={"nodes": names, "leaders": list(range(nodes)), "bytes": 4 << 20, "mbps": mbps,
                                    "samples_mbps": [[[v] if v else [] for v in row] for row in mbps]})


def test_links_median_rule_names_the_pair_in_words():
    c = links_check(_links_result(4, {(0, 2): 2.4, (2, 0): 2.5}), CollectivesSection())
    assert c.status == "fail"
    assert c.message.startswith("node0 <-> node2: 2.4 MB/s, median link 610 MB/s"), c.message
    assert c.evidence["failing_pairs"] == [["node0", "node2"]]
    chart = c.evidence["charts"][0]
    assert {k: chart[k] for k in ("kind", "x_label", "y_label", "unit")} == {
        "kind": "heatmap", "x_label": "receiver", "y_label": "sender", "unit": "MB/s"}
    assert chart["rows"] == chart["cols"] == ["node0", "node1", "node2", "node3"]
    assert chart["values"][0][0] is None and chart["values"][0][2] == 2.4 and chart["marked"] == [[0, 2], [2, 0]]
    from day0.results import charts

    assert "<svg" in charts.render_spec(charts.parse_spec(chart, "collectives.links evidence.charts[0]"))
    assert c.evidence["table"]["columns"][:3] == ["sender", "receiver", "MB/s"]
    assert len(c.evidence["table"]["rows"]) == 12


def test_links_one_slow_direction_fails_the_pair_and_near_median_passes():
    one_way = links_check(_links_result(3, {(1, 0): 100.0}), CollectivesSection())
    assert one_way.status == "fail" and one_way.message.startswith("node0 <-> node1: 100 MB/s")
    near = links_check(_links_result(3, {(1, 0): 400.0, (2, 1): 350.0}), CollectivesSection())
    assert near.status == "pass", near.message
    assert "min 350 MB/s, median link 400 MB/s" in near.message  # links (0,1) 400, (1,2) 350, (0,2) 610


def test_two_nodes_are_one_link_judged_by_the_expectation_alone():
    """Two nodes are one link: its directions 4x apart (measured beside a busy test suite: 28 vs 112
    MB/s at 1 Gbit/s) are not a slow link; only an expectation fails it."""
    r = _links_result(2, {(0, 1): 28.3}, fast=112.0)
    assert links_check(r, CollectivesSection()).status == "pass"
    slow = links_check(r, CollectivesSection(expected_link_gbps=0.1, pass_fraction=0.8))
    assert slow.status == "fail" and slow.message.startswith("node0 <-> node1: 28.3 MB/s")


def test_links_expectation_rule_fails_uniformly_slow_links():
    r = _links_result(2, {})
    assert links_check(r, CollectivesSection()).status == "pass"  # no expectation: all equal, nothing stands out
    c = links_check(r, CollectivesSection(expected_link_gbps=1.0, pass_fraction=0.8))
    assert c.status == "fail" and c.limit == 800.0
    assert "expected 1000 MB/s" in c.message and c.message.startswith("node0 <-> node1: 610 MB/s")
    # without expected_link_gbps, the inter-node sendrecv busbw expectation is the link's
    via_busbw = links_check(r, CollectivesSection(expected_busbw={"inter_node": {"sendrecv": 0.5}}, pass_fraction=1.0))
    assert via_busbw.status == "pass" and via_busbw.limit == 500.0


def test_links_single_node_skips_and_missing_matrix_is_an_error():
    one = CollectivesResult(backend="gloo", world_size=2, hosts=["h", "h"])
    assert links_check(one, CollectivesSection()).status == "skip"
    two = CollectivesResult(backend="gloo", world_size=2, hosts=["node0", "node1"])
    assert links_check(two, CollectivesSection()).status == "error"
    failed_alone = CollectivesResult(backend="gloo", world_size=2)
    failed_alone.fault = Fault("died", [1], "rank 1 died (SIGKILL)")
    assert links_check(failed_alone, CollectivesSection(), nodes=1).status == "skip"
    failed_across = links_check(failed_alone, CollectivesSection(), nodes=2)
    assert failed_across.status == "error" and "rank 1 died" in failed_across.message
    imported = CollectivesResult(source="nccl-tests", backend="nccl", world_size=16, hosts=["a"] * 8 + ["b"] * 8)
    assert links_check(imported, CollectivesSection()).status == "skip"


# --------------------------------------------------------------------------- gloo's inter-node sockets


def _table(rank, node, addr, conns):
    return {"rank": rank, "node": node, "addr": addr, "conns": [list(c) for c in conns]}


def _socket_result(tables) -> CollectivesResult:
    return CollectivesResult(backend="gloo", world_size=len(tables), hosts=[t["node"] for t in tables], sockets=tables)


def test_inter_node_sockets_pass_on_node_addresses():
    a, b = "198.18.0.1", "198.18.0.2"
    tables = [_table(0, "node0", a, [(a, 40000, b, 50000), ("127.0.0.1", 1, "127.0.0.1", 2)]),
              _table(1, "node1", b, [(b, 50000, a, 40000)]),
              _table(2, "node1", b, [(b, 50001, a, 40001)])]
    c = socket_transport_check(_socket_result(tables))
    assert c.status == "pass" and c.value == 2 and c.message.startswith("2 inter-node rank pairs verified"), c.message


def test_inter_node_sockets_fail_on_loopback_and_name_the_pair():
    lo = "127.0.0.1"
    tables = [_table(0, "node0", "198.18.0.1", [(lo, 40000, lo, 50000)]),
              _table(1, "node1", "198.18.0.2", [(lo, 50000, lo, 40000)])]
    c = socket_transport_check(_socket_result(tables))
    assert c.status == "fail" and c.value == 0 and c.limit == 1
    assert c.message.startswith("rank 0 (node0 198.18.0.1) <-> rank 1 (node1 198.18.0.2): 127.0.0.1:40000"), c.message
    assert "loopback" in c.message and "0 of 1" in c.message
    # a pair with no connection between the node addresses fails too
    none = [_table(0, "node0", "198.18.0.1", []), _table(1, "node1", "198.18.0.2", [])]
    assert socket_transport_check(_socket_result(none)).status == "fail"
    # on gloo the NCCL-log inter-node check is replaced; on one node it stays today's skip
    ids = {c.id: c.status for c in stage_transport_checks(_socket_result(tables), "", {})}
    assert ids == {"collectives.transport.intra_node": "skip", "collectives.transport.inter_node": "fail"}
    single = CollectivesResult(backend="gloo", world_size=2, hosts=["h", "h"])
    assert {c.status for c in stage_transport_checks(single, "", {})} == {"skip"}


def test_proc_net_tcp_is_decoded_and_own_connections_are_found():
    text = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
            "   1: 010012C6:9C40 020012C6:C350 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n")
    assert parse_proc_tcp(text) == [("198.18.0.1", 40000, "198.18.0.2", 50000)]
    assert parse_proc_tcp(text, {"111"}) == []
    v6 = ("  sl  local_address                         remote_address                        st x x x x x x inode\n"
          "   0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:A000 01 0 0 0 0 0 0 333\n")
    assert parse_proc_tcp(v6) == [("127.0.0.1", 8080, "127.0.0.1", 40960)]
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname()) as cli:
            peer, _ = srv.accept()
            with peer:
                mine = own_tcp_connections()
                assert ("127.0.0.1", cli.getsockname()[1], "127.0.0.1", srv.getsockname()[1]) in mine


def test_the_engine_check_names_a_pair_of_nodes_its_ranks_did_not_connect():
    from day0.stages.collectives import engine_cross_node_check

    conns = [{"node": "node0", "peer": "node1", "local": "198.18.0.1:1", "remote": "198.18.0.2:2"},
             {"node": "node1", "peer": "node0", "local": "198.18.0.2:2", "remote": "198.18.0.1:1"}]
    ok = engine_cross_node_check(conns, ["node0", "node1"], readable=True)
    assert ok.status == "pass" and "2 TCP connections" in ok.message
    bad = engine_cross_node_check(conns, ["node0", "node1", "node2"], readable=True)
    assert bad.status == "fail" and bad.message.startswith("no engine connection between node0 <-> node2, node1 <-> node2")
    assert engine_cross_node_check([], ["node0", "node1"], readable=False).status == "skip"
    assert engine_cross_node_check([], ["node0"], readable=True).status == "skip"


def test_a_worker_under_a_multi_node_srun_meets_on_the_first_host_not_loopback():
    from day0.stages.collectives.cli import rendezvous_addr

    s = CollectivesSection()
    job = {"SLURM_JOB_NODELIST": "gpu[07-10]", "SLURM_JOB_NUM_NODES": "4", "SLURM_PROCID": "5", "SLURM_NTASKS": "32"}
    assert rendezvous_addr(s, job) == "gpu07"
    assert rendezvous_addr(s, {"SLURM_JOB_NODELIST": "gpu07", "SLURM_JOB_NUM_NODES": "1"}) == "127.0.0.1"
    assert rendezvous_addr(s, {}) == "127.0.0.1"


def test_a_rank_names_its_node_by_the_ip_its_traffic_leaves_from():
    """Slurm names nodes (node0, gpu017): the socket check compares IPs, so a name is resolved, and the
    interface gloo binds to wins over the name (a hostname may resolve to a management network)."""
    from day0.core.sockets import node_ip

    assert node_ip("127.0.0.1", None) == "127.0.0.1"
    assert node_ip("localhost", None) == "127.0.0.1"
    assert node_ip("10.9.9.9", "lo") == "127.0.0.1"
    assert node_ip("10.9.9.9", "no-such-if0") == "10.9.9.9"
    assert node_ip("no-such-host.invalid", None) is None
    assert node_ip(None, None) is None


def test_the_link_buffers_are_made_where_the_groups_backend_takes_them():
    """NCCL has no CPU backend: the link test's CPU tensors raised on every multi-node GPU run. A
    labelled fake: torch's tensor makers recorded (on the CPU, standing in for the GPU device), a
    dist whose peer answers every send at once."""
    import torch

    from day0.config.collectives import CollectivesSection
    from day0.stages.collectives.links import measure_links

    made: list[object] = []

    class RecordingTorch:
        def __getattr__(self, name):
            real = getattr(torch, name)
            if name in ("ones", "zeros", "tensor"):
                def make(*a, **k):
                    made.append(k.get("device"))
                    return real(*a, **k)
                return make
            return real

    class AnsweringDist:
        def barrier(self):
            pass

        def send(self, t, dst):
            pass

        def recv(self, t, src):
            t.fill_(0)

        def all_gather_object(self, out, obj):
            out[:] = [obj] * len(out)

    device = torch.device("cpu")
    settings = CollectivesSection(links_bytes=1024, links_rounds=1, links_time_s=0.01)
    got = measure_links(AnsweringDist(), RecordingTorch(), settings, 0, ["node0", "node1"], device)
    assert got["nodes"] == ["node0", "node1"] and got["mbps"][0][1] is not None
    assert made and all(d == device for d in made), made
