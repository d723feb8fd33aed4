"""KV pool capacity: the live pool (blocks x block size) against target_context x target_concurrency,
KV bytes per token from config.json and from the engine's own KV spec."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from day0.client.kv_metrics import http_cache_info
from day0.model.sizing import config_kv_bytes_per_token
from day0.stages.kvcache.exact import SchedulerSampler


@dataclass(frozen=True)
class Capacity:
    """The live KV pool against what the profile asks it to hold."""

    block_size: int
    num_blocks: int  # as the engine reports it (one is vLLM's null block)
    kv_bytes_per_token: int  # per rank, from config.json under TP x PP
    target_context: int
    target_concurrency: int
    min_margin: float
    engine_kv_bytes_per_token: int | None = None  # from the engine's own KV spec (in-process only)
    engine_pool_bytes: int | None = None  # one engine's
    engines: int = 1  # data-parallel engines, each with a pool of its own; num_blocks is their sum

    @property
    def pool_tokens(self) -> int:
        """What one engine's pool holds (its null block out). A request's KV must fit in one engine,
        and each engine serves its share of the concurrency: summed over data-parallel engines, two
        pools of 10K tokens "held" a 16K context (and one null block was taken out in all)."""
        return (self.num_blocks // self.engines - 1) * self.block_size

    @property
    def needed_tokens(self) -> int:
        """What one engine must hold: its share of the concurrency, each request the whole context."""
        share = math.ceil(self.target_concurrency / self.engines)
        return share * math.ceil(self.target_context / self.block_size) * self.block_size

    @property
    def margin(self) -> float:
        return self.pool_tokens / self.needed_tokens - 1.0

    @property
    def required_tokens(self) -> int:
        return math.ceil(self.needed_tokens * (1.0 + self.min_margin))

    @property
    def pool_bytes(self) -> int:
        return self.engine_pool_bytes or self.num_blocks // self.engines * self.block_size * self.kv_bytes_per_token


def engine_kv_bytes_per_token(llm: Any) -> int:
    """KV bytes one token costs on a rank, from the engine's own KV-cache spec (all groups)."""
    cfg = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    total = 0.0
    for group in cfg.kv_cache_groups:
        spec = group.kv_cache_spec
        total += spec.page_size_bytes * len(group.layer_names) / spec.block_size
    return int(round(total))


def engine_pool_bytes(llm: Any) -> int:
    cfg = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    return int(sum(t.size for t in cfg.kv_cache_tensors))


def live_capacity(engine: Any, profile: Any) -> Capacity:
    """The KV pool of a live engine (scheduler view: exact; HTTP view: /metrics cache_config_info)."""
    from day0.model.config import model_config

    config, _ = model_config(profile)
    per_token = config_kv_bytes_per_token(config, profile.engine.args)
    k = profile.kvcache
    if getattr(engine, "view", "") == "scheduler":
        sampler = SchedulerSampler(engine.scheduler)
        return Capacity(sampler.block_size, sampler.num_blocks, per_token, k.target_context, k.target_concurrency,
                        k.min_capacity_margin, engine_kv_bytes_per_token=engine_kv_bytes_per_token(engine.llm),
                        engine_pool_bytes=engine_pool_bytes(engine.llm))
    m = http_cache_info(engine.base_url)
    blocks = m.usable_blocks + m.engines
    # the pool is whole blocks plus less than one block of slack, so the floor is the exact figure
    measured_per_token = (m.kv_cache_memory_bytes * m.engines // (blocks * m.block_size)
                          if m.kv_cache_memory_bytes else None)
    return Capacity(m.block_size, blocks, per_token, k.target_context, k.target_concurrency, k.min_capacity_margin,
                    engine_kv_bytes_per_token=measured_per_token,
                    engine_pool_bytes=m.kv_cache_memory_bytes or None, engines=max(1, m.engines))
