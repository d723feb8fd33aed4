"""day0's default for every config.json key it reads is the one vLLM 0.32 ends up with.

Why: vLLM reads config.json through transformers' config class for the ``model_type`` (its field
defaults fill what the file leaves out); day0 reads the JSON itself. A default of day0's own plans
a model vLLM does not build: a DeepseekV3 config.json without ``first_k_dense_replace`` made
every layer MoE for day0 (default 0) but layers 0-2 dense for vLLM (DeepseekV3Config: 3), and the
experts stage refused the healthy engine's router view. The reference here is transformers'
class, instantiated; where the class has no such attribute, vLLM's own ``getattr`` default in the
model file (cited by file and line, vllm 0.32.0).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from day0.model import arch_tensors, archs
from day0.stages.experts.routed import moe_layers

transformers = pytest.importorskip("transformers")

DERIVED = object()  # hidden_size // num_attention_heads, computed from the instance

# (architecture, key) -> vLLM 0.32's value where the transformers class has no such attribute
VLLM_GETATTR: dict[tuple[str, str], Any] = {
    ("MistralForCausalLM", "attention_bias"): False,  # llama.py:268 getattr(config, "attention_bias", False)
    ("MistralForCausalLM", "mlp_bias"): False,  # llama.py:305 getattr(config, "mlp_bias", False)
    ("Qwen2ForCausalLM", "head_dim"): DERIVED,  # qwen2.py:150 hidden_size // total_num_heads
    ("Qwen2ForCausalLM", "mlp_bias"): False,  # qwen2.py:94,101 Qwen2MLP bias=False
    ("Qwen3ForCausalLM", "mlp_bias"): False,  # qwen3.py:58 Qwen3MLP is Qwen2MLP (bias=False)
    ("MixtralForCausalLM", "attention_bias"): False,  # mixtral.py:185,192 qkv/o bias=False
    ("Qwen2MoeForCausalLM", "head_dim"): DERIVED,  # qwen2_moe.py:225 hidden_size // total_num_heads
    ("Qwen3MoeForCausalLM", "head_dim"): DERIVED,  # qwen3_moe.py:377 getattr None; :277 `or hidden // heads`
    ("Qwen3MoeForCausalLM", "shared_expert_intermediate_size"): 0,  # qwen3_moe.py:177-178 getattr(..., 0)
    ("DeepseekV2ForCausalLM", "moe_layer_freq"): 1,  # deepseek_v2.py:1269 getattr(config, "moe_layer_freq", 1)
    ("DeepseekV3ForCausalLM", "moe_layer_freq"): 1,  # deepseek_v2.py:1269
    ("DeepseekV3ForCausalLM", "topk_method"): None,  # deepseek_v2.py:327 getattr(config, "topk_method", None)
    # deepseek_v2.py never reads it; deepseek_mtp.py:152 only for speculative decoding
    ("DeepseekV2ForCausalLM", "num_nextn_predict_layers"): 0,
}

_DENSE = ("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias",
          "max_position_embeddings")
_QWEN_MOE = ("num_key_value_heads", "head_dim", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
             "decoder_sparse_step", "shared_expert_intermediate_size", "max_position_embeddings")
_DEEPSEEK = ("num_key_value_heads", "tie_word_embeddings", "attention_bias", "n_routed_experts",
             "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
             "topk_method", "num_nextn_predict_layers", "max_position_embeddings")
# The keys archs.py and arch_tensors.py read with a default, per architecture (accessors, tensor builders).
READ: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": _DENSE,
    "MistralForCausalLM": _DENSE,
    "Qwen2ForCausalLM": tuple(k for k in _DENSE if k != "attention_bias"),  # q/k/v biases always
    "Qwen3ForCausalLM": _DENSE,
    "MixtralForCausalLM": ("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias",
                           "num_experts_per_tok", "max_position_embeddings"),
    "Qwen2MoeForCausalLM": (*_QWEN_MOE, "qkv_bias"),
    "Qwen3MoeForCausalLM": (*_QWEN_MOE, "attention_bias"),
    "DeepseekV2ForCausalLM": _DEEPSEEK,
    "DeepseekV3ForCausalLM": _DEEPSEEK,
}
# Read with a default but not a model property, or not what vLLM sizes the model with.
NOT_COMPARED = {
    "model_type": "names the config class",
    # DeepSeek: transformers overwrites head_dim with qk_rope_head_dim and vLLM sizes MLA from
    # qk_*_head_dim and kv_lora_rank; archs.head_dim() only sizes standard attention.
    "head_dim": "DeepSeek only",
}


def _null_defaults() -> dict[str, Any]:
    """Every key archs.py and arch_tensors.py read with ``get(config, "key", default)``, with that
    default: what an explicit null (or a class default of None) means to day0. One meaning per key."""
    source = "".join(Path(module.__file__).read_text(encoding="utf-8") for module in (archs, arch_tensors))
    found: dict[str, Any] = {"max_position_embeddings": None}  # read by derived_max_model_len
    for key, default in re.findall(r'\bget\(config, "(\w+)", ([^()]+?)\)', source):
        try:
            value = ast.literal_eval(default)
        except ValueError:  # a computed default: kept as its text, which no reference equals
            value = default
        assert found.setdefault(key, value) == value, f"{key}: read with defaults {found[key]!r} and {value!r}"
    return found


NULL = _null_defaults()
PROBES = ({}, {"hidden_size": 1200, "num_attention_heads": 12})  # the second tells derived from constant


def test_every_defaulted_key_is_compared_somewhere() -> None:
    compared = {k for keys in READ.values() for k in keys}
    assert set(NULL) == compared | set(NOT_COMPARED)
    assert set(READ) == set(archs.known_architectures())


def _instance(arch: str, probe: dict[str, Any]) -> Any:
    model_type = {v: k for k, v in archs._MODEL_TYPES.items()}[arch]
    return transformers.CONFIG_MAPPING[model_type](**probe)


def _reference(arch: str, key: str, inst: Any) -> Any:
    value = VLLM_GETATTR[(arch, key)] if (arch, key) in VLLM_GETATTR else getattr(inst, key)
    if value is None and key == "head_dim":  # mixtral.py:174-175, llama.py:158-159: None -> hidden // heads
        value = DERIVED
    if value is DERIVED:
        return inst.hidden_size // inst.num_attention_heads
    return NULL[key] if value is None else value  # None is unset, read like a null


def _day0(arch: str, key: str, inst: Any) -> Any:
    """What day0 reads for ``key`` from a config.json that leaves it out (heads and width as ``inst``'s)."""
    config = {"architectures": [arch], "hidden_size": inst.hidden_size, "num_attention_heads": inst.num_attention_heads}
    if key == "num_key_value_heads":
        return archs.num_kv_heads(config)
    if key == "head_dim":
        return archs.head_dim(config)
    if key == "max_position_embeddings":
        return archs.derived_max_model_len(config)[0]
    return archs.get(config, key, NULL[key])


@pytest.mark.parametrize("probe", PROBES, ids=["no-arguments", "other-heads"])
@pytest.mark.parametrize("arch,key", [(a, k) for a, keys in READ.items() for k in keys])
def test_absent_key_reads_as_vllm_does(arch: str, key: str, probe: dict[str, Any]) -> None:
    inst = _instance(arch, probe)
    if (arch, key) not in VLLM_GETATTR:
        assert hasattr(inst, key), f"{arch}: transformers has no {key}; cite vLLM's getattr default in VLLM_GETATTR"
    assert _day0(arch, key, inst) == _reference(arch, key, inst)


def _deepseek_v3_without(key: str) -> dict[str, Any]:
    config = archs.example_config("deepseek-v3")
    config.update(num_hidden_layers=6, n_routed_experts=4, num_experts_per_tok=2)
    del config[key]
    return config


def test_deepseek_v3_without_first_k_dense_replace_plans_layers_3_on_as_moe() -> None:
    """vLLM builds layers 0-2 dense (DeepseekV3Config.first_k_dense_replace = 3, deepseek_v2.py:1293-1296)."""
    config = _deepseek_v3_without("first_k_dense_replace")
    tensors = arch_tensors.expected_tensors(config)
    assert moe_layers(tensors) == [3, 4, 5]  # what the experts stage holds the router hook to
    assert arch_tensors.moe_layer_count(config) == 3
    for i in range(3):
        assert f"model.layers.{i}.mlp.gate_proj.weight" in tensors
        assert f"model.layers.{i}.mlp.gate.weight" not in tensors
    assert "model.layers.3.mlp.experts.0.gate_proj.weight" in tensors


def test_null_is_not_absent() -> None:
    """An explicit null stays None in transformers (V2-Lite's ``"q_lora_rank": null``: no q_a_proj);
    only an absent key takes the class default (1536)."""
    config = archs.example_config("deepseek-v3")
    config.update(num_hidden_layers=4, n_routed_experts=4, num_experts_per_tok=2, q_lora_rank=None)
    assert "model.layers.0.self_attn.q_proj.weight" in arch_tensors.expected_tensors(config)
    del config["q_lora_rank"]
    assert arch_tensors.expected_tensors(config)["model.layers.0.self_attn.q_a_proj.weight"] == (1536, 7168)


def test_unknown_architecture_reads_no_table_default() -> None:
    assert archs.derived_max_model_len({"architectures": ["FooForCausalLM"]}) == (2048, "default")
    archs.check_types({"architectures": ["FooForCausalLM"]})
