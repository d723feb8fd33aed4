"""The Slurm recipe (scripts/slurm/day0.sbatch, shown in docs/ci.md) runs, unchanged, on an emulated
two-node cluster: a fake ``srun`` runs each task in its host's network namespace and a fake
``scontrol`` expands the node list. The launcher is the only thing that differs from a real
allocation: vLLM starts with ``--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID`` (headless on
node 1), and the suites' collective ranks start on both nodes through day0's srun launcher.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from day0.config.profile import load_profile
from day0.config.topology import EmulateSection
from day0.engine.cluster.netns import EmulatedCluster, day0_leftovers
from day0.model.locate import resolve_model
from tests.support import FAKE_SLURM, REPO

pytestmark = pytest.mark.host("root")

SITE_PROFILE = """
extends = "cpu-tiny"
name = "slurm-rehearsal"

[engine]
mode = "external"
url = "http://set-by-the-recipe:1"
startup_timeout_s = 120

[topology]
nodes = 2
inter_node = "ethernet"
socket_ifname = "veth0"

[collectives]
ops = ["all_reduce", "sendrecv"]
max_bytes = "1M"
tp_equivalence = false

[collectives.expected_busbw.inter_node]
all_reduce = 0.001
sendrecv = 0.001

[latency]                   # num_requests unset: the 32 that bound cpu-tiny's p90 limits
concurrency = 2
input_len = [64, 128]
output_len = 16

[report]
required = ["collectives.*.correct", "collectives.links", "collectives.transport.inter_node",
            "latency.ttft_p99", "latency.tpot_p99"]
"""

VLLM_ARGS = ("--tensor-parallel-size 2 --dtype float32 --enforce-eager --block-size 32 --max-model-len 4096 "
             "--gpu-memory-utilization 0.5")


def test_the_sbatch_recipe_runs_vllm_across_nodes_and_the_suites_against_it(tmp_path):
    profile_path = tmp_path / "site.toml"
    profile_path.write_text(SITE_PROFILE)
    model = resolve_model(load_profile(profile_path))
    cluster = EmulatedCluster.up(2, EmulateSection(link_rate="1gbit"), owner_pid=os.getpid())  # as cpu-2node
    try:
        hosts = [n.address for n in cluster.nodes]
        prefix = hosts[0].rsplit(".", 1)[0]
        env = {**os.environ, "PATH": f"{FAKE_SLURM}{os.pathsep}{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               "SLURM_JOB_NODELIST": f"{prefix}.[1-2]", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
               "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": str(REPO),
               "FAKE_SLURM_NETNS": ",".join(f"{n.address}={n.netns}" for n in cluster.nodes),
               "DAY0_PROFILE": str(profile_path), "DAY0_MODEL": model, "DAY0_OUT": str(tmp_path / "out"),
               "DAY0_VLLM_ARGS": VLLM_ARGS, "DAY0_MARK": "day0 and (collectives or latency)",
               "DAY0_PYTEST_ARGS": "-p no:randomly -q", "DAY0_STARTUP_S": "300", "VLLM_CPU_KVCACHE_SPACE": "1"}
        proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "day0.sbatch")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        tail = (proc.stdout + proc.stderr)[-3000:]
        assert proc.returncode == 0, tail
        record = json.loads((tmp_path / "out" / "latest" / "run.json").read_text())
        stages = {st["name"]: st for st in record["stages"]}
        assert stages["collectives"]["verdict"] == "pass" and stages["latency"]["verdict"] == "pass", tail
        checks = {c["id"]: c for st in record["stages"] for c in st["checks"]}
        assert not [i for i, c in checks.items() if c["status"] in ("fail", "error")], tail
        assert checks["collectives.links"]["status"] == "pass"
        assert checks["collectives.transport.inter_node"]["status"] == "pass"
        assert checks["collectives.ranks"]["evidence"]["hosts"] == ["node0", "node1"]
        assert [(n["host"], n["launcher"]) for n in record["environment"]["nodes"]] == [(h, "srun") for h in hosts]
        engine_log = (tmp_path / "out" / "vllm-4242.log").read_text(errors="replace")
        assert "Application startup complete" in engine_log  # rank 0 served HTTP on node0
        assert f"headless multiproc executor, with head node address {hosts[0]}:" in engine_log  # node 1
    finally:
        cluster.down()
    namespaces, links = day0_leftovers()
    assert not [x for x in namespaces + links if cluster.cid in x], (namespaces, links)
