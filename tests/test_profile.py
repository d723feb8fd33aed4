"""Profiles: presets, extends, strict validation with key paths, overrides, secret removal."""


import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.config.profile import (
    ProfileError,
    deep_merge,
    load_profile,
    parse_override,
    preset_names,
    redact_secrets,
)

REQUIRED_PRESETS = {"cpu-tiny", "h200x8", "supernode-tp8pp4-1m", "gb200-nvl72"}


def test_required_presets_ship_and_load():
    assert REQUIRED_PRESETS <= set(preset_names())
    for name in preset_names():
        p = load_profile(name)
        assert p.name == name


def test_default_is_cpu_tiny_on_the_cpu_backend():
    p = load_profile()
    assert p.name == "cpu-tiny"
    assert p.model.source == "tiny"
    assert p.topology.device == "cpu"
    # settings measured to work on the CPU backend (shared/notes/vllm-cpu.md)
    assert p.engine.args["block_size"] % 32 == 0
    assert p.model.tiny.hidden_size // p.model.tiny.num_attention_heads == 64


def test_supernode_preset_is_the_reference_deployment():
    p = load_profile("supernode-tp8pp4-1m")
    a = p.engine.args
    assert (a["tensor_parallel_size"], a["pipeline_parallel_size"]) == (8, 4)
    assert a["max_model_len"] >= 1_000_000 and a["block_size"] == 16 and a["enable_prefix_caching"]
    # INT4 is a quantization method in vLLM, never a dtype
    assert a["dtype"] in {"auto", "half", "float16", "bfloat16", "float", "float32"}
    assert a["quantization"] == "compressed-tensors"
    assert p.topology.world_size == 32


def test_extends_overrides_only_what_it_names(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('extends = "h200x8"\nname = "mine"\n[sla]\nttft_p99_ms = 900\n[engine.args]\nmax_num_seqs = 7\n')
    p = load_profile(str(f))
    base = load_profile("h200x8")
    assert p.name == "mine"
    assert p.sla.ttft_p99_ms == 900 and p.sla.tpot_p99_ms == base.sla.tpot_p99_ms
    assert p.engine.args["max_num_seqs"] == 7
    assert p.engine.args["tensor_parallel_size"] == base.engine.args["tensor_parallel_size"]


def test_extends_a_relative_file_and_detects_cycles(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ProfileError, match="cycle"):
        load_profile(str(tmp_path / "a.toml"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[sla]\nttft_p99_ms = "fast"\n', "sla.ttft_p99_ms: expected a number"),
        ("[slaa]\nx = 1\n", "slaa: unknown key"),
        ("[engine]\nmodee = 'server'\n", "engine.modee: unknown key"),
        ('[engine]\nmode = "external"\n', "engine.url: required when mode"),
        ('[model]\nsource = "path"\n', "model.path: required when source"),
        ('[topology]\nnodes = 0\n', "topology.nodes:"),
        ('[topology]\nintra_node = "nvl"\n', "topology.intra_node: expected 'shm', 'pcie' or 'nvlink'"),
        ("[kvcache]\nfragmentation_limit = 5\n", "kvcache.fragmentation_limit:"),
        ('[report]\nsignatories = [{name = "A"}]\n', "report.signatories.0.role: required value missing"),
        ("[sla\n", "not valid TOML"),
        ("extends = 3\n", "extends: expected a string"),
        ('extends = "no-such-preset"\n', "no such preset"),
    ],
)
def test_broken_profiles_name_the_key(tmp_path, text, expected):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(str(f))
    msg = str(err.value)
    assert expected in msg
    assert "\n" not in msg and str(f) in msg


def test_missing_file_is_named():
    with pytest.raises(ProfileError, match="nowhere.toml: profile file not found"):
        load_profile("nowhere.toml")


def test_engine_args_pass_through_unchanged(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[engine.args]\nsome_future_vllm_flag = {a = [1, 2]}\nspeculative_config = {method = "ngram"}\n')
    p = load_profile(str(f))
    assert p.engine.args == {"some_future_vllm_flag": {"a": [1, 2]}, "speculative_config": {"method": "ngram"}}


def test_secrets_are_removed_from_the_resolved_profile():
    p = load_profile("cpu-tiny", overrides={"engine": {"env": {"HF_TOKEN": "hf_abc", "VLLM_API_KEY": "k"}}})
    env = p.resolved()["engine"]["env"]
    assert env["HF_TOKEN"] == "<redacted>" and env["VLLM_API_KEY"] == "<redacted>"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # look-alike keys are not secrets
    assert p.resolved()["model"]["tiny"]["num_key_value_heads"] == 2
    assert redact_secrets({"max_num_batched_tokens": 4}) == {"max_num_batched_tokens": 4}


_keys = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
_trees = st.recursive(st.integers() | st.text(max_size=3),
                      lambda children: st.dictionaries(_keys, children, max_size=3), max_leaves=8)


@given(st.dictionaries(_keys, _trees, max_size=4), st.dictionaries(_keys, _trees, max_size=4))
def test_deep_merge_keeps_every_override_and_every_untouched_key(base, over):
    merged = deep_merge(base, over)

    def check(m, b, o):
        for k, v in o.items():
            if isinstance(v, dict) and isinstance(b.get(k), dict):
                check(m[k], b[k], v)
            else:
                assert m[k] == v
        for k, v in b.items():
            if k not in o:
                assert m[k] == v

    check(merged, base, over)


@given(st.lists(st.sampled_from(["engine", "args", "x_y"]), min_size=1, max_size=4), st.integers())
def test_parse_override_builds_the_nested_table(path, value):
    out = parse_override(".".join(path) + f"={value}")
    for p in path:
        out = out[p]
    assert out == value


def test_parse_override_keeps_strings_and_rejects_garbage():
    assert parse_override("engine.mode=inprocess") == {"engine": {"mode": "inprocess"}}
    assert parse_override('engine.args.enforce_eager=true') == {"engine": {"args": {"enforce_eager": True}}}
    with pytest.raises(ProfileError):
        parse_override("no-equals-sign")
