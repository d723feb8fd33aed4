"""The embedded model's architectures: for each, the config.json it writes and how its weights are drawn.

One :class:`TinyArch` per architecture in :data:`TINY_ARCHS`. The dense Llama keeps its own weight
list (its bytes, and so every cached dense model, predate the MoE targets). The MoE targets take
their tensor list from :func:`day0.model.arch_tensors.expected_tensors`, the same list the weights stage
audits a checkpoint against, so a builder and an auditor cannot disagree about a name or a shape.

The configs write every key whose default differs between vLLM and transformers, so both serve
the same function: docs/engine.md ("The MoE targets") says which keys and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from day0.config.tiny import TinySpec

# The router's weights are drawn wider than the rest (std 0.1 against 0.02): with hidden states
# RMS-normalised to ~1, a router logit then has a std of ~1.6 over hidden 256, so top-k selection
# is decisive and two correct implementations route every token alike (a 0.02 router leaves
# experts within float noise of each other, a near-tie in routing that no output margin shows).
ROUTER_STD = 0.1
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class TinyArch:
    name: str
    config: Callable[[TinySpec, dict[str, Any]], dict[str, Any]]  # spec, shared keys -> config.json
    weights: Callable[[TinySpec, dict[str, Any]], dict[str, Any]]  # spec, config -> name -> tensor


def _common(spec: TinySpec, vocab_size: int, bos_token_id: int, eos_token_id: int) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }


def _llama_config(spec: TinySpec, common: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **common,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "rms_norm_eps": 1e-5,
        "mlp_bias": False,
    }


def _qwen3_moe_config(spec: TinySpec, common: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **common,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "rms_norm_eps": 1e-6,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(spec.first_k_dense_replace)),
        "use_sliding_window": False,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
    }


def _deepseek_v3_config(spec: TinySpec, common: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **common,
        "num_key_value_heads": spec.num_attention_heads,  # MLA: one latent; HF counts the heads
        "rms_norm_eps": 1e-6,
        "n_routed_experts": spec.num_experts,
        "n_shared_experts": spec.n_shared_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "first_k_dense_replace": spec.first_k_dense_replace,
        "moe_layer_freq": 1,
        # vLLM reads a missing n_group/topk_group as no grouping; transformers' defaults are 8 and 4
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",  # without it vLLM has no e_score_correction_bias and the load fails
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "kv_lora_rank": spec.kv_lora_rank,
        "q_lora_rank": spec.q_lora_rank,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "head_dim": spec.qk_rope_head_dim,
        "rope_interleave": True,
        "num_nextn_predict_layers": 0,  # no MTP layer is built
    }


def _llama_weights(spec: TinySpec, config: dict[str, Any]) -> dict[str, Any]:
    """The dense Llama's weights, drawn in the order every cached dense model was drawn in."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    h, i, vocab = spec.hidden_size, spec.intermediate_size, config["vocab_size"]
    kv = spec.num_key_value_heads * (h // spec.num_attention_heads)

    def normal(*shape: int) -> "torch.Tensor":
        return (torch.randn(*shape, generator=gen) * WEIGHT_STD).contiguous()

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, h)}
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        tensors[p + "input_layernorm.weight"] = torch.ones(h)
        tensors[p + "self_attn.q_proj.weight"] = normal(h, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, h)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(h)
        tensors[p + "mlp.gate_proj.weight"] = normal(i, h)
        tensors[p + "mlp.up_proj.weight"] = normal(i, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, i)
    tensors["model.norm.weight"] = torch.ones(h)
    tensors["lm_head.weight"] = normal(vocab, h)
    return tensors


def _listed_weights(spec: TinySpec, config: dict[str, Any]) -> dict[str, Any]:
    """Weights for every tensor the architecture lists, in its order: norms one, routers wide,
    the correction bias zero but for a planted one, the rest small normal."""
    import torch

    from day0.model.arch_tensors import expected_tensors

    gen = torch.Generator().manual_seed(spec.seed)
    planted = {int(k): v for k, v in spec.router_bias.items()}
    tensors: dict[str, Any] = {}
    for name, shape in expected_tensors(config).items():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith("e_score_correction_bias"):
            bias = torch.zeros(shape)
            for expert, value in planted.items():
                bias[expert] = value
            tensors[name] = bias
        elif name.endswith("mlp.gate.weight"):
            tensors[name] = (torch.randn(*shape, generator=gen) * ROUTER_STD).contiguous()
        else:
            tensors[name] = (torch.randn(*shape, generator=gen) * WEIGHT_STD).contiguous()
    return tensors


TINY_ARCHS: dict[str, TinyArch] = {a.name: a for a in (
    TinyArch("llama", _llama_config, _llama_weights),
    TinyArch("qwen3-moe", _qwen3_moe_config, _listed_weights),
    TinyArch("deepseek-v3", _deepseek_v3_config, _listed_weights),
)}


def model_config(spec: TinySpec, *, vocab_size: int, bos_token_id: int, eos_token_id: int) -> dict[str, Any]:
    """config.json for ``spec``, in the layout of the architecture's public checkpoints."""
    return TINY_ARCHS[spec.arch].config(spec, _common(spec, vocab_size, bos_token_id, eos_token_id))


def weights(spec: TinySpec, config: dict[str, Any]) -> dict[str, Any]:
    return TINY_ARCHS[spec.arch].weights(spec, config)
