"""One vLLM engine across nodes: rank 0 serves HTTP on node0, the other nodes run headless ranks.

vLLM's mp executor spans nodes with ``--nnodes N --node-rank K --master-addr A --master-port P``;
ranks K > 0 run ``serve --headless`` (which only vLLM's CLI has, hence :mod:`day0.engine.vllm_cli`).
Each node's processes are started by the cluster's launcher, with the node's own interface and
address (``GLOO_SOCKET_IFNAME``, ``VLLM_HOST_IP``) and, on CPU nodes, their own core for OpenMP.
What a multi-node engine must also show is that its TP traffic crossed nodes: the established
TCP connections between node addresses, read from the nodes' socket tables.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from typing import Any

from day0.config.profile import Profile
from day0.core.sockets import namespace_connections
from day0.engine.cluster.launchers import Node
from day0.engine.cluster.nodes import Cluster


@dataclass(frozen=True)
class NodeCommand:
    node: Node
    argv: list[str]
    env: dict[str, str]


def node0_ports(profile: Profile) -> tuple[int, int]:
    """(HTTP port, the port vLLM's ranks meet on) at node0. On emulated nodes every namespace has
    its own ports, so any one is free; on real nodes the topology names the rendezvous port (a
    firewall usually decides). Neither is the port after the rendezvous port: the collectives
    stage meets there (:func:`day0.stages.collectives.multinode.collectives_port`)."""
    master = profile.topology.master_port or random.randint(20000, 29999)
    http = random.randint(20000, 29999)
    while http in (master, master + 1):
        http = random.randint(20000, 29999)
    return http, master


def node_commands(profile: Profile, cluster: Cluster, model: str, port: int, master_port: int,
                  engine_args: list[str], served_name: str) -> list[NodeCommand]:
    """vLLM's command line on every node: node0 serves HTTP on its node address, the rest are headless."""
    n = len(cluster.nodes)
    out = []
    for node in cluster.nodes:
        argv = [sys.executable, "-m", "day0.engine.vllm_cli", "serve", model, *engine_args,
                "--nnodes", str(n), "--node-rank", str(node.index),
                "--master-addr", cluster.master_addr, "--master-port", str(master_port)]
        if node.index == 0:
            argv += ["--served-model-name", served_name, "--host", node.address, "--port", str(port)]
        else:
            argv += ["--headless"]
        out.append(NodeCommand(node, argv, node_env(profile, node)))
    return out


def node_env(profile: Profile, node: Node) -> dict[str, str]:
    """The node's environment for vLLM. On CPU each node's ranks get their own cores (OpenMP binds
    threads; two nodes on one box must not bind the same core), unless the profile chose."""
    env: dict[str, str] = {}
    topo = profile.topology
    if topo.device == "cpu" and "VLLM_CPU_OMP_THREADS_BIND" not in profile.engine.env:
        cores = os.cpu_count() or 1
        per = topo.devices_per_node
        first = node.index * per
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str((first + r) % cores) for r in range(per))
    return env


def engine_cli_args(args: dict[str, Any]) -> dict[str, Any]:
    """Engine args for a multi-node start: the mp executor spans nodes (vLLM's CPU platform refuses Ray)."""
    return {"distributed_executor_backend": "mp", **args}


# ---------------------------------------------------------------------------- TP traffic


def cross_node_connections(cluster: Cluster) -> list[dict[str, str]]:
    """Established TCP connections between two node addresses, from each emulated node's socket
    table (one process per namespace shows the namespace's whole table). Empty when the nodes are
    not on this host: their tables are not readable from here."""
    if cluster.emulated is None:
        return []
    addrs = {nd.address: nd.name for nd in cluster.nodes}
    pids = cluster.emulated.pids()
    out = []
    for node in cluster.nodes:
        for pid in pids.get(node.name, [])[:1]:
            for la, lp, ra, rp in namespace_connections(pid):
                if la in addrs and ra in addrs and la != ra:
                    out.append({"node": node.name, "peer": addrs[ra], "local": f"{la}:{lp}", "remote": f"{ra}:{rp}"})
    return out
