"""TCP connections as the kernel lists them in ``/proc/<pid>/net/tcp{,6}``: the one reader; and the
one way to pick a port for a server day0 starts (:func:`free_port`).

A table under ``/proc/<pid>/net`` is the whole network namespace's, so it shows which addresses
traffic really used; ``/proc/self/fd`` narrows it to one process's sockets. The collective ranks
read their own (``collectives.transport.inter_node``); the harness reads an emulated node's to
show that vLLM's TP ranks talked across nodes.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import random
import re
import socket
import struct
from pathlib import Path

_ESTABLISHED = "01"
Conn = tuple[str, int, str, int]  # local addr, local port, remote addr, remote port


def hex_addr(h: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order; IPv4-mapped IPv6 as IPv4."""
    raw = b"".join(struct.pack("<I", int(h[i:i + 8], 16)) for i in range(0, len(h), 8))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    addr = ipaddress.IPv6Address(raw)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def parse_proc_tcp(text: str, inodes: set[str] | None = None) -> list[Conn]:
    """Established connections in a /proc/net/tcp or tcp6 table (only those holding ``inodes``)."""
    out: list[Conn] = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10 or f[3] != _ESTABLISHED or (inodes is not None and f[9] not in inodes):
            continue
        (la, lp), (ra, rp) = (x.split(":") for x in (f[1], f[2]))
        out.append((hex_addr(la), int(lp, 16), hex_addr(ra), int(rp, 16)))
    return out


def own_tcp_connections() -> list[Conn]:
    """This process's established TCP connections, read from /proc (empty where there is none)."""
    inodes: set[str] = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
            if m:
                inodes.add(m.group(1))
    except OSError:
        return []
    return namespace_connections("self", inodes)


def namespace_connections(pid: int | str, inodes: set[str] | None = None) -> list[Conn]:
    """The established TCP connections in the network namespace process ``pid`` lives in (only
    those holding ``inodes`` when given); empty when its tables cannot be read."""
    conns: list[Conn] = []
    for name in ("tcp", "tcp6"):
        try:
            text = Path(f"/proc/{pid}/net/{name}").read_text(encoding="ascii", errors="replace")
            conns.extend(parse_proc_tcp(text, inodes))
        except OSError:
            continue
    return conns


def interface_address(ifname: str) -> str | None:
    """The IPv4 address of interface ``ifname`` in this network namespace (SIOCGIFADDR), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])


def node_ip(address: str | None, ifname: str | None) -> str | None:
    """The address this node's traffic leaves from, as an IP: the interface gloo/NCCL bind to when one
    is named (a hostname may resolve to a management network the ranks do not use), else the node's
    address itself, resolved when it is a name (Slurm's node lists are names). None when unknown."""
    if ifname:
        ip = interface_address(ifname)
        if ip:
            return ip
    if not address:
        return None
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


PORT_FLOOR = 10000  # free_port's lowest pick: above the well-known and most registered service ports
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel hands out as a connection's source port (32768 where unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", *, tries: int = 64, floor: int = PORT_FLOOR, low: int | None = None) -> int:
    """A TCP port free on ``host`` now, for a server day0 starts a moment later (vLLM's, a torch
    rendezvous, slurmctld), picked below the kernel's ephemeral range. A port that ``bind(0)`` hands
    back is an ephemeral one: until the server binds it, any connection the host opens may take it
    as its source port. A slurmctld started while other live tests ran beside it lost its port
    that way ("Address already in use", a CI run of 2026-12-06). Below the range only an explicit
    bind takes a port. Picks in [``floor``, ``low``), ``low`` the range's start unless given; falls
    back to ``bind(0)`` where that leaves no room or every try was taken."""
    top = ephemeral_low() if low is None else low
    pick = random.SystemRandom()
    for _ in range(tries if top > floor else 0):
        port = pick.randrange(floor, top)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
