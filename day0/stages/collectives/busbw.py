"""Bandwidth formulas for collectives, as nccl-tests defines them (src/*.cu, doc/PERFORMANCE.md).

One definition for every number the collectives stage reports, so a figure measured here and one
imported from a site's nccl-tests run mean the same thing:

- ``S`` (the ``size`` column of nccl-tests) is the bytes of the *larger* buffer of one rank:
  the input of all_reduce / reduce_scatter / all_to_all, the output of all_gather.
- algbw = S / t, in GB/s with GB = 1e9 bytes.
- busbw = algbw x factor, where factor depends on the collective and the number of ranks n,
  so that busbw is comparable with the hardware's link bandwidth whatever n is.

The collectives' names (``OPS``, ``canonical_op``) are defined with the ``[collectives]`` table in
:mod:`day0.config.collectives` and re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.config.collectives import EXTRA_OPS, OPS, UnknownCollective, canonical_op

__all__ = ["EXTRA_OPS", "OPS", "BufferPlan", "UnknownCollective", "algbw_gbps", "bus_factor", "busbw_gbps",
           "canonical_op", "plan", "size_from_count"]

# Ops whose buffer of S bytes is split into n equal chunks (one per rank).
_SPLIT_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"})


def bus_factor(op: str, nranks: int) -> float:
    """busbw / algbw for ``op`` on ``nranks`` ranks (nccl-tests' correction factors)."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    op = canonical_op(op)
    n = float(nranks)
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1.0) / n
    return 1.0  # broadcast, reduce, sendrecv, hypercube


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """S / t in GB/s (1e9). A zero or negative time has no bandwidth: NaN, never infinity."""
    if seconds <= 0:
        return float("nan")
    return float(size_bytes) / seconds / 1e9


def busbw_gbps(op: str, size_bytes: float, seconds: float, nranks: int) -> float:
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

    @property
    def size_bytes(self) -> int:
        return self.elements * self.elem_size

    @property
    def count(self) -> int:
        """The ``count`` column of nccl-tests: per-rank elements for split ops, else all of them."""
        return self.chunk


def plan(op: str, size_bytes: int, elem_size: int, nranks: int) -> BufferPlan:
    """Turn a requested S into whole elements; split ops get n equal chunks of at least 0."""
    if elem_size < 1:
        raise ValueError(f"elem_size must be >= 1, got {elem_size}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    op = canonical_op(op)
    total = int(size_bytes) // elem_size
    if op in _SPLIT_OPS:
        chunk = total // nranks
        return BufferPlan(op, nranks, elem_size, chunk * nranks, chunk)
    return BufferPlan(op, nranks, elem_size, total, total)


def size_from_count(op: str, count: int, elem_size: int, nranks: int) -> int:
    """Inverse of :func:`plan`: S from the nccl-tests ``count`` column."""
    op = canonical_op(op)
    if op in _SPLIT_OPS:
        return count * elem_size * nranks
    return count * elem_size
