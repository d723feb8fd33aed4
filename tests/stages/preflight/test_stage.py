"""Stage 0 wired to profiles: every preset plans, `day0 plan` exit codes, and an error-level
finding blocks the later stages before any engine starts."""

import json
import subprocess
import sys

import pytest

from day0.config.profile import load_profile, preset_names
from day0.model.config import ConfigUnavailable, model_config
from day0.stages.preflight import preflight
from day0.stages.preflight.lint import vllm_rules
from tests.support import REPO


@pytest.fixture(scope="module")
def rules():
    return vllm_rules()


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_plans_without_errors(name, rules):
    result = preflight(load_profile(name), rules=rules)
    assert result.plan is not None, result.plan_error
    assert [f for f in result.errors] == []
    assert result.plan.verdict != "does_not_fit"


def test_the_supernode_needs_the_supernode(rules):
    result = preflight(load_profile("supernode-tp8pp4-1m"), rules=rules)
    assert result.plan.verdict == "needs_supernode"
    assert result.config_source == "example config 'moe-2.8t-1m-w4a16'"


def test_the_supernode_with_expert_parallel(rules):
    """The seed's 2.8T target with EP turned on for one run: experts per rank and the node's share."""
    from day0.model.plan import format_table

    result = preflight(load_profile("supernode-tp8pp4-1m"), {"enable_expert_parallel": True}, rules=rules)
    assert result.errors == [] and result.plan.verdict == "needs_supernode"
    moe = result.plan.moe
    assert (moe.ep_size, moe.experts_per_rank, moe.experts_even) == (8, 512 // 8, True)
    assert result.plan.node_holds_share and result.plan.nodes_used == 4
    info = {f.rule: f for f in result.findings}["expert_parallel"]
    assert "64 whole expert(s) per MoE layer of 512" in info.why
    assert "EP: 64 whole experts per rank" in format_table(result.plan)
    evidence = {c.id: c for c in result.plan_checks()}["preflight.plan.verdict"].evidence["plan"]
    assert evidence["moe"]["experts_per_rank"] == 64 and evidence["mla"]["latent_width"] == 576


def test_what_if_int4_dtype_is_an_error_with_the_fix(rules):
    result = preflight(load_profile("h200x8"), {"dtype": "int4"}, rules=rules)
    (err,) = result.errors
    assert err.key == "engine.args.dtype" and "quantization" in err.fix
    assert result.plan is None and "not a vLLM dtype" in result.plan_error


def test_a_model_dir_without_config_needs_model_config(tmp_path):
    profile = load_profile("h200x8", overrides={"model": {"path": str(tmp_path), "config": None}})
    with pytest.raises(ConfigUnavailable, match="has no local config.json; set model.config"):
        model_config(profile)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert model_config(profile)[1] == str(tmp_path / "config.json")  # the checkpoint's own wins


def test_day0_plan_cli_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "day0.cli", "plan", "--profile", "cpu-tiny"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "verdict" in ok.stdout and "fits_one_device" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "day0.cli", "plan", "--profile", "h200x8", "--what-if", "dtype=int4"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert "ERROR    engine.args.dtype = 'int4'" in bad.stdout


@pytest.mark.parametrize("start_early", [False, True])
def test_an_error_finding_blocks_every_later_stage_and_leaves_no_engine(tmp_path, start_early):
    """Without engine.start_early no engine is started at all; with it (the CPU presets) the server
    launched as preflight began is stopped the moment preflight fails, and no stage waits for it."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "day0" / "suites"), "-m", "day0", "--day0-out", str(tmp_path),
         "--day0-set", 'engine.args.dtype="int4"', "--day0-set", f"engine.start_early={str(start_early).lower()}",
         "-p", "no:cacheprovider", "-rs"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    run = json.loads((tmp_path / "latest" / "run.json").read_text())
    stages = {s["name"]: s for s in run["stages"]}
    assert stages["preflight"]["verdict"] == "fail"
    assert stages["weights"]["verdict"] == "blocked"
    assert "stage preflight failed (preflight.lint.dtype" in stages["weights"]["checks"][0]["message"]
    assert not any(k.startswith("engine.") for k in run["notes"])  # no engine served a stage
    assert (tmp_path / "latest" / "engine-server.log").exists() is start_early
    assert ("the engine launched early is stopped" in out) is start_early
    assert "waiting for vLLM /health" not in out
