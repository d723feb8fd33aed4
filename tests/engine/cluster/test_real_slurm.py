"""A real Slurm (Debian's 22.05: munge, slurmctld, one slurmd per emulated node) runs the recipe
unchanged: ``sbatch scripts/slurm/day0.sbatch`` starts vLLM across the nodes through ``srun``, the
suites run against it from the batch host, and the collective ranks start through day0's ``srun``
launcher inside the allocation. The faults a scheduler brings (a node down, a job cancelled) are
met by ``day0 slurm submit``. (A fake-srun rehearsal of the recipe ran beside this one until
2026-12-05: everything it checked, this run checks through the real scheduler, and CI always has it.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from day0.config.profile import load_profile
from day0.config.topology import EmulateSection
from day0.core.sockets import namespace_connections
from day0.engine.cluster.netns import EmulatedCluster, day0_leftovers
from day0.engine.rpc_folder import FOLDER_LINE
from day0.engine.server import cli_args
from day0.model.locate import resolve_model
from tests.support import REPO, processes_naming

pytestmark = pytest.mark.host("slurm")

MASTER_PORT = 29611

# The site profile a team writes for its cluster: the nodes come from the allocation (launcher auto =
# srun inside it), the engine is the one the recipe started. cpu-2node's settings, without emulation.
SITE_PROFILE = """
extends = "cpu-tiny"
name = "slurm-site"

[engine]
mode = "external"
url = "http://set-by-the-recipe:1"

[engine.args]                   # what the recipe serves (DAY0_VLLM_ARGS): the per-rank KV and plan use it
tensor_parallel_size = 2
distributed_executor_backend = "mp"

[sla]                           # TP 2 across two nodes on 2 shared cores: a floor that catches a broken engine
ttft_p90_ms = 3000
tpot_p90_ms = 1000
e2e_p90_ms = 20000

[topology]
nodes = 2
inter_node = "ethernet"
socket_ifname = "veth0"

[collectives]
tp_equivalence = false

[collectives.expected_busbw.inter_node]
all_reduce = 0.005
all_gather = 0.005
reduce_scatter = 0.005
all_to_all = 0.005
broadcast = 0.005
sendrecv = 0.005

[report]    # an external engine across nodes: no scheduler view, no worker memory (as cpu-2node)
required = ["preflight.plan.verdict", "weights.smoke.*", "weights.golden_tokens",
            "collectives.*.correct", "collectives.links", "collectives.transport.inter_node",
            "latency.ttft_p99", "latency.tpot_p99", "kvcache.blackbox_fragmentation"]
"""


@pytest.fixture
def slurm_cluster():
    cluster = EmulatedCluster.up(2, EmulateSection(link_rate="1gbit", scheduler="slurm"), owner_pid=os.getpid())
    try:
        yield cluster
    finally:
        cluster.down()
    assert_nothing_left(cluster)


def assert_nothing_left(cluster: EmulatedCluster) -> None:
    namespaces, links = day0_leftovers()
    assert not [x for x in namespaces + links if cluster.cid in x], (namespaces, links)
    assert not cluster.folder.exists()
    assert not processes_naming(str(cluster.folder)), "a Slurm daemon outlived the cluster"


def _node_processes(cluster: EmulatedCluster) -> dict[str, list[str]]:
    """What runs in each node's namespace besides its slurmd: the command lines."""
    out = {}
    for name, pids in cluster.pids().items():
        cmds = []
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if cmd and "slurmd -f" not in cmd:
                cmds.append(cmd)
        out[name] = cmds
    return out


def assert_nodes_empty(cluster: EmulatedCluster, within_s: float = 30.0) -> None:
    """Nothing of the job outlives it for long. `sbatch --wait` returns when the controller marks the
    job done; each node's slurmstepd still reports its step's end and exits after that (a busy CI box
    caught `slurmstepd: [1.0]` alive at the return), and a cancelled step gets KillWait (5 s here)
    before SIGKILL. So a bound, not an instant: what is left after it is a leak."""
    deadline = time.monotonic() + within_s
    while any(_node_processes(cluster).values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_node_processes(cluster).values()), _node_processes(cluster)


def _engine_cross_node(cluster: EmulatedCluster) -> list[tuple[str, int, str, int]]:
    """node1's vLLM processes' established connections to node0's address (their sockets only)."""
    node0, node1 = cluster.nodes[0], cluster.nodes[1]
    inodes: set[str] = set()
    pids = cluster.pids()[node1.name]
    for pid in pids:
        try:
            if b"vllm" not in Path(f"/proc/{pid}/cmdline").read_bytes().lower():  # VLLM::Worker too
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
                if m:
                    inodes.add(m.group(1))
        except OSError:
            continue
    if not pids or not inodes:
        return []
    return [c for c in namespace_connections(pids[0], inodes) if c[0] == node1.address and c[2] == node0.address]


def recipe_env(cluster: EmulatedCluster, tmp_path: Path, mark: str = "day0") -> dict[str, str]:
    profile = tmp_path / "site.toml"
    profile.write_text(SITE_PROFILE)
    site = load_profile(profile)
    # what the recipe serves is the site profile's [engine.args], flag for flag, as a team would pass them
    vllm_args = " ".join(cli_args(site.engine.args))
    assert cluster.slurm is not None
    return cluster.slurm.env({
        **os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DAY0_PROFILE": str(profile), "DAY0_MODEL": resolve_model(site),
        "DAY0_OUT": str(tmp_path / "out"), "DAY0_VLLM_ARGS": vllm_args, "DAY0_MARK": mark,
        "DAY0_MASTER_PORT": str(MASTER_PORT), "DAY0_PYTEST_ARGS": "-p no:randomly -q", "DAY0_STARTUP_S": "400",
        "VLLM_CPU_KVCACHE_SPACE": "1"})


@pytest.mark.engine
def test_sbatch_runs_the_recipe_across_the_nodes_and_the_run_is_accepted(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    env = recipe_env(cluster, tmp_path)
    seen: list[tuple[str, int, str, int]] = []
    done = threading.Event()

    def watch() -> None:  # the engine's own TP sockets between the nodes, read while it serves
        while not done.is_set() and not seen:
            seen.extend(_engine_cross_node(cluster))
            done.wait(2.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["sbatch", "--wait", "--nodes=2", "--gpus-per-node=0", "-o", str(tmp_path / "job.out"),
                               str(REPO / "scripts" / "slurm" / "day0.sbatch")],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    finally:
        done.set()
        watcher.join(10)
    wall = time.monotonic() - t0
    job_out = (tmp_path / "job.out").read_text(errors="replace") if (tmp_path / "job.out").exists() else ""
    tail = (proc.stdout + proc.stderr + job_out)[-4000:]
    assert proc.returncode == 0, tail
    record = json.loads((tmp_path / "out" / "latest" / "run.json").read_text())
    assert record["verdict"] == "accepted", (record["reason"], tail)
    nodes = record["environment"]["nodes"]
    assert [(n["host"], n["launcher"]) for n in nodes] == [("node0", "srun"), ("node1", "srun")]
    assert record["environment"]["slurm"]["nodelist"] == "node[0-1]"
    checks = {c["id"]: c for st in record["stages"] for c in st["checks"]}
    assert checks["collectives.ranks"]["evidence"]["hosts"] == ["node0", "node1"]
    assert checks["collectives.transport.inter_node"]["status"] == "pass"
    engine_log = next((tmp_path / "out").glob("vllm-*.log")).read_text(errors="replace")
    assert "headless multiproc executor, with head node address node0:" in engine_log  # Slurm's name for it
    # stopped the way vLLM cleans up after itself (SIGTERM to the step's tasks, not to srun): each
    # node's socket folder is gone
    folders = [Path(m.group(1)) for m in FOLDER_LINE.finditer(engine_log)]
    assert len(folders) == 2 and not [f for f in folders if f.exists()], folders
    assert seen, "no TCP connection from node1's vLLM ranks to node0 while the engine served"
    print(f"real Slurm recipe: ACCEPTED in {wall:.0f} s wall (sbatch to job end)")
    assert_nodes_empty(cluster)


def submit(env: dict[str, str], *args: str, out: Path, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "day0.cli", "slurm", "submit", "--out", str(out), *args],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("state", ["down", "drain"])
def test_a_job_waiting_for_a_node_out_of_service_is_blocked_naming_it(slurm_cluster, tmp_path, state):
    cluster = slurm_cluster
    slurm = cluster.slurm
    slurm.run("scontrol", "update", "nodename=node1", f"state={state}", "reason=disk failed")
    env = recipe_env(cluster, tmp_path)
    proc = submit(env, "--unavailable-timeout", "2", "--nodes=2", "--gpus-per-node=0", "-o", str(tmp_path / "job.out"),
                  str(REPO / "scripts" / "slurm" / "day0.sbatch"), out=tmp_path / "out")
    stdout, stderr = proc.communicate(timeout=120)  # bounded: the wait is 2 s past Slurm's first answer
    assert proc.returncode == 3, stdout + stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("day0: blocked: job ") and "node1 (" in line and "disk failed" in line, stderr
    assert "node0" not in line.split("cancelled")[0], line  # the node in service is not blamed
    assert not slurm.run("squeue", "-h").stdout.strip()  # cancelled, not left pending
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*/events.jsonl"))


SLOW_JOB = """#!/bin/bash
#SBATCH --nodes=2
set -euo pipefail
exec "$DAY0_PY" -m pytest --pyargs day0.suites -m "day0 and (preflight or collectives)" -p no:randomly -q \\
  --day0-profile "$DAY0_PROFILE" --day0-out "$DAY0_OUT"
"""


def test_a_job_cancelled_mid_run_has_its_record_rebuilt_saying_so(slurm_cluster, tmp_path):
    """scancel while the collectives stage's ranks run on both nodes (started through srun inside the job),
    after preflight recorded its checks."""
    cluster = slurm_cluster
    env = {**recipe_env(cluster, tmp_path), "DAY0_PY": sys.executable}
    script = tmp_path / "collectives.sbatch"
    script.write_text(SLOW_JOB)
    out = tmp_path / "out"
    proc = submit(env, "-o", str(tmp_path / "job.out"), str(script), out=out)
    deadline = time.monotonic() + 180
    while not any("collectives.rank" in c or "day0.stages.collectives" in c
                  for c in _node_processes(cluster)["node1"]):
        assert proc.poll() is None and time.monotonic() < deadline, (proc.communicate(), _node_processes(cluster))
        time.sleep(0.5)
    (events,) = [p for p in out.glob("*/events.jsonl") if not p.parent.is_symlink()]
    events_before = events.read_text().count('"type": "check"')
    assert events_before > 0  # preflight's
    cluster.slurm.run("scancel", cluster.slurm.run("squeue", "-h", "-o", "%i").stdout.split()[0])
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0, stdout + stderr
    assert " CANCELLED " in stdout and "rebuilt" in stdout, stdout + stderr
    run_dir = events.parent
    record = json.loads((run_dir / "run.json").read_text())
    assert record["notes"]["scheduler"]["state"] == "CANCELLED"
    assert record["verdict"] == "incomplete" and record["reason"].startswith("the scheduler ended it: Slurm job ")
    assert sum(len(st["checks"]) for st in record["stages"]) >= events_before  # what was measured is kept
    assert (run_dir / "report.html").exists()
    assert_nodes_empty(cluster)


def test_a_run_on_emulated_nodes_with_slurm_starts_its_processes_as_job_steps(tmp_path):
    """[topology.emulate] scheduler = "slurm": the run's cluster gets the daemons, its launcher is srun
    (SLURM_CONF on the command line), and a process lands on the node it names, with that node's identity."""
    from day0.config.topology import TopologySection
    from day0.engine.cluster.launchers import spawn
    from day0.engine.cluster.nodes import open_cluster

    topo = TopologySection(nodes=2, emulate=EmulateSection(scheduler="slurm"))
    cluster = open_cluster(topo, environ={})
    try:
        assert cluster.launcher.kind == "srun" and cluster.emulated is not None
        node1 = cluster.nodes[1]
        log = tmp_path / "node1.log"
        proc = spawn(cluster.launcher, node1, ["sh", "-c", "echo $(hostname) $SLURM_NODEID $SLURMD_NODENAME $DAY0_NODE"],
                     {}, log, os.environ)
        assert proc.wait(timeout=60) == 0, log.read_text()
        text = log.read_text()
        assert cluster.launcher.argv(node1, ["true"], {})[:3] == ["env", f"SLURM_CONF={cluster.emulated.slurm_conf}", "srun"]
        assert text.strip().splitlines()[-1] == "node1 0 node1 node1", text  # a one-node job: node 0 of it
        assert [d["launcher"] for d in cluster.describe()] == ["srun", "srun"]
        emulated = cluster.emulated
    finally:
        cluster.close()
    assert_nothing_left(emulated)


def test_cluster_up_slurm_shows_sinfo_and_down_leaves_nothing():
    day0 = [sys.executable, "-m", "day0.cli", "cluster"]
    up = subprocess.run([*day0, "up", "--slurm", "--json"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    status = json.loads(up.stdout)
    cluster = EmulatedCluster.load(status["cid"])
    try:
        assert status["slurm_conf"].endswith("/slurm/slurm.conf") and Path(status["slurm_conf"]).is_file()
        assert re.search(r"node0 +1 +debug\* +idle", status["sinfo"]), status["sinfo"]
        shown = subprocess.run([*day0, "status"], capture_output=True, text=True, timeout=60)
        assert f"SLURM_CONF={status['slurm_conf']}" in shown.stdout and "idle" in shown.stdout
        assert not any(Path(status["slurm_conf"]).is_relative_to(p) for p in (Path("/etc"),))
    finally:
        down = subprocess.run([*day0, "down", status["cid"]], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and status["cid"] in down.stdout
    assert_nothing_left(cluster)
