"""The per-rank arithmetic of the memory plan: bytes per dtype, where each tensor sits under
TP x PP, and the weights and KV pool of every pipeline stage on one TP rank.

It mirrors vLLM 0.32 (see :mod:`day0.model.plan` for the rules); every function here prices one
layout, so the search for the smallest layout that fits is a loop over them.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from day0.model import arch_tensors, archs
from day0.model.plan_model import StagePlan
from day0.model.quantization import WeightScheme, stays_unquantized

GIB = 1024**3
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE for VocabParallelEmbedding / ParallelLMHead
MLA_FP8_DS_BYTES = 656  # fp8_ds_mla: 512 fp8 latent + 4 fp32 scales + 64 bf16 rope values

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPE_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}


# --------------------------------------------------------------------------- dtypes


def resolve_dtype(dtype: str, config: dict[str, Any]) -> str:
    """vLLM's dtype resolution: ``auto`` takes the checkpoint's dtype, float32 checkpoints run in bf16."""
    d = str(dtype).lower()
    if d == "auto":
        d = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").replace("torch.", "")
        d = DTYPE_ALIASES.get(d, d)
        return "bfloat16" if d == "float32" else d if d in DTYPE_BYTES else "bfloat16"
    d = DTYPE_ALIASES.get(d, d)
    if d not in DTYPE_BYTES:
        raise ValueError(
            f"dtype={dtype!r} is not a vLLM dtype (one of {', '.join(VLLM_DTYPES)}); "
            "INT4/INT8/FP8 weights are chosen with quantization= (e.g. compressed-tensors, awq, gptq, fp8)"
        )
    return d


def kv_dtype_bytes(kv_cache_dtype: str, dtype: str) -> int:
    k = str(kv_cache_dtype).lower()
    if k == "auto":
        return DTYPE_BYTES[dtype]
    if k in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[k]
    if k == "fp8_ds_mla":
        return 1
    raise ValueError(
        f"kv_cache_dtype={kv_cache_dtype!r}: day0 sizes auto, fp8_ds_mla, " + ", ".join(KV_DTYPE_BYTES)
    )


def kv_layer_bytes(config: dict[str, Any], kv_cache_dtype: str, dtype: str, tp: int) -> int:
    """KV bytes per token of one layer on one TP rank."""
    if archs.is_mla(config) and str(kv_cache_dtype).lower() == "fp8_ds_mla":
        return MLA_FP8_DS_BYTES
    b = kv_dtype_bytes(kv_cache_dtype, dtype)
    return archs.kv_bytes_per_token(config, b, tp=tp, pp=archs.num_layers(config))  # exactly one layer


# --------------------------------------------------------------------------- per-tensor placement

_REPLICATED_SUFFIXES = ("norm.weight", "e_score_correction_bias", ".mlp.gate.weight", "block_sparse_moe.gate.weight",
                        "shared_expert_gate.weight")
_REPLICATED_PARTS = (".q_a_proj.", ".kv_a_proj_with_mqa.")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass
class Footprint:
    """Bytes per layer split by how TP places them, so many layouts can be priced in O(layers)."""

    replicated: list[float]
    split: list[float]
    kv_proj: list[float]  # k/v projections: split by KV head, replicated below one head per rank
    embed: float
    lm_head: float  # 0 when tied (pp == 1 uses the embedding)
    final_norm: float
    total: float
    parameters: int = 0
    active_parameters: float = 0.0
    experts: list[float] = field(default_factory=list)  # all routed experts of each layer (0 for dense layers)
    routed: int = 0  # routed experts per MoE layer
    routed_parameters: int = 0  # parameters of every routed expert of every layer
    _prefix: dict[tuple[int, float, int], list[float]] = field(default_factory=dict, repr=False)

    def layer_bytes(self, tp: int, kv_share: float, start: int, end: int, ep: int = 1) -> float:
        """Bytes of layers [start, end) on one TP rank, from running totals kept per (tp, kv_share, ep).

        Why running totals: the search for the smallest layout prices hundreds of layouts, and
        summing every layer for each would cost layers x layouts. ``ep`` > 1 prices routed experts
        whole, ``ceil(E / ep)`` of them on the busiest rank (:func:`expert_share`).
        """
        key = (tp, kv_share, ep)
        prefix = self._prefix.get(key)
        if prefix is None:
            experts = self.experts or [0.0] * len(self.split)
            per_layer = (r + math.ceil(s / tp) + k * kv_share + expert_share(e, self.routed, tp, ep)
                         for r, s, k, e in zip(self.replicated, self.split, self.kv_proj, experts))
            prefix = self._prefix[key] = [0.0, *itertools.accumulate(per_layer)]
        return prefix[end] - prefix[start]

    def expert_bytes(self, tp: int, start: int, end: int, ep: int = 1) -> int:
        """Routed-expert bytes of layers [start, end) on the busiest rank (sliced by TP, or whole under EP)."""
        return int(math.ceil(sum(expert_share(e, self.routed, tp, ep) for e in self.experts[start:end])))


def ep_size_of(args: Mapping[str, Any]) -> int:
    """The expert-parallel group a vLLM engine's args make: TP x DP under ``enable_expert_parallel``
    (vLLM's ``FusedMoEParallelConfig``), else 1 (every TP rank holds a slice of every expert)."""
    if not args.get("enable_expert_parallel"):
        return 1
    return int(args.get("tensor_parallel_size") or 1) * int(args.get("data_parallel_size") or 1)


def experts_on_rank(routed: int, ep: int, ep_rank: int) -> int:
    """Routed experts one EP rank holds, as vLLM 0.32's ``determine_expert_map`` places them.

    ``E // ep`` each; the first ``E % ep`` ranks hold one more (the code, not its docstring, which
    says "the last rank"). vLLM accepts an uneven split unless EPLB is on.
    """
    return routed // ep + (1 if ep_rank < routed % ep else 0)


def expert_share(layer_experts: float, routed: int, tp: int, ep: int) -> float:
    """One layer's routed-expert bytes on the busiest rank.

    TP (``ep == 1``): every rank holds a ``1/TP`` slice of every expert. EP (vLLM's
    ``enable_expert_parallel``, ``ep = TP x DP``): the MoE layer runs with TP 1 and each rank holds
    whole experts, ``ceil(E / ep)`` on the busiest one.
    """
    if not layer_experts or not routed:
        return 0.0
    if ep > 1:
        return layer_experts * experts_on_rank(routed, ep, 0) / routed
    return float(math.ceil(layer_experts / tp))


_MLA_KV_B = ".self_attn.kv_b_proj.weight"


def footprint(config: dict[str, Any], scheme: WeightScheme, dtype_bytes: int) -> Footprint:
    n_layers = archs.num_layers(config)
    fp = Footprint([0.0] * n_layers, [0.0] * n_layers, [0.0] * n_layers, 0.0, 0.0, 0.0, 0.0,
                   experts=[0.0] * n_layers, routed=archs.routed_experts(config))
    routed = fp.routed
    mla = archs.is_mla(config)
    active_share = archs.experts_per_token(config) / routed if routed else 1.0
    for name, shape in arch_tensors.expected_tensors(config).items():
        count = math.prod(shape)
        fp.parameters += count
        fp.active_parameters += count * active_share if routed and ".experts." in name else count
        quantize = not stays_unquantized(name, shape) and (not scheme.experts_only or ".experts." in name)
        size = scheme.linear_bytes(shape[0], shape[1], dtype_bytes) if quantize else math.prod(shape) * dtype_bytes
        fp.total += size
        m = _LAYER_RE.match(name)
        if m is None:
            if "embed_tokens" in name:
                fp.embed = size
            elif name.startswith("lm_head"):
                fp.lm_head = size
            else:
                fp.final_norm += size
            continue
        i = int(m.group(1))
        if name.endswith(_REPLICATED_SUFFIXES) or any(p in name for p in _REPLICATED_PARTS):
            fp.replicated[i] += size
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            fp.kv_proj[i] += size
        elif routed and ".experts." in name:  # routed only: shared experts ("shared_expert(s).") stay TP-split
            fp.experts[i] += size
            fp.routed_parameters += count
        else:
            fp.split[i] += size
        if mla and name.endswith(_MLA_KV_B):
            # vLLM's MLA keeps kv_b_proj for prefill and splits a copy into W_UK_T and W_UV for the
            # absorbed decode, in the activation dtype even when kv_b_proj is quantized
            # (mla_attention.py: split_kv_b_proj); measured: the tiny DeepSeek-V3 held exactly one
            # kv_b_proj per layer more than its checkpoint (15.59 vs 12.59 MiB)
            fp.split[i] += count * dtype_bytes
    return fp


def pp_partition(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) layer ranges per stage, as vLLM's ``get_pp_indices`` (extra layers to middle stages)."""
    if pp < 1 or pp > num_layers:
        raise ValueError(f"pipeline_parallel_size={pp} must be between 1 and the layer count ({num_layers})")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for n in parts:
        out.append((start, start + n))
        start += n
    return out


# --------------------------------------------------------------------------- one layout, stage by stage


def stage_weights(config: dict[str, Any], fp: Footprint, tp: int, start: int, end: int, first: bool, last: bool,
                  ep: int = 1) -> int:
    kv = archs.num_kv_heads(config)
    kv_share = max(1, kv // tp) / kv
    total = fp.layer_bytes(tp, kv_share, start, end, ep)
    vocab = int(config["vocab_size"])
    vocab_share = math.ceil(math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING / tp) / vocab
    if first:
        total += fp.embed * vocab_share
    if last:
        total += fp.final_norm
        head = fp.lm_head or (fp.embed if not first else 0.0)  # tied head: a copy on the last stage when PP > 1
        total += head * vocab_share
    return int(math.ceil(total))


def price_stages(
    config: dict[str, Any], fp: Footprint, *, tp: int, pp: int, kv_layer: int, budget: int, headroom: int, block_size: int,
    fixed_pool: int | None = None, ep: int = 1,
) -> tuple[StagePlan, ...]:
    """Every pipeline stage's busiest rank: weights (experts by TP slices, or whole under ``ep`` > 1) and KV pool."""
    stages = []
    parts = pp_partition(archs.num_layers(config), pp)
    for s, (start, end) in enumerate(parts):
        w = stage_weights(config, fp, tp, start, end, s == 0, s == pp - 1, ep)
        kv_tok = kv_layer * (end - start)
        pool = fixed_pool if fixed_pool is not None else max(0, budget - w - headroom)
        blocks = pool // (kv_tok * block_size) if kv_tok else 0
        stages.append(StagePlan(s, (start, end), w, kv_tok, pool, blocks, blocks * block_size,
                                expert_bytes=fp.expert_bytes(tp, start, end, ep) if fp.routed else 0))
    return tuple(stages)


def node_weights(stages: tuple[StagePlan, ...], tp: int, routed: int, ep: int, devices_per_node: int) -> list[tuple[int, int]]:
    """(weights, routed-expert weights) on each node, ranks placed as vLLM numbers them.

    Global rank = stage x TP + TP rank (TP innermost), node = rank // devices_per_node. Under EP an
    uneven split gives the first ``E % ep`` EP ranks one more expert; the stage figures are those
    of the busiest rank, so the others are scaled down to their own expert count.
    """
    ranks: list[tuple[int, int]] = []
    most = experts_on_rank(routed, ep, 0) if routed and ep > 1 else 0
    for st in stages:
        for r in range(tp):
            experts = st.expert_bytes
            if most:
                experts = st.expert_bytes * experts_on_rank(routed, ep, r % ep) // most
            ranks.append((st.weight_bytes - st.expert_bytes + experts, experts))
    nodes = [ranks[i:i + devices_per_node] for i in range(0, len(ranks), devices_per_node)]
    return [(sum(w for w, _ in n), sum(e for _, e in n)) for n in nodes]


def scope(ranks: int, devices_per_node: int) -> str:
    """The verdict of a layout that fits: one device, one node, or more."""
    if ranks <= 1:
        return "fits_one_device"
    return "fits_one_node" if ranks <= devices_per_node else "needs_supernode"


def valid_tp(config: dict[str, Any], tp: int) -> bool:
    heads, kv = archs.num_attention_heads(config), archs.num_kv_heads(config)
    return heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)
