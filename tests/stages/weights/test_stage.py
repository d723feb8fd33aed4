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
from tests.support import REPO


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


def test_weight_memory_is_unmeasurable_without_the_worker_rpc():
    from day0.stages.weights import Unmeasurable, loaded_bytes_per_rank

    with pytest.raises(Unmeasurable, match="which the server mode does not expose"):
        loaded_bytes_per_rank(_engine(mode="server"))
    assert loaded_bytes_per_rank(_engine([{"loaded_bytes": 7, "parameter_bytes": 1}])) == [7]


def _cpu_rank(params, repacked, layers, buffers=0):
    return {"loaded_bytes": None, "parameter_bytes": params, "buffer_bytes": buffers, "repacked_bytes": repacked,
            "repacked_layers": layers, "weight_bytes": params + buffers + repacked}


def test_cpu_workers_count_parameters_plus_repacked_layers_and_say_how():
    from day0.stages.weights.memory import rank_weights

    found = rank_weights(_engine([_cpu_rank(2**20, 9 * 2**20, 12), _cpu_rank(2**20, 3 * 2**20, 12)]))
    assert found.per_rank == [10 * 2**20, 4 * 2**20]
    assert found.evidence["parameter_bytes"] == [2**20, 2**20] and found.evidence["repacked_layers"] == [12, 12]
    assert found.evidence["repacked_bytes"] == [9 * 2**20, 3 * 2**20]
    assert found.note.startswith("parameters 1.0 MiB + [9.0, 3.0] MiB repacked into oneDNN handles (12 linear layers)")
    assert "whose own allocation is not exposed, so counted from the partition shapes the engine holds" in found.note


class _Engines:
    def __init__(self, scheduler=None, why_not=None, primary=None):
        self._scheduler, self.why_not, self.asked = scheduler, why_not, 0
        self._primary = primary or _engine(mode="server")
        self.primary_view = "scheduler" if getattr(self._primary, "llm", None) is not None else "http"

    def primary(self):
        return self._primary

    def scheduler(self):
        from day0.engine.handle import ViewUnavailable

        self.asked += 1
        if self.why_not:
            raise ViewUnavailable(self.why_not)
        return self._scheduler


def test_a_cpu_server_is_measured_through_the_scheduler_view_and_a_gpu_server_skips():
    from day0.stages.weights import Unmeasurable
    from day0.stages.weights.memory import SERVER_NOTE, measure_weights

    engines = _Engines(scheduler=_engine([_cpu_rank(100, 900, 4)]))
    found = measure_weights(engines)
    assert engines.asked == 1 and found.per_rank == [1000] and found.note.startswith(SERVER_NOTE + "; parameters 0.0 MiB")
    assert "not reachable over HTTP" in found.note and found.evidence["engine"].startswith("scheduler view")
    inproc = _Engines(primary=_engine([_cpu_rank(5, 0, 0)]))
    assert measure_weights(inproc).per_rank == [5] and inproc.asked == 0
    with pytest.raises(Unmeasurable, match="which the server mode does not expose"):
        measure_weights(_Engines(why_not="a second engine would not fit on the GPUs"))


def _fake_repacked_model(tp: int):
    """A FAKE module tree laid out as vLLM's CPU backend leaves a Llama layer (not vLLM's classes):
    linear layers hold an empty ``weight`` and a ``cpu_linear``, with vLLM's partition attributes."""
    import torch

    def linear(k, outs, **attrs):
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.float32), requires_grad=False)
        m.cpu_linear = torch.nn.functional.linear
        m.params_dtype = torch.float32
        m.output_partition_sizes = outs
        for name, value in {"input_size_per_partition": k, **attrs}.items():
            setattr(m, name, value)
        return m

    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(384, 256)  # kept whole (4 x 384 x 256 bytes)
    model.norm = torch.nn.Module()
    model.norm.weight = torch.nn.Parameter(torch.ones(256))
    model.norm.register_buffer("scale", torch.zeros(8))  # persistent: counted
    model.rope = torch.nn.Module()
    model.rope.register_buffer("cos_sin_cache", torch.zeros(1000, 64), persistent=False)  # derived: not counted
    model.qkv = linear(256, [256 // tp, 128 // tp, 128 // tp])
    model.o = linear(256 // tp, [256])
    model.router = linear(None, [8], input_size=256)  # ReplicatedLinear: no per-partition input
    model.lm_head = torch.nn.Linear(256, 384, bias=False)
    model.lm_head.cpu_linear = torch.nn.functional.linear  # weight kept (remove_weight=False): a parameter
    return model


def test_worker_side_counting_on_a_fake_repacked_module_tree():
    from types import SimpleNamespace

    from day0.engine.loaded import _weight_bytes

    def count(tp):
        return _weight_bytes(SimpleNamespace(model_runner=SimpleNamespace(model=_fake_repacked_model(tp))))

    one, two = count(1), count(2)
    params = 4 * (384 * 256 + 256 + 256 * 384)
    assert one["parameter_bytes"] == two["parameter_bytes"] == params and one["buffer_bytes"] == 4 * 8
    assert one["repacked_layers"] == two["repacked_layers"] == 3
    assert one["repacked_bytes"] == 4 * (256 * 512 + 256 * 256 + 256 * 8)
    assert two["repacked_bytes"] == 4 * (256 * 256 + 128 * 256 + 256 * 8)  # the live split shows
    assert one["weight_bytes"] == params + 32 + one["repacked_bytes"] and one["loaded_bytes"] is None


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


def test_weight_memory_with_pipeline_stages_holds_each_rank_to_its_own_stage():
    """Stages differ by design (embedding first, lm_head last, layers split unevenly): each rank is held
    to its stage's planned bytes, not to the busiest stage's, which failed an exact PP deployment."""
    from day0.config.profile import load_profile
    from day0.stages.weights import memory_checks
    from day0.stages.weights.memory import planned

    profile = load_profile("cpu-tiny", overrides={"engine": {"args": {"pipeline_parallel_size": 3}}})
    plan_, _ = planned(profile)
    assert plan_ is not None
    exact = [s.weight_bytes for s in plan_.stages]
    assert max(exact) / min(exact) > 1.2  # the busiest stage's figure would be 40% off the others
    check = memory_checks(exact, profile)[0]
    assert (check.status, check.value) == ("pass", 0.0), check.message
    assert "by pipeline stage" in check.message and check.evidence["plan_bytes_per_rank"] == exact
    swapped = [exact[1], exact[0], exact[2]]  # the same bytes on the wrong stages is a wrong split
    assert memory_checks(swapped, profile)[0].status == "fail"


def test_rank_balance_compares_the_tp_ranks_of_one_stage_only():
    from day0.stages.weights.beside import tp_groups

    assert tp_groups([5, 5, 9, 9], tp=2, pp=2) == [[5, 5], [9, 9]]
    assert tp_groups([5, 6], tp=2, pp=1) == [[5, 6]]
    assert tp_groups([5, 9], tp=2, pp=2) == []  # a partial view across stages: nothing to hold equal


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


@pytest.mark.parametrize("prompts", [[], [{"prompt": "a", "token_ids": []}]])
def test_a_golden_file_with_nothing_to_compare_is_refused_not_passed(tmp_path, prompts):
    """all([]) is True: a golden file of no prompts (or of prompts without tokens) passed any engine."""
    from day0.stages.weights import golden_check

    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"model": "m", "max_tokens": 2, "prompts": prompts}))
    with pytest.raises(ValueError, match="nothing to compare an engine with"):
        golden_check(object(), str(golden))


def test_a_golden_prompt_the_engine_answered_nothing_for_differs(tmp_path):
    from types import SimpleNamespace

    from day0.engine.handle import Completion
    from day0.stages.weights import golden_check

    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"model": "m", "max_tokens": 2, "prompts": [
        {"prompt": "a", "token_ids": [1, 2]}, {"prompt": "b", "token_ids": [3, 4]}]}))
    engine = SimpleNamespace(view="http", greedy=lambda prompts, n: [Completion("", [1, 2], n)])  # one answer of two
    check = golden_check(engine, str(golden))
    assert (check.status, check.value) == ("fail", 1) and "['b']" in check.message


def test_the_tiny_build_writes_the_manifest_the_audit_verifies(tiny, tmp_path):
    """weights.manifest passes on the embedded model, and the builder's manifest is the stage's format."""
    from day0.stages.weights import audit, write_manifest

    checks = [c for c in audit(tiny, verify_manifest=True) if c.id == "weights.manifest"]
    assert [c.status for c in checks] == ["pass"] and checks[0].value == 5
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    built = json.loads((copy / "day0-manifest.json").read_text())["files"]
    write_manifest(copy)
    assert json.loads((copy / "day0-manifest.json").read_text())["files"] == built
    with (copy / "model-00001-of-00003.safetensors").open("r+b") as fh:  # a changed byte is found
        fh.seek(-1, 2)
        fh.write(b"\x01")
    bad = [c for c in audit(copy, verify_manifest=True) if c.id == "weights.manifest"]
    assert bad[0].status == "fail"
