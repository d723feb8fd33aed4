"""The device check against what could cost the one GPU run its record: a probe that breaks before
any step, a stage that refuses to import, stale wheels, a hard stop inside the sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

from day0.core.record import load
from day0.device_check import sweep
from day0.device_check.run import execute
from day0.device_check.runner import DeviceRun, Options
from tests.device_check.test_on_cpu import _declared_ids, _env
from tests.support import REPO

SCRIPT = REPO / "scripts" / "device-check.sh"


def _run(tmp_path: Path, **kw) -> DeviceRun:
    return DeviceRun(Options(out=tmp_path / "out", **kw), "test", {}, stream=open(os.devnull, "w"))


class _Refusing(types.ModuleType):
    """A module whose every name raises what pydantic raises on a pydantic-core version mismatch."""

    def __getattr__(self, name: str):
        raise SystemError("The installed pydantic-core version (2.23.4) is incompatible with the current "
                          "pydantic version")


# --------------------------------------------------------------------------- before any step


def test_an_environment_probe_that_raises_still_leaves_a_record(tmp_path, monkeypatch):
    from day0.core import environment

    def broken(*a, **kw):
        raise ValueError("could not convert string to float: '[N/A]'")

    monkeypatch.setattr(environment, "collect", broken)
    code = execute(Options(out=tmp_path / "out", budget_s=1e-9), stream=open(os.devnull, "w"))
    record = load(tmp_path / "out")
    assert code == 0 and {c.id for c in record.checks()} == set(_declared_ids())
    assert "ValueError: could not convert" in record.environment["error"]
    assert (tmp_path / "out" / "summary.json").is_file()


# --------------------------------------------------------------------------- a stage that will not import


def test_plain_op_ids_are_the_stages_own():
    from day0.core.collective_ops import OPS
    from day0.stages.collectives.checks import op_check_ids

    assert [sweep.plain_op_ids(op) for op in OPS.runnable()] == [tuple(op_check_ids(op)) for op in OPS.runnable()]


def test_a_stage_that_raises_systemerror_on_import_is_the_steps_error_under_its_usual_ids(tmp_path, monkeypatch):
    """pydantic with the wrong pydantic-core raises SystemError, not ImportError: it used to escape
    sweep_steps() as a traceback, exit 1, no summary.json."""
    usual = sweep.sweep_ids()
    monkeypatch.setitem(sys.modules, "day0.stages.collectives.checks", _Refusing("day0.stages.collectives.checks"))
    [step] = sweep.sweep_steps()
    assert step.ids == usual
    run = _run(tmp_path)
    run.state.no_cuda = None  # as on the GPU: the step runs and breaks
    run.do(step)
    assert {c.id for c in run.checks} == set(usual)
    assert all(c.status == "error" and "SystemError: The installed pydantic-core" in c.message for c in run.checks)


def test_a_whole_run_whose_pydantic_refuses_to_import_ends_with_every_check(tmp_path):
    finder = """
import importlib.abc, runpy, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pydantic":
            raise SystemError("pydantic-core 2.23.4 is incompatible with the current pydantic")
sys.meta_path.insert(0, Broken())
sys.argv = ["day0.device_check", "--out", sys.argv[1], "--work-dir", sys.argv[2]]
runpy.run_module("day0.device_check", run_name="__main__", alter_sys=True)
"""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", finder, str(out), str(tmp_path / "work")], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {c["id"] for c in summary["checks"]} == set(_declared_ids())
    tiny = next(c for c in summary["checks"] if c["id"] == "device.tiny_model")
    assert tiny["status"] == "error" and "SystemError" in tiny["message"]


# --------------------------------------------------------------------------- --prepare


FAKE_PIP = """#!/bin/sh
# stands in for the Python that runs --prepare: prints the pins, "downloads" one wheel per pin
if [ "$1" = "-c" ]; then echo "pydantic==9.9.9 annotated-types==1.0"; exit 0; fi
[ -n "$FAIL_DOWNLOAD" ] && exit 1
while [ $# -gt 0 ]; do
    case "$1" in -d) dest=$2; shift ;; *==*) : > "$dest/${1%%==*}-${1##*==}-py3-none-any.whl" ;; esac
    shift
done
"""


def test_prepare_replaces_the_wheels_and_a_failed_download_keeps_the_old_ones(tmp_path):
    """The device unpacks every wheel in the folder: a stale version left by an earlier --prepare
    would be unpacked beside the new one."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PIP)
    fake.chmod(0o755)
    wheels = tmp_path / "build" / "device-wheels"
    wheels.mkdir(parents=True)
    (wheels / "pydantic-1.0.0-py3-none-any.whl").write_text("stale")
    env = {**_env(), "PYTHON": str(fake), "DAY0_DEVICE_WHEELS": str(wheels)}
    proc = subprocess.run(["bash", str(SCRIPT), "--prepare"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    want = {"pydantic-9.9.9-py3-none-any.whl", "annotated-types-1.0-py3-none-any.whl"}
    assert {p.name for p in wheels.iterdir()} == want
    failed = subprocess.run(["bash", str(SCRIPT), "--prepare"], env={**env, "FAIL_DOWNLOAD": "1"},
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "left as it was" in failed.stderr
    assert {p.name for p in wheels.iterdir()} == want
    assert sorted(p.name for p in wheels.parent.iterdir()) == ["device-wheels"]  # no scratch folder left



# --------------------------------------------------------------------------- a hard stop inside the sweep


def test_a_hard_stop_inside_the_sweep_keeps_what_the_sweep_left(tmp_path, monkeypatch):
    """The hard limit fired inside run_local: the copies into the output folder never ran and the
    work folder was removed next, losing the partial result and the NCCL log."""
    import day0.stages.collectives as stage
    from day0.device_check.runner import HardStop
    from day0.stages.collectives.result import CollectivesResult
    from tests.device_check.test_on_cpu import ONE_RANK_LOG

    def cut_off(settings, world, scratch, env=None):
        (scratch / "ranks").mkdir(parents=True)
        (scratch / "ranks" / "rank0.log").write_text("rank 0: all_reduce 64 MiB\n")
        (scratch / "nccl-debug.h200-0.4242.log").write_text(ONE_RANK_LOG)
        CollectivesResult(backend="nccl", world_size=1).write(scratch / "collectives.json")
        raise HardStop("stopped at the hard limit: --budget-s 1 + --grace-s 1 s")

    monkeypatch.setattr(stage, "run_local", cut_off)
    monkeypatch.setattr(sweep, "_world", lambda: 1)
    run = _run(tmp_path)
    run.state.work, run.state.no_cuda = tmp_path / "work", None
    run.do(sweep.sweep_steps()[0])
    assert {c.status for c in run.checks} == {"error"} and "hard limit" in run.checks[0].message
    out = tmp_path / "out"
    assert "NCCL version 2.27.7+cuda13.0" in (out / "nccl-debug.log").read_text()
    assert json.loads((out / "collectives.json").read_text())["world_size"] == 1
    assert "===== rank0.log" in (out / "device-check.log").read_text()


# --------------------------------------------------------------------------- CUDA that answers, then fails


def test_a_cuda_failure_after_is_available_is_the_reason_the_gpu_steps_give(tmp_path, monkeypatch):
    """is_available() True, then the first real call fails: the GPU steps used to say
    'torch.cuda.is_available() is False', which is not what happened."""
    import torch

    from day0.device_check import steps
    from day0.device_check.runner import Step

    def busy(i):
        raise RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", busy)
    run = _run(tmp_path)
    run.do(steps.model_steps()[0])
    run.do(Step("gpu", "device", {"device.gpu": "a GPU step"}, lambda r: None, needs_cuda=True))
    got = {c.id: c for c in run.checks}
    assert got["device.cuda"].status == "error" and "busy or unavailable" in got["device.cuda"].message
    assert got["device.gpu"].status == "skip" and "is_available() is False" not in got["device.gpu"].message
    assert "is True, but the first query raised RuntimeError: CUDA error" in got["device.gpu"].message
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "busy or unavailable" in summary["cuda"]["reason"]


def test_the_docs_give_the_device_tool_call_that_prepare_prints():
    import re

    call = re.search(r'run\(command="bash scripts/device-check\.sh".*?\)', SCRIPT.read_text().replace('\\"', '"'))
    doc = (REPO / "docs" / "device-check.md").read_text()
    assert call and call.group(0) in doc
    timeout = re.search(r"timeout_s=(\d+)", call.group(0)).group(1)
    assert set(re.findall(r"timeout_s=(\d+)", doc)) == {timeout}


def test_the_wheels_are_unpacked_under_the_checkout_not_tmp(tmp_path):
    """pydantic-core is a shared library: a /tmp mounted noexec would refuse to load it from there."""
    import shutil
    import zipfile

    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "device-check.sh")
    (root / "build" / "device-wheels").mkdir(parents=True)
    with zipfile.ZipFile(root / "build" / "device-wheels" / "pydantic-9.9.9-py3-none-any.whl", "w") as whl:
        whl.writestr("pydantic/__init__.py", "VERSION = '9.9.9'\n")
    fake = tmp_path / "python"  # no pydantic of its own; unzips for real; prints what the run would get
    fake.write_text(f"""#!/bin/sh
case "$1 $2" in
  "-m zipfile") exec {sys.executable} "$@" ;;
  "-m day0.device_check") echo "PYTHONPATH=$PYTHONPATH"; exit 0 ;;
esac
exit 1
""")
    fake.chmod(0o755)
    env = {**_env(), "PYTHON": str(fake), "TMPDIR": str(tmp_path / "tmpdir")}
    env.pop("DAY0_DEVICE_SITE", None)
    proc = subprocess.run(["bash", str(root / "scripts" / "device-check.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    site = root / "build" / "device-site" / "main"
    assert (site / "pydantic" / "__init__.py").is_file() and f":{site}" in proc.stdout
    assert not (tmp_path / "tmpdir").exists()
