"""Percentiles as the field computes them, in one place for the stages and the report.

Latency percentiles follow vLLM's benchmark (numpy's default linear interpolation); the report's
charts must show the same numbers the checks judged, so they use this function too. The
collective sweep's per-iteration times follow nccl-tests' nearest-rank rule (``method="nearest"``).
"""

from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], p: float, *, presorted: bool = False, method: str = "linear") -> float:
    """``linear``: interpolation between closest ranks (numpy's default, what vLLM bench uses);
    ``nearest``: the value at rank ceil(n p / 100) (nccl-tests' rule, never a value not seen)."""
    if not values:
        return math.nan
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside [0, 100]")
    v = values if presorted else sorted(values)
    if method == "nearest":
        return float(v[min(len(v) - 1, max(0, math.ceil(len(v) * p / 100.0) - 1))])
    if method != "linear":
        raise ValueError(f"percentile method {method!r} is not 'linear' or 'nearest'")
    rank = (len(v) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(v) - 1)
    frac = rank - lo
    return v[lo] + (v[hi] - v[lo]) * frac if frac else float(v[lo])
