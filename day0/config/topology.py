"""``[topology]``: the nodes, the devices on each, the links between them, and how day0 reaches a node.

``launcher`` says how a process is started on a node: ``local`` (this host), ``netns`` (an
emulated node on this host, see ``[topology.emulate]``), ``srun`` (inside a Slurm allocation) or
``ssh``. ``[topology.emulate]`` turns a CPU profile into a rehearsal of a multi-node cluster:
one network namespace per node, real links between them, some of them slowed on purpose.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from day0.config.section import Section

# Bounds on the topology, shared with the memory plan's --what-if: past them no deployment exists,
# and the plan's layout search would only spend time.
MAX_NODES = 4096
MAX_DEVICES_PER_NODE = 1024
MAX_DEVICE_MEMORY_GIB = float(1 << 20)  # 1 PiB per device
# An emulated node is a network namespace and a few processes; past this the box runs out of cores
# long before the kernel runs out of namespaces.
MAX_EMULATED_NODES = 16

# tc's rate syntax as tbf takes it (tc-tbf(8)): a number and a bit or byte unit.
RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
               "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
NODE_NAME = re.compile(r"^node(\d+)$")


def rate_bytes_per_s(rate: str) -> float:
    """A tc rate (``20mbit``) in bytes per second: what a shaped link can carry at most."""
    m = re.match(r"^(\d+(?:\.\d+)?)([a-z]+)$", rate)
    if not m or m.group(2) not in _RATE_UNITS:
        raise ValueError(f"{rate!r} is not a tc rate such as '20mbit' or '1gbit'")
    return float(m.group(1)) * _RATE_UNITS[m.group(2)]


class EmulateSection(Section):
    """``[topology.emulate]``: the nodes become network namespaces on this host (docs/cluster.md).

    Every node gets a veth to one bridge and an address from 198.18.0.0/15 (RFC 2544's range for
    network benchmarks: it can never be mistaken for a real host). ``link_rate`` shapes every
    node's link with tbf, both directions; ``degrade`` shapes single nodes, e.g. ``{node2 = "20mbit"}``.
    """

    link_rate: str = Field("", description="tbf rate on every node's link, both directions ('' = unshaped)")
    degrade: dict[str, str] = Field({}, description="node name -> tbf rate for that node's link, e.g. {node2 = '20mbit'}")
    burst: str = Field("64kb", description="tbf burst (bucket size); small buckets cap the rate below `rate`")
    latency_ms: int = Field(400, ge=1, le=60_000, description="tbf latency: how long a packet may queue")
    scheduler: Literal["none", "slurm"] = Field(
        "none", description="slurm: a real Slurm on the nodes (slurmctld on the bridge, one slurmd per node) "
                            "and day0 starts its processes with srun")

    @field_validator("link_rate")
    @classmethod
    def _link_rate(cls, value: str) -> str:
        if value and not RATE.match(value):
            raise ValueError(f"{value!r} is not a tc rate such as '100mbit' or '1gbit'")
        return value

    @field_validator("degrade")
    @classmethod
    def _degrade(cls, value: dict[str, str]) -> dict[str, str]:
        for node, rate in value.items():
            if not NODE_NAME.match(node):
                raise ValueError(f"{node}: node names are node0, node1, ...")
            if not RATE.match(rate):
                raise ValueError(f"{node}: {rate!r} is not a tc rate such as '20mbit'")
        return value

    @field_validator("burst")
    @classmethod
    def _burst(cls, value: str) -> str:
        if not re.match(r"^\d+(k|kb|kbit|m|mb|mbit|b)?$", value):
            raise ValueError(f"{value!r} is not a tc size such as '64kb'")
        return value

    def rate_of(self, node: str) -> str:
        """The rate node's link is shaped to ('' when it is not)."""
        return self.degrade.get(node, self.link_rate)


class TopologySection(Section):
    device: Literal["cpu", "cuda"] = "cpu"
    accelerator: str = "cpu"
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    devices_per_node: int = Field(1, ge=1, le=MAX_DEVICES_PER_NODE)
    device_memory_gib: float = Field(24.0, gt=0, le=MAX_DEVICE_MEMORY_GIB)
    intra_node: Literal["shm", "pcie", "nvlink"] = "shm"
    inter_node: Literal["none", "ethernet", "roce", "infiniband", "nvlink"] = "none"
    launcher: Literal["auto", "local", "netns", "srun", "ssh"] = Field(
        "auto", description="how a process starts on a node; auto: netns with [topology.emulate], "
                            "srun inside a Slurm allocation of several nodes, else local")
    hosts: list[str] = Field([], description="ssh: the nodes' host names, node0 first (srun reads Slurm's list)")
    socket_ifname: str = Field("", description="the interface torch/gloo and vLLM bind on every node "
                                               "(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); emulated nodes set their own")
    master_port: int = Field(0, ge=0, le=65534,  # the collectives take the next port, itself a port
                             description="the port vLLM's ranks meet on at node0 (0: a free one); "
                                         "the collectives stage meets on the port after it")
    emulate: Optional[EmulateSection] = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for h in value:
            if not re.match(r"^[A-Za-z0-9_.@:\-\[\]]+$", h) or h.startswith("-"):  # ssh, srun: an option
                raise ValueError(f"{h!r} is not a host name")
        return value

    @model_validator(mode="after")
    def _together(self) -> "TopologySection":
        if self.emulate is not None:
            if self.device != "cpu":
                raise ValueError("emulate: an emulated cluster is for CPU profiles (device = \"cpu\")")
            if self.nodes > MAX_EMULATED_NODES:
                raise ValueError(f"emulate: at most {MAX_EMULATED_NODES} emulated nodes, got nodes = {self.nodes}")
            allowed = ("auto", "srun") if self.emulate.scheduler == "slurm" else ("auto", "netns")
            if self.launcher not in allowed:
                raise ValueError(f"launcher: {self.launcher!r} with [topology.emulate] scheduler = "
                                 f"{self.emulate.scheduler!r}; use {' or '.join(allowed)}")
            for node in self.emulate.degrade:
                if int(NODE_NAME.match(node).group(1)) >= self.nodes:  # type: ignore[union-attr]
                    raise ValueError(f"emulate.degrade.{node}: there are only {self.nodes} nodes (node0..node{self.nodes - 1})")
        elif self.launcher == "netns":
            raise ValueError("launcher: netns needs a [topology.emulate] table")
        if self.launcher == "ssh" and len(self.hosts) != self.nodes:
            raise ValueError(f"hosts: launcher ssh needs one host per node ({self.nodes}), got {len(self.hosts)}")
        return self

    def launcher_kind(self, environ: Any = None) -> str:
        """The launcher ``auto`` stands for here: netns when emulating (srun when the emulated nodes run
        a Slurm), srun inside a multi-node Slurm allocation, else local."""
        if self.launcher != "auto":
            return self.launcher
        if self.emulate is not None:
            return "srun" if self.emulate.scheduler == "slurm" else "netns"
        env = environ or {}
        if self.nodes > 1 and (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")):
            return "srun"
        return "local"
