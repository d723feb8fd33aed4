"""How a bound on the capacity search's walk down would have cut searches already run: the count
behind ``search.BACKLOG_STEPS`` (docs/stages/latency.md, "Past an overloaded hold the walk skips").

Reads ``bench_search_repeat.py --json`` files. For every held miss (a point held from its start or a
confirmation, that did not meet, over at least ``--min-requests`` requests) it takes the answer over
what the miss completed (its achieved req/s): the bound ``factor`` x achieved is safe while that stays
under the factor. For every search that walked one step at a time (no skip in its message), it applies
the bound in walk order (each held miss lowers it to ``factor`` x what it completed) and counts the
held misses above it, which the walk would have skipped, with their requests: spared, and spared less
the largest skipped hold (a skip lands on a hold of its own); and whether the bound ever fell under the
search's answer, where a hold that meets costs its whole length and the bisection back up more.
No server: the searches' own records.

    .venv/bin/python benchmarks/walk_bound.py runs1.json runs2.json [--factor 1.157625 --factor 1.1025]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from day0.config.latency import CapacitySearch  # noqa: E402
from day0.stages.latency.search import BACKLOG_STEPS  # noqa: E402

STEPS = (1.0 + CapacitySearch().precision) ** BACKLOG_STEPS  # the search's own bound, at its default precision
HELD = ("held from its start", "its point's")  # a confirmation's row says one of these (capacity._extends_text)


@dataclass(frozen=True)
class Held:
    offered: float
    achieved: float
    completed: int
    met: bool


def held_points(run: dict[str, Any]) -> list[Held]:
    """The search's held points, highest offered first (the walk's order), a lagged one left out."""
    rows = [r for r in run.get("rows") or [] if any(h in str(r[-1]) for h in HELD)
            and not str(r[-1]).startswith("client_lagged")]
    return sorted((Held(r[0], r[1], r[2], str(r[-1]).startswith("meets")) for r in rows),
                  key=lambda h: -h.offered)


def counted(run: dict[str, Any], factor: float, min_requests: int) -> dict[str, Any]:
    """What the bound would have done to one plain walk."""
    bound: float | None = None
    skipped: list[Held] = []
    for h in (h for h in held_points(run) if not h.met):
        if bound is not None and h.offered > bound:
            skipped.append(h)
        if h.completed >= min_requests and h.achieved:
            bound = min(bound, factor * h.achieved) if bound is not None else factor * h.achieved
    spared = sum(h.completed for h in skipped)
    return {"seed": run.get("seed"), "answer": run["value"], "bound": bound, "skipped": [h.offered for h in skipped],
            "spared": spared, "spared_less_landing": spared - max((h.completed for h in skipped), default=0),
            "requests": run["completed"], "under": bound is not None and bound < run["value"]}


def answer_over_achieved(runs: list[dict[str, Any]], min_requests: int) -> list[float]:
    """Each held miss's search answer over what the miss completed, largest first."""
    return sorted((r["value"] / h.achieved for r in runs for h in held_points(r)
                   if not h.met and h.completed >= min_requests and h.achieved), reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench_search_repeat.py --json outputs")
    ap.add_argument("--factor", type=float, action="append",
                    help="bound / achieved (default: the search's own, 1.05^3, and one step less)")
    ap.add_argument("--min-requests", type=int, default=60, help="a held miss's fewest requests (a point's)")
    a = ap.parse_args()
    runs = [r for f in a.files for r in json.loads(f.read_text())["runs"] if r.get("status") == "pass"]
    ratios = answer_over_achieved(runs, a.min_requests)
    print(f"{len(runs)} searches, {len(ratios)} held misses: answer / achieved at most "
          f"{', '.join(f'{x:.3f}' for x in ratios[:3])}")
    plain = [r for r in runs if "completed only" not in r["message"]]
    for factor in a.factor or [STEPS, STEPS / (1.0 + CapacitySearch().precision)]:
        got = [counted(r, factor, a.min_requests) for r in plain]
        for g in got:
            print(f"  x{factor:.4f} seed {g['seed']}: answer {g['answer']:.2f}, bound {g['bound'] or 0:.2f}"
                  f"{' UNDER' if g['under'] else ''}, skipped {[round(x, 2) for x in g['skipped']]} "
                  f"({g['spared']} of {g['requests']} requests)")
        total = sum(g["requests"] for g in got) or 1
        print(f"x{factor:.4f}: {len(got)} plain walks, {sum(bool(g['skipped']) for g in got)} cut short, "
              f"spared {sum(g['spared_less_landing'] for g in got) / total:.1%}-{sum(g['spared'] for g in got) / total:.1%}"
              f" of their requests, under the answer in {sum(g['under'] for g in got)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
