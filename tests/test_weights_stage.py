"""The weights stage on broken copies of the tiny model: failed checks with one-line messages,
stage verdict fail, and the run record, report and JUnit file still produced."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from day0.config.profile import TinySpec
from day0.model.tiny import build

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build(TinySpec(), tmp_path_factory.mktemp("tiny") / "model")


def _truncate(d: Path) -> str:
    p = d / "model-00002-of-00003.safetensors"
    size = p.stat().st_size
    with p.open("r+b") as fh:
        fh.truncate(size - 1000)
    return f"model-00002-of-00003.safetensors: header says {size} bytes, file has {size - 1000}"


def _missing(d: Path) -> str:
    (d / "model-00003-of-00003.safetensors").unlink()
    return "model-00003-of-00003.safetensors"


def _bad_index(d: Path) -> str:
    (d / "model.safetensors.index.json").write_text('{"weight_map": {')
    return "model.safetensors.index.json"


def _no_config(d: Path) -> str:
    (d / "config.json").unlink()
    return "config.json"


@pytest.mark.parametrize("breaker", [_truncate, _missing, _bad_index, _no_config])
def test_broken_checkpoint_fails_the_stage_and_still_reports(tiny, tmp_path, breaker):
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    expected = breaker(model)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "day0" / "suites"), "-m", "day0 and weights", "-k", "checkpoint_audit",
         "--day0-out", str(tmp_path / "reports"), "-p", "no:cacheprovider",
         "--day0-set", 'model.source="path"', "--day0-set", f'model.path="{model}"'],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    latest = tmp_path / "reports" / "latest"
    run = json.loads((latest / "run.json").read_text())
    weights = next(s for s in run["stages"] if s["name"] == "weights")
    assert weights["verdict"] == "fail"
    failed = [c for c in weights["checks"] if c["status"] in ("fail", "error")]
    assert failed and all("\n" not in c["message"] for c in failed)
    assert any(expected in c["message"] for c in failed), [c["message"] for c in failed]
    assert (latest / "report.html").is_file() and (latest / "junit.xml").is_file()
