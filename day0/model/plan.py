"""Memory plan per rank for a model under TP x PP, computed from ``config.json`` before any launch.

Why: a 2.8T-parameter model on 32+ GPUs costs many minutes per failed start. The plan answers, in
seconds and without weights, whether the weights fit each rank, how many tokens the KV pool then
holds, whether that covers the target context x concurrency, and what the smallest layout is that
would fit. The arithmetic mirrors vLLM 0.32:

* per-rank budget = device memory x ``gpu_memory_utilization``; the KV pool is what is left after
  the rank's weights and an activation headroom (vLLM measures peak activations at start-up; the
  plan takes a figure, since it cannot run the model); ``kv_cache_memory_bytes`` (vLLM's arg, or
  ``VLLM_CPU_KVCACHE_SPACE`` on the CPU backend) fixes the pool instead, and then weights + headroom
  + pool must fit the whole device;
* layers are split over PP stages as ``vllm.distributed.utils.get_pp_indices`` splits them; the
  embedding sits on the first stage, final norm and lm_head on the last;
* TP splits every parallel linear layer and the vocabulary (padded to 64); norms, MoE routers and
  the MLA down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) are replicated; KV heads are
  replicated when there are fewer than TP ranks;
* KV per token and layer: ``2 x kv_heads_per_rank x head_dim x bytes``, or for MLA
  ``(kv_lora_rank + qk_rope_head_dim) x bytes`` on every TP rank (``fp8_ds_mla``: 656 bytes).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from day0.core.record import Check, measured
from day0.model import archs

GIB = 1024**3
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE for VocabParallelEmbedding / ParallelLMHead
MLA_FP8_DS_BYTES = 656  # fp8_ds_mla: 512 fp8 latent + 4 fp32 scales + 64 bf16 rope values

VERDICTS = ("fits_one_device", "fits_one_node", "needs_supernode", "does_not_fit")

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPE_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}


# --------------------------------------------------------------------------- quantization schemes


@dataclass(frozen=True)
class WeightScheme:
    """How a quantized linear weight is stored: packed bits plus per-group/block/channel scales."""

    name: str
    bits: int | None  # None: unquantized (stored in the model dtype)
    group_size: int | None = None  # scales per group of input features (int4/mxfp4/nvfp4)
    block: tuple[int, int] | None = None  # scales per [out, in] block (fp8 block-wise)
    per_channel: bool = False  # one scale per output channel
    scale_bytes: float = 4.0
    zero_points: bool = False  # awq/gptq keep packed zero points per group
    experts_only: bool = False  # experts_int8 quantizes MoE experts only

    def linear_bytes(self, out_f: int, in_f: int, dtype_bytes: int) -> float:
        if self.bits is None:
            return out_f * in_f * dtype_bytes
        packed = out_f * in_f * self.bits / 8
        if self.group_size:
            groups = out_f * math.ceil(in_f / self.group_size)
            extra = groups * self.scale_bytes + (groups * self.bits / 8 if self.zero_points else 0)
        elif self.block:
            extra = math.ceil(out_f / self.block[0]) * math.ceil(in_f / self.block[1]) * self.scale_bytes
        elif self.per_channel:
            extra = out_f * self.scale_bytes
        else:
            extra = self.scale_bytes  # one per-tensor scale
        return packed + extra


UNQUANTIZED = WeightScheme("none", None)

_FP8_NAMES = {"fp8", "fbgemm_fp8", "fp8_per_tensor", "fp8_per_channel", "fp8_per_block", "modelopt", "deepseek_v4_fp8"}
_INT_GROUP_NAMES = {"awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq", "moe_wna16"}
_PLAN_ONLY = {"w4a16": "compressed-tensors", "int4": "compressed-tensors", "w8a16": "compressed-tensors",
              "int8": "compressed-tensors", "w8a8": "compressed-tensors"}
SIZEABLE_QUANTIZATION = tuple(sorted(_FP8_NAMES | _INT_GROUP_NAMES | set(_PLAN_ONLY)
                                     | {"compressed-tensors", "experts_int8", "int8_per_channel_weight_only",
                                        "mxfp4", "gpt_oss_mxfp4", "modelopt_fp4", "nvfp4"}))


def weight_scheme(quantization: str | None, config: dict[str, Any]) -> WeightScheme:
    """The storage scheme vLLM would use: the ``quantization=`` arg, else the checkpoint's own.

    ``w4a16``/``int4``/``w8a8``/``int8`` are planning shorthands (the vLLM method for such a
    checkpoint is ``compressed-tensors``); they size int4 with group-128 scales, int8 per channel.
    """
    qc = config.get("quantization_config") or {}
    method = (quantization or qc.get("quant_method") or "").lower() or None
    if method is None or method == "none":
        return UNQUANTIZED
    if method in _FP8_NAMES:
        block = qc.get("weight_block_size") if qc.get("quant_method") == "fp8" else None
        if method == "fp8_per_block" and not block:
            block = [128, 128]
        if block:
            return WeightScheme(method, 8, block=(int(block[0]), int(block[1])))
        return WeightScheme(method, 8, per_channel=method == "fp8_per_channel")
    if method in _INT_GROUP_NAMES:
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        group = group if group > 0 else None  # gptq group_size=-1: one group per row
        return WeightScheme(method, bits, group_size=group, per_channel=group is None, scale_bytes=2, zero_points=True)
    if method in ("w4a16", "int4"):
        return WeightScheme(method, 4, group_size=128, scale_bytes=2)
    if method in ("w8a16", "int8", "w8a8", "int8_per_channel_weight_only"):
        return WeightScheme(method, 8, per_channel=True, scale_bytes=4)
    if method == "experts_int8":
        return WeightScheme(method, 8, per_channel=True, experts_only=True)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return WeightScheme(method, 4, group_size=32, scale_bytes=1)
    if method in ("modelopt_fp4", "nvfp4"):
        return WeightScheme(method, 4, group_size=16, scale_bytes=1)
    if method == "compressed-tensors":
        return _compressed_tensors_scheme(qc)
    raise ValueError(
        f"quantization={method!r}: day0 cannot size this scheme; it sizes: " + ", ".join(SIZEABLE_QUANTIZATION)
    )


def _compressed_tensors_scheme(qc: dict[str, Any]) -> WeightScheme:
    groups = qc.get("config_groups") or {}
    weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
    if not weights:  # no checkpoint description: the common W4A16 group-128 recipe
        return WeightScheme("compressed-tensors(w4a16)", 4, group_size=128, scale_bytes=2)
    bits = int(weights.get("num_bits") or 4)
    strategy = weights.get("strategy") or "group"
    name = f"compressed-tensors({weights.get('type', 'int')}{bits},{strategy})"
    zeros = not weights.get("symmetric", True)
    if strategy == "group":
        return WeightScheme(name, bits, group_size=int(weights.get("group_size") or 128), scale_bytes=2, zero_points=zeros)
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        return WeightScheme(name, bits, block=(int(block[0]), int(block[1])))
    return WeightScheme(name, bits, per_channel=strategy == "channel", zero_points=zeros)


def stays_unquantized(name: str, shape: tuple[int, ...]) -> bool:
    """Tensors every scheme keeps in the model dtype: embeddings, lm_head, norms, routers, biases."""
    return (
        len(shape) != 2
        or not name.endswith(".weight")
        or "embed_tokens" in name
        or name.startswith("lm_head")
        or name.endswith((".mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight"))
    )


# --------------------------------------------------------------------------- per-tensor placement

_REPLICATED_SUFFIXES = ("norm.weight", "e_score_correction_bias", ".mlp.gate.weight", "block_sparse_moe.gate.weight",
                        "shared_expert_gate.weight")
_REPLICATED_PARTS = (".q_a_proj.", ".kv_a_proj_with_mqa.")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass
class _Footprint:
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


def _footprint(config: dict[str, Any], scheme: WeightScheme, dtype_bytes: int) -> _Footprint:
    n_layers = archs.num_layers(config)
    fp = _Footprint([0.0] * n_layers, [0.0] * n_layers, [0.0] * n_layers, 0.0, 0.0, 0.0, 0.0)
    routed = archs.routed_experts(config)
    active_share = int(config.get("num_experts_per_tok") or 0) / routed if routed else 1.0
    for name, shape in archs.expected_tensors(config).items():
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
        else:
            fp.split[i] += size
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


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage, per TP rank."""

    stage: int
    layers: tuple[int, int]  # [start, end)
    weight_bytes: int
    kv_bytes_per_token: int
    kv_pool_bytes: int
    kv_blocks: int
    kv_tokens: int


@dataclass(frozen=True)
class Plan:
    """Per-rank memory figures for one layout; the busiest stage decides."""

    architecture: str
    parameters: int
    active_parameters: int
    tp: int
    pp: int
    dtype: str
    quantization: str
    kv_cache_dtype: str
    weight_bytes_total: int
    weight_bytes_per_rank: int
    kv_bytes_per_token: int  # per rank, busiest stage
    kv_bytes_per_token_model: int  # whole model on one rank (no TP/PP split)
    device_memory_bytes: int
    gpu_memory_utilization: float
    budget_bytes: int  # device memory x utilization (whole device when kv_cache_memory_bytes is set)
    activation_headroom_bytes: int
    weight_limit_bytes: int  # what the busiest rank's weights may take: budget - headroom (- fixed KV pool)
    kv_pool_bytes: int  # smallest stage pool
    kv_blocks: int
    kv_tokens: int  # tokens every stage can hold
    block_size: int
    max_model_len: int
    target_context: int
    target_concurrency: int
    tokens_needed: int  # target_concurrency x target_context rounded up to whole blocks
    devices_per_node: int
    nodes: int
    stages: tuple[StagePlan, ...]
    verdict: str
    reasons: tuple[str, ...]
    smallest_tp: int | None
    smallest_pp: int | None
    smallest_verdict: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ranks(self) -> int:
        return self.tp * self.pp

    @property
    def devices_available(self) -> int:
        return self.devices_per_node * self.nodes

    @property
    def fits(self) -> bool:
        return self.verdict != "does_not_fit"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = self.ranks
        data["devices_available"] = self.devices_available
        return data


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


def _kv_layer_bytes(config: dict[str, Any], kv_cache_dtype: str, dtype: str, tp: int) -> int:
    if archs.is_mla(config) and str(kv_cache_dtype).lower() == "fp8_ds_mla":
        return MLA_FP8_DS_BYTES
    b = kv_dtype_bytes(kv_cache_dtype, dtype)
    return archs.kv_bytes_per_token(config, b, tp=tp, pp=archs.num_layers(config))  # exactly one layer


def _stage_weights(config: dict[str, Any], fp: _Footprint, tp: int, start: int, end: int, first: bool, last: bool) -> int:
    kv = archs.num_kv_heads(config)
    kv_share = max(1, kv // tp) / kv
    total = 0.0
    for i in range(start, end):
        total += fp.replicated[i] + math.ceil(fp.split[i] / tp) + fp.kv_proj[i] * kv_share
    vocab = int(config["vocab_size"])
    vocab_share = math.ceil(math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING / tp) / vocab
    if first:
        total += fp.embed * vocab_share
    if last:
        total += fp.final_norm
        head = fp.lm_head or (fp.embed if not first else 0.0)  # tied head: a copy on the last stage when PP > 1
        total += head * vocab_share
    return int(math.ceil(total))


def _price(
    config: dict[str, Any], fp: _Footprint, *, tp: int, pp: int, kv_layer: int, budget: int, headroom: int, block_size: int,
    fixed_pool: int | None = None,
) -> tuple[StagePlan, ...]:
    stages = []
    parts = pp_partition(archs.num_layers(config), pp)
    for s, (start, end) in enumerate(parts):
        w = _stage_weights(config, fp, tp, start, end, s == 0, s == pp - 1)
        kv_tok = kv_layer * (end - start)
        pool = fixed_pool if fixed_pool is not None else max(0, budget - w - headroom)
        blocks = pool // (kv_tok * block_size) if kv_tok else 0
        stages.append(StagePlan(s, (start, end), w, kv_tok, pool, blocks, blocks * block_size))
    return tuple(stages)


def _scope(ranks: int, devices_per_node: int) -> str:
    if ranks <= 1:
        return "fits_one_device"
    return "fits_one_node" if ranks <= devices_per_node else "needs_supernode"


def _valid_tp(config: dict[str, Any], tp: int) -> bool:
    heads, kv = archs.num_attention_heads(config), archs.num_kv_heads(config)
    return heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def plan(
    config: dict[str, Any],
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    block_size: int | None = 16,
    gpu_memory_utilization: float = 0.92,
    device_memory_gib: float,
    devices_per_node: int = 8,
    nodes: int = 1,
    target_context: int | None = None,
    target_concurrency: int = 1,
    activation_headroom_gib: float = 2.0,
    kv_cache_memory_bytes: int | None = None,
) -> Plan:
    """Price one layout and search the smallest one that fits (TP within a node, then PP across nodes).

    ``device_memory_gib`` is the memory of one device (GiB, 2**30 bytes); ``activation_headroom_gib``
    covers peak activations, CUDA graphs and communicator buffers per rank, which vLLM measures at
    start-up and the plan cannot.
    """
    if tp < 1 or pp < 1 or devices_per_node < 1 or nodes < 1 or target_concurrency < 1:
        raise ValueError(f"plan: tp={tp}, pp={pp}, devices_per_node={devices_per_node}, nodes={nodes}, "
                         f"target_concurrency={target_concurrency} must all be >= 1")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    if device_memory_gib <= 0 or activation_headroom_gib < 0:
        raise ValueError(f"device_memory_gib={device_memory_gib} must be > 0 and activation_headroom_gib >= 0")
    block_size = int(block_size or 16)
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    arch = archs.architecture(config)
    layers = archs.num_layers(config)
    if pp > layers:
        raise ValueError(f"pipeline_parallel_size={pp} exceeds num_hidden_layers={layers} in config.json")
    notes: list[str] = []
    dt = resolve_dtype(dtype, config)
    scheme = weight_scheme(quantization, config)
    if quantization is None and scheme is not UNQUANTIZED:
        notes.append(f"weights sized as the checkpoint's quantization_config ({scheme.name})")
    if archs.num_mtp_layers(config):
        notes.append(f"{archs.num_mtp_layers(config)} MTP layer(s) (num_nextn_predict_layers) not counted: "
                     "vLLM loads them only for speculative decoding")
    derived_len, _ = archs.derived_max_model_len(config)
    max_len = int(max_model_len or derived_len)
    context = int(target_context or max_len)
    kv_layer = _kv_layer_bytes(config, kv_cache_dtype, dt, tp)
    headroom = int(activation_headroom_gib * GIB)
    if kv_cache_memory_bytes is not None:
        if kv_cache_memory_bytes < 0:
            raise ValueError(f"kv_cache_memory_bytes={kv_cache_memory_bytes} must be >= 0")
        budget = int(device_memory_gib * GIB)  # vLLM ignores gpu_memory_utilization when the pool is fixed
        weight_limit = budget - headroom - int(kv_cache_memory_bytes)
        usable_txt = f"{device_memory_gib:g} GiB - {kv_cache_memory_bytes / GIB:.1f} GiB fixed KV pool"
    else:
        budget = int(device_memory_gib * GIB * gpu_memory_utilization)
        weight_limit = budget - headroom
        usable_txt = f"{device_memory_gib:g} GiB x {gpu_memory_utilization:g}"
    fp = _footprint(config, scheme, DTYPE_BYTES[dt])
    needed = target_concurrency * math.ceil(context / block_size) * block_size
    max_len_blocks = math.ceil(max_len / block_size) * block_size

    def fits(stages: tuple[StagePlan, ...], ranks: int) -> list[str]:
        why = []
        if ranks > devices_per_node * nodes:
            why.append(f"{ranks} ranks > {devices_per_node * nodes} devices ({nodes} node(s) x {devices_per_node})")
        worst_w = max(s.weight_bytes for s in stages)
        if worst_w > weight_limit:
            why.append(f"weights {worst_w / GIB:.1f} GiB/rank + {headroom / GIB:.1f} GiB headroom > "
                       f"{(weight_limit + headroom) / GIB:.1f} GiB usable ({usable_txt})")
        tokens = min(s.kv_tokens for s in stages)
        if tokens < max_len_blocks:
            why.append(f"KV pool holds {tokens} tokens < max_model_len {max_len} (vLLM refuses to start)")
        if tokens < needed:
            why.append(f"KV pool holds {tokens} tokens < {needed} needed "
                       f"({target_concurrency} x {context} tokens)")
        return why

    price = dict(kv_layer=kv_layer, budget=budget, headroom=headroom, block_size=block_size,
                 fixed_pool=None if kv_cache_memory_bytes is None else int(kv_cache_memory_bytes))
    stages = _price(config, fp, tp=tp, pp=pp, **price)
    reasons = fits(stages, tp * pp)
    verdict = "does_not_fit" if reasons else _scope(tp * pp, devices_per_node)
    if tp > devices_per_node:
        notes.append(f"tp={tp} spans nodes: TP all-reduces would cross the inter-node network")

    smallest: tuple[int, int] | None = None
    # Candidate layouts as deployments are built: TP a power of two within a node; beyond one node,
    # the widest such TP per stage and PP stages across nodes.
    tps = [2**k for k in range(devices_per_node.bit_length()) if _valid_tp(config, 2**k)]
    candidates = []
    for t in tps:
        for p in range(1, min(layers, (devices_per_node * nodes) // t) + 1):
            if t * p <= devices_per_node or t == tps[-1]:
                candidates.append((t * p, p, t))
    for _, _, p, t in sorted((r, -t, p, t) for r, p, t in candidates):  # fewest devices, then widest TP
        kv_t = _kv_layer_bytes(config, kv_cache_dtype, dt, t)
        if not fits(_price(config, fp, tp=t, pp=p, **{**price, "kv_layer": kv_t}), t * p):
            smallest = (t, p)
            break
    smallest_verdict = _scope(smallest[0] * smallest[1], devices_per_node) if smallest else "does_not_fit"

    worst = max(stages, key=lambda s: s.weight_bytes)
    tightest = min(stages, key=lambda s: s.kv_tokens)
    return Plan(
        architecture=arch,
        parameters=fp.parameters,
        active_parameters=int(round(fp.active_parameters)),
        tp=tp,
        pp=pp,
        dtype=dt,
        quantization=scheme.name,
        kv_cache_dtype=str(kv_cache_dtype),
        weight_bytes_total=int(math.ceil(fp.total)),
        weight_bytes_per_rank=worst.weight_bytes,
        kv_bytes_per_token=max(s.kv_bytes_per_token for s in stages),
        kv_bytes_per_token_model=_kv_layer_bytes(config, kv_cache_dtype, dt, 1) * layers,
        device_memory_bytes=int(device_memory_gib * GIB),
        gpu_memory_utilization=float(gpu_memory_utilization),
        budget_bytes=budget,
        activation_headroom_bytes=headroom,
        weight_limit_bytes=weight_limit,
        kv_pool_bytes=min(s.kv_pool_bytes for s in stages),
        kv_blocks=tightest.kv_blocks,
        kv_tokens=tightest.kv_tokens,
        block_size=block_size,
        max_model_len=max_len,
        target_context=context,
        target_concurrency=int(target_concurrency),
        tokens_needed=needed,
        devices_per_node=devices_per_node,
        nodes=nodes,
        stages=stages,
        verdict=verdict,
        reasons=tuple(reasons),
        smallest_tp=smallest[0] if smallest else None,
        smallest_pp=smallest[1] if smallest else None,
        smallest_verdict=smallest_verdict,
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- profile glue

PLAN_KEYS = (
    "tp", "pp", "dtype", "quantization", "kv_cache_dtype", "max_model_len", "block_size",
    "gpu_memory_utilization", "device_memory_gib", "devices_per_node", "nodes", "target_context",
    "target_concurrency", "activation_headroom_gib", "kv_cache_memory_bytes",
)
_ALIASES = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "concurrency": "target_concurrency",
            "context": "target_context"}
_INT_KEYS = {"kv_cache_memory_bytes", "tp", "pp", "max_model_len", "block_size", "devices_per_node", "nodes", "target_context", "target_concurrency"}
_FLOAT_KEYS = {"gpu_memory_utilization", "device_memory_gib", "activation_headroom_gib"}
_STR_KEYS = {"dtype", "quantization", "kv_cache_dtype"}


def plan_kwargs(mapping: dict[str, Any]) -> dict[str, Any]:
    """Pick the plan's keywords out of a merged profile section (vLLM names accepted), ignoring the rest."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        k = _ALIASES.get(key, key)
        if k in PLAN_KEYS and value is not None:
            out[k] = value
    return out


def parse_human_int(text: str, key: str = "value") -> int:
    """Integers as vLLM's CLI reads them: ``1m`` = 1,000,000, ``1M`` = 1,048,576, ``25.6k`` = 25,600."""
    s = text.strip().replace("_", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", s)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        if "." in number:
            raise ValueError(f"{key}={text!r}: decimals are not allowed with binary suffix {suffix}")
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    raise ValueError(f"{key}={text!r} is not an integer (forms: 1000000, 1m, 1M, 25.6k)")


def parse_what_if(text: str) -> dict[str, Any]:
    """``"tp=8,pp=4,max_model_len=1m"`` -> ``{"tp": 8, "pp": 4, "max_model_len": 1000000}``.

    Why a parser and not eval: the string comes from a command line; every key is checked against
    the plan's keywords and every value gets the plan's type, with one-line errors naming the key.
    """
    out: dict[str, Any] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"--what-if: {item!r} is not key=value (e.g. tp=8,pp=4,max_model_len=1000000)")
        key, value = (part.strip() for part in item.split("=", 1))
        k = _ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if k not in PLAN_KEYS:
            raise ValueError(f"--what-if: unknown key {key!r}; known: {', '.join(PLAN_KEYS)}")
        if not value:
            raise ValueError(f"--what-if: {key} has no value")
        if k in _INT_KEYS:
            out[k] = parse_human_int(value, key)
        elif k in _FLOAT_KEYS:
            try:
                out[k] = float(value)
            except ValueError:
                raise ValueError(f"--what-if: {key}={value!r} is not a number") from None
            if not math.isfinite(out[k]):
                raise ValueError(f"--what-if: {key}={value!r} is not a finite number")
        else:
            out[k] = None if value.lower() in ("none", "null") and k == "quantization" else value
    return out


def format_what_if(changes: dict[str, Any]) -> str:
    """The inverse of :func:`parse_what_if` (used to label a what-if row)."""
    return ",".join(f"{k}={'none' if v is None else v}" for k, v in changes.items())


# --------------------------------------------------------------------------- checks and table


def _count(n: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _gib(n: float) -> float:
    return round(n / GIB, 3)


def plan_table(p: Plan) -> dict[str, Any]:
    rows = [
        ["architecture", p.architecture],
        ["parameters", f"{_count(p.parameters)} (active {_count(p.active_parameters)})"],
        ["layout", f"TP={p.tp} x PP={p.pp} = {p.ranks} ranks on {p.nodes} node(s) x {p.devices_per_node}"],
        ["dtype / weights / kv cache", f"{p.dtype} / {p.quantization} / {p.kv_cache_dtype}"],
        ["weights, whole model", f"{_gib(p.weight_bytes_total)} GiB"],
        ["weights per rank (busiest stage)", f"{_gib(p.weight_bytes_per_rank)} GiB"],
        ["usable per rank", f"{_gib(p.budget_bytes)} GiB of {_gib(p.device_memory_bytes)} GiB "
                            f"(gpu_memory_utilization {p.gpu_memory_utilization:g})"],
        ["weights may take per rank", f"{_gib(p.weight_limit_bytes)} GiB"],
        ["activation headroom", f"{_gib(p.activation_headroom_bytes)} GiB"],
        ["KV pool per rank (smallest stage)", f"{_gib(p.kv_pool_bytes)} GiB"],
        ["KV bytes per token per rank", f"{p.kv_bytes_per_token} (whole model {p.kv_bytes_per_token_model})"],
        ["KV tokens held", f"{p.kv_tokens} ({p.kv_blocks} blocks of {p.block_size})"],
        ["max_model_len", str(p.max_model_len)],
        ["needed", f"{p.tokens_needed} tokens = {p.target_concurrency} x {p.target_context}"],
        ["verdict", p.verdict + ("" if not p.reasons else ": " + "; ".join(p.reasons))],
        ["smallest layout that fits",
         f"TP={p.smallest_tp} x PP={p.smallest_pp} ({p.smallest_verdict})" if p.smallest_tp else "none (does_not_fit)"],
    ]
    rows += [["note", n] for n in p.notes]
    return {"columns": ["item", "value"], "rows": rows}


def stage_table(p: Plan) -> dict[str, Any]:
    return {
        "columns": ["stage", "layers", "weights GiB", "KV pool GiB", "KV bytes/token", "KV tokens"],
        "rows": [[s.stage, f"{s.layers[0]}-{s.layers[1] - 1}", _gib(s.weight_bytes), _gib(s.kv_pool_bytes),
                  s.kv_bytes_per_token, s.kv_tokens] for s in p.stages],
    }


def format_table(p: Plan) -> str:
    """Plain-text plan for the CLI: the summary, then one line per pipeline stage."""
    summary = plan_table(p)["rows"]
    width = max(len(r[0]) for r in summary)
    lines = [f"{k.ljust(width)}  {v}" for k, v in summary]
    st = stage_table(p)
    cells = [st["columns"]] + [[str(c) for c in r] for r in st["rows"]]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(st["columns"]))]
    lines.append("")
    for row in cells:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def plan_checks(p: Plan) -> list[Check]:
    """``preflight.plan.*`` checks: devices, weights per rank, KV for max_model_len and for the target."""
    src = "static"
    evidence = {"table": plan_table(p), "plan": p.to_dict(), "charts": [_stage_chart(p)]}
    hint = (f"; smallest layout that fits: tp={p.smallest_tp} pp={p.smallest_pp}" if p.smallest_tp
            else "; no layout on this hardware fits: quantize, lower max_model_len or concurrency, or add nodes")
    usable = p.weight_limit_bytes
    len_limit = math.ceil(p.max_model_len / p.block_size) * p.block_size
    checks = [
        measured("preflight.plan.devices", "Ranks fit the devices", p.ranks, p.devices_available,
                 unit="devices", direction="lower_is_better", source=src,
                 message="" if p.ranks <= p.devices_available else
                 f"TP x PP = {p.ranks} ranks but the topology has {p.devices_available} devices{hint}"),
        measured("preflight.plan.weights_per_rank", "Weights fit each rank", _gib(p.weight_bytes_per_rank), _gib(usable),
                 unit="GiB", direction="lower_is_better", source=src, evidence={"table": stage_table(p)},
                 message="" if p.weight_bytes_per_rank <= usable else
                 f"weights need {_gib(p.weight_bytes_per_rank)} GiB on the busiest rank but {_gib(usable)} GiB is usable "
                 f"after {_gib(p.activation_headroom_bytes)} GiB headroom (and any fixed KV pool){hint}"),
        measured("preflight.plan.kv_max_model_len", "KV pool holds one max_model_len sequence", p.kv_tokens,
                 len_limit, unit="tokens", direction="higher_is_better",
                 source=src,
                 message="" if p.kv_tokens >= len_limit else
                 f"KV pool holds {p.kv_tokens} tokens but max_model_len={p.max_model_len}: vLLM refuses to start; "
                 f"raise gpu_memory_utilization, use kv_cache_dtype=fp8, or raise tp/pp{hint}"),
        measured("preflight.plan.kv_capacity", "KV pool holds target context x concurrency", p.kv_tokens, p.tokens_needed,
                 unit="tokens", direction="higher_is_better", source=src,
                 message="" if p.kv_tokens >= p.tokens_needed else
                 f"KV pool holds {p.kv_tokens} tokens, {p.target_concurrency} x {p.target_context} needs {p.tokens_needed}"
                 f" ({p.kv_tokens // max(1, math.ceil(p.target_context / p.block_size) * p.block_size)} sequences fit){hint}"),
        measured("preflight.plan.context", "max_model_len covers the target context", p.max_model_len, p.target_context,
                 unit="tokens", direction="higher_is_better", source=src,
                 message="" if p.max_model_len >= p.target_context else
                 f"max_model_len={p.max_model_len} is below the target context {p.target_context}: raise max_model_len"),
    ]
    verdict_msg = (
        f"{p.verdict}: TP={p.tp} x PP={p.pp}, {_gib(p.weight_bytes_per_rank)} GiB weights/rank, "
        f"{p.kv_tokens} KV tokens for {p.tokens_needed} needed"
        + (f" ({'; '.join(p.reasons)})" if p.reasons else "")
        + (f"; smallest fitting layout TP={p.smallest_tp} x PP={p.smallest_pp} ({p.smallest_verdict})"
           if p.smallest_tp else "; no layout on this hardware fits")
    )
    checks.append(Check(id="preflight.plan.verdict", title="Memory plan verdict", status="pass" if p.fits else "fail",
                        value=p.verdict, limit=None, unit="", direction="exact", message=verdict_msg,
                        evidence=evidence, source=src))
    return checks


def _stage_chart(p: Plan) -> dict[str, Any]:
    xs = [f"stage {s.stage}" for s in p.stages]
    return {
        "kind": "bar",
        "title": f"Memory per rank by pipeline stage (TP={p.tp}, PP={p.pp})",
        "x_label": "pipeline stage",
        "y_label": "GiB",
        "x_log": False,
        "series": [
            {"name": "weights", "x": xs, "y": [_gib(s.weight_bytes) for s in p.stages]},
            {"name": "activation headroom", "x": xs, "y": [_gib(p.activation_headroom_bytes)] * len(xs)},
            {"name": "KV pool", "x": xs, "y": [_gib(s.kv_pool_bytes) for s in p.stages]},
        ],
        "reference": [{"y": _gib(p.budget_bytes), "label": "device memory x gpu_memory_utilization"}],
    }
