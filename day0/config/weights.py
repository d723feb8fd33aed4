"""The profile's ``[weights]`` table: what the weights stage verifies and the limits it judges by
(docs/stages/weights.md)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from day0.config.section import Section


class WeightsSection(Section):
    verify_manifest: bool = True  # check day0-manifest.json's SHA-256 per shard when present
    manifest: str = "day0-manifest.json"
    hash_workers: int = Field(0, ge=0)  # 0: one per usable CPU
    max_checks_per_category: int = Field(200, ge=1)
    memory_tolerance: float = Field(0.10, ge=0)  # measured weights per rank vs plan, relative
    # weights.rank_memory (read beside the engine): what a rank holds beyond its weights and KV pool
    # (runtime, activations, CUDA context and graphs); unset: 2 GiB on CPU, 4 GiB on GPUs
    runtime_allowance_gib: Optional[float] = Field(None, ge=0)
    load_time_limit_s: Optional[float] = Field(None, gt=0)  # engine start-up incl. weight loading
    golden: Optional[str] = None  # greedy tokens from a trusted run (day0 weights golden)
