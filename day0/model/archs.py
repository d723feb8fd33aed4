"""Tensor shapes a Hugging Face checkpoint must hold, derived from its ``config.json`` alone.

Why: the weights stage needs to know what a *complete* checkpoint looks like before it opens a
single shard, and the memory plan needs an exact parameter count for models far too large to
instantiate (a 2.8T MoE). Both come from the same per-architecture tensor list, so the count
and the shard check can never disagree.

Shapes follow ``torch.nn.Linear`` (``[out_features, in_features]``) and the HF tensor names of
the unquantized checkpoint. DeepSeek multi-token-prediction (MTP) layers
(``num_nextn_predict_layers``) are *not* part of the model vLLM serves for plain decoding; they
are left out of :func:`expected_tensors` and :func:`parameter_count` unless ``include_mtp=True``
(DeepSeek-V3 is "671B" without its 14B MTP module, "685B" with it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

Shapes = dict[str, tuple[int, ...]]

LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MIXTRAL = ("MixtralForCausalLM",)
QWEN_MOE = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
DEEPSEEK = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
MLA_ARCHITECTURES = DEEPSEEK

# model_type fallbacks for configs that lack "architectures" (hand-written or stripped configs).
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


EXAMPLES_DIR = Path(__file__).parent / "archconfigs"


def example_names() -> tuple[str, ...]:
    """Configs shipped with day0 (``day0/archconfigs/*.json``): public model cards plus a synthetic 2.8T MoE."""
    return tuple(sorted(p.stem for p in EXAMPLES_DIR.glob("*.json")))


def example_config(name: str) -> dict[str, Any]:
    path = EXAMPLES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"{path}: no such example config; known: {', '.join(example_names())}")
    return json.loads(path.read_text(encoding="utf-8"))


def known_architectures() -> tuple[str, ...]:
    return LLAMA_LIKE + MIXTRAL + QWEN_MOE + DEEPSEEK


def architecture(config: dict[str, Any]) -> str:
    """The single architecture name day0 models; a clear error for anything else."""
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    name = archs[0] if archs else _MODEL_TYPES.get(str(config.get("model_type", "")), "")
    if not name:
        raise ValueError(
            "config.json: neither 'architectures' nor a known 'model_type' is set; known: "
            + ", ".join(known_architectures())
        )
    if name not in known_architectures():
        raise ValueError(
            f"config.json: architecture {name} is not known to day0; known: "
            + ", ".join(known_architectures())
        )
    return name


def is_mla(config: dict[str, Any]) -> bool:
    """Multi-head latent attention caches one compressed latent per token, not K and V per head."""
    return architecture(config) in MLA_ARCHITECTURES and config.get("kv_lora_rank") is not None


def is_moe(config: dict[str, Any]) -> bool:
    arch = architecture(config)
    if arch in MIXTRAL:
        return True
    if arch in QWEN_MOE:
        return int(_get(config, "num_experts")) > 0
    if arch in DEEPSEEK:
        return bool(config.get("n_routed_experts"))
    return False


def num_layers(config: dict[str, Any]) -> int:
    return int(_get(config, "num_hidden_layers"))


def num_attention_heads(config: dict[str, Any]) -> int:
    return int(_get(config, "num_attention_heads"))


def num_kv_heads(config: dict[str, Any]) -> int:
    """KV heads as vLLM counts them (MLA: the latent is shared, but vLLM reports the attention heads)."""
    value = config.get("num_key_value_heads")
    return int(value) if value is not None else num_attention_heads(config)


def head_dim(config: dict[str, Any]) -> int:
    value = config.get("head_dim")
    if value:
        return int(value)
    return int(_get(config, "hidden_size")) // num_attention_heads(config)


def num_mtp_layers(config: dict[str, Any]) -> int:
    return int(config.get("num_nextn_predict_layers") or 0) if architecture(config) in DEEPSEEK else 0


# --------------------------------------------------------------------------- public API


def expected_tensors(config: dict[str, Any], *, include_mtp: bool = False) -> Shapes:
    """Every tensor name of the unquantized HF checkpoint mapped to its shape.

    ``include_mtp`` adds DeepSeek's multi-token-prediction layers (``model.layers.{L..}``), which
    the published checkpoints ship but vLLM only loads for speculative decoding.
    """
    arch = architecture(config)
    builder = _BUILDERS[arch]
    out: Shapes = {}
    hidden = int(_get(config, "hidden_size"))
    vocab = int(_get(config, "vocab_size"))
    out["model.embed_tokens.weight"] = (vocab, hidden)
    for i in range(num_layers(config)):
        builder(config, i, f"model.layers.{i}.", out)
    out["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (vocab, hidden)
    if include_mtp:
        for j in range(num_mtp_layers(config)):
            i = num_layers(config) + j
            p = f"model.layers.{i}."
            out[p + "embed_tokens.weight"] = (vocab, hidden)
            out[p + "enorm.weight"] = (hidden,)
            out[p + "hnorm.weight"] = (hidden,)
            out[p + "eh_proj.weight"] = (hidden, 2 * hidden)
            builder(config, i, p, out)
            out[p + "shared_head.norm.weight"] = (hidden,)
            out[p + "shared_head.head.weight"] = (vocab, hidden)
    return out


def parameter_count(config: dict[str, Any], *, include_mtp: bool = False) -> int:
    """Total parameters (all experts counted), MTP layers excluded unless asked for."""
    return sum(math.prod(s) for s in expected_tensors(config, include_mtp=include_mtp).values())


def active_parameter_count(config: dict[str, Any]) -> int:
    """Parameters touched per token: routed experts counted ``num_experts_per_tok`` times, not all."""
    total = 0
    routed = routed_experts(config)
    per_tok = int(config.get("num_experts_per_tok") or 0)
    for name, shape in expected_tensors(config).items():
        n = math.prod(shape)
        if routed and ".experts." in name:
            n = n * per_tok / routed
        total += n
    return int(round(total))


def kv_bytes_per_token(config: dict[str, Any], kv_dtype_bytes: float, tp: int = 1, pp: int = 1) -> int:
    """KV-cache bytes one token costs on one rank (the busiest pipeline stage).

    Standard attention: ``2 x ceil(layers/PP) x max(1, kv_heads // TP) x head_dim x bytes``; KV
    heads are replicated (one per rank) when there are fewer KV heads than TP ranks. MLA caches
    ``kv_lora_rank + qk_rope_head_dim`` values per layer, the same latent on every TP rank.
    """
    if tp < 1 or pp < 1:
        raise ValueError(f"kv_bytes_per_token: tp={tp} and pp={pp} must be >= 1")
    layers = math.ceil(num_layers(config) / pp)
    if is_mla(config):
        width = int(_get(config, "kv_lora_rank")) + int(_get(config, "qk_rope_head_dim"))
        return int(layers * width * kv_dtype_bytes)
    heads = max(1, num_kv_heads(config) // tp)
    return int(2 * layers * heads * head_dim(config) * kv_dtype_bytes)


# rope types whose max_position_embeddings is already the scaled length (vLLM does not multiply).
_ROPE_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
_MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)


def rope_parameters(config: dict[str, Any]) -> dict[str, Any] | None:
    """The rope scaling dict under either name (``rope_scaling`` or transformers v5 ``rope_parameters``)."""
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, dict) and value:
            return value
    return None


def derived_max_model_len(config: dict[str, Any]) -> tuple[int, str]:
    """(length, key) as vLLM 0.32 derives it (``_get_and_verify_max_len``), before any user override.

    Why: a ``max_model_len`` above this is refused at start-up unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``; day0 wants to say so before a multi-node launch.
    The smallest of the length keys wins; a rope ``factor`` multiplies it except for rope types
    whose ``max_position_embeddings`` is already the scaled length (llama3, yarn, longrope).
    """
    found = [(int(config[k]), k) for k in _MAX_LEN_KEYS if config.get(k) is not None]
    if config.get("model_max_length"):
        length, key = int(config["model_max_length"]), "model_max_length"
    elif found:
        length, key = min(found)
    else:
        return 2048, "default"
    rope = rope_parameters(config)
    if rope and "gemma3" not in str(config.get("model_type", "")):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in _ROPE_ALREADY_SCALED and rope.get("factor"):
            return int(length * float(rope["factor"])), f"{key} x rope factor {rope['factor']}"
    return length, key


# --------------------------------------------------------------------------- per-architecture layers


def _get(config: dict[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ValueError(f"config.json: key {key!r} is missing (needed for {config.get('architectures')})")
    return value


def _linear(out: Shapes, name: str, out_f: int, in_f: int, bias: bool = False) -> None:
    out[name + ".weight"] = (out_f, in_f)
    if bias:
        out[name + ".bias"] = (out_f,)


def _gqa_attention(config: dict[str, Any], p: str, out: Shapes) -> None:
    arch = architecture(config)
    hidden = int(_get(config, "hidden_size"))
    hd = head_dim(config)
    nh, nkv = num_attention_heads(config), num_kv_heads(config)
    if arch == "Qwen2ForCausalLM":
        qkv_bias, o_bias = True, False
    elif arch == "Qwen2MoeForCausalLM":
        qkv_bias, o_bias = bool(config.get("qkv_bias", True)), False
    else:
        qkv_bias = o_bias = bool(config.get("attention_bias", False))
    a = p + "self_attn."
    _linear(out, a + "q_proj", nh * hd, hidden, qkv_bias)
    _linear(out, a + "k_proj", nkv * hd, hidden, qkv_bias)
    _linear(out, a + "v_proj", nkv * hd, hidden, qkv_bias)
    _linear(out, a + "o_proj", hidden, nh * hd, o_bias)
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        out[a + "q_norm.weight"] = (hd,)
        out[a + "k_norm.weight"] = (hd,)


def _gated_mlp(out: Shapes, p: str, hidden: int, inter: int, bias: bool = False) -> None:
    _linear(out, p + "gate_proj", inter, hidden, bias)
    _linear(out, p + "up_proj", inter, hidden, bias)
    _linear(out, p + "down_proj", hidden, inter, bias)


def _norms(config: dict[str, Any], p: str, out: Shapes) -> None:
    hidden = int(_get(config, "hidden_size"))
    out[p + "input_layernorm.weight"] = (hidden,)
    out[p + "post_attention_layernorm.weight"] = (hidden,)


def _llama_layer(config: dict[str, Any], i: int, p: str, out: Shapes) -> None:
    _gqa_attention(config, p, out)
    hidden = int(_get(config, "hidden_size"))
    _gated_mlp(out, p + "mlp.", hidden, int(_get(config, "intermediate_size")), bool(config.get("mlp_bias", False)))
    _norms(config, p, out)


def _mixtral_layer(config: dict[str, Any], i: int, p: str, out: Shapes) -> None:
    _gqa_attention(config, p, out)
    hidden = int(_get(config, "hidden_size"))
    inter = int(_get(config, "intermediate_size"))
    experts = int(_get(config, "num_local_experts"))
    m = p + "block_sparse_moe."
    _linear(out, m + "gate", experts, hidden)
    for e in range(experts):
        x = f"{m}experts.{e}."
        _linear(out, x + "w1", inter, hidden)
        _linear(out, x + "w2", hidden, inter)
        _linear(out, x + "w3", inter, hidden)
    _norms(config, p, out)


def _qwen_moe_is_sparse(config: dict[str, Any], i: int) -> bool:
    experts = int(config.get("num_experts") or 0)
    step = int(config.get("decoder_sparse_step") or 1)
    return i not in (config.get("mlp_only_layers") or []) and experts > 0 and (i + 1) % step == 0


def _qwen_moe_layer(config: dict[str, Any], i: int, p: str, out: Shapes) -> None:
    _gqa_attention(config, p, out)
    hidden = int(_get(config, "hidden_size"))
    m = p + "mlp."
    if not _qwen_moe_is_sparse(config, i):
        _gated_mlp(out, m, hidden, int(_get(config, "intermediate_size")))
    else:
        experts = int(_get(config, "num_experts"))
        inter = int(_get(config, "moe_intermediate_size"))
        _linear(out, m + "gate", experts, hidden)
        for e in range(experts):
            _gated_mlp(out, f"{m}experts.{e}.", hidden, inter)
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        if shared:
            _gated_mlp(out, m + "shared_expert.", hidden, shared)
            _linear(out, m + "shared_expert_gate", 1, hidden)
    _norms(config, p, out)


def _deepseek_is_moe(config: dict[str, Any], i: int) -> bool:
    return (
        bool(config.get("n_routed_experts"))
        and i >= int(config.get("first_k_dense_replace") or 0)
        and i % int(config.get("moe_layer_freq") or 1) == 0
    )


def _deepseek_layer(config: dict[str, Any], i: int, p: str, out: Shapes) -> None:
    hidden = int(_get(config, "hidden_size"))
    nh = num_attention_heads(config)
    nope, rope = int(_get(config, "qk_nope_head_dim")), int(_get(config, "qk_rope_head_dim"))
    v_dim, kv_rank = int(_get(config, "v_head_dim")), int(_get(config, "kv_lora_rank"))
    bias = bool(config.get("attention_bias", False))
    a = p + "self_attn."
    q_rank = config.get("q_lora_rank")
    if q_rank is None:
        _linear(out, a + "q_proj", nh * (nope + rope), hidden)
    else:
        _linear(out, a + "q_a_proj", int(q_rank), hidden, bias)
        out[a + "q_a_layernorm.weight"] = (int(q_rank),)
        _linear(out, a + "q_b_proj", nh * (nope + rope), int(q_rank))
    _linear(out, a + "kv_a_proj_with_mqa", kv_rank + rope, hidden, bias)
    out[a + "kv_a_layernorm.weight"] = (kv_rank,)
    _linear(out, a + "kv_b_proj", nh * (nope + v_dim), kv_rank)
    _linear(out, a + "o_proj", hidden, nh * v_dim, bias)
    m = p + "mlp."
    if not _deepseek_is_moe(config, i):
        _gated_mlp(out, m, hidden, int(_get(config, "intermediate_size")))
    else:
        experts = int(_get(config, "n_routed_experts"))
        inter = int(_get(config, "moe_intermediate_size"))
        _linear(out, m + "gate", experts, hidden)
        topk_method = config.get("topk_method", "noaux_tc" if architecture(config) == "DeepseekV3ForCausalLM" else "greedy")
        if topk_method == "noaux_tc":
            out[m + "gate.e_score_correction_bias"] = (experts,)
        for e in range(experts):
            _gated_mlp(out, f"{m}experts.{e}.", hidden, inter)
        shared = int(config.get("n_shared_experts") or 0)
        if shared:
            _gated_mlp(out, m + "shared_experts.", hidden, inter * shared)
    _norms(config, p, out)


def routed_experts(config: dict[str, Any]) -> int:
    """Routed experts per MoE layer (0 for dense models); shared experts are not routed."""
    arch = architecture(config)
    if arch in MIXTRAL:
        return int(_get(config, "num_local_experts"))
    if arch in QWEN_MOE:
        return int(config.get("num_experts") or 0)
    if arch in DEEPSEEK:
        return int(config.get("n_routed_experts") or 0)
    return 0


_BUILDERS: dict[str, Callable[[dict[str, Any], int, str, Shapes], None]] = {
    **{a: _llama_layer for a in LLAMA_LIKE},
    **{a: _mixtral_layer for a in MIXTRAL},
    **{a: _qwen_moe_layer for a in QWEN_MOE},
    **{a: _deepseek_layer for a in DEEPSEEK},
}
