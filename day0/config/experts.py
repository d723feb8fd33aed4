"""The profile's ``[experts]`` table: the expert-load stage's workload size and limits
(docs/stages/experts.md; the figures are defined in docs/metrics.md, "Expert load").

The requests take the ``[latency]`` workload's shape (prompt and output lengths, shared prefixes,
seed, concurrency); this table only says how many, and what counts as balanced.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from day0.config.section import Section


class ExpertsSection(Section):
    """Limits and workload size of the experts stage (docs/stages/experts.md)."""

    num_requests: int = Field(16, ge=1, le=1 << 20, description="requests of the [latency] workload's shape")
    concurrency: int = Field(0, ge=0, le=4096, description="in flight at once; 0 = latency.concurrency")
    # Worst MoE layer's mean/max load, over EP ranks under expert parallelism, else over experts.
    # Measured on day0's random-weight tiny MoEs (8 experts, top-2; seeds 0-5, 16 and 32 requests):
    # 0.38-0.55; one expert that every token picks gives 0.25 (docs/stages/experts.md).
    min_balancedness: float = Field(0.3, gt=0, le=1)
    # The busiest expert's load over the uniform load: 1 = its fair share, E / top_k = every token
    # picks it. The tiny MoEs measured 1.83-2.64; the planted router bias 4.0.
    max_hot_expert_ratio: float = Field(3.0, ge=1)
    # The least spread layer's entropy, from a collapsed router (0: every token to the same top-k,
    # entropy ln k) to a uniform one at its token count (1: ln E - (E - k) / 2kT); the midpoint, so
    # a collapse fails at any E/k, where mean/max and the hot expert cannot see one when E/k <= 3
    # (docs/metrics.md, "Expert load"). The tiny MoEs' recorded runs: 0.887-0.890; one expert that
    # every token picks (the planted bias) 0.62.
    min_spread: float = Field(0.5, gt=0, lt=1)
    view: Literal["auto", "router", "routed"] = Field(
        "auto", description="router: day0's worker extension via collective_rpc; routed: vLLM's routed_experts "
                            "field; auto: whichever the engine gives (both: they are compared)")
    agreement_limit: float = Field(0.02, gt=0, le=1, description="router vs routed: largest per-expert share "
                                                                 "difference in any layer")
    min_tokens_per_layer: int = Field(1000, ge=1, description="fewer routed tokens than this: too few to judge")
