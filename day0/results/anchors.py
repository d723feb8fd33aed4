"""The report's element ids: one per check, unique on the page, in time and size linear in the checks.

Why a module of its own: check ids repeat by design (one check per shard, per rank, per node all
share an id), and the page needs one id per row to link to. Suffixing "-x" until an id was free
made the 8,000th copy of an id 16,000 characters long and its search 8,000 steps: 50 s and 63 MB
for 8,000 checks. Here each base id keeps its own counter, so a copy costs one step and a few
characters (``check-weights.shard-7999``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Anchors:
    """Hands out unique ids: the base id the first time, then ``base-1``, ``base-2``, ..."""

    taken: set[str] = field(default_factory=set)
    _next: dict[str, int] = field(default_factory=dict)  # base -> the next suffix to try

    def claim(self, base: str) -> str:
        """``base`` if free, else ``base-N`` for the lowest N not yet handed out for it. The
        counter only moves forward, so n copies cost O(n) in all, even when other checks' ids
        already hold some of the suffixed names (``weights.shard-1`` next to ``weights.shard``)."""
        anchor = base
        if anchor in self.taken:
            n = self._next.get(base, 1)
            while f"{base}-{n}" in self.taken:
                n += 1
            anchor = f"{base}-{n}"
            self._next[base] = n + 1
        self.taken.add(anchor)
        return anchor
