"""What a Hugging Face ``config.json`` says about the model vLLM builds from it, read strictly.

Why: the plan, the lint and the weights and experts stages size a model from its config.json
alone, before a weight is read; asking one module for its architecture, layers, heads, experts,
KV bytes per token and context length means every one of them reads each key the same way. The
tensor list those values imply (shard check, parameter count) is :mod:`day0.model.arch_tensors`.

A key config.json leaves out takes the default vLLM ends up with for that architecture
(:mod:`day0.model.arch_defaults`: transformers' config class, or vLLM's ``getattr``), never one
of day0's own; an explicit ``null`` is read as "not set", as transformers keeps it ``None``.

Every value is read strictly (:func:`get`, :func:`check_types`): config.json comes from
anywhere, and ``int("256")`` or ``bool("false")`` would quietly describe a model that is not the
one vLLM loads. Counts are bounded, because a loop per layer or per expert over ``1e9`` of them
would exhaust memory before it said anything.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from day0.model import arch_defaults

LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MIXTRAL = ("MixtralForCausalLM",)
QWEN_MOE = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
DEEPSEEK = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")

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

# Bounds far beyond any served model (DeepSeek-V3: 61 layers, 256 experts; day0's
# synthetic 2.8T: 112 layers, 512 experts) and far below what would exhaust memory or time.
MAX_LAYERS = 100_000
MAX_EXPERTS = 65_536
MAX_DIM = 1 << 31  # hidden sizes, vocabularies, head counts
MAX_LEN = 10**31  # positions (tokenizers write 1e30 for "no limit")


class ConfigError(ValueError):
    """A config.json value day0 cannot use: the key and what is wrong, one line."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config.json: {key}: {problem}")
        self.key = key
        self.problem = problem


def example_names() -> tuple[str, ...]:
    """Configs shipped with day0 (``day0/archconfigs/*.json``): public model cards plus a synthetic 2.8T MoE."""
    return tuple(sorted(p.stem for p in EXAMPLES_DIR.glob("*.json")))


def example_config(name: str) -> dict[str, Any]:
    path = EXAMPLES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"{path}: no such example config; known: {', '.join(example_names())}")
    return json.loads(path.read_text(encoding="utf-8"))


def known_architectures() -> tuple[str, ...]:
    return tuple(name for f in FAMILIES for name in f.names)


Rule = Callable[[dict[str, Any]], int]


def _none(config: dict[str, Any]) -> int:
    return 0


def _every_layer(config: dict[str, Any]) -> Callable[[int], bool]:
    return lambda i: True


@dataclass(frozen=True)
class Family:
    """What one family's config.json keys say about its experts, each read as vLLM's model class
    reads it; one spec per family, so a new MoE family is one entry, not a branch in each question."""

    names: tuple[str, ...]
    routed: Rule = _none  # routed experts per MoE layer (0: dense)
    shared: Rule = _none  # shared experts per MoE layer, asked only when some are routed
    mtp: Rule = _none  # multi-token-prediction layers after the decoder
    # which decoder layers are MoE layers (asked only when some experts are routed): config read once
    sparse: Callable[[dict[str, Any]], Callable[[int], bool]] = _every_layer
    mla: bool = False  # multi-head latent attention, where config.json sets kv_lora_rank


def _qwen_sparse(config: dict[str, Any]) -> Callable[[int], bool]:
    step = get(config, "decoder_sparse_step", 1)
    dense = frozenset(config.get("mlp_only_layers") or ())
    return lambda i: i not in dense and (i + 1) % step == 0


def _deepseek_sparse(config: dict[str, Any]) -> Callable[[int], bool]:
    first = get(config, "first_k_dense_replace", 0)
    freq = get(config, "moe_layer_freq", 1)
    return lambda i: i >= first and i % freq == 0


FAMILIES: tuple[Family, ...] = (
    Family(LLAMA_LIKE),
    Family(MIXTRAL, routed=lambda config: get(config, "num_local_experts")),
    # Qwen MoE: one shared_expert when shared_expert_intermediate_size > 0
    Family(QWEN_MOE, routed=lambda config: get(config, "num_experts", 0),
           shared=lambda config: 1 if get(config, "shared_expert_intermediate_size", 0) else 0, sparse=_qwen_sparse),
    # DeepSeek fuses n_shared_experts into one MLP of n x moe_intermediate_size
    Family(DEEPSEEK, routed=lambda config: get(config, "n_routed_experts", 0),
           shared=lambda config: get(config, "n_shared_experts", 0),
           mtp=lambda config: get(config, "num_nextn_predict_layers", 0), sparse=_deepseek_sparse, mla=True),
)
_BY_NAME = {name: f for f in FAMILIES for name in f.names}


def family(config: dict[str, Any]) -> Family:
    """The family of the architecture config.json names (:func:`architecture`'s error otherwise)."""
    return _BY_NAME[architecture(config)]


def architecture(config: dict[str, Any]) -> str:
    """The single architecture name day0 models; a clear error for anything else."""
    archs = _architecture_names(config)
    name = archs[0] if archs else _MODEL_TYPES.get(config.get("model_type") or "", "")
    if not name:
        raise ConfigError("architectures", "neither 'architectures' nor a known 'model_type' is set; known: "
                          + ", ".join(known_architectures()))
    if name not in known_architectures():
        raise ConfigError("architectures", f"architecture {reprlib.repr(name)[1:-1]} is not known to day0; known: "
                          + ", ".join(known_architectures()))
    return name


def _architecture_names(config: Any) -> list[str]:
    """``architectures`` as a list of strings (a lone string counts), checked; ``model_type`` too."""
    if not isinstance(config, dict):
        raise ConfigError("top level", f"expected an object, got {describe_value(config)}")
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError("architectures", f"expected a list of model class names, got {describe_value(archs)}")
    get(config, "model_type", None)
    return archs


def is_mla(config: dict[str, Any]) -> bool:
    """Multi-head latent attention caches one compressed latent per token, not K and V per head."""
    return family(config).mla and config.get("kv_lora_rank") is not None


def num_layers(config: dict[str, Any]) -> int:
    return get(config, "num_hidden_layers")


def num_attention_heads(config: dict[str, Any]) -> int:
    return get(config, "num_attention_heads")


def num_kv_heads(config: dict[str, Any]) -> int:
    """KV heads as vLLM counts them (MLA: the latent is shared, but vLLM reports the attention heads)."""
    value = get(config, "num_key_value_heads", None)
    return value if value is not None else num_attention_heads(config)


def head_dim(config: dict[str, Any]) -> int:
    value = get(config, "head_dim", None)
    if value:
        return value
    return get(config, "hidden_size") // num_attention_heads(config)


def num_mtp_layers(config: dict[str, Any]) -> int:
    return family(config).mtp(config)


def routed_experts(config: dict[str, Any]) -> int:
    """Routed experts per MoE layer (0 for dense models); shared experts are not routed."""
    return family(config).routed(config)


def shared_experts(config: dict[str, Any]) -> int:
    """Shared experts per MoE layer (every token passes them; they are never routed nor EP-split)."""
    return family(config).shared(config) if routed_experts(config) else 0


def experts_per_token(config: dict[str, Any]) -> int:
    """Routed experts each token goes through (``num_experts_per_tok``, top-k); 0 for dense models."""
    return get(config, "num_experts_per_tok", 0) if routed_experts(config) else 0


# --------------------------------------------------------------------------- KV cache and context length


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
        width = get(config, "kv_lora_rank") + get(config, "qk_rope_head_dim")
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
    whose ``max_position_embeddings`` is already the scaled length (llama3, yarn, longrope). An
    absent ``max_position_embeddings`` is the config class's default (Mistral 131072), as vLLM
    reads it; 2048 only where no key is set and day0 knows no class (vLLM's own fallback).
    """
    found = [(v, k if k in config else f"{k} (default)") for k in _MAX_LEN_KEYS
             if (v := get(config, k, None)) is not None]
    if config.get("model_max_length"):
        length, key = get(config, "model_max_length"), "model_max_length"
    elif found:
        length, key = min(found)
    else:
        return 2048, "default"
    rope = rope_parameters(config)
    if rope and "gemma3" not in str(config.get("model_type", "")):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        factor = _rope_factor(config, rope)
        if isinstance(rope_type, str) and rope_type not in _ROPE_ALREADY_SCALED and factor:
            return int(length * factor), f"{key} x rope factor {rope['factor']}"
    return length, key


def _rope_factor(config: dict[str, Any], rope: dict[str, Any]) -> float | None:
    """The rope scaling factor: a finite positive number (inf would make the length infinite)."""
    factor = rope.get("factor")
    if factor is None:
        return None
    where = "rope_parameters" if rope is config.get("rope_parameters") else "rope_scaling"
    if type(factor) not in (int, float) or not math.isfinite(factor) or not 0 < factor <= 1e6:
        raise ConfigError(f"{where}.factor", f"expected a finite number in (0, 1e6], got {describe_value(factor)}")
    return float(factor)


# --------------------------------------------------------------------------- strict reading

_REQUIRED = object()
# Integer keys day0 reads: (least, most). Null means "not set" (HF writes null for optional keys).
_INT_RANGES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, MAX_DIM), "intermediate_size": (1, MAX_DIM), "vocab_size": (1, MAX_DIM),
    "num_hidden_layers": (1, MAX_LAYERS), "num_attention_heads": (1, MAX_DIM),
    "num_key_value_heads": (1, MAX_DIM), "head_dim": (1, MAX_DIM),
    "num_local_experts": (1, MAX_EXPERTS), "num_experts": (0, MAX_EXPERTS), "n_routed_experts": (0, MAX_EXPERTS),
    "n_shared_experts": (0, MAX_EXPERTS), "num_experts_per_tok": (0, MAX_EXPERTS),
    "moe_intermediate_size": (1, MAX_DIM), "shared_expert_intermediate_size": (0, MAX_DIM),
    "decoder_sparse_step": (1, MAX_LAYERS), "first_k_dense_replace": (0, MAX_LAYERS), "moe_layer_freq": (1, MAX_LAYERS),
    "qk_nope_head_dim": (0, MAX_DIM), "qk_rope_head_dim": (0, MAX_DIM), "v_head_dim": (1, MAX_DIM),
    "kv_lora_rank": (1, MAX_DIM), "q_lora_rank": (1, MAX_DIM), "num_nextn_predict_layers": (0, 64),
    **{k: (1, MAX_LEN) for k in _MAX_LEN_KEYS},
}
_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias")
_STR_KEYS = ("model_type", "torch_dtype", "dtype", "topk_method")
_JSON_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array",
               dict: "an object", type(None): "null"}


def describe_value(value: Any) -> str:
    """A value as a one-line message may quote it: short, and with its JSON type."""
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)):
        return f"{kind} of {len(value)}"
    return f"{reprlib.repr(value)} ({kind})"


def get(config: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    """``config[key]`` checked against its kind: integers are integers (not ``"256"``, ``256.0``
    or ``true``) within :data:`_INT_RANGES`, flags are booleans.

    An absent key is the architecture's default in :mod:`day0.model.arch_defaults` (what vLLM
    reads through transformers' config class), so every caller sees the same model vLLM builds;
    ``default`` is what an explicit null (or a class default of None) means to the caller. Public
    so that the tensor list (:mod:`day0.model.arch_tensors`) reads every key exactly this way.
    """
    value = config.get(key)
    if value is None and key in arch_defaults.KEYS and key not in config:
        value = arch_defaults.absent_default(_known_architecture(config), key)
    if value is None:
        if default is _REQUIRED:
            arch = config.get("architectures")
            needed = f" (needed for {reprlib.repr(arch)})" if arch else ""
            raise ConfigError(key, f"missing{needed}")
        return default
    if key in _INT_RANGES:
        least, most = _INT_RANGES[key]
        if type(value) is not int:  # bool is an int to Python, not to a config
            raise ConfigError(key, f"expected an integer, got {describe_value(value)}")
        if value < least:
            raise ConfigError(key, f"{value} is below {least}")
        if value > most:
            raise ConfigError(key, f"{value} is more than any model day0 plans for (at most {most})")
    elif key in _BOOL_KEYS and type(value) is not bool:
        raise ConfigError(key, f"expected true or false, got {describe_value(value)}")
    elif key in _STR_KEYS and not isinstance(value, str):
        raise ConfigError(key, f"expected a string, got {describe_value(value)}")
    return value


def _known_architecture(config: dict[str, Any]) -> str | None:
    """The architecture when day0 knows it, else None: an unknown model reads no table default,
    and :func:`check_types` still types its keys (the error, if any, is :func:`architecture`'s)."""
    try:
        return architecture(config)
    except ConfigError:
        return None


def check_types(config: Any) -> None:
    """Every key day0 reads that config.json sets has the right type and range (whatever the model).

    Why apart from :func:`day0.model.arch_tensors.check_config`: the weights audit still checks
    dtypes of a model day0 has no tensor list for, but a wrong type there is a finding all the same.
    """
    _architecture_names(config)
    for key in (*_INT_RANGES, *_BOOL_KEYS, *_STR_KEYS):
        get(config, key, None)
    only = config.get("mlp_only_layers")
    if only is not None and (not isinstance(only, list) or len(only) > MAX_LAYERS
                             or not all(type(i) is int and 0 <= i < MAX_LAYERS for i in only)):
        raise ConfigError("mlp_only_layers", f"expected an array of layer numbers, got {describe_value(only)}")
    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ConfigError(key, f"expected an object, got {describe_value(config[key])}")
        if config.get(key):
            _rope_factor(config, config[key])
    quant = config.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ConfigError("quantization_config", f"expected an object, got {describe_value(quant)}")
    derived_max_model_len(config)
