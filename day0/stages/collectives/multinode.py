"""Collectives across nodes: one torchrun per node, started through the cluster's launcher.

:func:`run_cluster` starts ``python -m torch.distributed.run`` on every node of the run's
:class:`~day0.engine.cluster.nodes.Cluster` (``ip netns exec`` for emulated nodes, ``srun`` or
``ssh`` for real ones), static rendezvous on node 0's address; each torchrun starts the node's
ranks as ``python -m day0.stages.collectives run --worker``. The ranks report through the same
files as local ranks (step, heartbeat, pid, exit under ``<out>/ranks``), so the local launcher's
watcher judges them: at the first failure the others get ``grace_s``, then every rank's group and
every node's torchrun are SIGKILLed, and the fault names the rank and its node. torchrun's own
failure summary supplies the exit status of a rank that died without writing one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from day0.core.sockets import free_port
from day0.engine.cluster.launchers import spawn
from day0.engine.process import pid_alive
from day0.stages.collectives.launcher import (
    _Rank,
    _tail,
    finish_result,
    kill_and_reap,
    prepare_out_dir,
    rank_base_env,
    watch_ranks,
)
from day0.stages.collectives.result import SETTINGS_FILE, CollectivesResult
from day0.stages.collectives.settings import CollectivesSection, coerce_settings

DEFAULT_PORT = 29500
_SUMMARY = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


class _Agents:
    """Every node's torchrun as the watcher sees it: one status, one kill, torchrun's exit codes."""

    def __init__(self, procs: list[subprocess.Popen], logs: list[Path], names: list[str]) -> None:
        self.procs, self.logs, self.names = procs, logs, names

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        return next((c for c in codes if c), 0)

    def exit_code(self, node: int, rank: int) -> int | None:
        """The rank's exit status from its torchrun's failure summary, once written."""
        try:
            text = self.logs[node].read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        for m in _SUMMARY.finditer(text):
            if int(m.group(1)) == rank:
                return int(m.group(2))
        return None

    def no_ranks_message(self) -> str:
        k = next((i for i, p in enumerate(self.procs) if p.returncode), 0)
        return f"torchrun on {self.names[k]} failed before starting ranks: {_tail(self.logs[k])}"

    def kill(self, ranks: list[_Rank]) -> None:
        """SIGKILL every rank's group, give each torchrun a moment to report, then SIGKILL the torchruns."""
        for c in ranks:
            c.kill_group()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        for p in self.procs:
            kill_and_reap(p)
        for c in ranks:
            c.kill_group()


class _ClusterRank(_Rank):
    """A rank that torchrun started on a node: its pid and exit files, else torchrun's word on it."""

    def __init__(self, rank: int, ranks_dir: Path, agents: _Agents, node_index: int, node: str, local_pids: bool) -> None:
        super().__init__(rank, ranks_dir)
        self.agents, self.node_index, self.node, self.local_pids = agents, node_index, node, local_pids

    def poll(self, launcher_rc: int | None = None) -> int | None:
        if self.recorded_exit() is not None:
            return self.rc
        agent_rc = self.agents.procs[self.node_index].poll()
        pid = self._read_pid()
        if self.local_pids and pid is not None and pid_alive(pid):
            return None
        if not self.local_pids and agent_rc is None:
            return None  # another host's process: its torchrun's exit is the news
        code = self.agents.exit_code(self.node_index, self.rank)
        if code is not None:
            self.rc = code
        elif agent_rc is not None:
            self.rc = agent_rc or 1
        return self.rc  # None: dead, its torchrun not done reporting yet

    def kill_group(self) -> None:
        if self.local_pids:
            super().kill_group()
            pid = self.pid
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def collectives_port(engine_master_port: int) -> int:
    """Where the collectives' ranks meet on node0 when the topology names vLLM's rendezvous port:
    the port after it. vLLM's ranks hold theirs while the engine serves, and the collectives run
    beside it; 0 (none named) leaves the choice to :func:`run_cluster`."""
    return engine_master_port + 1 if engine_master_port else 0


def run_cluster(settings: CollectivesSection | Mapping[str, Any] | None, cluster: Any, out_dir: Path | str, *,
                devices_per_node: int = 1, master_port: int = 0, env: Mapping[str, str] | None = None,
                poll_s: float = 0.05) -> CollectivesResult:
    """Run the sweep with ``devices_per_node`` ranks on every node of ``cluster``; nothing outlives the call."""
    s = coerce_settings(settings)
    nodes = list(cluster.nodes)
    per = int(devices_per_node)
    n = len(nodes) * per
    out, ranks_dir = prepare_out_dir(out_dir, s)
    emulated = getattr(cluster, "emulated", None) is not None
    local_kind = getattr(cluster.launcher, "kind", "local") in ("local", "netns")
    # Emulated nodes have ports of their own and real ones cannot be probed from here: a port near torchrun's
    # default, varied by this process so that a fixed-port service on node 0 (or a second day0) is unlikely to hold it.
    fixed = DEFAULT_PORT + os.getpid() % 400
    port = master_port or s.master_port or (fixed if emulated or not local_kind else free_port("0.0.0.0"))
    base = rank_base_env(env)
    cmd_env = {k: base[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS")}
    logs = [ranks_dir / f"{nd.name}.torchrun.log" for nd in nodes]
    agents = _Agents([], logs, [nd.name for nd in nodes])
    ranks = [_ClusterRank(r, ranks_dir, agents, r // per, nodes[r // per].name, local_kind) for r in range(n)]
    t_start = time.monotonic()
    try:
        for k, nd in enumerate(nodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
                   "--nproc-per-node", str(per), "--node-rank", str(k), "--master-addr", cluster.master_addr,
                   "--master-port", str(port), "--max-restarts", "0", "--monitor-interval", "0.1",
                   # no per-rank log folders: the ranks report through out/ranks and torchrun's
                   # summary, and without it each torchrun leaves a torchelastic_* folder in /tmp
                   "--log-dir", os.devnull,
                   "-m", "day0.stages.collectives", "run", "--worker", "--settings", str(out / SETTINGS_FILE),
                   "--out-dir", str(out)]
            agents.procs.append(spawn(cluster.launcher, nd, cmd, cmd_env, logs[k], base,
                                      header=f"# day0 collectives: torchrun on {nd.name} ({nd.address})"))
    except BaseException:
        agents.kill(ranks)
        raise
    fault = watch_ranks(ranks, agents, s, out, t_start, poll_s, f"collectives sweep ({n} ranks on {len(nodes)} nodes)")
    return finish_result(out, s, n, fault, time.monotonic() - t_start)
