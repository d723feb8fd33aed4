"""The ordered Day0 stages. One list, so markers, gating, the record and the report agree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    question: str  # what the stage answers, shown in --markers and the report


STAGES: tuple[Stage, ...] = (
    Stage("preflight", "Preflight: config lint and memory plan", "can this profile work at all, before any GPU-hour?"),
    Stage("weights", "Weight-shard loading", "are the shards complete and loaded right, within memory?"),
    Stage("collectives", "Collective communication", "are collectives correct and fast on this topology?"),
    Stage("latency", "Prefill/decode latency", "do TTFT, TPOT and throughput meet the SLA?"),
    Stage("kvcache", "KV cache at long context", "is PagedAttention fragmentation under the limit?"),
    Stage("risks", "Risks: tenant isolation, accuracy, cost",
          "are tenants kept apart, is the served model as accurate as its reference, and is it within budget?"),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)


def stage_index(name: str) -> int:
    return STAGE_NAMES.index(name)
