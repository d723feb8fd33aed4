"""The CPU-kernel table and the expert-parallel rules: each row fires exactly where vLLM 0.32's CPU
backend refuses or changes the setting, the table agrees with the installed vLLM's backends, and
the docs list every row."""

from __future__ import annotations

from typing import Any

import pytest

from day0.model import archs
from day0.stages.preflight.cpu_kernels import (
    CPU_BLOCK_MULTIPLE,
    CPU_HEAD_SIZES,
    CPU_KERNEL_LIMITS,
    CPU_MLA_LATENT,
    cpu_kernel_findings,
    host_cpu_flags,
)
from day0.stages.preflight.lint import Finding, VllmRules, lint
from tests.support import REPO

SNAPSHOT = VllmRules("0.32.0 (snapshot)", frozenset(), ("auto", "bfloat16", "float32"), ("auto", "fp8", "fp8_ds_mla"),
                     ("fp8", "compressed-tensors"), 0.92, False)
TINY = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}
TINY_MOE = {**TINY, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64, "head_dim": 64}

AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})  # day0's box of 2026-12-01
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}
AMX = AVX512 | {"amx_tile", "amx_bf16", "amx_int8"}  # day0's box of 2026-12-03


def run(args: dict[str, Any], config: dict[str, Any] | None = None, device: str = "cpu") -> list[Finding]:
    return lint(args, config or TINY, device=device, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, rules=SNAPSHOT)


def by_rule(findings: list[Finding]) -> dict[str, Finding]:
    return {f.rule: f for f in findings}


def deepseek(**kw: Any) -> dict[str, Any]:
    return {**archs.example_config("deepseek-v3"), **kw}


# --------------------------------------------------------------------------- the table, row by row


def test_pp_with_eager_is_refused_on_cpu_only() -> None:
    f = by_rule(run({"pipeline_parallel_size": 2, "enforce_eager": True}))["cpu_pp_eager"]
    assert f.severity == "error" and f.key == "engine.args.pipeline_parallel_size" and f.value == 2
    assert "intermediate_tensors is not None" in f.why and "notes/vllm-cpu.md" in f.why
    assert "cpu_pp_eager" not in by_rule(run({"pipeline_parallel_size": 2}))  # compiled PP serves
    assert "cpu_pp_eager" not in by_rule(run({"pipeline_parallel_size": 2, "enforce_eager": True}, device="cuda"))


@pytest.mark.parametrize("rank,rope,refused", [(512, 64, False), (256, 64, True), (512, 32, True), (448, 128, True)])
def test_mla_latent_other_than_576_is_refused_on_cpu(rank: int, rope: int, refused: bool) -> None:
    found = by_rule(run({}, deepseek(kv_lora_rank=rank, qk_rope_head_dim=rope)))
    assert ("cpu_mla_latent" in found) == refused
    if refused:
        f = found["cpu_mla_latent"]
        assert f.severity == "error" and f.key == "config.json.kv_lora_rank" and str(rank + rope) in f.why
    assert "cpu_mla_latent" not in by_rule(run({}, deepseek(kv_lora_rank=rank, qk_rope_head_dim=rope), device="cuda"))


@pytest.mark.parametrize("head_dim,refused", [(16, True), (48, True), (64, False), (128, False), (512, False),
                                              (576, True)])
def test_attention_head_dim_outside_the_cpu_list_is_refused(head_dim: int, refused: bool) -> None:
    found = by_rule(run({}, {**TINY, "head_dim": head_dim}))
    assert ("cpu_head_dim" in found) == refused
    if refused:
        assert found["cpu_head_dim"].severity == "error" and found["cpu_head_dim"].value == head_dim
    assert "cpu_head_dim" not in by_rule(run({}, deepseek()))  # MLA: the latent rule applies instead


def test_mla_on_cpu_drops_prefix_caching_and_chunked_prefill_when_asked_for() -> None:
    asked_args = {"enable_prefix_caching": True, "enable_chunked_prefill": True, "block_size": 64}
    asked = by_rule(cpu_kernel_findings(asked_args, deepseek(), AVX512))
    assert asked["cpu_mla_prefix_caching"].severity == "warning"
    assert asked["cpu_mla_chunked_prefill"].severity == "warning"
    assert asked["block_size_cpu_mla"].severity == "info" and "block_size=16" in asked["block_size_cpu_mla"].why
    # AMX_MLA keeps both and takes any block size, unless the reference kernel is asked for by name
    amx = by_rule(cpu_kernel_findings(asked_args, deepseek(), AMX))
    assert not {"cpu_mla_prefix_caching", "cpu_mla_chunked_prefill", "block_size_cpu_mla"} & set(amx)
    named = by_rule(cpu_kernel_findings({**asked_args, "attention_backend": "CPU_MLA"}, deepseek(), AMX))
    assert {"cpu_mla_prefix_caching", "cpu_mla_chunked_prefill", "block_size_cpu_mla"} <= set(named)
    unset = by_rule(cpu_kernel_findings({}, deepseek(), AVX512))
    assert not {"cpu_mla_prefix_caching", "cpu_mla_chunked_prefill", "block_size_cpu_mla"} & set(unset)
    dense = by_rule(run(asked_args))
    assert not {"cpu_mla_prefix_caching", "cpu_mla_chunked_prefill", "block_size"} & set(dense)
    gpu = by_rule(run({"enable_prefix_caching": True, "block_size": 64}, deepseek(), device="cuda"))
    assert "cpu_mla_prefix_caching" not in gpu


@pytest.mark.parametrize("args,flags,refused", [
    ({"dtype": "float32"}, "amx", True),
    ({}, "amx", False),  # dtype auto: vLLM serves the float32 checkpoint in bfloat16 on x86
    ({"dtype": "float"}, "amx", True),
    ({"dtype": "float32", "attention_config": {"backend": "AMX_MLA"}}, "amx", True),
    ({"dtype": "float32", "attention_backend": "CPU_MLA"}, "amx", False),
    ({"dtype": "float32", "attention_config": {"backend": "CPU_MLA"}}, "amx", False),
    ({"dtype": "bfloat16"}, "amx", False),
    ({"dtype": "float32"}, "avx512", False),  # no AMX: vLLM picks the reference kernel itself
    ({"dtype": "float32"}, "unknown", False),
])
def test_float32_mla_on_an_amx_host_needs_the_reference_kernel(args: dict[str, Any], flags: str,
                                                               refused: bool) -> None:
    host = {"amx": AMX, "avx512": AVX512, "unknown": frozenset()}[flags]
    found = by_rule(cpu_kernel_findings(args, deepseek(torch_dtype="float32"), host))
    assert ("cpu_mla_amx_dtype" in found) == refused
    if refused:
        f = found["cpu_mla_amx_dtype"]
        assert f.severity == "error" and f.key == "engine.args.attention_backend"
        assert "AMX_MLA" in f.why and f"dtype={args['dtype']} fails" in f.why and "attention_backend=CPU_MLA" in f.fix
    assert "cpu_mla_amx_dtype" not in by_rule(cpu_kernel_findings({"dtype": "float32"}, TINY, AMX))  # dense: no MLA


def test_expert_parallel_on_cpu_is_a_warning_not_a_refusal() -> None:
    found = by_rule(run({"tensor_parallel_size": 2, "enable_expert_parallel": True, "block_size": 32}, TINY_MOE))
    f = found["cpu_expert_parallel"]
    assert f.severity == "warning" and "cpu_fused_moe.cpp" in f.why and "must show" in f.why
    assert not [x for x in found.values() if x.severity == "error"]
    assert "cpu_expert_parallel" not in by_rule(run({"tensor_parallel_size": 2, "enable_expert_parallel": True},
                                                    TINY_MOE, device="cuda"))
    assert "cpu_expert_parallel" not in by_rule(run({"tensor_parallel_size": 2, "enable_expert_parallel": True}))
    assert "cpu_expert_parallel" not in by_rule(run({"enable_expert_parallel": True}, TINY_MOE))  # one rank: no EP


def test_eplb_is_refused_on_cpu() -> None:
    args = {"tensor_parallel_size": 2, "enable_expert_parallel": True, "enable_eplb": True}
    assert by_rule(run(args, TINY_MOE))["cpu_eplb"].severity == "error"
    assert "cpu_eplb" not in by_rule(run(args, TINY_MOE, device="cuda"))


def w4a16(num_bits: int = 4, input_activations: dict[str, Any] | None = None) -> dict[str, Any]:
    """A compressed-tensors quantization_config as tests/stages/risks/test_live.py's w4a16_copy writes it."""
    weights = {"num_bits": num_bits, "type": "int", "strategy": "group", "group_size": 64, "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head", "re:.*mlp.gate$"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": input_activations}}}



def test_int4_moe_is_refused_on_a_cpu_without_amx_or_avx512() -> None:
    moe = {**TINY_MOE, "quantization_config": w4a16()}
    [f] = [x for x in cpu_kernel_findings({"dtype": "bfloat16"}, moe, AVX2) if x.rule == "cpu_int4_moe"]
    assert f.severity == "error" and f.key == "config.json.quantization_config"
    assert f.value == "compressed-tensors int4 weight-only (group 64)"
    assert "No WNA16 MoE backend supports the deployment configuration" in f.why and "CPUExpertsInt4" in f.why
    assert "SIMD flags: avx, avx2)" in f.why and "int_wna16.py" in f.why
    gptq = {**TINY_MOE, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    assert "cpu_int4_moe" in by_rule(cpu_kernel_findings({}, gptq, AVX2))
    # a kernel may exist: AMX (vLLM's CPU experts) or AVX-512 (zentorch's on a Zen); unknown flags say nothing
    for flags in (AVX2 | {"avx512f", "amx_tile"}, AVX512, frozenset()):
        assert "cpu_int4_moe" not in by_rule(cpu_kernel_findings({}, moe, flags)), flags
    # not an int4 weight-only MoE: dense int4, int8 weights, int4 weights with int8 activations, unquantized
    for config in ({**TINY, "quantization_config": w4a16()}, {**TINY_MOE, "quantization_config": w4a16(8)},
                   {**TINY_MOE, "quantization_config": w4a16(input_activations={"num_bits": 8, "type": "int"})},
                   TINY_MOE, {**TINY_MOE, "quantization_config": {"quant_method": "awq", "bits": 8}}):
        assert "cpu_int4_moe" not in by_rule(cpu_kernel_findings({}, config, AVX2)), config
    assert "cpu_int4_moe" not in by_rule(run({}, moe, device="cuda"))


def test_the_int4_moe_row_agrees_with_the_installed_vllm_on_this_host() -> None:
    """Where the row refuses an int4 MoE on this host, vLLM's WNA16 MoE oracle has no CPU experts kernel here."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip(f"vLLM's platform here is {type(current_platform).__name__}, not the CPU backend")
    backends = int_wna16._get_priority_backends()
    assert [b.value for b in backends] == ["ZEN_CPU", "CPU"]  # the two the row names
    kernels = [cls for b in backends for cls in int_wna16.backend_to_kernel_cls(b)]
    assert [cls.__name__ for cls in kernels] == ["ZentorchExpertsInt4", "CPUExpertsInt4"]
    refused = "cpu_int4_moe" in by_rule(cpu_kernel_findings({}, {**TINY_MOE, "quantization_config": w4a16()}))
    served = any(cls._supports_current_device() for cls in kernels)
    assert not (refused and served)  # never refuses what vLLM would serve here
    flags = host_cpu_flags()
    if flags and not any(f.startswith("avx512") for f in flags):  # no Zen platform possible: the row is exact
        assert refused == (not served)


def test_every_row_is_documented_and_every_rule_id_is_stable() -> None:
    doc = (REPO / "docs" / "stages" / "preflight.md").read_text()
    for limit in CPU_KERNEL_LIMITS:
        assert f"`{limit.rule}`" in doc, limit.rule
        assert limit.source and limit.severity in ("error", "warning", "info")
    rules = [limit.rule for limit in CPU_KERNEL_LIMITS]
    assert len(rules) == len(set(rules))


def test_the_table_agrees_with_the_installed_vllm_backends() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES
    assert CPUMLABackend.get_supported_head_sizes() == [sum(CPU_MLA_LATENT)]
    assert CPUMLABackend.get_supported_kernel_block_sizes() == [16]
    [multiple] = CPUAttentionBackend.get_supported_kernel_block_sizes()
    assert isinstance(multiple, MultipleOf) and multiple.base == CPU_BLOCK_MULTIPLE


# --------------------------------------------------------------------------- expert parallelism (any device)


def test_expert_parallel_names_the_experts_per_rank() -> None:
    big = archs.example_config("moe-2.8t-1m")
    f = by_rule(run({"tensor_parallel_size": 8, "enable_expert_parallel": True}, big, device="cuda"))
    assert f["expert_parallel"].severity == "info" and "64 whole expert(s) per MoE layer of 512" in f["expert_parallel"].why
    assert "ep_uneven" not in f
    dp = by_rule(run({"tensor_parallel_size": 8, "data_parallel_size": 4, "enable_expert_parallel": True}, big,
                     device="cuda"))
    assert "EP=32 (TP 8 x DP 4)" in dp["expert_parallel"].why and "16 whole" in dp["expert_parallel"].why
    assert dp["dp_not_planned"].severity == "info"


def test_uneven_experts_warn_and_eplb_refuses_them() -> None:
    sixty = {**TINY_MOE, "num_experts": 60, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 512}
    f = by_rule(run({"tensor_parallel_size": 8, "enable_expert_parallel": True}, sixty, device="cuda"))["ep_uneven"]
    assert f.severity == "warning" and "first 4 rank(s) hold 8, the rest 7" in f.why
    e = by_rule(run({"tensor_parallel_size": 8, "enable_expert_parallel": True, "enable_eplb": True}, sixty,
                    device="cuda"))["ep_uneven"]
    assert e.severity == "error" and "EPLB currently only supports even distribution" in e.why
    # 4 redundant experts make 64: EPLB takes it
    ok = run({"tensor_parallel_size": 8, "enable_expert_parallel": True, "enable_eplb": True,
              "eplb_config": {"num_redundant_experts": 4}}, sixty, device="cuda")
    assert "ep_uneven" not in by_rule(ok)


def test_expert_parallel_without_effect_and_eplb_without_ep() -> None:
    assert by_rule(run({"tensor_parallel_size": 2, "enable_expert_parallel": True}, device="cuda"))[
        "expert_parallel_no_effect"].severity == "info"  # a dense model
    assert "expert_parallel_no_effect" in by_rule(run({"enable_expert_parallel": True}, TINY_MOE, device="cuda"))
    f = by_rule(run({"tensor_parallel_size": 2, "enable_eplb": True}, TINY_MOE, device="cuda"))["eplb_needs_ep"]
    assert f.severity == "error" and "enable_expert_parallel must be True" in f.why
