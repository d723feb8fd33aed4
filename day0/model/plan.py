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
  ``(kv_lora_rank + qk_rope_head_dim) x bytes`` on every TP rank (``fp8_ds_mla``: 656 bytes);
* routed experts: without expert parallelism every rank holds a ``1/TP`` slice of every expert;
  with ``enable_expert_parallel`` the MoE layer runs with TP 1 over an EP group of TP x DP ranks
  (``FusedMoEParallelConfig.make``; PP does not enter, each stage has its own layers) and each rank
  holds whole experts, ``E // ep`` or one more on the first ``E % ep`` ranks
  (``determine_expert_map``). Shared experts and routers are not EP-split. DP = 1 here.

This module holds :func:`plan` (check the arguments, price the layout, search the smallest one
that fits); the per-rank arithmetic is in :mod:`day0.model.ranks`, quantized storage in
:mod:`day0.model.quantization`, the data model in :mod:`day0.model.plan_model`, its tables and
checks in :mod:`day0.model.plan_report`, the what-if parser in :mod:`day0.model.what_if`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from day0.config.topology import MAX_DEVICE_MEMORY_GIB, MAX_DEVICES_PER_NODE, MAX_NODES
from day0.model import arch_tensors, archs
from day0.model.plan_model import MlaKvPlan, MoePlan, Plan, StagePlan
from day0.model.plan_report import format_table
from day0.model.quantization import UNQUANTIZED, WeightScheme, weight_scheme
from day0.model.ranks import (
    DTYPE_BYTES,
    GIB,
    MLA_FP8_DS_BYTES,
    Footprint,
    experts_on_rank,
    footprint,
    kv_dtype_bytes,
    kv_layer_bytes,
    node_weights,
    pp_partition,
    price_stages,
    resolve_dtype,
    scope,
    valid_tp,
)
from day0.model.what_if import parse_what_if, plan_kwargs

__all__ = [
    "MLA_FP8_DS_BYTES",
    "Plan",
    "format_table",
    "kv_dtype_bytes",
    "parse_what_if",
    "plan",
    "plan_kwargs",
    "resolve_dtype",
]


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
    enable_expert_parallel: bool = False,
) -> Plan:
    """Price one layout and search the smallest one that fits (TP within a node, then PP across nodes).

    ``device_memory_gib`` is the memory of one device (GiB, 2**30 bytes); ``activation_headroom_gib``
    covers peak activations, CUDA graphs and communicator buffers per rank, which vLLM measures at
    start-up and the plan cannot. ``enable_expert_parallel`` places routed experts whole over the
    TP ranks of each stage (vLLM's EP with DP = 1) instead of slicing each expert by TP.
    """
    if type(enable_expert_parallel) is not bool:
        raise ValueError(f"enable_expert_parallel={enable_expert_parallel!r} must be true or false")
    _check_layout_arguments(tp, pp, devices_per_node, nodes, target_concurrency, gpu_memory_utilization,
                            device_memory_gib, activation_headroom_gib)
    _check_sizes(max_model_len, block_size, target_context, kv_cache_memory_bytes)
    block_size = int(block_size or 16)
    arch = arch_tensors.check_config(config)
    layers = archs.num_layers(config)
    if pp > layers:
        raise ValueError(f"pipeline_parallel_size={pp} exceeds num_hidden_layers={layers} in config.json")
    dt = resolve_dtype(dtype, config)
    scheme = weight_scheme(quantization, config)
    notes = _model_notes(config, quantization, scheme)
    derived_len, _ = archs.derived_max_model_len(config)
    max_len = int(max_model_len if max_model_len not in (None, 0, -1) else derived_len)  # -1: fitted below (_auto_fit)
    context = int(target_context or max_len)
    kv_layer = kv_layer_bytes(config, kv_cache_dtype, dt, tp)
    req = _Request(dt, scheme, kv_cache_dtype, block_size, max_len, context, target_concurrency,
                   devices_per_node, nodes, device_memory_gib, gpu_memory_utilization,
                   *_memory(device_memory_gib, gpu_memory_utilization, activation_headroom_gib, kv_cache_memory_bytes),
                   expert_parallel=enable_expert_parallel and archs.routed_experts(config) > 0)
    fp = footprint(config, scheme, DTYPE_BYTES[dt])
    stages = req.price(config, fp, tp, pp, kv_layer)
    if max_model_len == -1:
        req = _auto_fit(req, stages, derived_len, target_context, notes)
    reasons = req.reasons(stages, tp * pp)
    if tp > devices_per_node:
        notes.append(f"tp={tp} spans nodes: TP all-reduces would cross the inter-node network")
    smallest = _smallest_layout(config, fp, req, layers)
    if smallest is None and min(layers, devices_per_node * nodes) > MAX_SEARCH_PP:
        notes.append(f"the search for a layout that fits stopped at PP={MAX_SEARCH_PP} stages")
    return _assemble(config, arch, fp, req, tp, pp, stages, reasons, smallest, notes)


# --------------------------------------------------------------------------- the steps


@dataclass(frozen=True)
class _Request:
    """plan()'s arguments, checked and resolved against config.json: what every layout is priced with."""

    dtype: str
    scheme: WeightScheme
    kv_cache_dtype: str
    block_size: int
    max_len: int
    context: int
    target_concurrency: int
    devices_per_node: int
    nodes: int
    device_memory_gib: float
    gpu_memory_utilization: float
    headroom: int
    budget: int
    weight_limit: int
    usable_txt: str
    fixed_pool: int | None
    expert_parallel: bool = False  # EP asked for on a model with routed experts

    @property
    def needed(self) -> int:
        return self.target_concurrency * math.ceil(self.context / self.block_size) * self.block_size

    def ep(self, tp: int) -> int:
        """EP group size for a TP width: TP x DP (DP = 1) with EP on, else 1 (vLLM needs TP x DP > 1 for EP)."""
        return tp if self.expert_parallel and tp > 1 else 1

    def price(self, config: dict[str, Any], fp: Footprint, tp: int, pp: int, kv_layer: int) -> tuple[StagePlan, ...]:
        return price_stages(config, fp, tp=tp, pp=pp, kv_layer=kv_layer, budget=self.budget, headroom=self.headroom,
                            block_size=self.block_size, fixed_pool=self.fixed_pool, ep=self.ep(tp))

    def reasons(self, stages: tuple[StagePlan, ...], ranks: int) -> list[str]:
        """Why a layout does not fit (empty when it does): devices, weights per rank, KV tokens."""
        why = []
        if ranks > self.devices_per_node * self.nodes:
            why.append(f"{ranks} ranks > {self.devices_per_node * self.nodes} devices "
                       f"({self.nodes} node(s) x {self.devices_per_node})")
        worst_w = max(s.weight_bytes for s in stages)
        if worst_w > self.weight_limit:
            why.append(f"weights {worst_w / GIB:.1f} GiB/rank + {self.headroom / GIB:.1f} GiB headroom > "
                       f"{(self.weight_limit + self.headroom) / GIB:.1f} GiB usable ({self.usable_txt})")
        tokens = min(s.kv_tokens for s in stages)
        if tokens < math.ceil(self.max_len / self.block_size) * self.block_size:
            why.append(f"KV pool holds {tokens} tokens < max_model_len {self.max_len} (vLLM refuses to start)")
        if tokens < self.needed:
            why.append(f"KV pool holds {tokens} tokens < {self.needed} needed "
                       f"({self.target_concurrency} x {self.context} tokens)")
        return why


def _auto_fit(req: _Request, stages: tuple[StagePlan, ...], derived: int, target_context: int | None,
              notes: list[str]) -> _Request:
    """``max_model_len = -1``: vLLM 0.32 fits the length to what the KV pool holds
    (``v1/core/kv_cache_utils._auto_fit_max_model_len``), so a pool short of the model's own length
    shrinks the length instead of refusing to start; priced as the derived length, the plan said it would not start."""
    tokens = min(s.kv_tokens for s in stages)
    if tokens <= 0:
        return req  # not one token: vLLM refuses ("Cannot auto-fit"), as the reasons say
    fitted = min(derived, tokens)
    notes.append(f"max_model_len = -1: vLLM fits it to the KV pool, {fitted} tokens"
                 + (f" (the model's own {derived} does not fit)" if fitted < derived else ""))
    return replace(req, max_len=fitted, context=int(target_context or fitted))


MAX_RANKS = 1 << 20  # tp and pp each; any more is not a layout, and the arithmetic stays small
MAX_TOKENS = 1 << 62  # max_model_len, target_context, block_size
MAX_SEARCH_PP = 256  # the smallest-layout search stops at this many pipeline stages


def _check_layout_arguments(tp: int, pp: int, devices_per_node: int, nodes: int, target_concurrency: int,
                            gpu_memory_utilization: float, device_memory_gib: float,
                            activation_headroom_gib: float) -> None:
    for name, value, most in (("tp", tp, MAX_RANKS), ("pp", pp, MAX_RANKS), ("nodes", nodes, MAX_NODES),
                              ("devices_per_node", devices_per_node, MAX_DEVICES_PER_NODE),
                              ("target_concurrency", target_concurrency, 1 << 30)):
        _whole(name, value, 1, most)
    for name, value in (("gpu_memory_utilization", gpu_memory_utilization), ("device_memory_gib", device_memory_gib),
                        ("activation_headroom_gib", activation_headroom_gib)):
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be a finite number")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    if not 0 < device_memory_gib <= MAX_DEVICE_MEMORY_GIB or not 0 <= activation_headroom_gib <= MAX_DEVICE_MEMORY_GIB:
        raise ValueError(f"device_memory_gib={device_memory_gib} must be in (0, {MAX_DEVICE_MEMORY_GIB:g}] and "
                         f"activation_headroom_gib={activation_headroom_gib} in [0, {MAX_DEVICE_MEMORY_GIB:g}]")


def _check_sizes(max_model_len: int | None, block_size: int | None, target_context: int | None,
                 kv_cache_memory_bytes: int | None) -> None:
    """Token counts and byte sizes are whole numbers in range (None: derived from config.json)."""
    if max_model_len not in (None, -1):
        _whole("max_model_len", max_model_len, 1, MAX_TOKENS)
    for name, value in (("block_size", block_size), ("target_context", target_context)):
        if value is not None:
            _whole(name, value, 1, MAX_TOKENS)
    if kv_cache_memory_bytes is not None:
        _whole("kv_cache_memory_bytes", kv_cache_memory_bytes, 0, int(MAX_DEVICE_MEMORY_GIB) * GIB)


def _whole(name: str, value: Any, least: int, most: int) -> None:
    if type(value) is not int:  # bool is an int to Python, not to a layout
        raise ValueError(f"{name}={value!r} must be a whole number")
    if not least <= value <= most:
        raise ValueError(f"{name}={value} must be between {least} and {most}")


def _model_notes(config: dict[str, Any], quantization: str | None, scheme: WeightScheme) -> list[str]:
    notes: list[str] = []
    if quantization is None and scheme is not UNQUANTIZED:
        notes.append(f"weights sized as the checkpoint's quantization_config ({scheme.name})")
    if archs.num_mtp_layers(config):
        notes.append(f"{archs.num_mtp_layers(config)} MTP layer(s) (num_nextn_predict_layers) not counted: "
                     "vLLM loads them only for speculative decoding")
    return notes


def _memory(device_memory_gib: float, gpu_memory_utilization: float, activation_headroom_gib: float,
            kv_cache_memory_bytes: int | None) -> tuple[int, int, int, str, int | None]:
    """(headroom, budget, weight limit, how the usable memory was found, fixed KV pool) per rank."""
    headroom = int(activation_headroom_gib * GIB)
    if kv_cache_memory_bytes is not None:
        if kv_cache_memory_bytes < 0:
            raise ValueError(f"kv_cache_memory_bytes={kv_cache_memory_bytes} must be >= 0")
        budget = int(device_memory_gib * GIB)  # vLLM ignores gpu_memory_utilization when the pool is fixed
        weight_limit = budget - headroom - int(kv_cache_memory_bytes)
        usable_txt = f"{device_memory_gib:g} GiB - {kv_cache_memory_bytes / GIB:.1f} GiB fixed KV pool"
        return headroom, budget, weight_limit, usable_txt, int(kv_cache_memory_bytes)
    budget = int(device_memory_gib * GIB * gpu_memory_utilization)
    usable_txt = f"{device_memory_gib:g} GiB x {gpu_memory_utilization:g}"
    return headroom, budget, budget - headroom, usable_txt, None


def _smallest_layout(config: dict[str, Any], fp: Footprint, req: _Request, layers: int) -> tuple[int, int] | None:
    """(tp, pp) of the fewest devices that fit, widest TP first; None when no layout does."""
    # Candidate layouts as deployments are built: TP a power of two within a node; beyond one node,
    # the widest such TP per stage and PP stages across nodes.
    tps = [2**k for k in range(req.devices_per_node.bit_length()) if valid_tp(config, 2**k)]
    candidates = []
    for t in tps:
        most = (req.devices_per_node * req.nodes) // t if t == tps[-1] else req.devices_per_node // t
        for p in range(1, min(layers, most, MAX_SEARCH_PP) + 1):
            candidates.append((t * p, p, t))
    for _, _, p, t in sorted((r, -t, p, t) for r, p, t in candidates):  # fewest devices, then widest TP
        kv_t = kv_layer_bytes(config, req.kv_cache_dtype, req.dtype, t)
        if not req.reasons(req.price(config, fp, t, p, kv_t), t * p):
            return (t, p)
    return None


def _assemble(config: dict[str, Any], arch: str, fp: Footprint, req: _Request, tp: int, pp: int,
              stages: tuple[StagePlan, ...], reasons: list[str], smallest: tuple[int, int] | None,
              notes: list[str]) -> Plan:
    """The :class:`Plan` of the priced layout: the busiest stage's weights, the tightest stage's KV."""
    worst = max(stages, key=lambda s: s.weight_bytes)
    tightest = min(stages, key=lambda s: s.kv_tokens)
    per_seq = math.ceil(req.context / req.block_size) * req.block_size
    return Plan(
        architecture=arch,
        parameters=fp.parameters,
        active_parameters=int(round(fp.active_parameters)),
        tp=tp,
        pp=pp,
        dtype=req.dtype,
        quantization=req.scheme.name,
        kv_cache_dtype=str(req.kv_cache_dtype),
        weight_bytes_total=int(math.ceil(fp.total)),
        weight_bytes_per_rank=worst.weight_bytes,
        kv_bytes_per_token=max(s.kv_bytes_per_token for s in stages),
        kv_bytes_per_token_model=kv_layer_bytes(config, req.kv_cache_dtype, req.dtype, 1) * archs.num_layers(config),
        device_memory_bytes=int(req.device_memory_gib * GIB),
        gpu_memory_utilization=float(req.gpu_memory_utilization),
        budget_bytes=req.budget,
        activation_headroom_bytes=req.headroom,
        weight_limit_bytes=req.weight_limit,
        kv_pool_bytes=min(s.kv_pool_bytes for s in stages),
        kv_blocks=tightest.kv_blocks,
        kv_tokens=tightest.kv_tokens,
        block_size=req.block_size,
        max_model_len=req.max_len,
        target_context=req.context,
        target_concurrency=int(req.target_concurrency),
        tokens_needed=req.needed,
        devices_per_node=req.devices_per_node,
        nodes=req.nodes,
        stages=stages,
        verdict="does_not_fit" if reasons else scope(tp * pp, req.devices_per_node),
        reasons=tuple(reasons),
        smallest_tp=smallest[0] if smallest else None,
        smallest_pp=smallest[1] if smallest else None,
        smallest_verdict=scope(smallest[0] * smallest[1], req.devices_per_node) if smallest else "does_not_fit",
        notes=tuple(notes),
        max_concurrency=tightest.kv_tokens // per_seq,
        moe=_moe_plan(config, fp, req, tp, pp),
        mla=_mla_plan(config, req, tp, stages),
        **_node_figures(fp, req, tp, stages),
    )


def _moe_plan(config: dict[str, Any], fp: Footprint, req: _Request, tp: int, pp: int) -> MoePlan | None:
    """Experts per layer and per rank, with the routed-expert bytes of the busiest stage under TP and under EP."""
    routed = fp.routed
    if not routed:
        return None
    ep = req.ep(tp)
    parts = pp_partition(archs.num_layers(config), pp)
    under_tp = max(fp.expert_bytes(tp, a, b) for a, b in parts)
    under_ep = max(fp.expert_bytes(tp, a, b, tp) for a, b in parts) if tp > 1 else under_tp
    moe_layers = arch_tensors.moe_layer_count(config)
    routed_params = fp.routed_parameters
    return MoePlan(
        routed_experts=routed, shared_experts=archs.shared_experts(config),
        experts_per_token=archs.experts_per_token(config), moe_layers=moe_layers,
        dense_layers=archs.num_layers(config) - moe_layers,
        expert_parameters=routed_params // (routed * max(1, moe_layers)), routed_expert_parameters=routed_params,
        expert_parallel=ep > 1, ep_size=ep,
        experts_per_rank=experts_on_rank(routed, ep, 0), experts_per_rank_min=experts_on_rank(routed, ep, ep - 1),
        experts_even=routed % ep == 0,
        expert_bytes_per_rank_tp=under_tp, expert_bytes_per_rank_ep=under_ep,
        expert_bytes_per_rank=under_ep if ep > 1 else under_tp,
    )


def _mla_plan(config: dict[str, Any], req: _Request, tp: int, stages: tuple[StagePlan, ...]) -> MlaKvPlan | None:
    """The latent cache per token against a K/V cache of the same heads, per rank of the busiest stage."""
    if not archs.is_mla(config):
        return None
    rank, rope = int(config["kv_lora_rank"]), int(config["qk_rope_head_dim"])
    layers = max(s.layers[1] - s.layers[0] for s in stages)
    per_layer = kv_layer_bytes(config, req.kv_cache_dtype, req.dtype, tp)
    heads = max(1, archs.num_kv_heads(config) // tp)
    k_v = int(config["qk_nope_head_dim"]) + rope + int(config["v_head_dim"])
    mha = layers * heads * k_v * kv_dtype_bytes(req.kv_cache_dtype, req.dtype)
    latent = layers * per_layer
    return MlaKvPlan(kv_lora_rank=rank, qk_rope_head_dim=rope, latent_width=rank + rope,
                     bytes_per_token_layer=per_layer, bytes_per_token_per_rank=latent,
                     mha_bytes_per_token_per_rank=mha, mha_ratio=round(mha / latent, 2))


def _node_figures(fp: Footprint, req: _Request, tp: int, stages: tuple[StagePlan, ...]) -> dict[str, Any]:
    """The busiest node's weights (every rank placed on it) against devices_per_node x the per-rank weight limit."""
    nodes = node_weights(stages, tp, fp.routed, req.ep(tp), req.devices_per_node)
    weights, experts = max(nodes)
    limit = req.devices_per_node * req.weight_limit
    return {"nodes_used": len(nodes), "node_memory_bytes": req.devices_per_node * int(req.device_memory_gib * GIB),
            "node_weight_limit_bytes": limit, "weight_bytes_per_node": weights, "expert_bytes_per_node": experts,
            "node_holds_share": weights <= limit}
