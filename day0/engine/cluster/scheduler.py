"""A real Slurm on an emulated cluster: munge, slurmctld on the bridge, one slurmd per node.

The fake ``srun`` of the unit tests proves day0's command lines; only a real scheduler proves the
recipe (``scripts/slurm/day0.sbatch``) and the faults a scheduler brings: a node drained or down,
a job cancelled. Debian's Slurm 22.05 runs one per emulated node (measured: ../shared/notes/slurm.md):

- everything lives in the cluster's own folder (``/run/day0-clusters/<cid>/slurm``): the
  generated ``slurm.conf``, a munge key and socket of its own, state, logs and pid files. Nothing
  under /etc changes, and a host that already runs Slurm or munge is not disturbed (own ports,
  own socket). Every client finds it through ``SLURM_CONF``, which jobs inherit;
- ``slurmctld`` runs in the host's namespace on the bridge address; each ``slurmd`` runs inside its
  node's network namespace (``nsenter``, not ``ip netns exec``: that remounts /sys and slurmd stops
  without /sys/fs/cgroup) with its own hostname and a private mount namespace whose /etc/hosts names
  the nodes (the host's resolver is unreachable from a node and DNS would hang ~11 s);
- a TaskProlog gives each task what a site's node image would: the node's address and interface
  (``VLLM_HOST_IP``, ``GLOO_SOCKET_IFNAME``) and, on CPU, its own core for OpenMP.

Stopping is by pid: every daemon started here leaves a pid file in the folder, and
:func:`day0.engine.cluster.netns.teardown` (the reaper's too) stops each one whose command line names
the folder, so a SIGKILLed harness leaves no slurmctld behind.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from day0.core.commands import run_command
from day0.core.sockets import free_port
from day0.engine.cluster.sbatch import SINFO_NODES, parse_node_states
from day0.engine.process import pid_alive

Log = Callable[[str], None]

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
READY_TIMEOUT_S = 30.0
KILL_WAIT_S = 5  # SIGTERM to SIGKILL on scancel: Slurm's default 30 s only slows a rehearsal down


class SchedulerError(RuntimeError):
    """The scheduler could not be started or asked; one line naming the daemon or command."""


def slurm_missing() -> str | None:
    """Why this host cannot run a Slurm of its own, in one line, or None when it can."""
    missing = [b for b in BINARIES if not _which(b)]
    if missing:
        return (f"a real Slurm needs {', '.join(missing)}: scripts/install-system.sh slurm "
                "(apt-get install slurmctld slurmd slurm-client munge)")
    return None


def _which(binary: str) -> str | None:
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")


@dataclass(frozen=True)
class SlurmNode:
    name: str  # node0: the Slurm node name and the hostname inside the node
    address: str
    netns: str
    ifname: str
    core: int  # the CPU its tasks bind OpenMP to


@dataclass(frozen=True)
class SlurmCluster:
    """The scheduler of one emulated cluster, as its clients see it."""

    folder: Path
    nodes: tuple[SlurmNode, ...]
    controller: str  # the bridge address slurmctld listens on
    port: int

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose sbatch/srun/scontrol talk to this cluster (and jobs inherit it)."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "") + os.pathsep + "/usr/sbin"
        return env

    def run(self, *argv: str, timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster; bounded, one line on failure."""
        return run_command(argv, SchedulerError, missing="scripts/install-system.sh slurm", env=self.env(),
                           timeout=timeout, check=check)

    def node_states(self) -> dict[str, tuple[str, str]]:
        """Each node's (state, reason) as sinfo reports them (idle, allocated, down*, drained, ...)."""
        return parse_node_states(self.run(*SINFO_NODES).stdout)

    def sinfo(self) -> str:
        return self.run("sinfo", "-N", "-l", check=False).stdout.strip()


def slurm_up(folder: Path, nodes: Sequence[SlurmNode], controller: str, log: Log = lambda m: None) -> SlurmCluster:
    """Write the configuration and start munged, slurmctld and every slurmd; wait until every node is idle.

    Raises SchedulerError naming the daemon (and the last line of its log) when one does not come up;
    the caller tears down what was started (the pid files are already in ``folder``)."""
    why = slurm_missing()
    if why:
        raise SchedulerError(why)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)  # munged refuses a socket directory others can write to
    # a port of its own, not 6817: a host's own slurmctld is left alone
    cluster = SlurmCluster(folder=folder, nodes=tuple(nodes), controller=controller, port=free_port(controller))
    _write_files(cluster)
    t0 = time.monotonic()
    _start_munged(folder)
    _spawn(["slurmctld", "-f", str(cluster.conf), "-i"], folder / "slurmctld.out", cluster)
    _wait_for(lambda: (folder / "slurmctld.pid").exists() and cluster.run("scontrol", "ping", check=False)
              .stdout.count("UP") > 0, "slurmctld", folder / "slurmctld.log")
    for nd in nodes:
        _start_slurmd(cluster, nd)
    _wait_for(lambda: _all_idle(cluster), "slurmd", folder / f"slurmd-{nodes[-1].name}.log")
    log(f"Slurm on the emulated nodes: slurmctld {controller}:{cluster.port}, {len(nodes)} slurmd idle "
        f"in {time.monotonic() - t0:.1f} s (SLURM_CONF={cluster.conf})")
    return cluster


def _all_idle(cluster: SlurmCluster) -> bool:
    states = cluster.node_states()
    return len(states) == len(cluster.nodes) and all(state == "idle" for state, _ in states.values())


def _write_files(c: SlurmCluster) -> None:
    d = c.folder
    (d / "ctld").mkdir(exist_ok=True)
    for nd in c.nodes:
        (d / f"slurmd-{nd.name}").mkdir(exist_ok=True)
    (d / "munge.key").write_bytes(os.urandom(1024))
    (d / "munge.key").chmod(0o400)
    names = "\n".join(f"{nd.address} {nd.name}" for nd in c.nodes)
    (d / "hosts").write_text(f"127.0.0.1 localhost\n{c.controller} {socket.gethostname()}\n{names}\n")
    (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")  # fails at once
    cases = "\n".join(f"  {nd.name}) echo export VLLM_HOST_IP={nd.address}; echo export GLOO_SOCKET_IFNAME={nd.ifname};"
                      f" echo export VLLM_CPU_OMP_THREADS_BIND={nd.core} ;;" for nd in c.nodes)
    prolog = d / "task-prolog.sh"
    prolog.write_text(f"#!/bin/sh\n# what a site's node image gives every task on the node\ncase \"$SLURMD_NODENAME\" in\n{cases}\nesac\n")
    prolog.chmod(0o755)
    c.conf.write_text(_slurm_conf(c))


def _slurm_conf(c: SlurmCluster) -> str:
    """Debian's 22.05 as measured (../shared/notes/slurm.md). One CPU per node, shared by up to 8 jobs
    (OverSubscribe=FORCE:8): a run that starts its processes with srun from outside an allocation makes
    each one a job, and an engine rank and a collective rank share a node."""
    d = c.folder
    nodes = "\n".join(f"NodeName={nd.name} NodeAddr={nd.address} NodeHostname={nd.name} CPUs=1 State=UNKNOWN"
                      for nd in c.nodes)
    return f"""\
# generated by day0 for an emulated cluster (docs/cluster.md); a real cluster's slurm.conf replaces it
ClusterName=day0
SlurmctldHost={socket.gethostname()}({c.controller})
SlurmctldPort={c.port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d / "munge.socket"}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={d / "task-prolog.sh"}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait={KILL_WAIT_S}
StateSaveLocation={d / "ctld"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdSpoolDir={d}/slurmd-%n
SlurmdPidFile={d}/slurmd-%n.pid
SlurmdLogFile={d}/slurmd-%n.log
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
"""


def _start_munged(folder: Path) -> None:
    run_command([_which("munged") or "munged", "--force", f"--socket={folder / 'munge.socket'}",
                 f"--key-file={folder / 'munge.key'}", f"--pid-file={folder / 'munged.pid'}",
                 f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"],
                SchedulerError, missing="scripts/install-system.sh slurm")


def _start_slurmd(c: SlurmCluster, nd: SlurmNode) -> None:
    """slurmd in the node's network namespace, with the node's hostname and /etc/hosts (private mounts)."""
    inner = (f"mount --bind {c.folder / 'hosts'} /etc/hosts && mount --bind {c.folder / 'resolv.conf'} "
             f"/etc/resolv.conf && hostname {nd.name} && exec {_which('slurmd')} -f {c.conf} -N {nd.name} -D")
    _spawn(["nsenter", f"--net=/run/netns/{nd.netns}", "unshare", "--uts", "--mount", "sh", "-c", inner],
           c.folder / f"slurmd-{nd.name}.out", c)


def _spawn(argv: list[str], out: Path, c: SlurmCluster) -> None:
    binary = _which(argv[0]) or argv[0]
    with open(out, "ab") as fh:
        subprocess.Popen([binary, *argv[1:]], stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                         start_new_session=True, env=c.env(), close_fds=True)


def _wait_for(ready: Callable[[], bool], daemon: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except SchedulerError:
            pass
        time.sleep(0.2)
    raise SchedulerError(f"{daemon} not ready within {READY_TIMEOUT_S:g} s; {log_path}: {_last_line(log_path)}")


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def stop_daemons(folder: Path, timeout_s: float = 5.0) -> list[int]:
    """Stop every daemon whose pid file is in ``folder`` and whose command line names it; returns their pids.

    The command-line check keeps a reused pid (a daemon long gone, its number given to another
    process) from being killed."""
    pids = []
    for pid_file in sorted(folder.glob("*.pid")) if folder.is_dir() else []:
        try:
            pid = int(pid_file.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if str(folder) in cmdline:
            pids.append(pid)
    for sig in (15, 9):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.05)
    return pids
