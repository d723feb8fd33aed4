"""The day0 command line: listing, resolving, one-line errors with exit 2, pytest pass-through."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from day0.cli import main


def test_profiles_lists_every_preset(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu-tiny", "h200x8", "supernode-tp8pp4-1m", "gb200-nvl72"):
        assert name in out


def test_profile_show_resolves_extends_and_overrides(tmp_path, capsys):
    f = tmp_path / "mine.toml"
    f.write_text('extends = "h200x8"\n[sla]\nttft_p99_ms = 900\n')
    assert main(["profile", "show", str(f), "--json", "--set", "engine.args.max_num_seqs=3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sla"]["ttft_p99_ms"] == 900
    assert data["engine"]["args"]["tensor_parallel_size"] == 8 and data["engine"]["args"]["max_num_seqs"] == 3


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text("[topology]\nnodes = 'four'\n")
    assert main(["profile", "show", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"day0: {f}: topology.nodes: expected an integer"
    assert main(["record", "rebuild", str(tmp_path / "nowhere")]) == 2
    assert "event log not found" in capsys.readouterr().err


def test_unknown_options_are_refused_except_for_run(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profiles", "-k", "x"])
    assert exc.value.code == 2


def test_run_passes_pytest_options_through(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "run", "--profile", "cpu-tiny", "-m", "day0 and weights",
                           "-k", "checkpoint_audit", "--day0-out", str(tmp_path), "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    run = json.loads((tmp_path / "latest" / "run.json").read_text())
    ids = {c["id"] for s in run["stages"] for c in s["checks"]}
    assert "weights.shards_present" in ids and "weights.smoke.tokens" not in ids


def test_tiny_build_writes_a_checkpoint(tmp_path, capsys):
    assert main(["tiny", "build", str(tmp_path / "m")]) == 0
    assert (Path(tmp_path / "m") / "model.safetensors.index.json").is_file()


def test_weights_golden_with_the_transformers_reference(tmp_path, capsys):
    """No engine: transformers computes the golden tokens from the local checkpoint, with the
    top-k logprobs a later comparison needs to tell a near-tie from a divergence."""
    from day0.engine.loaded import GOLDEN_PROMPTS, GOLDEN_TOKENS

    out = tmp_path / "golden.json"
    assert main(["weights", "golden", "--reference", "transformers", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["reference"].startswith("transformers")
    assert [p["prompt"] for p in data["prompts"]] == list(GOLDEN_PROMPTS)
    assert all(len(p["token_ids"]) == GOLDEN_TOKENS for p in data["prompts"])
    assert all(len(p["sequence"]["top_logprobs"]) == GOLDEN_TOKENS for p in data["prompts"])
