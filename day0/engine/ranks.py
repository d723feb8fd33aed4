"""The engine's ranks as processes on this host, and the memory each one holds.

Where no worker RPC reaches the engine (an external deployment, a server on GPUs), day0 can
still see its ranks when it runs beside them: the process that listens on the engine's port (or
the server day0 started), its descendants, and in them the vLLM ranks by their process titles
(``VLLM::Worker_TP0_...``; at one rank the worker lives in ``VLLM::EngineCore``). Each rank's
memory is what its device holds for it (``nvidia-smi``'s per-process figure on GPUs) or, on CPU,
its private resident pages (``/proc/<pid>/smaps_rollup``, through psutil's USS): the weights, the
KV pool and the runtime, not the weights alone (docs/metrics.md, ``weights.rank_memory``).
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence
from urllib.parse import urlsplit

import psutil

WORKER_TITLE = "VLLM::Worker"
CORE_TITLE = "VLLM::EngineCore"
NVIDIA_SMI = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")


class RanksUnavailable(RuntimeError):
    """The engine's ranks cannot be seen from here; ``str()`` says why, in one line."""


@dataclass(frozen=True)
class RankProcess:
    """One rank: its process, its title, and the bytes it holds on its device (or host)."""

    pid: int
    title: str
    resident_bytes: int
    basis: str  # how resident_bytes was read


def local_addresses() -> set[str]:
    """This host's addresses (every interface), so a URL naming any of them is beside day0."""
    found = {"localhost"}
    for addrs in psutil.net_if_addrs().values():
        found.update(a.address.split("%", 1)[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return found


def beside(url: str) -> str | None:
    """Why an engine at ``url`` is not on this host (None: it is, so its ranks can be read here)."""
    host = urlsplit(url).hostname or ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    mine = local_addresses()
    if host in mine:
        return None
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        resolved = set()
    if resolved & mine or any(ipaddress.ip_address(a).is_loopback for a in resolved):
        return None
    return f"{host} is not this host, so its processes cannot be read from here"


def listener_pid(url: str) -> int:
    """The process listening on ``url``'s port on this host; raises :class:`RanksUnavailable`."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.AccessDenied as exc:
        raise RanksUnavailable(f"cannot list the sockets of this host to find who serves port {port}: {exc}") from exc
    pids = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    if not pids:
        raise RanksUnavailable(f"no process of this host listens on port {port} (is {parts.hostname} "
                               "another machine's address, or the engine in another PID namespace?)")
    return min(pids)


def rank_pids(root: int) -> list[tuple[int, str]]:
    """(pid, title) of each vLLM rank under ``root``: the workers when there are any, else the engine
    core (one rank, its worker inside), else the root itself (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
    with the uni executor runs everything in one process)."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error as exc:
        raise RanksUnavailable(f"engine process {root} is gone: {exc}") from exc
    titled = []
    for p in procs:
        try:
            title = " ".join(p.cmdline()).strip()  # a set process title is padded with spaces
        except psutil.Error:
            continue
        titled.append((p.pid, title))
    workers = sorted((t for t in titled if t[1].startswith(WORKER_TITLE)), key=lambda t: t[1])
    if workers:
        return workers
    cores = [t for t in titled if t[1].startswith(CORE_TITLE)]
    return cores or titled[:1]


def host_resident(pids: Sequence[int]) -> dict[int, int]:
    """Private resident bytes (USS: anonymous and private file pages) of each process."""
    out = {}
    for pid in pids:
        try:
            out[pid] = int(psutil.Process(pid).memory_full_info().uss)
        except psutil.Error as exc:
            raise RanksUnavailable(f"cannot read the memory of process {pid}: {exc}") from exc
    return out


def parse_compute_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory`` CSV (MiB) -> bytes per pid, summed over
    devices; a line that is not ``pid, MiB`` (``[N/A]`` under some MIG setups) is left out."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdecimal() and fields[1].isdecimal():
            out[int(fields[0])] = out.get(int(fields[0]), 0) + int(fields[1]) * 2**20
    return out


def device_resident(pids: Sequence[int], run: Callable[[Sequence[str]], str] | None = None) -> dict[int, int]:
    """Device bytes each process holds, from nvidia-smi; raises :class:`RanksUnavailable` naming the pid
    the driver does not list (a container's own PID namespace hides the host's pids from it)."""
    def default_run(cmd: Sequence[str]) -> str:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=True).stdout

    try:
        apps = parse_compute_apps((run or default_run)(NVIDIA_SMI))
    except (OSError, subprocess.SubprocessError) as exc:
        raise RanksUnavailable(f"nvidia-smi could not list the GPU processes: {exc}") from exc
    missing = [p for p in pids if p not in apps]
    if missing:
        raise RanksUnavailable(f"nvidia-smi lists no GPU memory for rank process {missing[0]} (another PID "
                               "namespace, or the rank holds no device)")
    return {p: apps[p] for p in pids}


def ranks(root: int, device: str) -> list[RankProcess]:
    """Each rank under ``root`` with the memory it holds: on its GPU for ``cuda``, else on the host."""
    found = rank_pids(root)
    pids = [p for p, _ in found]
    if device == "cuda":
        held, basis = device_resident(pids), "device memory per process (nvidia-smi)"
    else:
        held, basis = host_resident(pids), "private resident memory (USS, /proc/<pid>/smaps_rollup)"
    return [RankProcess(pid, title, held[pid], basis) for pid, title in found]
