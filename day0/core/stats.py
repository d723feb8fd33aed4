"""Percentiles as the field computes them, in one place for the stages and the report.

Latency percentiles follow vLLM's benchmark (numpy's default linear interpolation); the report's
charts must show the same numbers the checks judged, so they use this function too.
"""

from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], p: float, *, presorted: bool = False) -> float:
    """Linear interpolation between closest ranks (numpy's default, what vLLM bench uses)."""
    if not values:
        return math.nan
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside [0, 100]")
    v = values if presorted else sorted(values)
    rank = (len(v) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(v) - 1)
    frac = rank - lo
    return v[lo] + (v[hi] - v[lo]) * frac if frac else float(v[lo])
