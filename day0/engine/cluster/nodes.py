"""The run's nodes, from the topology: this host, an emulated cluster, a Slurm allocation or ssh hosts.

:func:`open_cluster` answers "where are the nodes and how do I start a process on each" once per
run; the engine (its ranks) and the collectives stage (its ranks) both ask the :class:`Cluster`.
The rendezvous address is node0's address, never a loopback default on a multi-node run: on
Slurm it is the first host of ``SLURM_JOB_NODELIST``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

from day0.config.topology import TopologySection
from day0.engine.cluster.launchers import Launcher, LocalLauncher, Node, SrunLauncher, launcher_for
from day0.engine.cluster.netns import EmulatedCluster, EmulationBlocked, EmulationError
from day0.engine.cluster.reaper import disarm, start_reaper
from day0.engine.cluster.slurm import SlurmError, SlurmJob

Log = Callable[[str], None]


class ClusterError(RuntimeError):
    """The nodes cannot be reached as the topology says; one line."""


class ClusterBlocked(ClusterError):
    """This host cannot provide the nodes at all (emulation without root); the run ends blocked."""


@dataclass
class Cluster:
    nodes: list[Node]
    launcher: Launcher
    emulated: EmulatedCluster | None = None
    _reaper_fd: int | None = field(default=None, repr=False)

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    @property
    def master_addr(self) -> str:
        return self.nodes[0].address

    def describe(self) -> list[dict[str, object]]:
        """For run.json's environment: each node's address, how it is reached, and its link."""
        rates = {nd.name: nd.rate for nd in self.emulated.nodes} if self.emulated else {}
        out = []
        for nd in self.nodes:
            d: dict[str, object] = {**nd.describe(), "launcher": self.launcher.kind}
            if self.emulated:
                d["link_rate"] = rates.get(nd.name) or "unshaped"
            out.append(d)
        return out

    def close(self) -> None:
        """Tear an emulated cluster down and disarm its reaper; nothing to do for real nodes. When
        the teardown raises, the reaper is left armed: closing the pipe gives it a second try."""
        fd, self._reaper_fd = self._reaper_fd, None
        torn_down = False
        try:
            if self.emulated is not None:
                self.emulated.down()
                self.emulated = None
            torn_down = True
        finally:
            if fd is not None:
                with contextlib.suppress(OSError):
                    (disarm if torn_down else os.close)(fd)


def open_cluster(topology: TopologySection, log: Log = lambda m: None,
                 environ: Mapping[str, str] | None = None) -> Cluster:
    """The nodes the topology describes, brought up when they are emulated.

    A single-node topology (or ``launcher = "local"``) is this host. Raises ClusterBlocked when
    emulation is impossible here and ClusterError when the nodes do not match the topology.
    """
    env = os.environ if environ is None else environ
    kind = topology.launcher_kind(env)
    if kind == "local":
        return Cluster([Node("node0", 0, "127.0.0.1")], LocalLauncher())
    if kind == "netns" or (kind == "srun" and topology.emulate is not None):
        return _emulated(topology, log)
    if kind == "srun":
        return Cluster(_slurm_nodes(topology, env), launcher_for("srun"))
    return Cluster([Node(f"node{i}", i, h, host=h, ifname=topology.socket_ifname)
                    for i, h in enumerate(topology.hosts)], launcher_for("ssh"))


def _emulated(topology: TopologySection, log: Log) -> Cluster:
    assert topology.emulate is not None
    try:
        emu = EmulatedCluster.up(topology.nodes, topology.emulate, owner_pid=os.getpid(), log=log)
    except EmulationBlocked as exc:
        raise ClusterBlocked(str(exc)) from None
    except EmulationError as exc:
        raise ClusterError(f"emulated cluster: {exc}") from None
    try:
        fd = start_reaper(emu.cid)
    except BaseException:  # without a reaper nothing would take the namespaces down
        emu.down()
        raise
    if emu.slurm_conf:  # the nodes run a real Slurm: every process starts as a job step on its node
        nodes = [Node(nd.name, nd.index, nd.address, host=nd.name, netns=nd.netns, ifname=nd.ifname)
                 for nd in emu.nodes]
        return Cluster(nodes, SrunLauncher(conf=emu.slurm_conf), emulated=emu, _reaper_fd=fd)
    nodes = [Node(nd.name, nd.index, nd.address, netns=nd.netns, ifname=nd.ifname) for nd in emu.nodes]
    return Cluster(nodes, launcher_for("netns"), emulated=emu, _reaper_fd=fd)


def _slurm_nodes(topology: TopologySection, env: Mapping[str, str]) -> list[Node]:
    try:
        job = SlurmJob.from_environ(env)
    except SlurmError as exc:
        raise ClusterError(f"Slurm allocation: {exc}") from None
    if job is None:
        raise ClusterError("launcher srun: not inside a Slurm allocation (SLURM_JOB_NODELIST is not set)")
    if len(job.hosts) < topology.nodes:
        raise ClusterError(f"topology.nodes = {topology.nodes} but the allocation has {len(job.hosts)} "
                           f"({job.nodelist})")
    return [Node(f"node{i}", i, h, host=h, ifname=topology.socket_ifname)
            for i, h in enumerate(job.hosts[: topology.nodes])]
