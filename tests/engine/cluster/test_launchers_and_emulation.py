"""Nodes, launchers and the emulated cluster (day0.engine.cluster).

The command-line tests need nothing; the emulation tests build real network namespaces, veths, a
bridge and tbf qdiscs, so they need root (CAP_NET_ADMIN) and iproute2: marked ``host("root")``,
they skip with that reason elsewhere and fail under CI=true. Every emulation test proves afterwards that nothing of day0's is left on the host.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from day0.config.profile import ProfileError, load_profile
from day0.config.topology import EmulateSection, TopologySection, rate_bytes_per_s
from day0.engine.cluster.launchers import (
    LocalLauncher,
    NetnsLauncher,
    Node,
    SrunLauncher,
    SshLauncher,
    launcher_for,
    spawn,
)
from day0.engine.cluster.netns import EmulatedCluster, day0_leftovers, netns_pids, sweep_stale
from day0.engine.cluster.nodes import ClusterError, open_cluster
from day0.engine.multinode import node0_ports, node_commands, node_env
from day0.engine.process import pid_alive, signal_group, stop_process_group
from day0.engine.rpc_folder import FOLDER_LINE
from day0.stages.collectives import collectives_port
from tests.support import REPO, processes_naming
from tests.support.fake_ssh import FAKE_SSH

PY = sys.executable

NODE1 = Node("node1", 1, "198.18.0.2", host="gpu02", netns="day0-1-node1", ifname="veth0")


# ---------------------------------------------------------------------------- command lines


def test_local_launcher_runs_the_command_as_it_is():
    assert LocalLauncher().argv(NODE1, ["python", "-m", "x"], {"A": "1"}) == ["python", "-m", "x"]
    assert LocalLauncher().env_input({"A": "1"}) is None  # inherited, stdin empty


def test_netns_launcher_enters_the_nodes_namespace():
    assert NetnsLauncher().argv(NODE1, ["python", "-m", "x"], {}) == [
        "ip", "netns", "exec", "day0-1-node1", "python", "-m", "x"]
    with pytest.raises(ValueError, match="node1: no network namespace"):
        NetnsLauncher().argv(Node("node1", 1, "10.0.0.2"), ["true"], {})


def test_srun_launcher_places_one_task_on_the_named_host():
    argv = SrunLauncher().argv(NODE1, ["python", "-m", "x"], {"A": "1"})
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=1", "-w", "gpu02"]
    assert "--overlap" in argv and "--export=ALL" in argv and argv[-3:] == ["python", "-m", "x"]


def test_ssh_launcher_runs_the_command_in_the_same_folder_and_sends_the_environment_apart():
    launcher = SshLauncher(cwd="/shared/day0 src")
    env = {"GLOO_SOCKET_IFNAME": "ib0", "X": "a b", "VLLM_API_KEY": "sk-not-on-a-command-line"}
    argv = launcher.argv(NODE1, ["python", "-c", "print('a b')"], env)
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "--", "gpu02"]  # after --, a host is never an option
    remote = shlex.split(argv[5])
    assert remote[:3] == ["exec", "sh", "-c"] and remote[4:] == ["day0-node", "/shared/day0 src", "python", "-c", "print('a b')"]
    assert "sk-not-on-a-command-line" not in " ".join(argv)
    sent = base64.b64decode(launcher.env_input(env) or b"").decode()
    assert sent == "export GLOO_SOCKET_IFNAME=ib0\nexport X='a b'\nexport VLLM_API_KEY=sk-not-on-a-command-line\n"


@pytest.mark.parametrize("name", ["X=1;touch f;Y", "NCCL-DEBUG", "1A", ""])
def test_ssh_launcher_refuses_an_environment_name_the_remote_shell_would_run_or_choke_on(name):
    with pytest.raises(ValueError, match=f"engine.env: {re.escape(repr(name))} is not an environment variable name"):
        SshLauncher().env_input({"OK_1": "v", name: "v"})


def _fake_ssh_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!{sys.executable}\n{FAKE_SSH}")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _until(predicate: Callable[[], bool], within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


def test_an_ssh_launch_gets_its_environment_over_the_channel_and_stops_when_the_client_does(tmp_path, monkeypatch):
    """The remote script day0 sends, run by sh behind a fake ssh (tests/support/fake_ssh.py): the
    process gets its environment (the API key too, never on a command line) in the launcher's
    folder, and the harness's stop, which can only reach the local ssh client, still ends it:
    SIGTERM, as a local server gets (without it a remote vLLM served on after every stop)."""
    _fake_ssh_on_path(tmp_path, monkeypatch)
    seen, termed = tmp_path / "seen.txt", tmp_path / "termed.txt"
    probe = ("import os, pathlib, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path(sys.argv[2]).write_text('TERM'), sys.exit(0)))\n"
             "pathlib.Path(sys.argv[1]).write_text('|'.join([os.getcwd(), os.environ['VLLM_API_KEY'], os.environ['X']]))\n"
             "time.sleep(600)\n")
    key = "sk-day0-" + "k" * 32
    proc = spawn(SshLauncher(cwd=tmp_path), NODE1, [sys.executable, "-c", probe, str(seen), str(termed)],
                 {"VLLM_API_KEY": key, "X": "a b\nc'd"}, tmp_path / "node1.log", dict(os.environ))
    try:
        assert _until(seen.exists), (tmp_path / "node1.log").read_text()
        assert seen.read_text() == f"{tmp_path}|{key}|a b\nc'd"
        assert key not in " ".join(proc.args)  # type: ignore[arg-type]
    finally:
        stop_process_group(proc, 5.0)  # what the engine's stop reaches: the ssh client's group
    assert _until(termed.exists), (tmp_path / "node1.log").read_text()
    assert _until(lambda: not processes_naming(str(seen))), "the remote session outlived its stop"


def test_an_ssh_launch_ends_with_the_remote_commands_status(tmp_path, monkeypatch):
    _fake_ssh_on_path(tmp_path, monkeypatch)
    proc = spawn(SshLauncher(cwd=tmp_path), NODE1, ["sh", "-c", "exit 3"], {}, tmp_path / "node1.log", dict(os.environ))
    assert proc.wait(timeout=60) == 3, (tmp_path / "node1.log").read_text()


def test_launcher_for_refuses_an_unknown_kind():
    assert launcher_for("srun").kind == "srun"
    with pytest.raises(ValueError, match="'pdsh' is not one of"):
        launcher_for("pdsh")


def test_node_env_names_the_node_and_binds_its_sockets():
    env = NODE1.env()
    assert env["DAY0_NODE"] == "node1" and env["DAY0_NODE_ADDR"] == "198.18.0.2"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "veth0"
    assert env["VLLM_HOST_IP"] == "198.18.0.2"
    assert "GLOO_SOCKET_IFNAME" not in Node("node0", 0, "gpu01", host="gpu01").env()


def test_spawn_writes_the_header_and_hands_the_node_env_to_a_local_process(tmp_path):
    log = tmp_path / "n.log"
    proc = spawn(LocalLauncher(), NODE1, [PY, "-c", "import os; print(os.environ['DAY0_NODE'], os.environ['Y'])"],
                 {"Y": "yes"}, log, dict(os.environ), header="$ demo")
    assert proc.wait(timeout=30) == 0
    assert log.read_text().splitlines() == ["$ demo", "node1 yes"]
    made = spawn(LocalLauncher(), NODE1, [PY, "-c", "pass"], {}, log, dict(os.environ),
                 header=lambda argv: "$ " + " ".join(argv))  # the line made from the launcher's argv
    assert made.wait(timeout=30) == 0 and log.read_text().splitlines() == [f"$ {PY} -c pass"]


# ---------------------------------------------------------------------------- topology


@pytest.mark.parametrize("topology, message", [
    ({"device": "cuda", "emulate": {}}, "emulate: an emulated cluster is for CPU profiles"),
    ({"nodes": 2, "emulate": {"degrade": {"node2": "20mbit"}}}, "emulate.degrade.node2: there are only 2 nodes"),
    ({"nodes": 2, "emulate": {"degrade": {"gpu1": "20mbit"}}}, "gpu1: node names are node0, node1"),
    ({"nodes": 2, "emulate": {"link_rate": "fast"}}, "'fast' is not a tc rate"),
    ({"nodes": 2, "launcher": "netns"}, "launcher: netns needs a [topology.emulate] table"),
    ({"nodes": 2, "launcher": "ssh", "hosts": ["a"]}, "hosts: launcher ssh needs one host per node (2), got 1"),
    ({"nodes": 17, "emulate": {}}, "at most 16 emulated nodes"),
])
def test_topology_refuses_what_cannot_run_in_one_line(topology, message):
    with pytest.raises(ProfileError) as exc:
        load_profile("cpu-tiny", overrides={"topology": topology})
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_launcher_auto_stands_for_follows_the_topology_and_slurm():
    assert TopologySection(nodes=2, emulate=EmulateSection()).launcher_kind({}) == "netns"
    assert TopologySection(nodes=4).launcher_kind({"SLURM_JOB_NODELIST": "gpu[01-04]"}) == "srun"
    assert TopologySection(nodes=1).launcher_kind({"SLURM_JOB_NODELIST": "gpu01"}) == "local"
    assert TopologySection(nodes=4).launcher_kind({}) == "local"


def test_rates_read_as_tc_reads_them():
    assert rate_bytes_per_s("20mbit") == 2.5e6 and rate_bytes_per_s("1gbit") == 1.25e8
    assert EmulateSection(link_rate="1gbit", degrade={"node2": "20mbit"}).rate_of("node2") == "20mbit"
    assert EmulateSection(link_rate="1gbit").rate_of("node0") == "1gbit"


def test_slurm_nodes_start_from_the_allocation_never_loopback():
    topo = TopologySection(nodes=4, socket_ifname="ib0")
    cluster = open_cluster(topo, environ={"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_NUM_NODES": "4"})
    assert [n.host for n in cluster.nodes] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert cluster.master_addr == "gpu01" and cluster.launcher.kind == "srun"
    assert cluster.nodes[2].env()["GLOO_SOCKET_IFNAME"] == "ib0"
    with pytest.raises(ClusterError, match=r"topology.nodes = 4 but the allocation has 2 \(gpu\[01-02\]\)"):
        open_cluster(topo, environ={"SLURM_JOB_NODELIST": "gpu[01-02]"})
    with pytest.raises(ClusterError, match="not inside a Slurm allocation"):
        open_cluster(TopologySection(nodes=4, launcher="srun"), environ={})


# ---------------------------------------------------------------------------- the engine's command lines


def test_vllm_runs_rank0_with_http_on_node0_and_headless_ranks_elsewhere():
    profile = load_profile("cpu-tiny", overrides={"topology": {"nodes": 3, "devices_per_node": 1, "emulate": {}}})
    nodes = [Node(f"node{i}", i, f"198.18.0.{i + 1}", netns=f"ns{i}", ifname="veth0") for i in range(3)]
    from day0.engine.cluster.nodes import Cluster

    cmds = node_commands(profile, Cluster(nodes, NetnsLauncher()), "/m", 8000, 29600, ["--dtype", "float32"], "tiny")
    for nc in cmds:
        a = nc.argv
        assert a[a.index("--nnodes") + 1] == "3" and a[a.index("--node-rank") + 1] == str(nc.node.index)
        assert a[a.index("--master-addr") + 1] == "198.18.0.1" and a[a.index("--master-port") + 1] == "29600"
        assert a[1:4] == ["-m", "day0.engine.vllm_cli", "serve"]
    assert cmds[0].argv[-6:] == ["--served-model-name", "tiny", "--host", "198.18.0.1", "--port", "8000"]
    assert all(nc.argv[-1] == "--headless" and "--port" not in nc.argv for nc in cmds[1:])
    cores = os.cpu_count() or 1
    assert [node_env(profile, nd)["VLLM_CPU_OMP_THREADS_BIND"] for nd in nodes] == [str(i % cores) for i in range(3)]


# ---------------------------------------------------------------------------- emulation


def _leftovers(owner: int | str | None = None) -> list[str]:
    """The namespaces and links of the clusters ``owner`` (this test process by default; a pid or a
    cluster id) built that are still on the host; another run's on a shared box are not counted."""
    mark = str(owner or os.getpid())
    namespaces, links = day0_leftovers()
    return [ns for ns in namespaces if ns.startswith(f"day0-{mark}")] + [
        ln for ln in links if ln.startswith((f"d0b{mark}", f"d0{mark}"))]


def _assert_nothing_left(owner: int | str | None = None, within_s: float = 0.0) -> None:
    """``within_s``: a reaper's teardown is asynchronous, so allow it that long before calling what
    is left a leak."""
    deadline = time.monotonic() + within_s
    while _leftovers(owner) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(owner) == [], f"left behind: {_leftovers(owner)}"


def _ours(owner: int | None = None) -> list[str]:
    return [ns for ns in day0_leftovers()[0] if ns.startswith(f"day0-{owner or os.getpid()}")]


@pytest.mark.host("root")
def test_an_emulated_cluster_has_real_links_shaped_where_asked_and_leaves_nothing():
    cluster = EmulatedCluster.up(3, EmulateSection(degrade={"node2": "20mbit"}), owner_pid=os.getpid())
    try:
        status = cluster.status()
        assert [n["address"].rsplit(".", 1)[1] for n in status["nodes"]] == ["1", "2", "3"]
        assert all(n["address"].startswith("198.18.") and n["up"] for n in status["nodes"])
        shaped = subprocess.run(["tc", "-n", cluster.nodes[2].netns, "qdisc", "show", "dev", "veth0"],
                                capture_output=True, text=True).stdout
        assert "tbf" in shaped and "20Mbit" in shaped
        host_side = subprocess.run(["tc", "qdisc", "show", "dev", cluster.nodes[2].host_if],
                                   capture_output=True, text=True).stdout
        assert "tbf" in host_side  # both directions
        assert "tbf" not in subprocess.run(["tc", "-n", cluster.nodes[0].netns, "qdisc", "show", "dev", "veth0"],
                                           capture_output=True, text=True).stdout
        # node0 reaches node1 over the link (a refused connection is an answer from node1's kernel)
        probe = (f"import socket\ntry: socket.create_connection(('{cluster.nodes[1].address}', 9), timeout=5)\n"
                 "except ConnectionRefusedError: print('answered')")
        out = subprocess.run(NetnsLauncher().argv(Node("node0", 0, "", netns=cluster.nodes[0].netns), [PY, "-c", probe], {}),
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "answered", out.stderr
    finally:
        cluster.down()
    _assert_nothing_left()


@pytest.mark.host("root")
def test_two_clusters_of_one_process_get_their_own_names_and_subnets():
    a = EmulatedCluster.up(2, EmulateSection(), owner_pid=os.getpid())
    try:
        b = EmulatedCluster.up(2, EmulateSection(), owner_pid=os.getpid())
        try:
            assert (b.cid, b.subnet) != (a.cid, a.subnet) and b.cid.startswith(str(os.getpid()))
            assert a.cid not in sweep_stale() and b.cid not in sweep_stale()  # both owners alive
        finally:
            b.down()
        assert len(_ours()) == 2  # a is untouched
    finally:
        a.down()
    _assert_nothing_left()


@pytest.mark.host("root")
def test_a_later_run_sweeps_what_a_dead_run_left():
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    EmulatedCluster.up(2, EmulateSection(), owner_pid=dead.pid)  # as if its owner had been SIGKILLed
    assert len(_ours(dead.pid)) == 2
    assert str(dead.pid) in sweep_stale()
    _assert_nothing_left(dead.pid)


HARNESS = """
import os, sys, time
from day0.config.profile import load_profile
from day0.engine.cluster.launchers import spawn
from day0.engine.cluster.nodes import open_cluster
p = load_profile("cpu-tiny", overrides={"topology": {"nodes": 2, "emulate": {"link_rate": "100mbit"}}})
c = open_cluster(p.topology)
for n in c.nodes:  # a long-lived process on every node, as engine ranks would be
    spawn(c.launcher, n, [sys.executable, "-c", "import time; time.sleep(600)"], {}, __import__("pathlib").Path(sys.argv[1]) / f"{n.name}.log", dict(os.environ))
print("ready", flush=True)
time.sleep(600)
"""


def _pids_in(namespaces: list[str], within_s: float = 30.0) -> list[int]:
    """The processes in each namespace, once every one has some: a launch enters its namespace
    (`ip netns exec`) after spawn has returned, and a busy CI read one namespace still empty."""
    deadline = time.monotonic() + within_s
    while True:
        found = {ns: netns_pids(ns) for ns in namespaces}
        if all(found.values()) or time.monotonic() > deadline:
            return [p for pids in found.values() for p in pids]
        time.sleep(0.1)


@pytest.mark.host("root")
def test_sigkill_of_the_harness_leaves_no_namespace_veth_or_process(tmp_path):
    proc = subprocess.Popen([PY, "-c", HARNESS, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        namespaces = _ours(proc.pid)
        assert len(namespaces) == 2
        pids = _pids_in(namespaces)
        assert len(pids) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _assert_nothing_left(proc.pid, within_s=30)
        alive = [p for p in pids if pid_alive(p)]
        assert alive == []
    finally:
        signal_group(proc.pid)


def _reaper_of(cid: str, within_s: float = 30.0) -> int:
    """The pid of cluster ``cid``'s reaper (day0.engine.cluster.reaper), by its command line. A CI
    run once scanned /proc without finding it right after the cluster came up (and a reaper was
    there later: the cluster was torn down when its worker ended), so the scan is retried for
    ``within_s``; the message lists every reaper seen."""
    deadline = time.monotonic() + within_s
    while True:
        seen = []
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"day0.engine.cluster.reaper" in argv:
                    if cid.encode() in argv:
                        return int(proc.name)
                    seen.append(f"{proc.name}: {b' '.join(argv).decode(errors='replace')}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no reaper for cluster {cid} in {within_s:g} s; reapers seen: {seen or 'none'}")
        time.sleep(0.1)


@pytest.mark.host("root")
def test_a_closed_clusters_reaper_leaves_the_next_cluster_of_the_same_harness_alone():
    """The id is the owner's pid, so a harness's next cluster has the last one's id. A reaper slow
    to start (a busy box) once read its EOF after that next cluster was half-built and tore its
    bridge down by name: the CI saw `ip link set d03248n1 master d0b3248` fail, device gone."""
    topology = load_profile("cpu-2node").topology
    first = open_cluster(topology)
    cid = first.emulated.cid
    try:
        reaper = _reaper_of(cid)
    except AssertionError:
        first.close()  # not left for the next tests of this worker to find as a leak
        raise
    os.kill(reaper, signal.SIGSTOP)  # still starting up when its harness moves on
    try:
        first.close()
        second = open_cluster(topology)
    finally:
        os.kill(reaper, signal.SIGCONT)
    try:
        assert second.emulated.cid == cid
        deadline = time.monotonic() + 60
        while pid_alive(reaper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(reaper), "the first reaper is still running"
        assert len(_ours()) == 2 and f"d0b{cid}" in day0_leftovers()[1], _leftovers()
        assert all(node["up"] for node in second.emulated.status()["nodes"])
    finally:
        second.close()
    _assert_nothing_left(within_s=30)


NO_NET_ADMIN = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]


@pytest.mark.host("root")
def test_without_cap_net_admin_emulation_is_blocked_in_one_line(tmp_path):
    code = ("from day0.config.profile import load_profile\nfrom day0.engine.cluster.nodes import open_cluster\n"
            "p = load_profile('cpu-2node')\n"
            "try: open_cluster(p.topology)\nexcept Exception as e: print(type(e).__name__, '|', e)")
    out = subprocess.run([*NO_NET_ADMIN, PY, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.startswith("ClusterBlocked | emulated nodes need root (CAP_NET_ADMIN)"), out.stderr
    cli = subprocess.run([*NO_NET_ADMIN, PY, "-m", "day0.cli", "cluster", "up", "--profile", "cpu-2node"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert cli.returncode == 2 and cli.stderr.strip().splitlines() == [
        "day0: blocked: emulated nodes need root (CAP_NET_ADMIN) to create network namespaces; "
        "run as root or use launcher = \"local\""]


@pytest.mark.host("root")
def test_a_run_without_cap_net_admin_ends_with_its_stages_blocked(tmp_path):
    out = subprocess.run([*NO_NET_ADMIN, PY, "-m", "pytest", str(REPO / "day0" / "suites"), "-p", "no:randomly", "-q",
                          "-m", "day0 and (weights or collectives)", "--day0-profile", "cpu-2node",
                          "--day0-out", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300)
    record = json.loads(next(tmp_path.glob("*/run.json")).read_text())
    checks = [c for st in record["stages"] for c in st["checks"]]
    assert checks and all(c["status"] == "blocked" for c in checks), out.stdout[-2000:]
    assert all(c["message"].startswith("cluster: emulated nodes need root (CAP_NET_ADMIN)") for c in checks)
    assert record["verdict"] == "incomplete"


@pytest.mark.host("root")
def test_cluster_cli_up_status_down(tmp_path):
    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "day0.cli", "cluster", *a], capture_output=True, text=True, cwd=REPO, timeout=60)
    up = run("up", "--profile", "cpu-2node", "--set", "topology.emulate.degrade.node1=\"20mbit\"", "--json")
    assert up.returncode == 0, up.stderr
    cid = json.loads(up.stdout)["cid"]
    try:
        status = run("status")
        assert status.returncode == 0 and f"cluster {cid} (by hand)" in status.stdout
        assert "20mbit" in status.stdout and "198.18." in status.stdout
        assert cid not in sweep_stale()  # a cluster brought up by hand is never swept by a run
    finally:
        down = run("down", cid)
    assert down.returncode == 0 and down.stdout.strip() == f"removed: {cid}"
    assert run("down", cid).returncode == 1
    _assert_nothing_left(cid)


@pytest.mark.parametrize("cid", ["/", ".", "..", "VICTIM", "abc/../.."])
def test_cluster_down_refuses_what_is_not_a_cluster_id_before_it_removes_anything(tmp_path, cid):
    """The id becomes a path under /run/day0-clusters, removed as root: an absolute path, ``.`` or a
    climb out of it would have been removed whole (``.``: every cluster's state)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    proc = subprocess.run([PY, "-m", "day0.cli", "cluster", "down", cid.replace("VICTIM", str(victim))],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "not a day0 cluster's" in proc.stderr, proc.stderr
    assert (victim / "keep").exists()


def test_cluster_status_and_down_without_iproute2_are_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    for args in (["status"], ["down", "--all"]):
        proc = subprocess.run([PY, "-m", "day0.cli", "cluster", *args], capture_output=True, text=True, cwd=REPO,
                              timeout=60, env={**os.environ, "PATH": str(empty)})
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith("day0: blocked: ip not found") and proc.stderr.count("\n") == 1, proc.stderr


def test_a_wedged_slurm_controller_is_shown_in_the_status_not_raised(monkeypatch):
    """Labelled fakes: no namespaces looked up, and an sinfo that times out. `cluster status` lists
    every cluster; one whose controller does not answer says so in its own lines."""
    from day0.engine.cluster import netns
    from day0.engine.cluster.scheduler import SchedulerError, SlurmCluster

    def wedged(self):
        raise SchedulerError("`sinfo -N -l` did not finish within 20 s")

    monkeypatch.setattr(netns, "list_netns", lambda: [])
    monkeypatch.setattr(netns, "_ip", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", ""))
    monkeypatch.setattr(SlurmCluster, "sinfo", wedged)
    node = netns.EmulatedNode("node0", 0, "day0-7a-node0", "198.18.7.2", "veth0", "d07an0", "")
    emu = EmulatedCluster("7a", "198.18.7.0/24", "d0b7a", "198.18.7.1", [node], None,
                          slurm_conf="/run/day0-clusters/7a/slurm.conf")
    assert emu.status()["sinfo"] == "sinfo did not answer: `sinfo -N -l` did not finish within 20 s"


def test_a_reaper_that_does_not_start_takes_the_cluster_it_was_to_guard_down(monkeypatch):
    """Labelled fakes: an emulated cluster that is built and removed in memory, and a reaper whose
    start fails (EMFILE): nothing else would remove the namespaces."""
    from day0.engine.cluster import nodes

    removed: list[str] = []

    class Built:
        cid = "7b"

        def down(self) -> None:
            removed.append(self.cid)

    def no_pipe(cid):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(nodes.EmulatedCluster, "up", classmethod(lambda cls, *a, **k: Built()))
    monkeypatch.setattr(nodes, "start_reaper", no_pipe)
    topology = TopologySection(device="cpu", nodes=2, devices_per_node=1, emulate=EmulateSection())
    with pytest.raises(OSError, match="Too many open files"):
        open_cluster(topology, environ={})
    assert removed == ["7b"]


def test_a_removal_that_left_something_says_what_and_a_sweep_goes_on(monkeypatch):
    """A labelled fake: `ip` that deletes nothing (as for a user without CAP_NET_ADMIN, whose
    `ip ... del` fails quietly). `down` must not print "removed"; a run's sweep logs it and goes on."""
    from day0.engine.cluster import netns

    monkeypatch.setattr(netns, "day0_leftovers", lambda: (["day0-4242-node0"], ["d0b4242"]))
    monkeypatch.setattr(netns, "teardown", lambda cid, ns, ln: None)
    monkeypatch.setattr(netns, "_owner_alive", lambda cid: False)
    with pytest.raises(netns.EmulationError, match=r"^cluster 4242: still there after its removal: "
                                                   r"day0-4242-node0, d0b4242 \(is this root\?\)$"):
        netns.teardown_cid("4242")
    said: list[str] = []
    assert netns.sweep_stale(said.append) == ["4242"]
    assert said[0].startswith("cluster 4242: still there")


def test_the_two_node_preset_is_tp2_across_two_emulated_nodes():
    p = load_profile("cpu-2node")
    assert p.topology.nodes == 2 and p.topology.emulate is not None and p.engine.args["tensor_parallel_size"] == 2
    assert p.topology.launcher_kind({}) == "netns"


@pytest.mark.host("root")
@pytest.mark.engine
def test_one_vllm_engine_across_two_emulated_nodes(tmp_path):
    """server mode across nodes: HTTP from node0, a headless rank on node1, TP traffic between the
    node addresses, one log per node; a rank that dies is named by its node; nothing is left."""
    from day0.engine.engines import Engines

    profile = load_profile("cpu-2node")
    lines: list[str] = []
    engines = Engines(profile, tmp_path, lines.append)
    try:
        engine = engines.http()
        info = engine.info
        node0 = engines.cluster().nodes[0]
        assert info.base_url.startswith(f"http://{node0.address}:")
        assert [n["node"] for n in info.nodes] == ["node0", "node1"]
        assert (tmp_path / "engine-node0.log").is_file() and (tmp_path / "engine-node1.log").is_file()
        assert "--headless" in (tmp_path / "engine-node1.log").read_text().splitlines()[0]
        assert {(c["node"], c["peer"]) for c in info.cross_node} >= {("node0", "node1")}
        assert len(engine.greedy(["The supernode serves"], 4)[0].token_ids) == 4
        assert engine.alive() is None
        os.killpg(info.nodes[1]["pid"], signal.SIGKILL)  # node1's rank group dies
        deadline = time.monotonic() + 30
        while engine.alive() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "on node1" in (engine.alive() or "")
    finally:
        engines.stop()
    _assert_nothing_left()
    # each node's socket folder: node0's went with its SIGTERM; node1's rank was SIGKILLed above,
    # which nothing can clean up after, so the test removes what it caused
    folders = {n: Path(FOLDER_LINE.search((tmp_path / f"engine-{n}.log").read_text()).group(1)) for n in ("node0", "node1")}
    shutil.rmtree(folders["node1"], ignore_errors=True)
    assert not folders["node0"].exists()


def test_a_named_rendezvous_port_is_vllms_and_the_collectives_meet_on_the_next():
    """With ``topology.master_port`` set the engine's start looped forever (its HTTP port was drawn
    from the same setting until the two differed), and the collectives took the very port vLLM's
    ranks hold while the engine serves beside them."""
    profile = load_profile("cpu-2node", overrides={"topology": {"master_port": 29611}})
    for _ in range(200):
        http, master = node0_ports(profile)
        assert master == 29611 and http not in (29611, 29612) and 20000 <= http <= 29999
    assert collectives_port(profile.topology.master_port) == 29612
    assert collectives_port(0) == 0  # none named: run_cluster picks
    drawn = node0_ports(load_profile("cpu-2node"))
    assert drawn[0] != drawn[1]
