"""The day0 command line: listing, resolving, one-line errors with exit 2, pytest pass-through."""

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from day0 import cli
from day0.cli import main


def test_python_dash_m_day0_is_the_day0_command():
    """An environment without the scripts folder on PATH (a bare venv python, a container's
    entrypoint) runs ``python -m day0``: before, "No module named day0.__main__"."""
    proc = subprocess.run([sys.executable, "-m", "day0", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("day0 "), proc.stderr


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


@pytest.mark.parametrize("where", ["a-file", "a-file/sub"])
def test_tiny_build_into_a_place_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("x")
    assert main(["tiny", "build", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"day0: {tmp_path / where}: ") and err.count("\n") == 1, err


def test_tiny_build_of_a_spec_too_big_to_draw_in_memory_is_refused_before_it_starts(tmp_path, capsys):
    """Every dimension within its range, 122B parameters in all: the builder draws every weight in
    memory first, and died of the allocator with a traceback."""
    big = tmp_path / "big.toml"
    big.write_text('extends = "cpu-tiny"\n[model.tiny]\nhidden_size = 8192\nintermediate_size = 32768\n'
                   "num_hidden_layers = 128\nnum_attention_heads = 64\nnum_key_value_heads = 8\n")
    assert main(["tiny", "build", "--profile", str(big), str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("day0: model.tiny: 122,414,964,736 parameters") and err.count("\n") == 1, err
    assert not (tmp_path / "m").exists()


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


def test_weights_golden_with_transformers_asks_first_whether_the_host_can_hold_it(tmp_path, capsys, monkeypatch):
    """The stage asks host_reference_unavailable before it loads a float32 copy; the command went
    straight to loading, so a checkpoint past the host's memory met the OOM killer (a hunt)."""
    import day0.model.reference as reference

    monkeypatch.setattr(reference, "_available_bytes", lambda: 1)
    assert main(["weights", "golden", "--reference", "transformers", "-o", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("day0: --reference transformers: the float32 reference needs ~") and err.count("\n") == 1
    assert not (tmp_path / "g.json").exists()


# --------------------------------------------------------------------------- one command, one module


def _registered(module: str) -> set[str]:
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_cli(parser.add_subparsers())
    return set(parser._subparsers._group_actions[0].choices)


def test_the_plugin_table_names_exactly_what_each_module_registers():
    """A command a module adds but the table lacks would be reachable only through --help's full
    parser; a word the table names but no module adds would send `day0 WORD` to the wrong module."""
    for module in set(cli.PLUGIN_COMMANDS.values()):
        assert _registered(module) == {w for w, m in cli.PLUGIN_COMMANDS.items() if m == module}, module
    built_in = set(cli.build_parser("profiles")._subparsers._group_actions[0].choices)
    assert not built_in & set(cli.PLUGIN_COMMANDS)


@pytest.mark.parametrize("argv, wanted", [
    (["profiles"], set()),
    (["--version"], set(cli.PLUGIN_COMMANDS.values())),
    (["compare", "run", "--baseline", "latest"], {"day0.results.compare"}),
    (["-h", "cluster", "up"], {"day0.engine.cluster.cli"}),
    (["nosuch"], set(cli.PLUGIN_COMMANDS.values())),
])
def test_a_command_imports_only_its_own_module(argv, wanted):
    """`day0 profiles` does not pay for aiohttp and Jinja2 (~0.9 s a process); an unknown word still
    gets every command, so the refusal lists them all."""
    code = ("import json, sys; from day0 import cli; "
            f"cli.build_parser(cli.command_word({argv!r})); print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout)) & set(cli.PLUGIN_COMMANDS.values())
    assert loaded == wanted
