"""Config lint: one test per rule, and agreement with the installed vLLM's own validators.

The agreement tests build vLLM's real ``ModelConfig`` / ``ParallelConfig`` / ``SchedulerConfig`` /
``CacheConfig`` from a config-only model folder (no weights are needed for those checks) and
assert that the lint reports an error exactly when vLLM refuses the same settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from day0.model import archs
from day0.stages.preflight.lint import Finding, VllmRules, lint, lint_checks, vllm_rules

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

SNAPSHOT = VllmRules("0.32.0 (snapshot)", frozenset(), ("auto", "half", "float16", "bfloat16", "float", "float32"),
                     ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"),
                     ("awq", "gptq", "fp8", "compressed-tensors", "awq_marlin", "gptq_marlin"), 0.92, False)


@pytest.fixture(scope="module")
def rules() -> VllmRules:
    pytest.importorskip("vllm")
    return vllm_rules()


def rules_of(findings: list[Finding], severity: str | None = None) -> set[str]:
    return {f.rule for f in findings if severity is None or f.severity == severity}


def run(args: dict[str, Any], config: dict[str, Any] | None = None, rules: VllmRules = SNAPSHOT, **kw: Any) -> list[Finding]:
    kw.setdefault("env", {})
    return lint(args, config or TINY, rules=rules, **kw)


# --------------------------------------------------------------------------- agreement with vLLM


def vllm_refuses(tmp_path: Path, config: dict[str, Any], args: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                 env: dict[str, str]) -> str | None:
    """Run vLLM's own config validators on these settings; the error text, or None if accepted."""
    from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs

    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    model_keys = {"dtype", "max_model_len", "quantization"}
    try:
        mc = EngineArgs(model=str(tmp_path), skip_tokenizer_init=True,
                        **{k: v for k, v in args.items() if k in model_keys}).create_model_config()
        mc.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=args.get("tensor_parallel_size", 1),
                                                      pipeline_parallel_size=args.get("pipeline_parallel_size", 1)))
        if "max_num_batched_tokens" in args:
            SchedulerConfig(max_model_len=mc.max_model_len, is_encoder_decoder=False,
                            max_num_batched_tokens=args["max_num_batched_tokens"],
                            enable_chunked_prefill=args.get("enable_chunked_prefill", True))
        if "kv_cache_dtype" in args:
            CacheConfig(cache_dtype=args["kv_cache_dtype"])
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        return str(exc)
    return None


FP8_QC = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
AGREEMENT = [
    # (config overrides, engine args, env, rule the lint must raise as an error or None)
    ({}, {"max_model_len": 4096}, {}, None),
    ({}, {"max_model_len": 4097}, {}, "max_model_len"),
    ({}, {"max_model_len": 4097}, {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, None),
    ({"rope_scaling": {"type": "linear", "factor": 4.0}}, {"max_model_len": 16384}, {}, None),
    ({"rope_scaling": {"type": "linear", "factor": 4.0}}, {"max_model_len": 16385}, {}, "max_model_len"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}},
     {"max_model_len": 4097}, {}, "max_model_len"),
    ({}, {"dtype": "int4"}, {}, "dtype"),
    ({}, {"dtype": "half"}, {}, None),
    ({}, {"kv_cache_dtype": "int4"}, {}, "kv_cache_dtype"),
    ({}, {"kv_cache_dtype": "fp8"}, {}, None),
    (FP8_QC, {"quantization": "awq"}, {}, "quantization_mismatch"),
    (FP8_QC, {"quantization": "fp8"}, {}, None),
    ({}, {"quantization": "bogus_q"}, {}, "quantization"),
    ({}, {"tensor_parallel_size": 3}, {}, "tp_heads"),
    ({}, {"tensor_parallel_size": 8}, {}, "tp_heads"),
    ({}, {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, {}, None),
    ({}, {"max_num_batched_tokens": 2048, "enable_chunked_prefill": False}, {}, "chunked_prefill"),
    ({}, {"max_num_batched_tokens": 2048, "enable_chunked_prefill": True}, {}, None),
]


@pytest.mark.parametrize("overrides,args,env,rule", AGREEMENT)
def test_lint_agrees_with_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rules: VllmRules,
                               overrides: dict, args: dict, env: dict, rule: str | None) -> None:
    config = {**TINY, **overrides}
    refused = vllm_refuses(tmp_path, config, args, monkeypatch, env)
    errors = rules_of(lint(args, config, rules=rules, env=env), "error")
    if rule is None:
        assert refused is None, refused
        assert not errors
    else:
        assert refused is not None, f"vLLM accepted {args} but the test expects a refusal"
        assert rule in errors


def test_rules_come_from_vllm(rules: VllmRules) -> None:
    import typing

    from vllm.config.model import ModelDType

    assert rules.from_vllm and rules.dtypes == typing.get_args(ModelDType)
    assert {"tensor_parallel_size", "max_model_len", "enable_prefix_caching"} <= rules.engine_arg_names
    assert "compressed-tensors" in rules.quantization_methods and "fp8_ds_mla" in rules.kv_cache_dtypes


# --------------------------------------------------------------------------- rule by rule


def test_dtype_int4_without_quantized_checkpoint_suggests_methods() -> None:
    [f] = [f for f in run({"dtype": "int4"}) if f.rule == "dtype"]
    assert f.severity == "error" and f.key == "engine.args.dtype" and f.value == "int4"
    assert "not a vLLM dtype" in f.why and "quantization=" in f.why
    assert "compressed-tensors" in f.fix and "awq" in f.fix and "gptq" in f.fix


@pytest.mark.parametrize("method", ["compressed-tensors", "awq", "gptq"])
def test_dtype_int4_names_the_checkpoints_method(method: str) -> None:
    cfg = {**TINY, "quantization_config": {"quant_method": method}}
    [f] = [f for f in run({"dtype": "int4"}, cfg) if f.rule == "dtype"]
    assert f"quantization={method!r}" in f.fix


def test_dtype_fp8_points_at_fp8_quantization() -> None:
    [f] = [f for f in run({"dtype": "fp8"}) if f.rule == "dtype"]
    assert "quantization='fp8'" in f.fix


def test_float16_on_bf16_checkpoint_warns() -> None:
    assert "dtype_cast" in rules_of(run({"dtype": "float16"}), "warning")
    assert "dtype_cast" not in rules_of(run({"dtype": "bfloat16"}))


def test_unknown_and_dashed_args(rules: VllmRules) -> None:
    found = {f.key: f for f in run({"max-num-seqs": 4, "gpu_mem_utilization": 0.9, "tensor_parallel_size": 2},
                                   rules=rules)}
    assert found["engine.args.max-num-seqs"].rule == "arg_spelling" and "max_num_seqs" in found["engine.args.max-num-seqs"].fix
    assert found["engine.args.gpu_mem_utilization"].rule == "unknown_arg"
    assert "gpu_memory_utilization" in found["engine.args.gpu_mem_utilization"].fix
    assert "engine.args.tensor_parallel_size" not in found


def test_a_server_only_arg_in_process_is_noted_not_refused(rules: VllmRules) -> None:
    """The in-process engine leaves the API server's own args out of vllm.LLM's (docs/engine.md), so
    a profile extending cpu-tiny (tool_call_parser, enable_auto_tool_choice) with mode = "inprocess"
    is not an error: it failed stage 0, saying vllm.LLM would refuse what it never gets."""
    args = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    found = [f for f in run(args, rules=rules, mode="inprocess") if f.rule == "server_only_arg"]
    assert [(f.key, f.severity) for f in found] == [("engine.args.tool_call_parser", "info"),
                                                    ("engine.args.enable_auto_tool_choice", "info")]
    assert "leaves it out of vllm.LLM's arguments" in found[0].why
    from day0.engine.inprocess import engine_kwargs

    kept, left_out = engine_kwargs({**args, "max_num_seqs": 4})
    assert kept == {"max_num_seqs": 4} and left_out == sorted(args)  # what the note says is what happens
    assert not [f for f in run(args, rules=rules) if f.rule == "server_only_arg"]


def test_kv_heads_neither_divides() -> None:
    cfg = {**TINY, "num_attention_heads": 12, "num_key_value_heads": 4}
    assert "tp_kv_heads" in rules_of(run({"tensor_parallel_size": 6}, cfg), "error")
    assert "tp_kv_heads" not in rules_of(run({"tensor_parallel_size": 2}, cfg))
    assert "tp_kv_replicated" in rules_of(run({"tensor_parallel_size": 12}, cfg), "info")


def test_mla_rules() -> None:
    ds = archs.example_config("deepseek-v3")
    f = run({"tensor_parallel_size": 8, "block_size": 16}, ds)
    assert "mla_kv_replicated" in rules_of(f, "info") and "tp_kv_heads" not in rules_of(f)
    assert "block_size_mla" in rules_of(f, "warning")
    assert "block_size_mla" not in rules_of(run({"tensor_parallel_size": 8, "block_size": 64}, ds))
    assert "block_size_cpu_mla" in rules_of(run({"block_size": 32, "attention_backend": "CPU_MLA"}, ds, device="cpu"), "info")
    assert "kv_cache_dtype" in rules_of(run({"kv_cache_dtype": "fp8_ds_mla"}), "error")  # not an MLA model


def test_pipeline_rules() -> None:
    assert "pp_layers" in rules_of(run({"pipeline_parallel_size": 8}), "warning")
    assert "pp_uneven" in rules_of(run({"pipeline_parallel_size": 3}), "info")
    assert not rules_of(run({"pipeline_parallel_size": 2}), "warning")
    assert "cpu_pp_eager" in rules_of(run({"pipeline_parallel_size": 2, "enforce_eager": True, "block_size": 32},
                                          device="cpu"), "error")  # measured: the second stage asserts


def test_topology_rules() -> None:
    f = run({"tensor_parallel_size": 4, "pipeline_parallel_size": 4}, devices_per_node=2, nodes=4)
    assert "topology_devices" in rules_of(f, "error") and "tp_across_nodes" in rules_of(f, "warning")
    assert not rules_of(run({"tensor_parallel_size": 2, "pipeline_parallel_size": 4}, devices_per_node=2, nodes=4),
                        "error")


@pytest.mark.parametrize("device,block,severity", [
    ("cpu", 16, "error"), ("cpu", 48, "error"), ("cpu", 32, None), ("cpu", 128, None),
    ("cuda", 8, "error"), ("cuda", 24, "error"), ("cuda", 16, None), ("cuda", 32, None),
])
def test_block_size_by_device(device: str, block: int, severity: str | None) -> None:
    found = [f for f in run({"block_size": block}, device=device) if f.rule == "block_size"]
    assert [f.severity for f in found] == ([severity] if severity else [])
    if severity and device == "cpu":
        assert "MultipleOf(32)" in found[0].why


def test_block_size_unset_is_explained() -> None:
    [f] = [f for f in run({}, device="cpu") if f.rule == "block_size_default"]
    assert "128" in f.why


def test_max_model_len_names_the_env_override() -> None:
    llama = archs.example_config("llama-3.1-8b")
    [f] = [f for f in run({"max_model_len": 1_000_000}, llama) if f.rule == "max_model_len"]
    assert f.severity == "error" and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in f.fix and "131072" in f.why
    assert "llama3 factor 8.0 is already included" in f.why
    [w] = [f for f in run({"max_model_len": 1_000_000}, llama, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
           if f.rule == "max_model_len"]
    assert w.severity == "warning"
    assert "max_model_len" not in rules_of(run({"max_model_len": 1_048_576}, archs.example_config("moe-2.8t-1m")))


def test_one_million_token_context_rules() -> None:
    big = archs.example_config("moe-2.8t-1m")
    f = run({"max_model_len": 1_048_576, "enable_prefix_caching": False, "enable_chunked_prefill": False}, big)
    assert {"prefix_caching", "chunked_prefill"} <= rules_of(f, "warning")
    f = run({"max_model_len": 1_048_576, "max_num_batched_tokens": 1_048_576}, big)
    assert "max_num_batched_tokens" in rules_of(f, "info") and not rules_of(f, "warning")
    assert not rules_of(run({"max_model_len": 4096, "enable_prefix_caching": False}), "warning")


def test_quantization_needs_a_quantized_checkpoint() -> None:
    assert "quantization_checkpoint" in rules_of(run({"quantization": "awq"}), "error")
    assert not rules_of(run({"quantization": "fp8"}), "error")  # online FP8 works on bf16 weights
    awq = {**TINY, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    assert not rules_of(run({"quantization": "awq_marlin"}, awq), "error")  # vLLM's override family


def test_memory_rules() -> None:
    assert "gpu_memory_utilization" in rules_of(run({"gpu_memory_utilization": 1.2}), "error")
    assert "cpu_kvcache_space" in rules_of(run({"block_size": 32}, device="cpu"), "info")
    assert "cpu_kvcache_space" not in rules_of(run({"block_size": 32}, device="cpu",
                                                   env={"VLLM_CPU_KVCACHE_SPACE": "1"}))


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="architecture GPT2LMHeadModel is not known to day0"):
        run({}, {"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="device='tpu'"):
        run({}, device="tpu")
    with pytest.raises(ValueError, match="severity 'fatal'"):
        Finding("fatal", "x", "k", 1, "w", "f")  # type: ignore[arg-type]


def test_snapshot_rules_are_flagged() -> None:
    assert "vllm_missing" in rules_of(run({}), "info")


def test_lint_checks_shape() -> None:
    findings = run({"dtype": "int4", "tensor_parallel_size": 3, "pipeline_parallel_size": 8, "block_size": 16},
                   device="cuda")
    checks = {c.id: c for c in lint_checks(findings)}
    assert checks["preflight.lint.dtype"].status == "fail"
    assert checks["preflight.lint.tp_heads"].status == "fail"
    assert checks["preflight.lint.tp_kv_heads"].status == "fail"  # 2 KV heads, tp=3
    assert checks["preflight.lint.pp_layers"].status == "pass" and checks["preflight.lint.pp_layers"].message.startswith("warning:")
    summary = checks["preflight.lint"]
    assert summary.status == "fail" and summary.value == 3 and summary.limit == 0
    assert len(summary.evidence["table"]["rows"]) == len(findings)
    assert not any(c.id.startswith("preflight.lint.block_size") for c in checks.values())  # infos only in the table
    clean = lint_checks(run({"tensor_parallel_size": 2}))
    assert [c.id for c in clean] == ["preflight.lint"] and clean[0].status == "pass"


def test_duplicate_rules_get_distinct_ids() -> None:
    findings = [Finding("error", "unknown_arg", f"engine.args.{k}", 1, "w", "f") for k in ("foo", "bar", "foo")]
    ids = [c.id for c in lint_checks(findings)]
    assert len(ids) == len(set(ids)) == 4
