"""Where a point's values past a limit came from: spells of late requests, each beside the arrivals
the schedule offered in the second before it.

Near a server's edge its first tokens do not run late one by one. On the cpu-tiny server
(docs/stages/capacity-evidence.md, "Late first tokens come in spells") the values past a 300 ms TTFT limit
came in spells of 1 to 149 requests, each right after one of the schedule's busiest seconds; the
same schedule replayed on fresh prompts brought about half of them back, a fresh schedule none, and the
server's own histogram counted them as the client did. So a miss reads with the burst that built
its queue (which a longer run at that rate meets again), or, after an ordinary second, as a rate the
server does not sustain (the point completed well under its offered rate: a queue that needs no
burst) or a stall of the host or the engine. The requests of one spell are one event, not
independent samples, though the order-statistic bounds count them as many (docs/metrics.md,
"Confidence" and "Spells")."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Sequence

JOIN_S = 1.0  # late requests scheduled within this of the spell's last (or within the limit, if longer) join it
LEAD_S = 1.0  # the arrivals that build a spell's queue: those scheduled this long before its first late request
TIME_METRICS = ("ttft", "e2e")  # per request and timed from its scheduled send: each value has a place in time
SHOWN = 3  # spells a line names (the largest); the record keeps them all


@dataclass(frozen=True)
class Spell:
    """Late requests whose scheduled times lie close together (``JOIN_S``), and the arrivals the
    schedule offered in the ``LEAD_S`` before the first: ``lead`` requests, ``ratio`` times the
    point's rate, more than in ``busier`` of the point's seconds (each ending at one of its requests;
    ties count half). None without a rate (a closed loop has no schedule) or a whole
    second before the spell."""

    start_s: float  # scheduled time of its first late request, seconds after the point's t=0
    end_s: float  # of its last
    late: int  # requests past the limit in it
    worst_ms: float
    lead: int | None
    ratio: float | None
    busier: float | None

    def text(self) -> str:
        when = f"{self.start_s:.1f} s" if self.end_s - self.start_s < 0.05 else f"{self.start_s:.1f}-{self.end_s:.1f} s"
        burst = (f"; the second before offered {self.ratio:.2g}x the rate, busier than {self.busier:.0%} of the "
                 "point's seconds" if self.ratio is not None and self.busier is not None else "")
        return f"{self.late} at {when} (up to {self.worst_ms:.0f} ms{burst})"


def late_spells(offsets_s: Sequence[float], values_ms: Sequence[float], limit_ms: float,
                rate: float | None) -> list[Spell]:
    """The spells of ``values_ms`` past ``limit_ms``, in time order; ``offsets_s`` are the requests'
    scheduled times (the same order and length as the values, as ``LatencyMetrics`` keeps them).
    Every request's offset counts as an arrival, late or not."""
    if len(offsets_s) != len(values_ms):
        raise ValueError(f"{len(offsets_s)} scheduled times for {len(values_ms)} values")
    times = sorted(offsets_s)
    late = sorted((t, v) for t, v in zip(offsets_s, values_ms) if v > limit_ms)
    join = max(JOIN_S, limit_ms / 1000.0)
    groups: list[list[tuple[float, float]]] = []
    for t, v in late:
        if groups and t - groups[-1][-1][0] <= join:
            groups[-1].append((t, v))
        else:
            groups.append([(t, v)])
    seconds = sorted(_lead(times, t) for t in times if t - LEAD_S >= times[0]) if rate else []
    spells = []
    for g in groups:
        start = g[0][0]
        lead = _lead(times, start) if seconds and start - LEAD_S >= times[0] else None
        busier = None if lead is None else (bisect_left(seconds, lead) + 0.5 * (
            bisect_right(seconds, lead) - bisect_left(seconds, lead))) / len(seconds)
        spells.append(Spell(round(start, 3), round(g[-1][0], 3), len(g), round(max(v for _, v in g), 1), lead,
                            None if lead is None or not rate else round(lead / (rate * LEAD_S), 3),
                            None if busier is None else round(busier, 3)))
    return spells


def _lead(times: Sequence[float], t: float) -> int:
    """Arrivals scheduled in the ``LEAD_S`` before ``t`` (``t`` itself not counted)."""
    return bisect_left(times, t) - bisect_left(times, t - LEAD_S)


@dataclass(frozen=True)
class LateSpells:
    """One limit's late requests at one point, spell by spell."""

    key: str  # the limit, as a point's misses name it ("ttft_p99")
    limit_ms: float
    spells: list[Spell]

    @property
    def late(self) -> int:
        return sum(s.late for s in self.spells)

    def text(self) -> str:
        """"ttft_p99: 7 values past 300 ms in 2 spells: 6 at 5.5-5.7 s (up to 362 ms; the second before
        offered 1.4x the rate, busier than 97% of the point's seconds), 1 at 23.2 s (...)"; the largest
        ``SHOWN`` spells only; "" when none is late."""
        if not self.late:
            return ""
        head = f"{self.key}: {self.late} value{'s' if self.late > 1 else ''} past {self.limit_ms:g} ms"
        if len(self.spells) == 1:
            return f"{head} in one spell, {self.spells[0].text()}"
        shown = sorted(sorted(self.spells, key=lambda s: -s.late)[:SHOWN], key=lambda s: s.start_s)
        rest = f"; the largest {SHOWN}" if len(self.spells) > SHOWN else ""
        return f"{head} in {len(self.spells)} spells{rest}: " + ", ".join(s.text() for s in shown)


def late_text(late: Sequence[LateSpells]) -> str:
    """Every limit's spells in words, "; "-joined ("" when no request was late)."""
    return "; ".join(t for t in (lt.text() for lt in late) if t)
