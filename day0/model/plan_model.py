"""The memory plan as data: one :class:`Plan` per priced layout, one :class:`StagePlan` per
pipeline stage, all figures per TP rank. Computed by :func:`day0.model.plan.plan`, rendered by
:mod:`day0.model.plan_report`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VERDICTS = ("fits_one_device", "fits_one_node", "needs_supernode", "does_not_fit")


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
    expert_bytes: int = 0  # routed-expert weights on this stage's busiest rank (part of weight_bytes)


@dataclass(frozen=True)
class MoePlan:
    """Where a mixture of experts' weights sit: all figures per MoE layer or per rank of the busiest stage.

    Why both TP and EP figures: they are the two ways vLLM can place experts, and the choice
    (``enable_expert_parallel``) is made before launch; the layout's own figure is ``expert_bytes_per_rank``.
    """

    routed_experts: int  # per MoE layer
    shared_experts: int  # per MoE layer, always on, split by TP like a dense MLP
    experts_per_token: int  # routed experts each token passes (top-k)
    moe_layers: int
    dense_layers: int
    expert_parameters: int  # one routed expert of one layer
    routed_expert_parameters: int  # every routed expert of every layer
    expert_parallel: bool  # enable_expert_parallel, and it takes effect (TP x DP > 1)
    ep_size: int  # ranks the experts of one stage are spread over (TP x DP, DP = 1 here); 1 without EP
    experts_per_rank: int  # busiest rank per MoE layer: ceil(E / ep) whole experts (EP), E slices (TP)
    experts_per_rank_min: int  # least loaded rank: floor(E / ep) under EP
    experts_even: bool  # E % ep == 0 (EPLB refuses an uneven split)
    expert_bytes_per_rank_tp: int  # busiest stage, each rank a 1/TP slice of every expert
    expert_bytes_per_rank_ep: int  # busiest stage, ceil(E / TP) whole experts per rank
    expert_bytes_per_rank: int  # the layout's own (EP when expert_parallel, else TP)


@dataclass(frozen=True)
class MlaKvPlan:
    """Multi-head latent attention's KV arithmetic: one latent per token and layer, on every TP rank.

    Why the comparison: the latent is why a 1M-token context fits at all; ``mha_*`` is what a K/V
    cache of the same heads (K: qk_nope + qk_rope, V: v_head_dim per head, split by TP) would cost.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    latent_width: int  # kv_lora_rank + qk_rope_head_dim values per token and layer
    bytes_per_token_layer: int  # latent x KV bytes (fp8_ds_mla: 656)
    bytes_per_token_per_rank: int  # busiest stage: ceil(layers / PP) x bytes_per_token_layer, not divided by TP
    mha_bytes_per_token_per_rank: int  # K/V of the same heads, split by TP, busiest stage
    mha_ratio: float  # mha / latent, per rank


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
    max_concurrency: int = 0  # sequences of target_context (whole blocks) the KV pool holds at once
    moe: MoePlan | None = None
    mla: MlaKvPlan | None = None
    nodes_used: int = 1  # ceil(TP x PP / devices_per_node)
    node_memory_bytes: int = 0  # devices_per_node x device memory
    node_weight_limit_bytes: int = 0  # devices_per_node x what one rank's weights may take
    weight_bytes_per_node: int = 0  # the busiest node: every rank placed on it
    expert_bytes_per_node: int = 0  # routed-expert weights on that node
    node_holds_share: bool = True  # weight_bytes_per_node <= node_weight_limit_bytes

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
