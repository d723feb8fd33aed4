"""The memory plan for mixtures of experts and MLA: experts per rank under TP and EP, the latent KV cache,
the seed's 2.8T plan per node. Expected values are computed here from config.json by hand, not by the
plan's own functions."""

from __future__ import annotations

import math

import pytest

from day0.model import archs
from day0.model import plan as P
from day0.model.ranks import experts_on_rank

GIB = 1024**3
H200_GIB = 141.0


def cfg(name: str) -> dict:
    return archs.example_config(name)


def w4a16(out_f: int, in_f: int) -> int:
    """Bytes of one W4A16 (group 128) linear weight: 4-bit values plus one bf16 scale per 128 inputs."""
    return out_f * in_f // 2 + 2 * out_f * math.ceil(in_f / 128)


# A Qwen1.5-MoE-like model: 60 routed experts (8 does not divide it) and one shared expert.
QWEN_MOE_60 = {
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1024, "num_experts": 60, "num_experts_per_tok": 4,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 512, "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


# --------------------------------------------------------------------------- counts


def test_moe_counts_total_and_active_parameters() -> None:
    c = cfg("moe-2.8t-1m")
    p = P.plan(c, tp=8, pp=4, nodes=4, device_memory_gib=H200_GIB, quantization="w4a16", kv_cache_dtype="fp8")
    m = p.moe
    assert m is not None and p.mla is not None
    assert (m.routed_experts, m.shared_experts, m.experts_per_token) == (512, 1, 8)
    assert (m.moe_layers, m.dense_layers) == (112 - 4, 4)  # first_k_dense_replace = 4
    one_expert = 3 * 8192 * 2048  # gate, up, down of moe_intermediate_size 2048
    assert m.expert_parameters == one_expert
    assert m.routed_expert_parameters == 108 * 512 * one_expert
    # active: every parameter except the routed experts a token does not visit (512 - 8 of them)
    assert p.active_parameters == p.parameters - 108 * (512 - 8) * one_expert
    assert 2.8e12 < p.parameters < 2.85e12 and 76e9 < p.active_parameters < 78e9


def test_dense_model_has_no_moe_or_mla_section() -> None:
    p = P.plan(cfg("llama-3.1-8b"), device_memory_gib=80, max_model_len=8192)
    assert p.moe is None and p.mla is None
    assert "experts per MoE layer" not in P.format_table(p)


# --------------------------------------------------------------------------- experts per rank, TP vs EP


def test_experts_on_rank_matches_vllm_determine_expert_map() -> None:
    mod = pytest.importorskip("vllm.model_executor.layers.fused_moe.expert_map_manager")
    for routed, ep in ((60, 8), (8, 6), (512, 8), (8, 16), (256, 32)):
        for rank in range(ep):
            local, _, _ = mod.determine_expert_map(ep, rank, routed)
            assert experts_on_rank(routed, ep, rank) == local


def test_uneven_experts_under_ep_versus_tp() -> None:
    c = QWEN_MOE_60
    per_expert = 3 * 512 * 128 * 2  # bf16 gate/up/down
    tp = P.plan(c, tp=8, device_memory_gib=8, max_model_len=4096)
    ep = P.plan(c, tp=8, device_memory_gib=8, max_model_len=4096, enable_expert_parallel=True)
    assert tp.moe.ep_size == 1 and not tp.moe.expert_parallel
    assert (ep.moe.ep_size, ep.moe.experts_per_rank, ep.moe.experts_per_rank_min, ep.moe.experts_even) == (8, 8, 7, False)
    # TP: each rank a 1/8 slice of all 60 experts; EP: the busiest rank holds 8 whole experts (60 = 4 x 8 + 4 x 7)
    assert tp.moe.expert_bytes_per_rank == 4 * math.ceil(60 * per_expert / 8)
    assert ep.moe.expert_bytes_per_rank == 4 * 8 * per_expert
    assert ep.moe.expert_bytes_per_rank_tp == tp.moe.expert_bytes_per_rank
    # the busiest rank is half an expert per layer heavier under EP; everything else is placed the same
    assert ep.weight_bytes_per_rank - tp.weight_bytes_per_rank == 4 * 8 * per_expert - 4 * math.ceil(60 * per_expert / 8)
    assert ep.stages[0].expert_bytes == ep.moe.expert_bytes_per_rank
    # one node of 8: it holds every expert exactly once either way
    assert ep.expert_bytes_per_node == tp.expert_bytes_per_node == 4 * 60 * per_expert


def test_ep_needs_more_than_one_rank_and_leaves_dense_models_alone() -> None:
    one = P.plan(QWEN_MOE_60, tp=1, device_memory_gib=8, max_model_len=4096, enable_expert_parallel=True)
    assert one.moe.ep_size == 1 and one.moe.experts_per_rank == 60
    dense = P.plan(cfg("llama-3.1-8b"), tp=8, device_memory_gib=80, max_model_len=8192, enable_expert_parallel=True)
    plain = P.plan(cfg("llama-3.1-8b"), tp=8, device_memory_gib=80, max_model_len=8192)
    assert dense.weight_bytes_per_rank == plain.weight_bytes_per_rank and dense.moe is None
    with pytest.raises(ValueError, match="enable_expert_parallel='yes'"):
        P.plan(QWEN_MOE_60, tp=8, device_memory_gib=8, enable_expert_parallel="yes")  # type: ignore[arg-type]


def test_shared_experts_and_routers_are_not_ep_split() -> None:
    c = QWEN_MOE_60
    tp = P.plan(c, tp=4, device_memory_gib=8, max_model_len=4096)
    ep = P.plan(c, tp=4, device_memory_gib=8, max_model_len=4096, enable_expert_parallel=True)
    # 60 experts over 4 ranks divide evenly: the same bytes per rank, whole experts instead of slices
    assert ep.moe.experts_even and ep.moe.experts_per_rank == 15
    assert ep.weight_bytes_per_rank == tp.weight_bytes_per_rank
    assert ep.moe.shared_experts == 1


# --------------------------------------------------------------------------- MLA


def test_mla_latent_is_not_divided_by_tp_and_beats_a_kv_cache_of_the_same_heads() -> None:
    c = cfg("deepseek-v3")  # 61 layers, 128 heads, kv_lora_rank 512, qk_rope 64, qk_nope 128, v_head_dim 128
    for tp in (1, 8):
        p = P.plan(c, tp=tp, device_memory_gib=H200_GIB, kv_cache_dtype="auto", dtype="bfloat16")
        assert p.kv_bytes_per_token == 61 * (512 + 64) * 2
        assert p.mla.latent_width == 576 and p.mla.bytes_per_token_per_rank == p.kv_bytes_per_token
        assert p.mla.mha_bytes_per_token_per_rank == 61 * (128 // tp) * (128 + 64 + 128) * 2
    p = P.plan(c, tp=8, pp=2, nodes=2, device_memory_gib=H200_GIB, kv_cache_dtype="fp8")
    assert p.mla.bytes_per_token_per_rank == 31 * 576  # the busiest of 31 + 30 layers, one byte per value
    assert p.mla.mha_ratio == pytest.approx(31 * 16 * 320 / (31 * 576), abs=0.01)


def test_mla_max_concurrency_at_the_target_context_uses_the_latent() -> None:
    c = cfg("deepseek-v3")
    pool = 20 * GIB
    p = P.plan(c, tp=8, device_memory_gib=H200_GIB, kv_cache_memory_bytes=pool, kv_cache_dtype="auto",
               target_context=100_000, max_model_len=131072)
    per_token = 61 * 576 * 2
    tokens = pool // (per_token * 16) * 16
    assert p.kv_tokens == tokens
    assert p.max_concurrency == tokens // (math.ceil(100_000 / 16) * 16)
    assert "max concurrency at target context" in P.format_table(p)


# --------------------------------------------------------------------------- the seed's 2.8T plan


def supernode_plan(**kw: object) -> P.Plan:
    base = dict(tp=8, pp=4, nodes=4, devices_per_node=8, device_memory_gib=H200_GIB, kv_cache_dtype="fp8",
                max_model_len=1_048_576, target_context=1_048_576, target_concurrency=4, gpu_memory_utilization=0.92)
    base.update(kw)
    return P.plan(cfg("moe-2.8t-1m-w4a16"), **base)


def test_2_8t_with_expert_parallel_per_rank_and_per_node() -> None:
    p = supernode_plan(enable_expert_parallel=True)
    m = p.moe
    assert (m.ep_size, m.experts_per_rank, m.experts_per_rank_min, m.experts_even) == (8, 64, 64, True)  # 512 / 8
    expert = 2 * w4a16(2048, 8192) + w4a16(8192, 2048)  # gate + up [2048, 8192], down [8192, 2048]
    assert expert == 25_952_256
    # the busiest stage holds 28 MoE layers (stage 0 has the 4 dense ones), 64 whole experts each
    assert m.expert_bytes_per_rank == 28 * 64 * expert == 46_506_442_752
    assert m.expert_bytes_per_rank_tp == m.expert_bytes_per_rank  # 512 divides by 8: the same bytes either way
    # a node is one PP stage (TP 8 = devices per node): it holds all 512 experts of its 28 layers
    assert p.nodes_used == 4
    assert p.expert_bytes_per_node == 28 * 512 * expert
    assert p.node_memory_bytes == 8 * int(H200_GIB * GIB)
    usable = 8 * (int(H200_GIB * GIB * 0.92) - 2 * GIB)
    assert p.node_weight_limit_bytes == usable
    assert p.weight_bytes_per_node == 8 * p.weight_bytes_per_rank  # the last stage: equal ranks, no uneven experts
    assert p.node_holds_share and p.weight_bytes_per_node < 0.4 * usable
    # KV per token per rank: 28 layers x 576-value latent x 1 byte (fp8), on every TP rank
    assert p.kv_bytes_per_token == 28 * 576 and p.mla.mha_bytes_per_token_per_rank == 28 * 16 * 320
    assert p.max_concurrency >= 4 and p.verdict == "needs_supernode"


def test_2_8t_on_one_node_does_not_hold_its_share() -> None:
    p = supernode_plan(pp=1, nodes=1, enable_expert_parallel=True)
    expert = 2 * w4a16(2048, 8192) + w4a16(8192, 2048)
    routed = 108 * 512 * expert  # every routed expert of the model, on 8 GPUs
    limit = 8 * (int(H200_GIB * GIB * 0.92) - 2 * GIB)
    assert routed > limit  # the experts alone overflow the node
    assert p.expert_bytes_per_node == routed and not p.node_holds_share and not p.fits
    assert p.moe.experts_per_rank == 64


def test_plan_dict_and_table_carry_the_moe_fields() -> None:
    p = supernode_plan(enable_expert_parallel=True)
    d = p.to_dict()
    assert d["moe"]["experts_per_rank"] == 64 and d["moe"]["expert_parallel"] is True
    assert d["mla"]["latent_width"] == 576 and d["node_holds_share"] is True
    assert d["stages"][3]["expert_bytes"] == 28 * 64 * 25_952_256
    text = P.format_table(p)
    assert "EP: 64 whole experts per rank per MoE layer over EP=8" in text
    assert "holds its share: yes" in text and "the same on every TP rank" in text
    assert "512 routed (top-8 per token) + 1 shared; 108 MoE layers, 4 dense" in text


def test_what_if_turns_expert_parallel_on() -> None:
    assert P.parse_what_if("enable_expert_parallel=true,tp=8") == {"enable_expert_parallel": True, "tp": 8}
    assert P.parse_what_if("expert_parallel=off") == {"enable_expert_parallel": False}
    with pytest.raises(ValueError, match="enable_expert_parallel='maybe' is not true or false"):
        P.parse_what_if("enable_expert_parallel=maybe")
    assert P.plan_kwargs({"enable_expert_parallel": True, "seed": 0}) == {"enable_expert_parallel": True}
    from day0.model.what_if import check_engine_args

    for bad in ({"enable_expert_parallel": "true"}, {"data_parallel_size": 0}):
        with pytest.raises(ValueError, match=f"engine.args.{next(iter(bad))}: "):
            check_engine_args(bad)


def test_mla_ranks_hold_the_decode_copy_of_kv_b_proj_in_the_activation_dtype() -> None:
    """vLLM's MLA splits kv_b_proj into W_UK_T and W_UV for the absorbed decode and keeps kv_b_proj
    for prefill: one more kv_b_proj per layer on each rank (its TP slice), in the compute dtype even
    when the checkpoint's kv_b_proj is int4. Measured on the tiny DeepSeek-V3: 15.59 MiB held vs
    12.59 MiB of checkpoint, 3 layers x 1 MiB."""
    c = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
         "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 384, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
         "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 64,
         "qk_rope_head_dim": 64, "v_head_dim": 64, "topk_method": "noaux_tc", "max_position_embeddings": 4096,
         "tie_word_embeddings": False, "torch_dtype": "float32"}
    kv_b = 512 * 4 * (64 + 64)  # kv_lora_rank x heads x (qk_nope + v)
    one = P.plan(c, dtype="float32", device_memory_gib=24, max_model_len=4096)
    assert one.weight_bytes_per_rank - one.weight_bytes_total == 3 * kv_b * 4
    two = P.plan(c, dtype="float32", tp=2, device_memory_gib=24, max_model_len=4096)
    assert one.weight_bytes_per_rank - two.weight_bytes_per_rank >= 3 * kv_b * 4 // 2  # the copy is TP-split
    gqa = P.plan(QWEN_MOE_60, dtype="float32", device_memory_gib=24, max_model_len=4096)
    assert gqa.weight_bytes_per_rank == gqa.weight_bytes_total  # no such copy without MLA
