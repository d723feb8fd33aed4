"""Verdict stability: the same checks measured N times on the same engine (``--day0-repeat N``).

A harness whose verdict flips on an unchanged system is worse than none, so repeating the
measuring stages is a feature, not a debugging aid: each check's values across the repeats are
summarised (median, range, spread) and any check whose status differed between repeats is named.
A flipped verdict cannot be signed, so it makes the run INCOMPLETE (an ``error`` check) unless a
``fail`` already rejected it. Reads only the run record; the session adds the check it returns.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from day0.core.record import Check, RunRecord
from day0.core.stages import REPEAT_STAGE
from day0.core.stats import percentile

__all__ = ["REPEAT_STAGE", "STABILITY_ID", "Series", "series", "stability_check"]

STABILITY_ID = "repeat.stability"


@dataclass
class Series:
    """One check measured in several repeats (the k-th check of that id within each repeat)."""

    id: str
    unit: str
    statuses: list[str]
    values: list[Any]
    performance: bool = False  # a performance figure (its spread is news; a cross-check near 0 is not)

    @property
    def numbers(self) -> list[float]:
        return [float(v) for v in self.values if isinstance(v, (int, float)) and not isinstance(v, bool)]

    @property
    def stable(self) -> bool:
        return len(set(self.statuses)) == 1

    def describe_flip(self) -> str:
        counts = Counter(self.statuses)
        parts = [f"{_verb(s)} {n} of {len(self.statuses)}" for s, n in counts.most_common()]
        return f"{self.id} " + ", ".join(parts)

    def row(self) -> list[Any]:
        nums = self.numbers
        if len(nums) == len(self.values) and nums:
            med = percentile(nums, 50)
            lo, hi = min(nums), max(nums)
            spread = round(100.0 * (hi - lo) / abs(med), 2) if med else None
            figures: list[Any] = [_r(med), _r(lo), _r(hi), spread]
        else:
            figures = [None, None, None, None]
        verdicts = ", ".join(f"{_verb(s)} {n}" for s, n in Counter(self.statuses).most_common())
        return [self.id, self.unit, *figures, verdicts, "stable" if self.stable else "UNSTABLE"]


def _verb(status: str) -> str:
    return {"pass": "passed", "fail": "failed", "error": "errored", "skip": "skipped",
            "blocked": "blocked"}.get(status, status)


def _r(x: float) -> float:
    """Five significant digits for the table; whole numbers (tokens, blocks) stay exact."""
    return x if float(x).is_integer() else float(f"{x:.5g}")


def series(record: RunRecord) -> list[Series]:
    """Repeated checks grouped by id and by their position among same-id checks of one repeat."""
    grouped: dict[tuple[str, int], Series] = {}
    seen: dict[tuple[int, str], int] = defaultdict(int)
    for check in record.checks():
        if check.repeat is None:
            continue
        k = seen[(check.repeat, check.id)]
        seen[(check.repeat, check.id)] += 1
        s = grouped.setdefault((check.id, k), Series(check.id, check.unit, [], [], check.performance))
        s.statuses.append(check.status)
        s.values.append(check.value)
    return [s for s in grouped.values() if len(s.statuses) > 1]


def stability_check(record: RunRecord, repeats: int) -> Check:
    """One check for the whole run: a table of every repeated check's spread beside its value,
    ``error`` naming each check whose verdict flipped."""
    all_series = series(record)
    unstable = [s for s in all_series if not s.stable]
    table = {"columns": ["check", "unit", "median", "min", "max", "spread % of median", "verdicts", "stability"],
             "rows": [s.row() for s in all_series]}
    evidence = {"repeats": repeats, "table": table, "unstable": [s.describe_flip() for s in unstable]}
    title = f"Same verdict in each of {repeats} repeats"
    if not all_series:
        return Check(id=STABILITY_ID, title=title, status="skip", source="record", evidence=evidence,
                     message=f"--day0-repeat {repeats}: no check was measured more than once")
    if unstable:
        return Check(id=STABILITY_ID, title=title, status="error", source="record", evidence=evidence,
                     value=len(unstable), limit=0, unit="checks", direction="exact",
                     message="unstable: " + "; ".join(s.describe_flip() for s in unstable))
    # among performance figures only: a cross-check whose median is near 0 has a meaningless relative spread
    widest = max((s for s in all_series if s.performance and s.row()[5] is not None), key=lambda s: s.row()[5],
                 default=None)
    tail = f"; widest spread {widest.id} {widest.row()[5]:g}% of its median" if widest else ""
    return Check(id=STABILITY_ID, title=title, status="pass", source="record", evidence=evidence,
                 value=0, limit=0, unit="checks", direction="exact",
                 message=f"{len(all_series)} checks gave the same verdict in each of {repeats} repeats{tail}")
