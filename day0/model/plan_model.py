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
