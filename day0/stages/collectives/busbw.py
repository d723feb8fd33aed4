"""Bandwidth formulas for collectives, as nccl-tests defines them (src/*.cu, doc/PERFORMANCE.md).

One definition for every number the collectives stage reports, so a figure measured here and one
imported from a site's nccl-tests run mean the same thing:

- ``S`` (the ``size`` column of nccl-tests) is the bytes of the *larger* buffer of one rank:
  the input of all_reduce / reduce_scatter / all_to_all, the output of all_gather.
- algbw = S / t, in GB/s with GB = 1e9 bytes.
- busbw = algbw x factor, where factor depends on the collective and the number of ranks n,
  so that busbw is comparable with the hardware's link bandwidth whatever n is.

Each op's factor and buffer layout are its spec's (:mod:`day0.core.collective_ops`); these
functions read them from the registry, so a registered op has its busbw with no edit here.

An all-to-all with uneven splits (``uneven_splits``: expert dispatch and combine) has no factor of
n alone. Its S is each rank's T x top_k token rows (the same on every rank), algbw = S / t, and
busbw = the off-rank bytes of the busiest rank in its busier direction / t
(:func:`peak_offrank`): the bytes the most loaded rank's link carried in the time the step took.
With even splits that is S (n-1)/n / t, nccl-tests' all_to_all busbw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from day0.core.collective_ops import OPS, Traffic

if TYPE_CHECKING:
    from day0.stages.collectives.routing import Routing

__all__ = ["BufferPlan", "algbw_gbps", "bus_factor", "busbw_gbps", "peak_offrank", "plan", "size_from_count"]


def bus_factor(op: str, nranks: int) -> float:
    """busbw / algbw for ``op`` (any spelling) on ``nranks`` ranks: its spec's ``bus`` (nccl-tests'
    correction factor)."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    return OPS.resolve(op).bus(nranks)


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """S / t in GB/s (1e9). A zero or negative time has no bandwidth: NaN, never infinity."""
    if seconds <= 0:
        return float("nan")
    return float(size_bytes) / seconds / 1e9


def busbw_gbps(op: str, size_bytes: float, seconds: float, nranks: int) -> float:
    """algbw x the op's bus factor: comparable with the link's bandwidth whatever n is."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, nranks)


@dataclass(frozen=True)
class BufferPlan:
    """Element counts for one sweep point, rounded the way nccl-tests rounds them.

    ``size_bytes`` is the S actually moved (a requested size that does not split evenly into
    n chunks of whole elements is rounded down, as nccl-tests does), ``chunk`` the elements
    per rank for split ops (else equal to ``elements``).
    """

    op: str
    nranks: int
    elem_size: int
    elements: int  # elements in the larger buffer (S / elem_size)
    chunk: int  # elements per rank's share (split ops) or whole buffer
    traffic: Traffic | None = None  # uneven splits: elements rank i sends rank j (dispatch's direction)

    @property
    def size_bytes(self) -> int:
        return self.elements * self.elem_size

    @property
    def bus_factor(self) -> float:
        """busbw / algbw at this point: the op's factor of n, or with uneven splits the busiest rank's
        off-rank elements over S's (which is (n-1)/n again when the splits are even)."""
        if self.traffic is None:
            return bus_factor(self.op, self.nranks)
        return peak_offrank(self.traffic) / self.elements if self.elements else 0.0

    @property
    def count(self) -> int:
        """The ``count`` column of nccl-tests: per-rank elements for split ops, else all of them."""
        return self.chunk


def peak_offrank(m: Traffic) -> int:
    """What the busiest rank moves off itself in its busier direction: max over ranks r of
    max(sum of m[r][j], sum of m[i][r]) over peers i, j != r (its own block crosses no link; sending
    and receiving share no wire). The same for a matrix and its transpose: dispatch and combine."""
    n = len(m)
    return max((max(sum(m[r]) - m[r][r], sum(row[r] for row in m) - m[r][r]) for r in range(n)), default=0)


def plan(op: str, size_bytes: int, elem_size: int, nranks: int, routing: Routing | None = None) -> BufferPlan:
    """Turn a requested S into whole elements; split ops get n equal chunks of at least 0, uneven ops
    (``routing`` required) ``routing.per_rank`` token rows of S // (per_rank x elem) elements each."""
    if elem_size < 1:
        raise ValueError(f"elem_size must be >= 1, got {elem_size}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    spec = OPS.resolve(op)
    total = int(size_bytes) // elem_size
    if spec.uneven_splits:
        if routing is None or routing.n != nranks:
            raise ValueError(f"{spec.name} takes its split sizes from an expert routing of {nranks} ranks")
        row = total // routing.per_rank if routing.per_rank else 0
        elements = row * routing.per_rank
        return BufferPlan(spec.name, nranks, elem_size, elements, elements, routing.elements(row))
    if spec.split:
        chunk = total // nranks
        return BufferPlan(spec.name, nranks, elem_size, chunk * nranks, chunk)
    return BufferPlan(spec.name, nranks, elem_size, total, total)


def size_from_count(op: str, count: int, elem_size: int, nranks: int) -> int:
    """Inverse of :func:`plan`: S from the nccl-tests ``count`` column."""
    if OPS.resolve(op).split:
        return count * elem_size * nranks
    return count * elem_size
