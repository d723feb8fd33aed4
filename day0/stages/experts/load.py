"""Expert load: tokens per expert and per expert-parallel rank, and how balanced they are.

Pure arithmetic on counts, kept apart from how the counts were taken (the router hook, or vLLM's
``routed_experts`` field) so the definitions in docs/metrics.md ("Expert load") are tested on
hand-computed numbers. A token counts once for each expert of its top-k: a layer that routed ``T``
tokens with top-``k`` has ``k x T`` assignments spread over its experts.

Balancedness is vLLM's EPLB figure (``vllm/distributed/eplb/eplb_state.py``, after DeepSpeed-MoE):
mean load over max load, 1 when every unit carries the same, ``1/n`` when one of ``n`` units
carries everything. The busiest rank sets an MoE layer's step time, so this is the share of the
step the other ranks spend doing useful work.

Spread places a layer's entropy between a collapsed router (every token to the same k experts)
and a uniform one at its token count: balancedness and the hot expert score that collapse ``k/E``
and ``E/k``, which a loose limit passes when ``E/k`` is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from day0.model.ranks import experts_on_rank

PLACEMENTS = ("linear", "round_robin")  # vLLM's expert_placement_strategy values
# Assignments a uniform router must give each expert, on average, before a layer's spread is judged:
# the usual floor for a multinomial's expected cell count, under which the entropy's expected
# shortfall (the spread's top) is no longer the small correction its formula assumes.
MIN_EXPECTED = 5


class LoadError(ValueError):
    """Counts that cannot describe an MoE layer (negative, the wrong length); names the layer."""


@dataclass(frozen=True)
class Placement:
    """Which logical experts each expert-parallel rank holds, as vLLM's ``determine_expert_map``
    places them: ``linear`` gives each rank a contiguous block, ``E // ep`` experts and one more
    on each of the first ``E % ep`` ranks; ``round_robin`` gives rank ``r`` experts ``r, r+ep, ...``.
    ``ep_size = 1`` is no expert parallelism: every rank holds a slice of every expert."""

    num_experts: int
    ep_size: int = 1
    strategy: str = "linear"

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.ep_size < 1:
            raise LoadError(f"placement: need num_experts >= 1 and ep_size >= 1, got {self.num_experts}, {self.ep_size}")
        if self.strategy not in PLACEMENTS:
            raise LoadError(f"placement: strategy {self.strategy!r} is not one of {', '.join(PLACEMENTS)}")

    @property
    def expert_parallel(self) -> bool:
        return self.ep_size > 1

    def ranks(self) -> tuple[tuple[int, ...], ...]:
        """The experts on each rank, rank 0 first."""
        e, ep = self.num_experts, self.ep_size
        if self.strategy == "round_robin":
            return tuple(tuple(range(r, e, ep)) for r in range(ep))
        out, start = [], 0
        for r in range(ep):
            n = experts_on_rank(e, ep, r)  # the plan's rule, one place
            out.append(tuple(range(start, start + n)))
            start += n
        return tuple(out)

    def rank_of(self, expert: int) -> int:
        return next(r for r, held in enumerate(self.ranks()) if expert in held)


def balancedness(loads: Sequence[float]) -> float | None:
    """Mean over max; None when nothing was routed (no load is neither balanced nor not)."""
    if not loads:
        return None
    peak = max(loads)
    if peak <= 0:
        return None
    return (sum(loads) / len(loads)) / peak


@dataclass(frozen=True)
class LayerLoad:
    """One MoE layer: tokens it routed and the assignments each logical expert received."""

    layer: int
    experts: tuple[int, ...]
    tokens: int

    @classmethod
    def of(cls, layer: int, counts: Sequence[int], tokens: int, num_experts: int) -> LayerLoad:
        if len(counts) != num_experts:
            raise LoadError(f"layer {layer}: {len(counts)} expert counts for {num_experts} experts")
        if any(c < 0 for c in counts) or tokens < 0:
            raise LoadError(f"layer {layer}: negative counts")
        return cls(layer, tuple(int(c) for c in counts), int(tokens))

    @property
    def assignments(self) -> int:
        return sum(self.experts)

    def rank_loads(self, placement: Placement) -> tuple[int, ...]:
        return tuple(sum(self.experts[e] for e in held) for held in placement.ranks())

    def expert_balance(self) -> float | None:
        return balancedness(self.experts)

    def rank_balance(self, placement: Placement) -> float | None:
        return balancedness(self.rank_loads(placement)) if placement.expert_parallel else None

    @property
    def top_k(self) -> float:
        """Experts each routed token went to (the router's top-k when the counts are whole)."""
        return self.assignments / self.tokens if self.tokens else 0.0

    def spread_gap(self) -> str | None:
        """Why :meth:`spread` cannot tell a collapsed router from an even one here, or None."""
        e, k = len(self.experts), self.top_k
        if not self.assignments or not self.tokens:
            return "it routed nothing"
        if k >= e:
            return f"every token goes to all {e} experts (top-{k:g}): there is no choice to collapse"
        if self.assignments < MIN_EXPECTED * e:
            return (f"{self.assignments} assignments over {e} experts: a uniform router would give each fewer "
                    f"than {MIN_EXPECTED}, too few to tell it from a collapsed one")
        return None

    def spread(self) -> float | None:
        """Where this layer's routing sits between a collapsed router (0: every token to the same
        k experts, the least even a top-k router can be, entropy ``ln k``) and a uniform one at
        the same token count (1: entropy ``ln E - (E - k) / (2 k T)``, less than ``ln E`` by the
        plug-in entropy's expected shortfall), on the entropy of the expert shares; a collapse is 0
        at any ``E/k`` (the derivation: docs/metrics.md, "Expert load"). None: :meth:`spread_gap`."""
        if self.spread_gap() is not None:
            return None
        collapsed, observed, uniform = self.entropies()
        return (observed - collapsed) / (uniform - collapsed)

    def entropies(self) -> tuple[float, float, float]:
        """(collapsed, observed, uniform) entropy of the expert shares ``n_e / (k T)``, in nats:
        ``exp`` of each is the number of experts used evenly that would give it."""
        n, e, k = self.assignments, len(self.experts), self.top_k
        observed = -sum(c / n * math.log(c / n) for c in self.experts if c)
        return math.log(k), observed, math.log(e) - (e - k) / (2 * n)

    def hottest(self) -> tuple[int, float]:
        """(expert, its load over the uniform load): 1 is its fair share, ``E`` takes everything."""
        total = self.assignments
        if not total:
            return 0, 0.0
        expert = max(range(len(self.experts)), key=lambda e: (self.experts[e], -e))
        return expert, self.experts[expert] * len(self.experts) / total


def merge(parts: Sequence[Mapping[int, LayerLoad]]) -> dict[int, LayerLoad]:
    """Layers summed over parts (data-parallel ranks, pipeline stages, requests)."""
    out: dict[int, LayerLoad] = {}
    for part in parts:
        for layer, load in part.items():
            have = out.get(layer)
            if have is None:
                out[layer] = load
                continue
            if len(have.experts) != len(load.experts):
                raise LoadError(f"layer {layer}: parts disagree on the number of experts "
                                f"({len(have.experts)} vs {len(load.experts)})")
            out[layer] = LayerLoad(layer, tuple(a + b for a, b in zip(have.experts, load.experts)),
                                   have.tokens + load.tokens)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Hot:
    """The expert furthest above its share, in the layer where it is."""

    layer: int
    expert: int
    ratio: float  # its load over the uniform load (assignments / E)
    share: float  # of the layer's assignments
    uniform: float  # 1 / E
    token_share: float  # of the layer's tokens that reached it (uniform: k / E)

    def sentence(self, places: int = 2) -> str:
        """The hot expert in words, its ratio to ``places`` decimals (more where 2 would round it
        onto its limit: the checks say how many)."""
        return (f"layer {self.layer} expert {self.expert} takes {100 * self.share:.1f}% of the routed assignments "
                f"(uniform {100 * self.uniform:.1f}%; {100 * self.token_share:.0f}% of the layer's tokens reach it): "
                f"{self.ratio:.{places}f}x its share")


@dataclass(frozen=True)
class LoadSummary:
    """Every layer's load and the figures the checks judge."""

    layers: tuple[LayerLoad, ...]
    placement: Placement

    @property
    def measured(self) -> bool:
        return any(load.assignments for load in self.layers)

    def worst(self) -> tuple[int, float] | None:
        """(layer, balancedness) of the least balanced layer: over ranks under expert parallelism,
        else over experts. None when nothing was routed."""
        scored = [(load.layer, self.balance_of(load)) for load in self.layers]
        scored = [(layer, b) for layer, b in scored if b is not None]
        return min(scored, key=lambda lb: (lb[1], lb[0])) if scored else None

    def balance_of(self, load: LayerLoad) -> float | None:
        return load.rank_balance(self.placement) if self.placement.expert_parallel else load.expert_balance()

    def aggregate(self) -> float | None:
        """vLLM's logged EPLB balancedness: per-layer means summed over per-layer maxima summed."""
        rows = [load.rank_loads(self.placement) if self.placement.expert_parallel else load.experts
                for load in self.layers if load.assignments]
        if not rows:
            return None
        return sum(sum(r) / len(r) for r in rows) / sum(max(r) for r in rows)

    def least_spread(self) -> tuple[int, float] | None:
        """(layer, spread) of the layer closest to a collapsed router; None when no layer has one."""
        scored = [(load.layer, load.spread()) for load in self.layers]
        scored = [(layer, s) for layer, s in scored if s is not None]
        return min(scored, key=lambda ls: (ls[1], ls[0])) if scored else None

    def hottest(self) -> Hot | None:
        best: Hot | None = None
        for load in self.layers:
            if not load.assignments:
                continue
            expert, ratio = load.hottest()
            if best is None or ratio > best.ratio + 1e-12:
                e = len(load.experts)
                best = Hot(load.layer, expert, ratio, load.experts[expert] / load.assignments, 1 / e,
                           load.experts[expert] / load.tokens if load.tokens else math.nan)
        return best
