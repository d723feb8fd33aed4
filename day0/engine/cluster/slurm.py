"""What day0 needs from a Slurm allocation: the hosts it holds and which of them this process is.

Slurm hands a job its nodes as one compressed string (``SLURM_JOB_NODELIST=gpu[01-04]``). Every
launcher and the rendezvous address are derived from that string, so it is expanded here once,
the way ``scontrol show hostnames`` does, and with no Slurm installed (CI, laptops, containers
that inherit the environment but not the binaries).

The string comes from the environment, so it is treated as untrusted: its expansion is sized
before any host is built, and refused past a bound, so a hostile or mistyped ``n[0-99999999]``
costs a parse and not gigabytes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

__all__ = ["MAX_HOSTS", "SlurmError", "SlurmJob", "env_int", "expand_nodelist", "hostnames"]

# Slurm's own ceiling on a single range is 64k hosts; no allocation day0 tests comes near it.
MAX_HOSTS = 65_536
# A DNS name is at most 253 characters: longer is a typo or an attack, and the bound caps memory
# at MAX_HOSTS * MAX_NAME characters whatever the input says.
MAX_NAME = 253
# Slurm parses range bounds as unsigned long; wider digit strings are never a real node number.
MAX_DIGITS = 18
SCONTROL_TIMEOUT_S = 10.0

_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*")

Runner = Callable[..., "subprocess.CompletedProcess[Any]"]


class SlurmError(ValueError):
    """The allocation cannot be understood: day0 must stop rather than guess at the nodes."""


def _split_top(text: str) -> Iterator[str]:
    """Split on the commas between host groups, not the ones inside ``[...]``.

    Bracket balance is checked here, since this is the one pass that sees every character."""
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise SlurmError(f"nested '[' in node list at {text[start:i + 1]!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise SlurmError(f"unbalanced ']' in node list at {text[start:i + 1]!r}")
            depth = 0
        elif ch == "," and not depth:
            yield text[start:i]
            start = i + 1
    if depth:
        raise SlurmError(f"unbalanced '[' in node list at {text[start:]!r}")
    yield text[start:]


def _number(digits: str, piece: str) -> int:
    if not digits.isascii() or not digits.isdigit():
        raise SlurmError(f"non-digit range bound {digits!r} in {piece!r}")
    if len(digits) > MAX_DIGITS:
        raise SlurmError(f"range bound {digits[:MAX_DIGITS]}... too wide in {piece!r}")
    return int(digits)


@dataclass(frozen=True)
class _Range:
    """One ``lo-hi`` (or single number) inside brackets, kept unexpanded so it can be sized."""

    lo: int
    hi: int
    width: int

    def __len__(self) -> int:
        return self.hi - self.lo + 1

    def names(self) -> Iterator[str]:
        # Slurm pads every number to the width the lower bound was written with: 01-10 -> 01..10.
        return (f"{n:0{self.width}d}" for n in range(self.lo, self.hi + 1))


def _parse_ranges(inner: str, group: str) -> list[_Range]:
    """The comma-separated ranges of one ``[...]``; ``group`` is named in any error."""
    ranges: list[_Range] = []
    for item in (part.strip() for part in inner.split(",")):
        if not item:
            raise SlurmError(f"empty range in [{inner}] of {group!r}")
        lo_s, dash, hi_s = item.partition("-")
        lo_s, hi_s = lo_s.strip(), hi_s.strip()
        lo = _number(lo_s, group)
        hi = _number(hi_s, group) if dash else lo
        if hi < lo:
            raise SlurmError(f"reversed range [{item}] in {group!r}")
        ranges.append(_Range(lo, hi, len(lo_s)))
    return ranges


def _parse_group(group: str) -> list[list[str] | list[_Range]]:
    """A host group as alternating literal text and bracket ranges, still unexpanded.

    Literals are one-element lists so the group's expansion is one cartesian product,
    left to right: ``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02."""
    parts: list[list[str] | list[_Range]] = []
    pos = 0
    for m in re.finditer(r"\[([^\[\]]*)\]", group):
        parts.append([_literal(group[pos:m.start()], group)])
        parts.append(_parse_ranges(m.group(1), group))
        pos = m.end()
    parts.append([_literal(group[pos:], group)])
    return parts


def _literal(text: str, group: str) -> str:
    if not _NAME_CHARS.fullmatch(text):
        bad = next(ch for ch in text if not _NAME_CHARS.fullmatch(ch))
        raise SlurmError(f"character {bad!r} not allowed in host name {group!r}")
    return text


def _size(parts: list[list[str] | list[_Range]]) -> tuple[int, int]:
    """(host count, longest host name) of a parsed group, computed without expanding it."""
    count, longest = 1, 0
    for part in parts:
        if part and isinstance(part[0], _Range):
            count *= sum(len(r) for r in part)  # type: ignore[arg-type]
            longest += max(max(r.width, len(str(r.hi))) for r in part)  # type: ignore[union-attr]
        else:
            longest += len(part[0])  # type: ignore[arg-type]
    return count, longest


def _expand_group(parts: list[list[str] | list[_Range]]) -> Iterator[str]:
    choices = [
        [n for r in part for n in r.names()] if part and isinstance(part[0], _Range) else part  # type: ignore[union-attr]
        for part in parts
    ]
    return ("".join(combo) for combo in product(*choices))  # type: ignore[arg-type]


def expand_nodelist(text: str) -> list[str]:
    """Expand Slurm's compressed host list the way ``scontrol show hostnames`` does.

    Every group is parsed and sized before any is expanded, so a list over ``MAX_HOSTS`` is
    refused at the cost of reading it. Order and duplicates are kept: rank order follows it."""
    if not isinstance(text, str) or not text.strip():
        raise SlurmError(f"empty node list {text!r}")
    parsed: list[list[list[str] | list[_Range]]] = []
    total = 0
    for raw in _split_top(text):
        group = raw.strip()
        if not group:
            raise SlurmError(f"empty host name between commas in {text[:80]!r}")
        if group.startswith("-"):
            raise SlurmError(f"host name {group!r} starts with '-'")
        parts = _parse_group(group)
        count, longest = _size(parts)
        if longest > MAX_NAME:
            raise SlurmError(f"host name longer than {MAX_NAME} characters in {group[:80]!r}")
        if longest == 0:
            raise SlurmError(f"empty host name in {group!r}")
        total += count
        if total > MAX_HOSTS:
            raise SlurmError(f"node list expands past {MAX_HOSTS} hosts at {group[:80]!r}")
        parsed.append(parts)
    return [name for parts in parsed for name in _expand_group(parts)]


def _scontrol_hostnames(binary: str, nodelist: str, run: Runner) -> list[str] | None:
    """The hosts as Slurm itself expands them, or None when it cannot say.

    A timeout keeps a wedged slurmctld from hanging the whole run; any failure falls back to
    the local expansion instead of failing, since the syntax is the same."""
    try:
        proc = run(
            [binary, "show", "hostnames", nodelist],
            capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if proc.returncode != 0 or not isinstance(proc.stdout, str):
        return None
    hosts = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return hosts[:MAX_HOSTS + 1] if hosts else None


def hostnames(nodelist: str, run: Runner = subprocess.run) -> list[str]:
    """The allocation's hosts: Slurm's own answer when ``scontrol`` is installed, since it knows
    any syntax a newer Slurm adds; the local expansion otherwise, or when ``scontrol`` fails."""
    if not isinstance(nodelist, str) or not nodelist.strip():
        raise SlurmError(f"empty node list {nodelist!r}")
    nodelist = nodelist.strip()
    binary = shutil.which("scontrol")
    # A list starting with '-' would reach scontrol as an option; local expansion refuses it.
    if binary and not nodelist.startswith("-"):
        hosts = _scontrol_hostnames(binary, nodelist, run)
        if hosts:
            if len(hosts) > MAX_HOSTS:
                raise SlurmError(f"scontrol expanded {nodelist[:80]!r} past {MAX_HOSTS} hosts")
            return hosts
    hosts = expand_nodelist(nodelist)
    if not hosts:  # unreachable by construction; the contract is a non-empty list
        raise SlurmError(f"node list {nodelist!r} names no host")
    return hosts


def env_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """A launcher's integer variable (SLURM_PROCID, RANK, ...): ASCII digits only, or SlurmError naming
    the variable, since a misread rank would silently make two processes claim the same one (and
    ``int()`` takes Arabic-Indic digits and says nothing of where the text came from)."""
    raw = environ.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise SlurmError(f"{name}={raw[:40]!r} is not a non-negative integer")
    return int(text)


def _env_int(environ: Mapping[str, str], *names: str) -> tuple[str, int] | None:
    """(variable, value) of the first of ``names`` that is set."""
    for name in names:
        value = env_int(environ, name)
        if value is not None:
            return name, value
    return None


@dataclass(frozen=True)
class SlurmJob:
    """The allocation this process runs in, as Slurm described it in the environment."""

    nodelist: str
    hosts: list[str]
    node_id: int | None
    nnodes: int
    job_id: str | None

    @property
    def master_addr(self) -> str:
        """The rendezvous host: the allocation's first host, which every node can reach and
        agrees on without talking. Never loopback: other nodes would dial themselves."""
        return self.hosts[0]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], run: Runner = subprocess.run) -> SlurmJob | None:
        """The job, or None outside Slurm. The node count Slurm reports is checked against the
        expanded list, since a disagreement means ranks would be handed out for absent nodes."""
        nodelist = environ.get("SLURM_JOB_NODELIST")
        if nodelist is None:
            nodelist = environ.get("SLURM_NODELIST")
        if nodelist is None:
            return None
        hosts = hostnames(nodelist, run=run)
        counted = _env_int(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
        if counted is not None and counted[1] != len(hosts):
            raise SlurmError(
                f"{counted[0]}={counted[1]} but node list {nodelist[:80]!r} expands to {len(hosts)} hosts"
            )
        node = _env_int(environ, "SLURM_NODEID")
        if node is not None and node[1] >= len(hosts):
            raise SlurmError(f"SLURM_NODEID={node[1]} outside the {len(hosts)} hosts of {nodelist[:80]!r}")
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None
        return cls(
            nodelist=nodelist.strip(),
            hosts=hosts,
            node_id=node[1] if node is not None else None,
            nnodes=len(hosts),
            job_id=job_id,
        )
