"""Architecture shapes: counts against published totals, exact KV bytes, and a closed-form property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.model import arch_tensors, archs

# Published totals from the model cards (parameters, active parameters where the card gives one).
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, None),
    ("llama-3.1-70b", 70.6e9, None),
    ("llama-3.1-405b", 405.9e9, None),
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("deepseek-v3", 671e9, 37e9),
    ("moe-2.8t-1m", 2.8e12, None),  # day0's synthetic target: designed to be ~2.8T
]

# Bytes per token, bf16 KV, TP=1 PP=1: 2 x layers x kv_heads x head_dim x 2, or MLA layers x 576 x 2.
KV_BF16 = {
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2,  # 131072
    "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,
    "llama-3.1-405b": 2 * 126 * 8 * 128 * 2,
    "mixtral-8x7b": 2 * 32 * 8 * 128 * 2,
    "deepseek-v3": 61 * (512 + 64) * 2,  # 70272
    "moe-2.8t-1m": 112 * (512 + 64) * 2,
}

# Other families, written from their public config.json files (shapes only).
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "tie_word_embeddings": False}
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
              "tie_word_embeddings": True}
QWEN15_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
              "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
              "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "tie_word_embeddings": False}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}
DSV2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
             "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": None,
             "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
             "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
             "first_k_dense_replace": 1, "moe_layer_freq": 1, "vocab_size": 102400, "tie_word_embeddings": False,
             "topk_method": "greedy"}
OTHERS = [
    (QWEN2_7B, 7.62e9, None),
    (QWEN25_05B, 0.49e9, None),
    (QWEN15_MOE, 14.3e9, 2.7e9),
    (QWEN3_30B_A3B, 30.5e9, 3.3e9),
    (DSV2_LITE, 15.7e9, None),
]


def within(value: float, published: float, rel: float) -> bool:
    return abs(value - published) <= rel * published


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_parameter_count_matches_model_card(name: str, total: float, active: float | None) -> None:
    config = archs.example_config(name)
    count = arch_tensors.parameter_count(config)
    assert within(count, total, 0.01), f"{name}: {count / 1e9:.2f}B vs published {total / 1e9:.1f}B"
    if active:
        assert within(arch_tensors.active_parameter_count(config), active, 0.05)


@pytest.mark.parametrize("config,total,active", OTHERS, ids=lambda x: x["architectures"][0] if isinstance(x, dict) else "")
def test_other_families_match_model_cards(config: dict, total: float, active: float | None) -> None:
    assert within(arch_tensors.parameter_count(config), total, 0.01)
    if active:
        assert within(arch_tensors.active_parameter_count(config), active, 0.05)


@pytest.mark.parametrize("name", sorted(KV_BF16))
def test_kv_bytes_per_token_exact(name: str) -> None:
    assert archs.kv_bytes_per_token(archs.example_config(name), 2) == KV_BF16[name]


def test_kv_bytes_split_and_replicated() -> None:
    llama = archs.example_config("llama-3.1-8b")
    assert archs.kv_bytes_per_token(llama, 2, tp=8) == 2 * 32 * 1 * 128 * 2
    assert archs.kv_bytes_per_token(llama, 2, tp=16) == 2 * 32 * 1 * 128 * 2  # 8 KV heads replicated over 16 ranks
    assert archs.kv_bytes_per_token(llama, 1, tp=2, pp=4) == 2 * 8 * 4 * 128 * 1
    ds = archs.example_config("deepseek-v3")
    assert archs.kv_bytes_per_token(ds, 2, tp=8) == 61 * 576 * 2  # MLA latent is not split by TP
    assert archs.kv_bytes_per_token(ds, 2, pp=4) == 16 * 576 * 2  # busiest stage: ceil(61/4) layers


def test_llama_tensor_names_and_shapes() -> None:
    t = arch_tensors.expected_tensors(archs.example_config("llama-3.1-8b"))
    assert t["model.embed_tokens.weight"] == (128256, 4096)
    assert t["model.layers.0.self_attn.q_proj.weight"] == (4096, 4096)
    assert t["model.layers.31.self_attn.k_proj.weight"] == (1024, 4096)
    assert t["model.layers.0.mlp.down_proj.weight"] == (4096, 14336)
    assert t["lm_head.weight"] == (128256, 4096)
    assert "model.layers.32.input_layernorm.weight" not in t
    assert len(t) == 2 + 1 + 32 * 9


def test_tied_embeddings_drop_lm_head() -> None:
    tied = dict(archs.example_config("llama-3.1-8b"), tie_word_embeddings=True)
    assert "lm_head.weight" not in arch_tensors.expected_tensors(tied)
    untied = archs.example_config("llama-3.1-8b")
    assert arch_tensors.parameter_count(untied) - arch_tensors.parameter_count(tied) == 128256 * 4096


def test_qwen2_has_qkv_bias_only() -> None:
    t = arch_tensors.expected_tensors(QWEN2_7B)
    assert t["model.layers.0.self_attn.q_proj.bias"] == (3584,)
    assert t["model.layers.0.self_attn.k_proj.bias"] == (512,)
    assert "model.layers.0.self_attn.o_proj.bias" not in t
    assert "lm_head.weight" in t and "lm_head.weight" not in arch_tensors.expected_tensors(QWEN25_05B)


def test_mixtral_experts_and_router() -> None:
    t = arch_tensors.expected_tensors(archs.example_config("mixtral-8x7b"))
    assert t["model.layers.0.block_sparse_moe.gate.weight"] == (8, 4096)
    assert t["model.layers.5.block_sparse_moe.experts.7.w1.weight"] == (14336, 4096)
    assert t["model.layers.5.block_sparse_moe.experts.7.w2.weight"] == (4096, 14336)
    assert "model.layers.5.block_sparse_moe.experts.8.w1.weight" not in t


def test_qwen_moe_shared_expert_and_qwen3_norms() -> None:
    t = arch_tensors.expected_tensors(QWEN15_MOE)
    assert t["model.layers.0.mlp.shared_expert.gate_proj.weight"] == (5632, 2048)
    assert t["model.layers.0.mlp.shared_expert_gate.weight"] == (1, 2048)
    assert t["model.layers.0.mlp.experts.59.down_proj.weight"] == (2048, 1408)
    q3 = arch_tensors.expected_tensors(QWEN3_30B_A3B)
    assert q3["model.layers.0.self_attn.q_norm.weight"] == (128,)
    assert q3["model.layers.0.self_attn.q_proj.weight"] == (4096, 2048)  # head_dim x heads != hidden
    assert not any("shared_expert" in k for k in q3)


def test_qwen_moe_dense_layers_from_sparse_step() -> None:
    cfg = dict(QWEN15_MOE, decoder_sparse_step=2, mlp_only_layers=[3])
    t = arch_tensors.expected_tensors(cfg)
    assert "model.layers.0.mlp.gate_proj.weight" in t  # (0 + 1) % 2 != 0: dense
    assert "model.layers.1.mlp.gate.weight" in t  # sparse
    assert "model.layers.3.mlp.gate_proj.weight" in t  # listed in mlp_only_layers


def test_deepseek_v3_mla_dense_and_moe_layers() -> None:
    t = arch_tensors.expected_tensors(archs.example_config("deepseek-v3"))
    a = "model.layers.0.self_attn."
    assert t[a + "q_a_proj.weight"] == (1536, 7168)
    assert t[a + "q_a_layernorm.weight"] == (1536,)
    assert t[a + "q_b_proj.weight"] == (128 * 192, 1536)
    assert t[a + "kv_a_proj_with_mqa.weight"] == (576, 7168)
    assert t[a + "kv_a_layernorm.weight"] == (512,)
    assert t[a + "kv_b_proj.weight"] == (128 * 256, 512)
    assert t[a + "o_proj.weight"] == (7168, 128 * 128)
    assert t["model.layers.2.mlp.gate_proj.weight"] == (18432, 7168)  # first_k_dense_replace = 3
    assert "model.layers.2.mlp.gate.weight" not in t
    assert t["model.layers.3.mlp.gate.weight"] == (256, 7168)
    assert t["model.layers.3.mlp.gate.e_score_correction_bias"] == (256,)
    assert t["model.layers.60.mlp.experts.255.down_proj.weight"] == (7168, 2048)
    assert t["model.layers.60.mlp.shared_experts.up_proj.weight"] == (2048, 7168)
    assert "model.layers.61.eh_proj.weight" not in t


def test_deepseek_v2_lite_uses_q_proj_without_q_lora() -> None:
    t = arch_tensors.expected_tensors(DSV2_LITE)
    assert t["model.layers.0.self_attn.q_proj.weight"] == (16 * 192, 2048)
    assert "model.layers.0.self_attn.q_a_proj.weight" not in t
    assert "model.layers.1.mlp.gate.e_score_correction_bias" not in t  # greedy routing has no bias
    assert t["model.layers.1.mlp.shared_experts.gate_proj.weight"] == (2 * 1408, 2048)


def test_mtp_layer_is_excluded_unless_asked() -> None:
    ds = archs.example_config("deepseek-v3")
    with_mtp = arch_tensors.expected_tensors(ds, include_mtp=True)
    assert with_mtp["model.layers.61.eh_proj.weight"] == (7168, 2 * 7168)
    assert with_mtp["model.layers.61.shared_head.head.weight"] == (129280, 7168)
    assert within(arch_tensors.parameter_count(ds, include_mtp=True), 685e9, 0.01)  # the "685B" on the model card


def test_unknown_architecture_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"config.json: architectures: architecture GPT2LMHeadModel is not known to day0; known: .*LlamaForCausalLM"):
        arch_tensors.expected_tensors({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8})
    with pytest.raises(ValueError, match="config.json: intermediate_size: missing"):
        arch_tensors.parameter_count({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "vocab_size": 8,
                               "num_hidden_layers": 1, "num_attention_heads": 1})


def test_model_type_fallback() -> None:
    cfg = dict(archs.example_config("llama-3.1-8b"))
    cfg.pop("architectures")
    assert archs.architecture(cfg) == "LlamaForCausalLM"


@pytest.mark.parametrize(
    "extra,expected",
    [
        ({}, 4096),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 4096),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}, 4096),
        ({"rope_scaling": {"type": "linear", "factor": 4.0}}, 16384),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 8192),
        ({"model_max_length": 2000}, 2000),
        ({"seq_length": 1000}, 1000),
    ],
)
def test_derived_max_model_len(extra: dict, expected: int) -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096, **extra}
    assert archs.derived_max_model_len(cfg)[0] == expected


@settings(max_examples=60, deadline=None)
@given(
    hidden_mult=st.integers(1, 8),
    heads=st.sampled_from([1, 2, 4, 8]),
    kv_div=st.sampled_from([1, 2, 4]),
    layers=st.integers(1, 6),
    inter=st.integers(1, 64),
    vocab=st.integers(1, 500),
    tied=st.booleans(),
    bias=st.booleans(),
)
def test_llama_count_closed_form(hidden_mult: int, heads: int, kv_div: int, layers: int, inter: int, vocab: int,
                                 tied: bool, bias: bool) -> None:
    kv = max(1, heads // kv_div)
    hd = 4
    h = heads * hd * hidden_mult
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": h, "intermediate_size": inter, "head_dim": hd,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "tie_word_embeddings": tied, "attention_bias": bias}
    attn = h * heads * hd * 2 + h * kv * hd * 2 + (heads * hd * 2 + kv * hd * 2 if bias else 0)
    if bias:
        attn = attn - heads * hd + h  # o_proj bias has hidden_size entries, not heads x head_dim
    per_layer = attn + 3 * h * inter + 2 * h
    expected = vocab * h * (1 if tied else 2) + layers * per_layer + h
    assert arch_tensors.parameter_count(cfg) == expected
    for tp in (1, 2, 4, 8, 16):
        for pp in (1, 2, 3):
            kvb = archs.kv_bytes_per_token(cfg, 2, tp=tp, pp=pp)
            assert kvb == 2 * math.ceil(layers / pp) * max(1, kv // tp) * hd * 2
            assert kvb <= archs.kv_bytes_per_token(cfg, 2)


@pytest.mark.parametrize("key, value, problem", [
    ("hidden_size", "256", "expected an integer"),
    ("hidden_size", 256.0, "expected an integer"),
    ("num_hidden_layers", True, "expected an integer"),
    ("num_hidden_layers", 10**9, "at most 100000"),
    ("num_attention_heads", 0, "below 1"),
    ("tie_word_embeddings", "false", "expected true or false"),
    ("rope_scaling", {"type": "linear", "factor": float("inf")}, "finite"),
    ("architectures", [1], "list of model class names"),
])
def test_config_values_are_read_strictly(key: str, value: object, problem: str) -> None:
    """int("256") or bool("false") would describe a model vLLM does not load: refused, naming the key."""
    cfg = {**archs.example_config("llama-3.1-8b"), key: value}
    with pytest.raises(archs.ConfigError, match=problem) as err:
        arch_tensors.check_config(cfg)
    assert err.value.key.split(".")[0] == key and str(err.value).startswith(f"config.json: {err.value.key}: ")


def test_implied_tensor_count_is_bounded_before_listing() -> None:
    cfg = {**archs.example_config("mixtral-8x7b"), "num_hidden_layers": 50_000}
    assert arch_tensors.tensor_count_bound(cfg) > arch_tensors.MAX_TENSORS
    with pytest.raises(archs.ConfigError, match="tensors"):
        arch_tensors.expected_tensors(cfg)  # refused arithmetically, nothing listed
