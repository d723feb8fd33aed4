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


# --------------------------------------------------------------------------- weight memory per rank


class _FakeLLM:
    def __init__(self, ranks):
        self.ranks = ranks

    def collective_rpc(self, fn):
        return self.ranks


def _engine(ranks=None, mode="inprocess"):
    from types import SimpleNamespace

    return SimpleNamespace(llm=_FakeLLM(ranks) if ranks is not None else None, info=SimpleNamespace(mode=mode))


def test_weight_memory_is_unmeasurable_without_the_worker_rpc_or_its_figure():
    from day0.stages.weights import Unmeasurable, loaded_bytes_per_rank

    with pytest.raises(Unmeasurable, match="which the server mode does not expose"):
        loaded_bytes_per_rank(_engine(mode="server"))
    with pytest.raises(Unmeasurable, match=r"\[1.0, 2.0\] MiB seen\); measured on GPU workers"):
        loaded_bytes_per_rank(_engine([{"loaded_bytes": None, "parameter_bytes": 2**20},
                                       {"loaded_bytes": 5, "parameter_bytes": 2**21}]))
    assert loaded_bytes_per_rank(_engine([{"loaded_bytes": 7, "parameter_bytes": 1}])) == [7]


def test_weight_memory_checks_hold_each_rank_to_the_plan():
    from day0.config.profile import load_profile
    from day0.model.sizing import plan_for
    from day0.stages.weights import memory_checks

    profile = load_profile("cpu-tiny")
    plan_bytes = plan_for(profile).weight_bytes_per_rank
    per_rank = [plan_bytes, int(plan_bytes * 1.2)]
    per_rank_check, headroom = memory_checks(per_rank, profile)
    assert per_rank_check.id == "weights.memory_per_rank" and per_rank_check.status == "fail"
    assert per_rank_check.value == round(0.2, 4) and per_rank_check.limit == profile.weights.memory_tolerance
    assert per_rank_check.source == "scheduler" and per_rank_check.evidence["plan_bytes"] == plan_bytes
    assert "worst deviation 20.0%, tolerance 10%" in per_rank_check.message
    capacity = profile.topology.device_memory_gib * float(profile.engine.args.get("gpu_memory_utilization", 0.9))
    assert headroom.id == "weights.memory_headroom" and headroom.limit == round(capacity, 4)
    assert headroom.value == round(max(per_rank) / 2**30, 4) and headroom.status == "pass"


def test_weight_memory_without_a_plan_is_one_skip_saying_why(tmp_path):
    from day0.config.profile import load_profile
    from day0.stages.weights import memory_checks

    profile = load_profile("cpu-tiny", overrides={"model": {"source": "path", "path": str(tmp_path / "nowhere")}})
    [check] = memory_checks([123], profile)
    assert check.id == "weights.memory_per_rank" and check.status == "skip" and check.value == 123
    assert check.message.startswith("no plan to compare with: model.path ") and "config.json" in check.message


def test_golden_check_names_the_prompts_that_differ(tmp_path):
    from types import SimpleNamespace

    from day0.engine.handle import Completion
    from day0.stages.weights import golden_check

    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"model": "m", "max_tokens": 2, "prompts": [
        {"prompt": "a", "token_ids": [1, 2]}, {"prompt": "b", "token_ids": [3, 4]}]}))
    engine = SimpleNamespace(view="http", greedy=lambda prompts, n: [Completion("", [1, 2], n), Completion("", [3, 5], n)])
    check = golden_check(engine, str(golden))
    assert (check.id, check.status, check.value, check.source) == ("weights.golden_tokens", "fail", 1, "http")
    assert check.message == f"greedy tokens differ from {golden} for ['b']" and check.evidence == {"golden": str(golden)}
