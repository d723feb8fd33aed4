"""Exact data: inputs whose sums over any subset of ranks, in any order, are exact in the dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from day0.stages.collectives.settings import DTYPES


def _period(most: int) -> int:
    """The position pattern's period: the largest odd number <= ``most`` that 7 does not divide.
    Chunks and blocks are powers of two long, so an even period (bfloat16's budget gave 16 and 128)
    repeats at every chunk boundary: a chunk delivered to the wrong place held exactly the expected
    values and all_reduce with rotated chunks, reduce_scatter or all_to_all to the wrong rank passed.
    A multiple of 7 would make ``7 g mod m`` one value."""
    return next((m for m in range(max(1, most), 0, -1) if m % 2 and m % 7), 1)


@dataclass(frozen=True)
class ExactPattern:
    """Input values whose sums over any subset of ranks are exact in the dtype.

    value(rank, g) = (7 g mod m) + h(rank), h(rank) = (13 rank mod k) + 1, with
    n (m - 1 + k) <= the largest exact integer of the dtype. The sum over ranks has the closed
    form n (7 g mod m) + sum h, so checking an 8 GiB buffer costs one pass, not n.
    With more ranks than exact integers (bfloat16 beyond 256 ranks) only the first ``cap``
    ranks contribute (ones), the rest send zeros: still exact, less able to spot a lost rank.
    """

    m: int
    k: int
    nranks: int
    cap: int

    @classmethod
    def for_dtype(cls, dtype: str, nranks: int, *, reduce: bool = True) -> "ExactPattern":
        """``reduce=False`` for data that is only moved (gathers, broadcast, send/recv): each value
        alone must be exact, so the whole range of the dtype is used and every rank differs."""
        limit = DTYPES[dtype][2]
        cap = max(1, min(nranks, limit)) if reduce else max(1, nranks)
        budget = max(1, limit // cap) if reduce else limit
        m = _period(min(251, budget // 2))
        k = max(1, min(127, budget - (m - 1)))
        return cls(m, k, nranks, cap)

    def h(self, rank: int) -> int:
        return (13 * rank) % self.k + 1 if rank < self.cap else 0

    @property
    def h_sum(self) -> int:
        return sum(self.h(r) for r in range(self.nranks))

    def values(self, torch: Any, rank: int, start: int, count: int, dtype: Any, device: Any) -> Any:
        idx = torch.arange(start, start + count, device=device, dtype=torch.int64)
        return ((idx * 7) % self.m + self.h(rank)).to(dtype)

    def sums(self, torch: Any, start: int, count: int, dtype: Any, device: Any) -> Any:
        idx = torch.arange(start, start + count, device=device, dtype=torch.int64)
        return ((idx * 7) % self.m * self.nranks + self.h_sum).to(dtype)
