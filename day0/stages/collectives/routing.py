"""The expert-parallel routing behind ``expert_dispatch`` / ``expert_combine``: how many token rows
each rank sends each rank, drawn the way a mixture-of-experts layer routes its tokens.

The model, one MoE layer on n EP ranks:

- each rank holds ``tokens`` tokens (T); each token picks ``top_k`` distinct experts out of
  ``experts`` (E);
- expert e lives on rank ``e * n // E``: contiguous blocks, E/n experts each when n divides E (a
  rank holds none when E < n, and then receives nothing);
- dispatch sends one row per (token, expert) pair to the expert's rank, as Megatron's all-to-all
  token dispatcher does after permuting tokens by expert (a token whose two experts share a rank
  is sent twice); combine sends every row back. So every rank *sends* exactly T x top_k rows in
  dispatch, and what a rank *receives* is what the routing makes uneven.

Expert popularity is Zipf: expert e has weight (e+1)^-skew. ``skew = 0`` is uniform; with
``skew > 0`` the first experts are hot, and they sit together on rank 0: the placement an EP load
balancer exists to avoid, so the fabric is measured under the imbalance that routing gives, with
one rank's links carrying the most.

Each token's experts are drawn without replacement with probability proportional to the weights
(Efraimidis-Spirakis: the top_k largest log(u) / w), where u is a counter-based hash of
(seed, rank, token, expert): no generator state and no communication. Every rank draws every
rank's tokens, so rank i's send to rank j is rank j's receive from i by construction. The draws
cost n x T x E keys on each rank, once per sweep: instant for the defaults; 8 ranks of 4096 tokens
over 256 experts (8 M keys) took 1.8 s on the shared 2-core box, and the cost grows with n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from day0.core.collective_ops import Traffic, transpose

__all__ = ["Routing", "Traffic", "draw_experts", "expert_owners", "route", "transpose"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_KEYS_AT_ONCE = 1 << 20  # float64 keys held per block of tokens (8 MiB)


def _mix_int(x: int) -> int:
    """splitmix64's finaliser on a Python int: the per-rank stream's base, the same on every host."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """The same finaliser over uint64 arrays (numpy wraps array arithmetic modulo 2^64, as wanted)."""
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
    return x ^ (x >> np.uint64(31))


def expert_owners(experts: int, n: int) -> np.ndarray:
    """The rank of every expert: contiguous blocks, ``e * n // E`` (E/n each when n divides E)."""
    if experts < 1 or n < 1:
        raise ValueError(f"experts and ranks must be >= 1, got {experts} and {n}")
    return (np.arange(experts, dtype=np.int64) * n) // experts


def draw_experts(rank: int, *, tokens: int, top_k: int, experts: int, skew: float, seed: int) -> np.ndarray:
    """The experts of ``rank``'s tokens, shape (tokens, top_k): distinct per token, drawn with
    probability proportional to (e+1)^-skew, a pure function of (seed, rank) so any rank can
    recompute any other rank's draws."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be in 1..experts ({experts}), got {top_k}")
    if skew < 0 or not np.isfinite(skew):
        raise ValueError(f"skew must be a finite number >= 0, got {skew}")
    base = np.uint64(_mix_int(_mix_int(seed & _MASK) ^ (rank & _MASK)))
    scale = np.arange(1, experts + 1, dtype=np.float64) ** float(skew)  # 1 / weight
    out = np.empty((tokens, top_k), dtype=np.int64)
    step = max(1, _KEYS_AT_ONCE // experts)
    for t0 in range(0, tokens, step):
        t1 = min(tokens, t0 + step)
        counter = np.arange(t0 * experts, t1 * experts, dtype=np.uint64)
        bits = _mix((counter * np.uint64(_GOLDEN)) ^ base)
        u = (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53 + 2.0**-54  # in (0, 1), never 0
        keys = np.log(u).reshape(t1 - t0, experts) * scale
        if top_k == experts:
            out[t0:t1] = np.arange(experts)
        else:
            out[t0:t1] = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
    return out


@dataclass(frozen=True)
class Routing:
    """Rows each rank sends each rank in dispatch: ``rows[i][j]`` (token, expert) pairs of rank i's
    tokens whose expert lives on rank j. Combine is the transpose."""

    rows: Traffic
    tokens: int
    top_k: int
    experts: int
    skew: float
    seed: int

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def per_rank(self) -> int:
        """Rows every rank sends in dispatch (and receives in combine): T x top_k."""
        return self.tokens * self.top_k

    def sent(self, rank: int) -> int:
        return sum(self.rows[rank])

    def received(self, rank: int) -> int:
        return sum(row[rank] for row in self.rows)

    def received_shares(self) -> list[float]:
        """Each rank's share of all dispatched rows: 1/n each when uniform, rank 0's grows with skew."""
        total = sum(map(sum, self.rows)) or 1
        return [self.received(j) / total for j in range(self.n)]

    def elements(self, row: int) -> Traffic:
        """The routing in elements, ``row`` elements per token row (the sweep's split sizes)."""
        return tuple(tuple(c * row for c in r) for r in self.rows)


def route(n: int, *, tokens: int, top_k: int, experts: int, skew: float, seed: int = 0) -> Routing:
    """Every rank's dispatch rows for ``n`` EP ranks (the same answer on every rank, no communication)."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    owner = expert_owners(experts, n)
    rows = []
    for rank in range(n):
        picks = draw_experts(rank, tokens=tokens, top_k=top_k, experts=experts, skew=skew, seed=seed)
        rows.append(tuple(int(c) for c in np.bincount(owner[picks].ravel(), minlength=n)))
    return Routing(tuple(rows), tokens, top_k, experts, float(skew), seed)
