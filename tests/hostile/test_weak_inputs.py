"""Hostile inputs, second round, cause 8 ("weak"): inputs that were taken for something else.

* a bare ``extends``/``--profile`` name that names a preset is the preset, whatever file of that name
  lies in the current folder (a path says so with "/" or ".toml");
* a quoted key part in ``--set``/``--day0-set`` keeps its dots and its ``=`` (TOML's dotted keys);
* a count typed on the command line is ASCII digits within bounds: ``-5``, ``+3``, ``1_000``,
  Arabic-Indic or full-width digits are one usage error naming the option;
* a launcher's rank variables (RANK, SLURM_PROCID, ...) are ASCII digits, or one line naming the variable;
* an index cannot reach files outside the checkpoint through a directory symlink (a shard that is
  itself a symlink, as in a Hugging Face cache, still can).

Each case runs in tests/support/hostile.py's bounded child process where it is a whole command.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from day0.config.profile import ProfileError, load_profile, parse_override
from day0.engine.cluster.slurm import SlurmError, SlurmJob, env_int
from day0.stages.collectives.rank_env import RankEnv
from tests.support import ckpt_factory as cf
from tests.support import hostile

NOT_COUNTS = ["-5", "+3", "1_000", " 7", "٣", "３", "1e3", "0x10", "", "9" * 40]


# --------------------------------------------------------------------------- presets first


@pytest.mark.parametrize("planted", ["h200x8", "cpu-tiny"])
def test_a_file_named_like_a_preset_does_not_shadow_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str) -> None:
    (tmp_path / planted).write_text('name = "shadow"\n[engine]\nmode = "external"\nurl = "http://evil:1"\n')
    (tmp_path / "site.toml").write_text(f'extends = "{planted}"\nname = "site"\n')
    monkeypatch.chdir(tmp_path)
    assert load_profile(planted).name == planted  # the command line's bare name
    site = load_profile(tmp_path / "site.toml")  # and extends
    assert site.engine.url != "http://evil:1" and site.engine.mode != "external"
    assert load_profile(f"./{planted}").name == "shadow"  # a path is a path


def test_a_bare_name_that_is_no_preset_is_still_a_file_beside_the_profile(tmp_path: Path) -> None:
    (tmp_path / "base").write_text('extends = "cpu-tiny"\nname = "base"\n[latency]\nconcurrency = 3\n')
    (tmp_path / "site.toml").write_text('extends = "base"\nname = "site"\n')
    assert load_profile(tmp_path / "site.toml").latency.concurrency == 3


def test_the_cli_shows_the_preset_not_the_planted_file(tmp_path: Path) -> None:
    (tmp_path / "h200x8").write_text('name = "shadow"\n')
    out = hostile.day0("profile", "show", "h200x8", cwd=tmp_path)
    assert out.code == 0 and 'name = "h200x8"' in out.stdout and "shadow" not in out.stdout, out.explain()


# --------------------------------------------------------------------------- --set keys


@pytest.mark.parametrize("text, want", [
    ('compare.tolerances."collectives.*.busbw"="10%"', {"compare": {"tolerances": {"collectives.*.busbw": "10%"}}}),
    ("compare.tolerances.'latency.ttft_p90'=\"20%\"", {"compare": {"tolerances": {"latency.ttft_p90": "20%"}}}),
    ('engine.env."A=B"=1', {"engine": {"env": {"A=B": 1}}}),
    ('engine.env."X.Y".z=true', {"engine": {"env": {"X.Y": {"z": True}}}}),
    ("engine.args.max_num_seqs=8", {"engine": {"args": {"max_num_seqs": 8}}}),
    ('a.b="x=y"', {"a": {"b": "x=y"}}),
])
def test_a_quoted_key_part_keeps_its_dots(text: str, want: dict) -> None:
    assert parse_override(text) == want


@pytest.mark.parametrize("text", ['engine.env."A=B"', '"a.b=1', 'engine.env."A"x=1', "a.'b=2"])
def test_a_malformed_quoted_key_is_one_error(text: str) -> None:
    with pytest.raises(ProfileError, match="override"):
        parse_override(text)


def test_a_quoted_tolerance_reaches_the_profile() -> None:
    p = load_profile("cpu-tiny", overrides=parse_override('compare.tolerances."collectives.*.busbw"="10%"'))
    assert p.compare.tolerances["collectives.*.busbw"] == "10%"


# --------------------------------------------------------------------------- counts on the command line


@pytest.mark.parametrize("value", NOT_COUNTS)
@pytest.mark.parametrize("argv", [
    ("collectives", "transport", "x.log", "--nodes"),
    ("latency", "--url", "http://127.0.0.1:9", "--num-requests"),
    ("latency", "--url", "http://127.0.0.1:9", "--devices"),
])
def test_a_count_that_is_not_a_whole_number_is_a_usage_error(argv: tuple[str, ...], value: str) -> None:
    out = hostile.day0(*argv, value)
    assert out.code == 2 and "Traceback" not in out.stderr, out.explain()
    assert argv[-1] in out.stderr and "whole number" in out.stderr or "outside" in out.stderr, out.explain()


def test_zero_nodes_is_outside_the_bounds() -> None:
    out = hostile.day0("collectives", "transport", "x.log", "--nodes", "0")
    assert out.code == 2 and "0 is outside 1.." in out.stderr, out.explain()


# --------------------------------------------------------------------------- launcher variables


@pytest.mark.parametrize("raw", ["٣", "３", "-1", "1.0", "x", "1_0", "9" * 20])
@pytest.mark.parametrize("name, env", [
    ("RANK", {"WORLD_SIZE": "2"}),
    ("WORLD_SIZE", {"RANK": "0"}),
    ("LOCAL_RANK", {"RANK": "0", "WORLD_SIZE": "2"}),
    ("SLURM_PROCID", {"SLURM_NTASKS": "2"}),
    ("SLURM_NTASKS", {"SLURM_PROCID": "0"}),
    ("SLURM_LOCALID", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}),
])
def test_a_malformed_rank_variable_is_named(name: str, env: dict[str, str], raw: str) -> None:
    with pytest.raises(SlurmError, match=name):
        RankEnv.from_environ({**env, name: raw})


@pytest.mark.parametrize("name", ["SLURM_NODEID", "SLURM_JOB_NUM_NODES"])
def test_an_allocation_variable_in_other_digits_is_named(name: str) -> None:
    env = {"SLURM_JOB_NODELIST": "n[0-1]", name: "١"}
    with pytest.raises(SlurmError, match=name):
        SlurmJob.from_environ(env, run=lambda *a, **k: (_ for _ in ()).throw(OSError("no scontrol")))


def test_the_worker_refuses_a_malformed_rank_in_one_line(tmp_path: Path) -> None:
    out = hostile.run([sys.executable, "-m", "day0.stages.collectives", "run", "--worker", "--out-dir", str(tmp_path)],
                      env={"RANK": "٣", "WORLD_SIZE": "4"})
    hostile.refused(out, "RANK", problem="not a non-negative integer")


def test_env_int_takes_ascii_digits_and_the_default() -> None:
    assert env_int({"X": " 12 "}, "X") == 12 and env_int({}, "X", 3) == 3 and env_int({}, "X") is None


# --------------------------------------------------------------------------- index through a directory symlink


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return cf.make_checkpoint(tmp_path / "model", num_shards=2).dir


def _point_index_through(model: Path, outside: Path) -> str:
    """Move shard 2 outside the checkpoint and reach it through ``model/sub -> outside``."""
    index_path = model / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    outside.mkdir()
    shutil.move(str(model / shard), outside / shard)
    (model / "sub").symlink_to(outside, target_is_directory=True)
    index["weight_map"] = {k: (f"sub/{v}" if v == shard else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    return shard


def test_an_index_cannot_leave_the_checkpoint_through_a_directory_symlink(model: Path, tmp_path: Path) -> None:
    shard = _point_index_through(model, tmp_path / "elsewhere")
    out = hostile.day0("weights", "audit", model, "--no-manifest")
    assert out.code == 1 and "Traceback" not in out.stdout + out.stderr, out.explain()
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("FAIL  weights.index:")), "")
    assert f"sub/{shard}" in line and "outside the model folder" in line, out.explain()


def test_the_manifest_hashes_nothing_outside_the_checkpoint(model: Path, tmp_path: Path) -> None:
    shard = _point_index_through(model, tmp_path / "elsewhere")
    hostile.day0("weights", "manifest", model)
    manifest = model / "day0-manifest.json"
    assert not manifest.exists() or f"sub/{shard}" not in manifest.read_text()


def test_a_shard_that_is_a_file_symlink_outside_still_counts(model: Path, tmp_path: Path) -> None:
    """A Hugging Face cache: snapshots/<rev>/x.safetensors -> ../../blobs/<hash>."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for shard in model.glob("*.safetensors"):
        shutil.move(str(shard), blobs / shard.name)
        shard.symlink_to(blobs / shard.name)
    out = hostile.day0("weights", "audit", model, "--no-manifest")
    assert out.code == 0, out.explain()
