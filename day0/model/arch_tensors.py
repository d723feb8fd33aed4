"""Every tensor a Hugging Face checkpoint must hold, with its shape, listed from ``config.json``.

Why: the weights stage needs to know what a *complete* checkpoint looks like before it opens a
single shard, and the memory plan needs an exact parameter count for models far too large to
instantiate (a 2.8T MoE). Both come from the same per-architecture tensor list, so the count
and the shard check can never disagree. What the list reads from config.json (strictly, with
vLLM's defaults for absent keys) is :mod:`day0.model.archs`'s; this module only lays it out.

Shapes follow ``torch.nn.Linear`` (``[out_features, in_features]``) and the HF tensor names of
the unquantized checkpoint. DeepSeek multi-token-prediction (MTP) layers
(``num_nextn_predict_layers``) are *not* part of the model vLLM serves for plain decoding; they
are left out of :func:`expected_tensors` and :func:`parameter_count` unless ``include_mtp=True``
(DeepSeek-V3 is "671B" without its 14B MTP module, "685B" with it).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from day0.model import archs

Shapes = dict[str, tuple[int, ...]]

# DeepSeek-V3 lists ~92k tensors; a loop per tensor over far more would exhaust memory first.
MAX_TENSORS = 1_000_000  # tensors config.json may imply before day0 lists them one by one


def expected_tensors(config: dict[str, Any], *, include_mtp: bool = False) -> Shapes:
    """Every tensor name of the unquantized HF checkpoint mapped to its shape.

    ``include_mtp`` adds DeepSeek's multi-token-prediction layers (``model.layers.{L..}``), which
    the published checkpoints ship but vLLM only loads for speculative decoding.
    """
    arch = check_config(config)
    builder = _BUILDERS[arch]
    sparse = _sparse_rule(config)
    out: Shapes = {}
    hidden = archs.get(config, "hidden_size")
    vocab = archs.get(config, "vocab_size")
    out["model.embed_tokens.weight"] = (vocab, hidden)
    for i in range(archs.num_layers(config)):
        builder(config, f"model.layers.{i}.", out, sparse(i))
    out["model.norm.weight"] = (hidden,)
    if not archs.get(config, "tie_word_embeddings", False):
        out["lm_head.weight"] = (vocab, hidden)
    if include_mtp:
        for j in range(archs.num_mtp_layers(config)):
            i = archs.num_layers(config) + j
            p = f"model.layers.{i}."
            out[p + "embed_tokens.weight"] = (vocab, hidden)
            out[p + "enorm.weight"] = (hidden,)
            out[p + "hnorm.weight"] = (hidden,)
            out[p + "eh_proj.weight"] = (hidden, 2 * hidden)
            builder(config, p, out, sparse(i))
            out[p + "shared_head.norm.weight"] = (hidden,)
            out[p + "shared_head.head.weight"] = (vocab, hidden)
    return out


def parameter_count(config: dict[str, Any], *, include_mtp: bool = False) -> int:
    """Total parameters (all experts counted), MTP layers excluded unless asked for."""
    return sum(math.prod(s) for s in expected_tensors(config, include_mtp=include_mtp).values())


def active_parameter_count(config: dict[str, Any]) -> int:
    """Parameters touched per token: routed experts counted ``num_experts_per_tok`` times, not all."""
    total = 0
    routed = archs.routed_experts(config)
    per_tok = archs.experts_per_token(config)
    for name, shape in expected_tensors(config).items():
        n = math.prod(shape)
        if routed and ".experts." in name:
            n = n * per_tok / routed
        total += n
    return int(round(total))


def tensor_count_bound(config: dict[str, Any]) -> int:
    """At most how many tensors config.json implies, computed without listing them.

    Per layer: attention <= 10 (q, k, v, o with biases, q/k norms), MLP <= 6, a router with its bias,
    a shared expert <= 4, 2 norms, 7 for an MTP layer; plus 3 per routed expert.
    """
    layers = archs.num_layers(config) + archs.num_mtp_layers(config)
    return 8 + layers * (32 + 3 * archs.routed_experts(config))


def check_config(config: Any) -> str:
    """The architecture, once every key its tensor list needs is present, typed and in range.

    Raises :class:`~day0.model.archs.ConfigError` naming the key. A dry run builds one layer of
    each kind (dense and MoE), so a missing key is found without listing every layer, and the
    implied tensor count is bounded by :data:`MAX_TENSORS` before anything is listed.
    """
    archs.check_types(config)
    arch = archs.architecture(config)
    layers = archs.num_layers(config)
    bound = tensor_count_bound(config)
    if bound > MAX_TENSORS:
        experts = archs.routed_experts(config)
        raise archs.ConfigError("num_hidden_layers",
                                f"{layers} layers x {experts} routed experts imply up to {bound} tensors, "
                                f"more than day0 lists (at most {MAX_TENSORS})")
    sparse = _sparse_rule(config)
    kinds: set[bool] = set()
    for i in range(layers):  # at most MAX_LAYERS cheap tests; stops once both kinds were built
        kind = sparse(i)
        if kind not in kinds:
            kinds.add(kind)
            _BUILDERS[arch](config, f"model.layers.{i}.", {}, kind)
            if len(kinds) == 2:
                break
    archs.get(config, "vocab_size")
    archs.head_dim(config)
    archs.num_kv_heads(config)
    return arch


def moe_layer_count(config: dict[str, Any]) -> int:
    """Decoder layers whose MLP is a routed MoE (the rest are dense), as the tensor list builds them."""
    if not archs.routed_experts(config):
        return 0
    sparse = _sparse_rule(config)
    return sum(1 for i in range(archs.num_layers(config)) if sparse(i))


def _sparse_rule(config: dict[str, Any]) -> Callable[[int], bool]:
    """Which layers are MoE layers, as a test on the layer number, the config read once (none
    without routed experts)."""
    if not archs.routed_experts(config):
        return lambda i: False
    return archs.family(config).sparse(config)


# --------------------------------------------------------------------------- per-architecture layers


def _linear(out: Shapes, name: str, out_f: int, in_f: int, bias: bool = False) -> None:
    out[name + ".weight"] = (out_f, in_f)
    if bias:
        out[name + ".bias"] = (out_f,)


def _gqa_attention(config: dict[str, Any], p: str, out: Shapes) -> None:
    arch = archs.architecture(config)
    hidden = archs.get(config, "hidden_size")
    hd = archs.head_dim(config)
    nh, nkv = archs.num_attention_heads(config), archs.num_kv_heads(config)
    if arch == "Qwen2ForCausalLM":
        qkv_bias, o_bias = True, False
    elif arch == "Qwen2MoeForCausalLM":
        qkv_bias, o_bias = archs.get(config, "qkv_bias", True), False
    else:
        qkv_bias = o_bias = archs.get(config, "attention_bias", False)
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
    hidden = archs.get(config, "hidden_size")
    out[p + "input_layernorm.weight"] = (hidden,)
    out[p + "post_attention_layernorm.weight"] = (hidden,)


def _llama_layer(config: dict[str, Any], p: str, out: Shapes, sparse: bool) -> None:
    _gqa_attention(config, p, out)
    hidden = archs.get(config, "hidden_size")
    inter = archs.get(config, "intermediate_size")
    _gated_mlp(out, p + "mlp.", hidden, inter, archs.get(config, "mlp_bias", False))
    _norms(config, p, out)


def _mixtral_layer(config: dict[str, Any], p: str, out: Shapes, sparse: bool) -> None:
    _gqa_attention(config, p, out)
    hidden = archs.get(config, "hidden_size")
    inter = archs.get(config, "intermediate_size")
    experts = archs.get(config, "num_local_experts")
    m = p + "block_sparse_moe."
    _linear(out, m + "gate", experts, hidden)
    for e in range(experts):
        x = f"{m}experts.{e}."
        _linear(out, x + "w1", inter, hidden)
        _linear(out, x + "w2", hidden, inter)
        _linear(out, x + "w3", inter, hidden)
    _norms(config, p, out)


def _qwen_moe_layer(config: dict[str, Any], p: str, out: Shapes, sparse: bool) -> None:
    _gqa_attention(config, p, out)
    hidden = archs.get(config, "hidden_size")
    m = p + "mlp."
    if not sparse:
        _gated_mlp(out, m, hidden, archs.get(config, "intermediate_size"))
    else:
        experts = archs.get(config, "num_experts")
        inter = archs.get(config, "moe_intermediate_size")
        _linear(out, m + "gate", experts, hidden)
        for e in range(experts):
            _gated_mlp(out, f"{m}experts.{e}.", hidden, inter)
        shared = archs.get(config, "shared_expert_intermediate_size", 0)
        if shared:
            _gated_mlp(out, m + "shared_expert.", hidden, shared)
            _linear(out, m + "shared_expert_gate", 1, hidden)
    _norms(config, p, out)


def _deepseek_layer(config: dict[str, Any], p: str, out: Shapes, sparse: bool) -> None:
    hidden = archs.get(config, "hidden_size")
    nh = archs.num_attention_heads(config)
    nope, rope = archs.get(config, "qk_nope_head_dim"), archs.get(config, "qk_rope_head_dim")
    v_dim, kv_rank = archs.get(config, "v_head_dim"), archs.get(config, "kv_lora_rank")
    bias = archs.get(config, "attention_bias", False)
    a = p + "self_attn."
    q_rank = archs.get(config, "q_lora_rank", None)
    if q_rank is None:
        _linear(out, a + "q_proj", nh * (nope + rope), hidden)
    else:
        _linear(out, a + "q_a_proj", q_rank, hidden, bias)
        out[a + "q_a_layernorm.weight"] = (q_rank,)
        _linear(out, a + "q_b_proj", nh * (nope + rope), q_rank)
    _linear(out, a + "kv_a_proj_with_mqa", kv_rank + rope, hidden, bias)
    out[a + "kv_a_layernorm.weight"] = (kv_rank,)
    _linear(out, a + "kv_b_proj", nh * (nope + v_dim), kv_rank)
    _linear(out, a + "o_proj", hidden, nh * v_dim, bias)
    m = p + "mlp."
    if not sparse:
        _gated_mlp(out, m, hidden, archs.get(config, "intermediate_size"))
    else:
        experts = archs.get(config, "n_routed_experts")
        inter = archs.get(config, "moe_intermediate_size")
        _linear(out, m + "gate", experts, hidden)
        if archs.get(config, "topk_method", None) == "noaux_tc":  # vLLM adds the bias only then
            out[m + "gate.e_score_correction_bias"] = (experts,)
        for e in range(experts):
            _gated_mlp(out, f"{m}experts.{e}.", hidden, inter)
        shared = archs.get(config, "n_shared_experts", 0)
        if shared:
            _gated_mlp(out, m + "shared_experts.", hidden, inter * shared)
    _norms(config, p, out)


_BUILDERS: dict[str, Callable[[dict[str, Any], str, Shapes, bool], None]] = {
    **{a: _llama_layer for a in archs.LLAMA_LIKE},
    **{a: _mixtral_layer for a in archs.MIXTRAL},
    **{a: _qwen_moe_layer for a in archs.QWEN_MOE},
    **{a: _deepseek_layer for a in archs.DEEPSEEK},
}
