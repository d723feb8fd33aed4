"""An emulated cluster: one network namespace per node on this host, real links between them.

Each node is a namespace ``day0-<cid>-node<i>`` with a veth (``veth0`` inside) whose peer sits
on a bridge ``d0b<cid>`` in the host's namespace. Addresses come from 198.18.0.0/15, the range
RFC 2544 sets aside for network benchmarks: node i is ``198.18.<k>.<i+1>``, the bridge (where the
harness, the "client host", reaches the nodes) ``198.18.<k>.254``. A shaped link is a tbf qdisc on
both ends of the node's veth, so traffic to and from that node is slowed alike.

Nothing may outlive the run: :meth:`EmulatedCluster.down` kills every process in the namespaces
and deletes them (the veths go with them) and the bridge. A harness that is SIGKILLed cannot run
it, so a reaper process (:mod:`day0.engine.cluster.reaper`) holds a pipe from the harness and
tears down when it reads EOF; and a later run sweeps what a dead owner left (:func:`sweep_stale`),
found by the ``day0-``/``d0`` name prefixes and the owner pid in the cluster id.

With ``scheduler = "slurm"`` the nodes also run a real Slurm (:mod:`day0.engine.cluster.scheduler`);
its daemons live in the cluster's folder (``/run/day0-clusters/<cid>/``) and go with the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from day0.config.topology import EmulateSection
from day0.core.commands import run_command
from day0.engine.cluster.scheduler import SchedulerError, SlurmCluster, SlurmNode, slurm_missing, slurm_up, stop_daemons

NETNS_PREFIX = "day0-"
STATE_DIR = Path("/run/day0-clusters")
NODE_IFNAME = "veth0"
_CID = re.compile(r"[0-9a-z]{1,8}")  # a cluster id: the owner's pid and a letter, or a hand-made cluster's
_NETNS = re.compile(r"^day0-(?P<cid>[0-9a-z]{1,8})-node(?P<i>\d+)$")
_LINK = re.compile(r"^d0(?:b(?P<bcid>[0-9a-z]{1,8})|(?P<vcid>[0-9a-z]{1,8})n\d+)$")


class EmulationError(RuntimeError):
    """The cluster could not be built or removed; one line naming the command that failed."""


class EmulationBlocked(EmulationError):
    """This host cannot emulate nodes at all (no root / CAP_NET_ADMIN, no iproute2): the run is blocked."""


Log = Callable[[str], None]


def _ip(*args: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return run_command(args, EmulationError, missing="install iproute2 (apt-get install iproute2)",
                       missing_error=EmulationBlocked, check=check, timeout=timeout)


def blocked_reason() -> str | None:
    """Why this host cannot emulate nodes, in one line, or None when it can.

    Creating a namespace needs CAP_NET_ADMIN (root); asking for it up front gives one clear line
    instead of a failed ``ip netns add`` halfway through.
    """
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated nodes need `{tool}` (iproute2): apt-get install iproute2"
    if not _has_net_admin():
        return "emulated nodes need root (CAP_NET_ADMIN) to create network namespaces; run as root or use launcher = \"local\""
    return None


def _has_net_admin() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 12))  # CAP_NET_ADMIN
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


@dataclass(frozen=True)
class EmulatedNode:
    name: str  # node0
    index: int
    netns: str
    address: str
    ifname: str  # inside the namespace
    host_if: str  # the veth's peer on the bridge
    rate: str  # tbf rate on the link, '' when unshaped


@dataclass
class EmulatedCluster:
    cid: str
    subnet: str  # 198.18.<k>.0/24
    bridge: str
    gateway: str  # the bridge's address: where the harness reaches the nodes from
    nodes: list[EmulatedNode]
    owner_pid: int | None  # None for a cluster a person brought up by hand (`day0 cluster up`)
    created: float = field(default_factory=time.time)
    slurm_conf: str = ""  # the generated slurm.conf when the nodes run a real Slurm

    @property
    def folder(self) -> Path:
        """The cluster's own files (a scheduler's configuration, state, logs, pid files)."""
        return cluster_folder(self.cid)

    @property
    def slurm(self) -> SlurmCluster | None:
        if not self.slurm_conf:
            return None
        return SlurmCluster(folder=Path(self.slurm_conf).parent, nodes=tuple(self._slurm_nodes()),
                            controller=self.gateway, port=0)

    def _slurm_nodes(self) -> list[SlurmNode]:
        cores = os.cpu_count() or 1
        return [SlurmNode(nd.name, nd.address, nd.netns, nd.ifname, nd.index % cores) for nd in self.nodes]

    # ------------------------------------------------------------------ building

    @classmethod
    def up(cls, n: int, spec: EmulateSection, *, owner_pid: int | None, log: Log = lambda m: None) -> "EmulatedCluster":
        """Build n nodes (sweeping what dead runs left first); anything half-built is removed on failure."""
        why = blocked_reason() or (slurm_missing() if spec.scheduler == "slurm" else None)
        if why:
            raise EmulationBlocked(why)
        with _host_lock():  # two runs starting at once must not pick the same subnet
            sweep_stale(log)
            cid = _new_cid(owner_pid)
            cluster = cls._plan(cid, _free_subnet(), n, spec, owner_pid)
            try:
                cluster._save()
                cluster._build(spec)
                if spec.scheduler == "slurm":
                    cluster._start_slurm(log)
            except BaseException:
                cluster.down()
                raise
        log(f"emulated cluster {cid}: {n} nodes on {cluster.subnet} "
            + ", ".join(f"{nd.name}={nd.address}" + (f" ({nd.rate})" if nd.rate else "") for nd in cluster.nodes))
        return cluster

    @classmethod
    def _plan(cls, cid: str, k: int, n: int, spec: EmulateSection, owner_pid: int | None) -> "EmulatedCluster":
        nodes = [EmulatedNode(name=f"node{i}", index=i, netns=f"{NETNS_PREFIX}{cid}-node{i}",
                              address=f"198.18.{k}.{i + 1}", ifname=NODE_IFNAME, host_if=f"d0{cid}n{i}",
                              rate=spec.rate_of(f"node{i}")) for i in range(n)]
        return cls(cid=cid, subnet=f"198.18.{k}.0/24", bridge=f"d0b{cid}", gateway=f"198.18.{k}.254",
                   nodes=nodes, owner_pid=owner_pid)

    def _build(self, spec: EmulateSection) -> None:
        _ip("ip", "link", "add", self.bridge, "type", "bridge")
        _ip("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("ip", "link", "set", self.bridge, "up")
        for nd in self.nodes:
            _ip("ip", "netns", "add", nd.netns)
            _ip("ip", "link", "add", nd.host_if, "type", "veth", "peer", "name", nd.ifname, "netns", nd.netns)
            _ip("ip", "link", "set", nd.host_if, "master", self.bridge, "up")
            _ip("ip", "-n", nd.netns, "addr", "add", f"{nd.address}/24", "dev", nd.ifname)
            _ip("ip", "-n", nd.netns, "link", "set", nd.ifname, "up")
            _ip("ip", "-n", nd.netns, "link", "set", "lo", "up")
            if nd.rate:
                self._shape(nd, spec)

    def _start_slurm(self, log: Log) -> None:
        try:
            slurm = slurm_up(self.folder / "slurm", self._slurm_nodes(), self.gateway, log)
        except SchedulerError as exc:
            raise EmulationError(f"Slurm: {exc}") from None
        self.slurm_conf = str(slurm.conf)
        self._save()

    def _shape(self, nd: EmulatedNode, spec: EmulateSection) -> None:
        """tbf on both ends of the node's veth: what leaves the node and what reaches it."""
        tbf = ["tbf", "rate", nd.rate, "burst", spec.burst, "latency", f"{spec.latency_ms}ms"]
        _ip("tc", "-n", nd.netns, "qdisc", "replace", "dev", nd.ifname, "root", *tbf)
        _ip("tc", "qdisc", "replace", "dev", nd.host_if, "root", *tbf)

    # ------------------------------------------------------------------ state

    def _save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = state_file(self.cid)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, cid: str) -> "EmulatedCluster":
        data = json.loads(state_file(cid).read_text(encoding="utf-8"))
        data["nodes"] = [EmulatedNode(**nd) for nd in data["nodes"]]
        return cls(**data)

    # ------------------------------------------------------------------ looking and removing

    def pids(self) -> dict[str, list[int]]:
        """The processes living in each node's namespace."""
        return {nd.name: netns_pids(nd.netns) for nd in self.nodes}

    def status(self) -> dict[str, object]:
        """What a person rehearsing by hand wants to see: nodes, addresses, shaping, processes."""
        existing = set(list_netns())
        pids = self.pids()
        return {"cid": self.cid, "subnet": self.subnet, "bridge": self.bridge, "gateway": self.gateway,
                "owner_pid": self.owner_pid, "slurm_conf": self.slurm_conf, "sinfo": self._sinfo(),
                "nodes": [{"name": nd.name, "netns": nd.netns, "address": nd.address, "ifname": nd.ifname,
                           "rate": nd.rate or "unshaped", "up": nd.netns in existing, "pids": pids.get(nd.name, [])}
                          for nd in self.nodes]}

    def _sinfo(self) -> str:
        """sinfo's answer for the status, or why there is none: a wedged controller is shown, and the
        other clusters still listed."""
        slurm = self.slurm
        try:
            return slurm.sinfo() if slurm else ""
        except SchedulerError as exc:
            return f"sinfo did not answer: {exc}"

    def down(self) -> None:
        """Kill every process in the namespaces, delete them (their veths go too), the bridge, the state."""
        teardown(self.cid, [nd.netns for nd in self.nodes], [self.bridge, *(nd.host_if for nd in self.nodes)])


def cluster_folder(cid: str) -> Path:
    """The cluster's own folder. The one place a cluster id becomes a path, so the id is checked
    here: `day0 cluster down` takes it from the command line, runs as root, and removes the folder
    (``/``, ``.`` or ``../x`` would have been removed)."""
    if not _CID.fullmatch(cid):
        raise ValueError(f"cluster id {cid!r}: not a day0 cluster's (1-8 of 0-9 and a-z; `day0 cluster status` lists them)")
    return STATE_DIR / cid


def state_file(cid: str) -> Path:
    return cluster_folder(cid).with_name(f"{cid}.json")


def teardown(cid: str, namespaces: Sequence[str], links: Sequence[str]) -> None:
    """Idempotent removal: a namespace only goes away once no process lives in it; the daemons the
    cluster started on the host (a scheduler's) stop by their pid files, then its folder goes."""
    with contextlib.suppress(SchedulerError, OSError):
        stop_daemons(cluster_folder(cid) / "slurm")
    existing = set(list_netns())
    for ns in namespaces:
        if ns in existing:
            kill_netns_processes(ns)
            _ip("ip", "netns", "del", ns, check=False)
    present = set(list_links())
    for link in links:
        if link in present:
            _ip("ip", "link", "del", link, check=False)
    with contextlib.suppress(OSError):
        state_file(cid).unlink()
    shutil.rmtree(cluster_folder(cid), ignore_errors=True)


def netns_pids(ns: str) -> list[int]:
    """The processes living in a namespace (``ip netns pids``); none once it is gone."""
    proc = _ip("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()] if proc.returncode == 0 else []


def kill_netns_processes(ns: str, timeout_s: float = 5.0) -> None:
    """SIGKILL whatever runs in a namespace and wait (bounded) until none is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = netns_pids(ns)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def list_netns() -> list[str]:
    proc = _ip("ip", "netns", "list", check=False)
    return [ln.split()[0] for ln in proc.stdout.splitlines() if ln.strip()]


def list_links() -> list[str]:
    proc = _ip("ip", "-o", "link", "show", check=False)
    names = []
    for ln in proc.stdout.splitlines():
        parts = ln.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def day0_leftovers() -> tuple[list[str], list[str]]:
    """day0's namespaces and links present on this host (for tests and `day0 cluster status`)."""
    return ([ns for ns in list_netns() if _NETNS.match(ns)], [ln for ln in list_links() if _LINK.match(ln)])


def _new_cid(owner_pid: int | None) -> str:
    """The owner's pid (a letter added when that process already has a cluster up), or m + hex by hand."""
    if owner_pid is None:
        return "m" + secrets.token_hex(3)
    taken = {_NETNS.match(ns)["cid"] for ns in day0_leftovers()[0]}  # type: ignore[index]
    return next(c for c in (str(owner_pid), *(f"{owner_pid}{x}" for x in "abcdefghijklmnopqrstuvwxyz"))
                if c not in taken)


def _owner_alive(cid: str) -> bool:
    pid = re.match(r"\d+", cid)
    if not pid:
        return True  # a cluster brought up by hand: only `day0 cluster down` removes it
    try:
        os.kill(int(pid.group()), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def teardown_cid(cid: str) -> bool:
    """Remove everything of cluster ``cid`` found by name, state file or not; True when something was
    there. What is still there afterwards (``ip`` refused: not root) raises, named: the removal is
    idempotent and quiet, so only a second look can tell "removed" from "tried"."""
    files = (cluster_folder(cid), state_file(cid))  # first: an id that is not one is refused before any `ip`
    ns, ln = _cluster_parts(cid)
    had_files = any(p.exists() for p in files)
    teardown(cid, ns, ln)
    ns_left, ln_left = _cluster_parts(cid)
    left = [*ns_left, *ln_left, *(str(p) for p in files if p.exists())]
    if left:
        raise EmulationError(f"cluster {cid}: still there after its removal: {', '.join(left)} (is this root?)")
    return bool(ns or ln or had_files)


def _cluster_parts(cid: str) -> tuple[list[str], list[str]]:
    """The namespaces and host links of cluster ``cid`` that exist now."""
    namespaces, links = day0_leftovers()
    return ([n for n in namespaces if _NETNS.match(n)["cid"] == cid],  # type: ignore[index]
            [x for x in links if _link_cid(x) == cid])


def _link_cid(name: str) -> str:
    m = _LINK.match(name)
    return (m["bcid"] or m["vcid"]) if m else ""


def cluster_ids() -> set[str]:
    """Every day0 cluster on this host, found by its namespaces, its links or its state file."""
    namespaces, links = day0_leftovers()
    cids = {_NETNS.match(ns)["cid"] for ns in namespaces} | {_link_cid(ln) for ln in links}  # type: ignore[index]
    if STATE_DIR.is_dir():
        cids |= {p.stem for p in STATE_DIR.glob("*.json") if _CID.fullmatch(p.stem)}
        cids |= {p.name for p in STATE_DIR.iterdir() if p.is_dir() and _CID.fullmatch(p.name)}
    return cids


def sweep_stale(log: Log = lambda m: None) -> list[str]:
    """Remove the namespaces, links and state files of clusters whose owning run is dead."""
    gone = [cid for cid in sorted(cluster_ids()) if not _owner_alive(cid)]
    for cid in gone:
        try:
            teardown_cid(cid)
        except EmulationError as exc:  # another run's leftovers must not stop this one; said, not hidden
            log(str(exc))
    if gone:
        log(f"removed emulated clusters left by runs that are gone: {', '.join(gone)}")
    return gone


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """One cluster built at a time on this host (an flock, released if the holder dies)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _free_subnet() -> int:
    """The third octet of a 198.18.<k>.0/24 no other day0 bridge on this host uses."""
    proc = _ip("ip", "-o", "-4", "addr", "show", check=False)
    used = {int(m.group(1)) for m in re.finditer(r"inet 198\.18\.(\d+)\.\d+/", proc.stdout)}
    for k in range(256):
        if k not in used:
            return k
    raise EmulationError("every 198.18.<k>.0/24 on this host is in use; run `day0 cluster down --all`")
