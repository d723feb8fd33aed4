"""Hostile inputs for checkpoints, config.json, profiles and ``day0 plan`` (issue #16).

Each case runs day0 as a user would, in a child process capped in memory and time
(``tests/support/hostile.py``), and judges what the user sees:

* unusable input (a profile, a flag, a config.json the plan cannot read, a DIR that is not a
  folder): exit 2 and exactly one stderr line naming the file and the key or problem;
* a checkpoint the audit reads: exit 1 ("findings") with a FAIL line naming the shard, tensor or
  key, the audit finished (no ``weights.audit`` error) and the other shards still checked;
* ``day0 plan``: 0 fits, 1 does not fit, 2 unusable input;
* pytest with a bad ``--day0-profile``: exit 4 and one ``ERROR: day0: <file>: ...`` line.

No case asserts a duration: the harness's bounds are "did not run away" ceilings.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support import ckpt_factory as cf
from tests.support import hostile

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
DEEP = 100_000  # nesting far past Python's recursion limit


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real two-shard Llama checkpoint (written by safetensors), copied by each case."""
    return cf.make_checkpoint(tmp_path_factory.mktemp("pristine") / "model", num_shards=2).dir


@pytest.fixture
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "model"))


def audit(model: Path, **kw: Any) -> hostile.Outcome:
    return hostile.day0("weights", "audit", model, "--no-manifest", **kw)


def found(out: hostile.Outcome, category: str, *names: str | Path, problem: str | tuple[str, ...] = ()) -> str:
    """Assert the audit's "findings" outcome: exit 1, it ran to the end, and a FAIL line of
    ``category`` names every one of ``names`` and says ``problem``. Returns that line."""
    assert out.code == 1, f"expected exit 1 (findings)\n{out.explain()}"
    assert "Traceback" not in out.stderr + out.stdout, out.explain()
    assert "weights.audit" not in out.stdout, f"the audit stopped early\n{out.explain()}"
    words = (problem,) if isinstance(problem, str) else problem
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(f"FAIL  {category}:")]
    for ln in lines:
        if all(str(n) in ln for n in names) and all(w.lower() in ln.lower() for w in words):
            return ln
    raise AssertionError(f"no FAIL {category} line naming {names} and saying {words}\n{out.explain()}")


def edit_config(model: Path, **changes: Any) -> Path:
    path = model / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return path


def config_text(model: Path, text: str | bytes) -> Path:
    path = model / "config.json"
    path.unlink()
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def fifo(path: Path) -> Path:
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


def loop(path: Path) -> Path:
    """A symlink that points at itself."""
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(path.name)
    return path


def nested(depth: int = DEEP) -> bytes:
    return b"[" * depth + b"]" * depth


def raw_shard(model: Path, name: str, header: bytes | dict, data_len: int = 0, length_field: int | None = None) -> Path:
    return cf.write_raw_shard(model / name, header, data_len=data_len, length_field=length_field)


def no_vllm(tmp_path: Path) -> dict[str, str]:
    """Environment where ``import vllm`` fails, so the lint uses day0's snapshot of vLLM's rules.

    Why: a plan that answers (exit 0 or 1) lints first, and importing vLLM (and torch) needs more
    than the harness's 1 GiB; the snapshot path is the one the plan takes on a machine without vLLM.
    """
    shim = tmp_path / "no-vllm" / "vllm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("vllm hidden by the hostile-input corpus")\n')
    return {"PYTHONPATH": f"{shim.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def plan_profile(tmp_path: Path, config: dict[str, Any] | str | Path, extra: str = "", *,
                 name: str = "plan.toml") -> Path:
    """A profile whose model.config is ``config`` (a dict written to a file, an example name or a path)."""
    if isinstance(config, dict):
        ref = tmp_path / "cfg" / "config.json"
        ref.parent.mkdir(exist_ok=True)
        ref.write_text(json.dumps(config))
    else:
        ref = config
    path = tmp_path / name
    path.write_text(f'name = "hostile"\n[model]\nsource = "path"\npath = "{tmp_path}/no-such-model"\n'
                    f'config = "{ref}"\n[topology]\ndevice = "cuda"\ndevices_per_node = 8\n'
                    f'device_memory_gib = 80.0\n{extra}')
    return path


def plan(profile: Path, *args: str, **kw: Any) -> hostile.Outcome:
    return hostile.day0("plan", "--profile", profile, *args, **kw)


def profile_file(tmp_path: Path, text: str | bytes, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


# --------------------------------------------------------------------------- config.json under the audit

CONFIG_VALUES: list[tuple[str, dict[str, Any], str, str]] = [
    ("hidden_size-string", {"hidden_size": "256"}, "hidden_size", "expected an integer"),
    ("layers-bool", {"num_hidden_layers": True}, "num_hidden_layers", "expected an integer"),
    ("layers-float-1e9", {"num_hidden_layers": 1e9}, "num_hidden_layers", "expected an integer"),
    ("layers-int-1e9", {"num_hidden_layers": 10**9}, "num_hidden_layers", "at most"),
    ("heads-zero", {"num_attention_heads": 0}, "num_attention_heads", "below 1"),
    ("vocab-negative", {"vocab_size": -128}, "vocab_size", "below 1"),
    ("tie-string", {"tie_word_embeddings": "false"}, "tie_word_embeddings", "true or false"),
    ("rope-factor-huge", {"rope_scaling": {"rope_type": "linear", "factor": 1e300}}, "rope_scaling.factor", "finite"),
    ("architectures-object", {"architectures": {"LlamaForCausalLM": 1}}, "architectures", "list"),
    ("dtype-number", {"torch_dtype": 16}, "torch_dtype", "expected a string"),
    ("huge-int", {"intermediate_size": 10**40}, "intermediate_size", "at most"),
]


@pytest.mark.parametrize("changes, key, problem", [c[1:] for c in CONFIG_VALUES], ids=[c[0] for c in CONFIG_VALUES])
def test_config_value_of_wrong_type_or_range_is_a_finding(ckpt: Path, changes: dict, key: str, problem: str) -> None:
    edit_config(ckpt, **changes)
    found(audit(ckpt), "weights.config", "config.json", key, problem=problem)


CONFIG_TEXTS: list[tuple[str, bytes, str]] = [
    ("nan-literal", b'{"architectures": ["LlamaForCausalLM"], "hidden_size": NaN}', "hidden_size"),
    ("infinity-literal", b'{"architectures": ["LlamaForCausalLM"], "rope_scaling": {"factor": Infinity}}', "factor"),
    ("duplicate-key", b'{"hidden_size": 64, "hidden_size": 128}', "appears twice"),
    ("top-level-array", b'[{"hidden_size": 64}]', "not an object"),
    ("not-utf8", b'{"model_type": "llama\xff"}', "not UTF-8"),
    ("digits-5000", b'{"hidden_size": ' + b"9" * 5000 + b"}", "digits"),
    ("nested-100k", b'{"a": ' + nested() + b"}", "nested"),
    ("not-json", b'{"hidden_size": 64,', "not JSON"),
]


@pytest.mark.parametrize("text, problem", [c[1:] for c in CONFIG_TEXTS], ids=[c[0] for c in CONFIG_TEXTS])
def test_config_text_that_is_not_a_usable_object_is_a_finding(ckpt: Path, text: bytes, problem: str) -> None:
    config_text(ckpt, text)
    found(audit(ckpt), "weights.config", "config.json", problem=problem)


def test_config_fifo_does_not_hang_the_audit(ckpt: Path) -> None:
    fifo(ckpt / "config.json")
    found(audit(ckpt), "weights.config", "config.json", problem="FIFO")


def test_config_symlink_loop_says_so(ckpt: Path) -> None:
    loop(ckpt / "config.json")
    found(audit(ckpt), "weights.config", "config.json", problem="symlink loop")


def test_config_of_50_mb_is_refused_unread(ckpt: Path) -> None:
    with open(ckpt / "config.json", "r+b") as fh:
        fh.truncate(50_000_000)  # sparse: the refusal must come from the size, not from reading it
    found(audit(ckpt), "weights.config", "config.json", problem="over the 16 MiB a config.json may hold")


def test_layers_beyond_what_the_shards_name_are_one_finding(ckpt: Path) -> None:
    edit_config(ckpt, num_hidden_layers=20_000)  # in range, but the tensors name 3 layers
    found(audit(ckpt), "weights.shapes", "num_hidden_layers", "20000", problem="reach only 3 layers")


def test_experts_beyond_what_the_shards_name_are_one_finding(tmp_path: Path) -> None:
    model = cf.make_checkpoint(tmp_path / "moe", config=cf.mixtral_config(), num_shards=2).dir
    edit_config(model, num_local_experts=60_000)
    found(audit(model), "weights.shapes", "num_local_experts", problem="reach only 4 experts")


# --------------------------------------------------------------------------- shard headers


def test_deeply_nested_header_is_that_shards_finding_and_the_audit_goes_on(ckpt: Path) -> None:
    raw_shard(ckpt, SHARD1, b'{"t": ' + nested() + b"}")
    (ckpt / SHARD2).write_bytes(b"")  # the second shard is broken too: both must be named
    out = audit(ckpt)
    found(out, "weights.shard_header", SHARD1, problem="nested too deeply")
    found(out, "weights.shard_header", SHARD2, problem="shorter than the 8-byte")


HEADERS: list[tuple[str, Callable[[Path], None], str, str]] = [
    ("length-beyond-file", lambda m: raw_shard(m, SHARD1, {"t": {}}, length_field=10_000), "shard_header",
     "only"),
    ("length-absurd", lambda m: raw_shard(m, SHARD1, b"{}", length_field=2**63), "shard_header", "at most"),
    ("zero-length", lambda m: (m / SHARD1).write_bytes(b""), "shard_header", "shorter than the 8-byte"),
    ("not-an-object", lambda m: raw_shard(m, SHARD1, b"[1, 2]"), "shard_header", "not an object"),
    ("not-utf8", lambda m: raw_shard(m, SHARD1, b'{"t\xff": 1}'), "shard_header", "not UTF-8"),
    ("digits-5000", lambda m: raw_shard(m, SHARD1, b'{"t": {"dtype": "F32", "shape": [' + b"7" * 5000
                                        + b'], "data_offsets": [0, 4]}}'), "shard_header", "digits"),
    ("dtype-unknown", lambda m: raw_shard(m, SHARD1, {"t": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}},
                                          data_len=4), "shard_layout", "not a safetensors dtype"),
    ("dim-negative", lambda m: raw_shard(m, SHARD1, {"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
                                         data_len=4), "shard_layout", "non-negative"),
    ("dims-overflow", lambda m: raw_shard(m, SHARD1, {"t": {"dtype": "F32", "shape": [2**40, 2**40],
                                                            "data_offsets": [0, 4]}}, data_len=4),
     "shard_layout", "64-bit"),
    ("rank-100", lambda m: raw_shard(m, SHARD1, {"t": {"dtype": "F32", "shape": [1] * 100, "data_offsets": [0, 4]}},
                                     data_len=4), "shard_layout", "dimensions"),
    ("offsets-overlap", lambda m: raw_shard(m, SHARD1, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                                            data_len=12), "shard_layout", "overlaps"),
    ("offsets-past-file", lambda m: raw_shard(m, SHARD1, {"t": {"dtype": "F32", "shape": [256],
                                                                "data_offsets": [0, 1024]}}, data_len=16),
     "shard_size", "truncated"),
    ("offsets-past-64-bit", lambda m: raw_shard(m, SHARD1, {"t": {"dtype": "F32", "shape": [1],
                                                                  "data_offsets": [0, 2**70]}}, data_len=4),
     "shard_layout", "64-bit"),
]


@pytest.mark.parametrize("breaks, category, problem", [h[1:] for h in HEADERS], ids=[h[0] for h in HEADERS])
def test_broken_header_is_a_finding_naming_the_shard(ckpt: Path, breaks: Callable[[Path], None], category: str,
                                                     problem: str) -> None:
    breaks(ckpt)
    found(audit(ckpt), f"weights.{category}", SHARD1, problem=problem)


def test_shard_fifo_without_index_does_not_hang(ckpt: Path) -> None:
    (ckpt / cf.INDEX_NAME).unlink()
    fifo(ckpt / "zz-extra.safetensors")
    found(audit(ckpt), "weights.shard_header", "zz-extra.safetensors", problem="FIFO")


def test_shard_symlink_loop_says_so(ckpt: Path) -> None:
    loop(ckpt / SHARD2)
    found(audit(ckpt), "weights.shards_present", SHARD2, problem="symlink loop")


# --------------------------------------------------------------------------- the index


def rewrite_index(model: Path, change: Callable[[dict], None]) -> None:
    path = model / cf.INDEX_NAME
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_index_naming_a_directory(ckpt: Path) -> None:
    (ckpt / "subdir").mkdir()
    rewrite_index(ckpt, lambda d: d["weight_map"].__setitem__("model.norm.weight", "subdir"))
    found(audit(ckpt), "weights.shards_present", "subdir", problem="is a directory")


def test_index_with_parent_traversal(ckpt: Path) -> None:
    rewrite_index(ckpt, lambda d: d["weight_map"].__setitem__("model.norm.weight", "../outside.safetensors"))
    found(audit(ckpt), "weights.index", "model.norm.weight", "../outside.safetensors", problem="outside the model folder")


@pytest.mark.parametrize("suffix, prefix", [("/", ""), ("", "./"), ("//", "")])
def test_index_naming_a_shard_by_another_spelling_of_its_path(ckpt: Path, suffix: str, prefix: str) -> None:
    """``x.safetensors/`` names a file vLLM cannot open (ENOTDIR) that pathlib opened anyway; ``./x``
    names the same file as ``x`` twice over."""
    shard = json.loads((ckpt / cf.INDEX_NAME).read_text())["weight_map"]["model.norm.weight"]
    other = f"{prefix}{shard}{suffix}"
    rewrite_index(ckpt, lambda d: d["weight_map"].__setitem__("model.norm.weight", other))
    found(audit(ckpt), "weights.index", "model.norm.weight", other, problem="not a usable path")


def test_index_naming_a_missing_shard(ckpt: Path) -> None:
    rewrite_index(ckpt, lambda d: d["weight_map"].__setitem__("model.norm.weight", "model-gone.safetensors"))
    found(audit(ckpt), "weights.shards_present", "model-gone.safetensors", problem="missing")


@pytest.mark.parametrize("make, problem", [
    (lambda p: fifo(p), "FIFO"),
    (lambda p: p.write_bytes(b'{"weight_map": ' + nested() + b"}"), "nested"),
    (lambda p: loop(p), "symlink loop"),
    (lambda p: (p.unlink(), p.mkdir()), "is a directory"),
    (lambda p: p.write_bytes(b'{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}, "metadata": ' + b"9" * 5000
                             + b"}"), "digits"),
], ids=["fifo", "nested-100k", "symlink-loop", "directory", "digits-5000"])
def test_unusable_index_is_a_finding_and_the_shards_are_still_read(ckpt: Path, make: Callable[[Path], Any],
                                                                   problem: str) -> None:
    make(ckpt / cf.INDEX_NAME)
    out = audit(ckpt)
    found(out, "weights.index", cf.INDEX_NAME, problem=problem)
    assert "PASS  weights.shard_header: 2 shard headers read" in out.stdout, out.explain()


@pytest.mark.parametrize("raw", [b"NaN", b"1e999", b'"217984"', b"true"], ids=["nan", "inf", "string", "bool"])
def test_index_total_size_that_is_not_a_size_is_a_finding(ckpt: Path, raw: bytes) -> None:
    path = ckpt / cf.INDEX_NAME
    doc = json.loads(path.read_text())
    doc["metadata"]["total_size"] = "@"
    path.write_bytes(json.dumps(doc).encode().replace(b'"@"', raw))
    found(audit(ckpt), "weights.total_size", "metadata.total_size", problem="index written for other shards")


def test_tensor_name_with_a_newline_stays_on_one_line(ckpt: Path) -> None:
    raw_shard(ckpt, SHARD1, {"evil\nname": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, data_len=4)
    out = audit(ckpt)
    found(out, "weights.shard_layout", SHARD1, "evil\\nname", problem="not a safetensors dtype")
    assert all(ln[:5] in ("PASS ", "FAIL ", "SKIP ") for ln in out.stdout.splitlines()), out.explain()


def test_manifest_fifo_is_a_finding(ckpt: Path) -> None:
    fifo(ckpt / "day0-manifest.json")
    out = hostile.day0("weights", "audit", ckpt)
    found(out, "weights.manifest", "day0-manifest.json", problem="FIFO")


def test_a_config_path_holding_a_nul_byte_is_one_line_naming_it(tmp_path: Path) -> None:
    """`model.config = "/tmp/a\\u0000b.json"` was "day0: embedded null byte", naming nothing: every
    reader opens through day0.core.inputs.open_regular, which names the path (escaped)."""
    profile = tmp_path / "nul.toml"
    profile.write_text('extends = "h200x8"\n[model]\nconfig = "/tmp/a\\u0000b.json"\n')
    hostile.refused(hostile.day0("plan", "--profile", profile), "/tmp/a\\x00b.json", problem="NUL byte")


@pytest.mark.parametrize("name", ["a\u0000b", "../outside.bin", "./x.safetensors", "sub/../x"])
def test_a_manifest_name_outside_the_folder_is_a_finding_naming_it(ckpt: Path, name: str) -> None:
    """The manifest read its names by a rule of its own: a NUL byte stopped the whole audit
    ("audit stopped by ValueError: embedded null byte"); now the index's rule, one FAIL line."""
    from day0.stages.weights.manifest import write

    manifest = write(ckpt, [SHARD1])
    doc = json.loads(manifest.read_text())
    doc["files"][name] = {"size": 1, "sha256": "0" * 64}
    manifest.write_text(json.dumps(doc))
    found(hostile.day0("weights", "audit", ckpt), "weights.manifest", "day0-manifest.json",
          problem="not a path inside the model folder")


# --------------------------------------------------------------------------- `day0 weights audit DIR` refusals


@pytest.mark.parametrize("make, problem", [
    (lambda p: p, "does not exist"),
    (lambda p: loop(p), "symlink loop"),
    (lambda p: (p.write_text("x"), p)[1], "is a file"),
    (lambda p: fifo(p), "FIFO"),
], ids=["missing", "symlink-loop", "file", "fifo"])
def test_audit_dir_that_is_not_a_folder_is_refused(tmp_path: Path, make: Callable[[Path], Any], problem: str) -> None:
    target = tmp_path / "model"
    make(target)
    hostile.refused(audit(target), target, problem=problem)


# --------------------------------------------------------------------------- `day0 plan`

LLAMA = cf.llama_config(num_hidden_layers=4)


def test_plan_with_a_billion_layers_is_refused_in_one_line(tmp_path: Path) -> None:
    profile = plan_profile(tmp_path, {**LLAMA, "num_hidden_layers": 10**9})
    hostile.refused(plan(profile), tmp_path / "cfg" / "config.json", "num_hidden_layers", problem="at most")


PLAN_CONFIGS: list[tuple[str, dict[str, Any], str, str]] = [
    ("hidden_size-string", {"hidden_size": "256"}, "hidden_size", "expected an integer"),
    ("layers-1e9-float", {"num_hidden_layers": 1e9}, "num_hidden_layers", "expected an integer"),
    ("layers-50000", {"num_hidden_layers": 50_000}, "num_hidden_layers", "tensors"),
    ("missing-key", {"intermediate_size": None}, "intermediate_size", "missing"),
    ("heads-bool", {"num_attention_heads": True}, "num_attention_heads", "expected an integer"),
    ("unknown-architecture", {"architectures": ["GPT2LMHeadModel"]}, "architectures", "not known"),
]


@pytest.mark.parametrize("changes, key, problem", [c[1:] for c in PLAN_CONFIGS], ids=[c[0] for c in PLAN_CONFIGS])
def test_plan_refuses_a_config_it_cannot_read(tmp_path: Path, changes: dict, key: str, problem: str) -> None:
    profile = plan_profile(tmp_path, {**LLAMA, **changes})
    hostile.refused(plan(profile), tmp_path / "cfg" / "config.json", key, problem=problem)


@pytest.mark.parametrize("make, problem", [
    (lambda p: fifo(p), "FIFO"),
    (lambda p: p.write_bytes(b'{"hidden_size": 64, "hidden_size": 64}'), "appears twice"),
    (lambda p: p.write_bytes(b'{"architectures": ["LlamaForCausalLM"], "hidden_size": NaN}'), "hidden_size"),
    (lambda p: loop(p), "symlink loop"),
], ids=["fifo", "duplicate-key", "nan", "symlink-loop"])
def test_plan_refuses_a_config_file_it_cannot_use(tmp_path: Path, make: Callable[[Path], Any], problem: str) -> None:
    path = tmp_path / "config.json"
    make(path)
    hostile.refused(plan(plan_profile(tmp_path, path)), path, problem=problem)


PLAN_FLAGS: list[tuple[str, str, str]] = [
    ("tp-zero", "tp=0", "outside"),
    ("nodes-exponent", "nodes=1e999", "not an integer"),
    ("memory-inf", "device_memory_gib=inf", "finite"),
    ("len-100-digits", "max_model_len=" + "9" * 100, "characters"),
    ("unknown-key", "warp=9", "unknown key"),
    ("utilization-2", "gpu_memory_utilization=2", "outside"),
]


@pytest.mark.parametrize("what_if, problem", [f[1:] for f in PLAN_FLAGS], ids=[f[0] for f in PLAN_FLAGS])
def test_plan_refuses_a_bad_what_if(tmp_path: Path, what_if: str, problem: str) -> None:
    hostile.refused(plan(plan_profile(tmp_path, LLAMA), "--what-if", what_if), "--what-if", problem=problem)


@pytest.mark.parametrize("engine, key, problem", [
    ('[engine.args]\ntensor_parallel_size = "8"\n', "engine.args.tensor_parallel_size", "whole number"),
    ("[engine.args]\nmax_model_len = -5\n", "engine.args.max_model_len", "outside"),
    ("[engine.args]\nenable_prefix_caching = 1\n", "engine.args.enable_prefix_caching", "true or false"),
], ids=["tp-string", "max_model_len-negative", "flag-number"])
def test_plan_refuses_engine_args_of_the_wrong_type(tmp_path: Path, engine: str, key: str, problem: str) -> None:
    profile = plan_profile(tmp_path, LLAMA, engine)
    hostile.refused(plan(profile), profile, key, problem=problem)


def test_plan_exit_codes_fit_and_does_not_fit(tmp_path: Path) -> None:
    env = no_vllm(tmp_path)
    fits = plan(plan_profile(tmp_path, "llama-3.1-8b", "[kvcache]\ntarget_context = 8192\n"
                             "[engine.args]\nmax_model_len = 8192\n"), env=env)
    assert fits.code == 0 and "verdict" in fits.stdout and "does_not_fit" not in fits.stdout, fits.explain()
    small = plan_profile(tmp_path, "llama-3.1-70b", "[engine.args]\nmax_model_len = 8192\n", name="small.toml")
    out = plan(small, "--what-if", "device_memory_gib=24,devices_per_node=1", env=env)
    assert out.code == 1 and "does_not_fit" in out.stdout, out.explain()
    assert "Traceback" not in out.stderr, out.explain()


# --------------------------------------------------------------------------- profiles


def chain(tmp_path: Path, n: int) -> Path:
    """``p0.toml`` extends ``p1.toml`` ... extends ``p{n-1}.toml``, which extends the default preset."""
    for i in range(n):
        parent = f"p{i + 1}.toml" if i + 1 < n else "cpu-tiny"
        (tmp_path / f"p{i}.toml").write_text(f'extends = "{parent}"\n')
    return tmp_path / "p0.toml"


PROFILES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("not-utf8", lambda d: profile_file(d, b'name = "x"\ndescription = "\xff\xfe"\n'), "offset 26"),
    ("fifo", lambda d: fifo(d / "p.toml"), "FIFO"),
    ("symlink-loop", lambda d: loop(d / "p.toml"), "symlink loop"),
    ("extends-1500-deep", lambda d: chain(d, 1500), "chain of more than"),
    ("extends-cycle", lambda d: (profile_file(d, 'extends = "b.toml"\n', "b.toml"),
                                 profile_file(d, 'extends = "p.toml"\n'))[1], "cycle"),
    ("extends-directory", lambda d: ((d / "sub.toml").mkdir(), profile_file(d, 'extends = "sub.toml"\n'))[1],
     "is a directory"),
    ("extends-number", lambda d: profile_file(d, "extends = 5\n"), "expected a string"),
    ("array-nested-100k", lambda d: profile_file(d, b"x = " + nested()), "nested"),
    ("table-nested-40", lambda d: profile_file(d, "[" + ".".join(f"t{i}" for i in range(40)) + "]\nx = 1\n"),
     "nested deeper than"),
    ("digits-5000", lambda d: profile_file(d, "[topology]\nnodes = " + "9" * 5000 + "\n"), "digits"),
    ("nodes-huge", lambda d: profile_file(d, f"[topology]\nnodes = {2**62}\n"), "topology.nodes"),
    ("memory-negative", lambda d: profile_file(d, "[topology]\ndevice_memory_gib = -80.0\n"), "greater than 0"),
    ("memory-nan", lambda d: profile_file(d, "[topology]\ndevice_memory_gib = nan\n"), "finite"),
    ("memory-inf", lambda d: profile_file(d, "[topology]\ndevice_memory_gib = inf\n"), "finite"),
    ("nodes-string", lambda d: profile_file(d, '[topology]\nnodes = "8"\n'), "expected an integer"),
    ("context-negative", lambda d: profile_file(d, "[kvcache]\ntarget_context = -1\n"), "kvcache.target_context"),
    ("tiny-huge", lambda d: profile_file(d, "[model.tiny]\nhidden_size = 1000000000\n"), "model.tiny.hidden_size"),
    ("two-mb", lambda d: profile_file(d, "# " + "x" * (2 << 20) + "\n"), "over the 1 MiB a profile may hold"),
]


@pytest.mark.parametrize("make, problem", [p[1:] for p in PROFILES], ids=[p[0] for p in PROFILES])
def test_profile_show_refuses_in_one_line(tmp_path: Path, make: Callable[[Path], Path], problem: str) -> None:
    path = make(tmp_path)
    hostile.refused(hostile.day0("profile", "show", path), path, problem=problem)


def test_unknown_preset_is_refused(tmp_path: Path) -> None:
    hostile.refused(hostile.day0("profile", "show", "no-such-preset", cwd=tmp_path), "no-such-preset",
                    problem="no such preset")


@pytest.mark.parametrize("override, name, problem", [
    ("topology.nodes=" + "[" * 5000 + "]" * 5000, "override", "too deep"),
    ("topology..nodes=2", "override", "empty part"),
    (".".join(["t"] * 50) + "=1", "override", "more than"),
    ("topology.device_memory_gib=1e999", "topology.device_memory_gib", "finite"),
    ("topology.nodes", "override", "KEY.PATH=VALUE"),
], ids=["value-nested", "empty-key", "key-50-deep", "inf", "no-equals"])
def test_profile_show_refuses_a_bad_set(override: str, name: str, problem: str) -> None:
    hostile.refused(hostile.day0("profile", "show", "cpu-tiny", "--set", override), name, problem=problem)


# --------------------------------------------------------------------------- the pytest plugin


@pytest.mark.parametrize("make, problem", [
    (lambda d: profile_file(d, b'name = "x"\ndescription = "\xff\xfe"\n'), "not UTF-8"),
    (lambda d: chain(d, 1500), "chain of more than"),
    (lambda d: fifo(d / "p.toml"), "FIFO"),
], ids=["not-utf8", "extends-1500-deep", "fifo"])
def test_plugin_refuses_a_bad_profile_as_a_usage_error(tmp_path: Path, make: Callable[[Path], Path],
                                                       problem: str) -> None:
    path = make(tmp_path)
    out = hostile.pytest_day0("--pyargs", "day0.suites", "--collect-only", "-q", "--day0-profile", path, cwd=tmp_path)
    line = hostile.refused(out, path, code=4, problem=problem)
    assert line.startswith("ERROR: day0: "), out.explain()


def test_raw_shard_helper_writes_the_length_it_is_told(tmp_path: Path) -> None:
    """The corpus's own fixture: the length field is what the case says, not the header's size."""
    path = cf.write_raw_shard(tmp_path / "x.safetensors", b"{}", length_field=12345)
    assert struct.unpack("<Q", path.read_bytes()[:8])[0] == 12345
