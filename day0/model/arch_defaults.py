"""What vLLM 0.32 reads for a config.json key the file leaves out, per architecture day0 models.

Why: vLLM does not read config.json itself; it loads it through the transformers config class of
its ``model_type``, whose field defaults fill every key the file omits, and its model files
``getattr(config, key, default)`` the few keys that class lacks. day0 reads the JSON directly, so
a default of its own would plan a different model than the one vLLM builds (a DeepseekV3
config.json without ``first_k_dense_replace`` is 3 dense layers to vLLM, not 0), and the weights
and experts stages would then refuse a healthy engine.

The table is static on purpose: preflight must stay fast and must not import transformers.
``tests/model/test_arch_defaults.py`` holds it to transformers' classes (and to vLLM's
``getattr`` defaults, cited by file and line) so it cannot drift silently.

A value of ``None`` means the class itself leaves the key ``None`` (then derived or treated as
unset), which day0 reads exactly like a ``null`` in config.json: the caller's own meaning of
"not set" (``num_key_value_heads`` -> the attention heads, ``head_dim`` -> hidden / heads,
``q_lora_rank`` -> no query compression). An explicit ``null`` in config.json never reaches this
table: where transformers keeps it ``None`` rather than its default, that is what vLLM reads
(DeepSeek-V2-Lite's ``"q_lora_rank": null`` means no ``q_a_proj``, not 1536); for most other keys
transformers 5.19 refuses a ``null`` outright, so no loadable config has one (docs/stages/preflight.md).
"""

from __future__ import annotations

from typing import Any

_DENSE = {"tie_word_embeddings": False, "mlp_bias": False}

ABSENT: dict[str, dict[str, Any]] = {
    # LlamaConfig: head_dim and num_key_value_heads None (derived in __post_init__)
    "LlamaForCausalLM": {**_DENSE, "num_key_value_heads": None, "head_dim": None, "attention_bias": False,
                         "max_position_embeddings": 2048},
    # MistralConfig: 8 KV heads whatever the head count; attention/mlp bias from llama.py's getattr
    "MistralForCausalLM": {**_DENSE, "num_key_value_heads": 8, "head_dim": None, "attention_bias": False,
                           "max_position_embeddings": 131072},
    # Qwen2Config: 32 KV heads; vLLM's qwen2.py sizes heads as hidden / heads and always has q/k/v biases
    "Qwen2ForCausalLM": {**_DENSE, "num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768},
    # Qwen3Config: head_dim 128, not hidden / heads
    "Qwen3ForCausalLM": {**_DENSE, "num_key_value_heads": 32, "head_dim": 128, "attention_bias": False,
                         "max_position_embeddings": 32768},
    "MixtralForCausalLM": {"tie_word_embeddings": False, "num_key_value_heads": 8, "head_dim": None,
                           "attention_bias": False, "num_experts_per_tok": 2, "max_position_embeddings": 131072},
    "Qwen2MoeForCausalLM": {"tie_word_embeddings": False, "num_key_value_heads": 16, "head_dim": None,
                            "qkv_bias": True, "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                            "shared_expert_intermediate_size": 5632, "max_position_embeddings": 32768},
    # Qwen3MoeConfig has no shared_expert_intermediate_size; vLLM's qwen3_moe.py getattr's 0
    "Qwen3MoeForCausalLM": {"tie_word_embeddings": False, "num_key_value_heads": 4, "head_dim": None,
                            "attention_bias": False, "num_experts": 128, "num_experts_per_tok": 8,
                            "decoder_sparse_step": 1, "shared_expert_intermediate_size": 0,
                            "max_position_embeddings": 32768},
    # DeepseekV2Config: num_experts_per_tok None (vLLM cannot build the MoE without it)
    "DeepseekV2ForCausalLM": {"tie_word_embeddings": False, "num_key_value_heads": None, "attention_bias": False,
                              "n_routed_experts": 64, "num_experts_per_tok": None, "n_shared_experts": 2,
                              "first_k_dense_replace": 0, "moe_layer_freq": 1, "q_lora_rank": 1536,
                              "topk_method": "greedy", "num_nextn_predict_layers": 0, "max_position_embeddings": 2048},
    # DeepseekV3Config: no topk_method field, and vLLM's deepseek_v2.py getattr's None (no e_score_correction_bias)
    "DeepseekV3ForCausalLM": {"tie_word_embeddings": False, "num_key_value_heads": 128, "attention_bias": False,
                              "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
                              "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
                              "topk_method": None, "num_nextn_predict_layers": 1, "max_position_embeddings": 4096},
}

KEYS = frozenset(k for table in ABSENT.values() for k in table)


def absent_default(architecture: str | None, key: str) -> Any:
    """The value vLLM ends up with when config.json has no ``key`` at all (None: unset, or not tabled)."""
    return ABSENT.get(architecture or "", {}).get(key)
