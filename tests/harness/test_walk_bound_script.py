"""benchmarks/walk_bound.py: the count behind the search's bound on its walk down, over recorded
searches (no server)."""

import importlib.util
import sys

from tests.support import REPO

spec = importlib.util.spec_from_file_location("walk_bound", REPO / "benchmarks" / "walk_bound.py")
bound = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bound
spec.loader.exec_module(bound)

HELD = " (held from its start, 30 s of load: a held rate above it did not meet, so no short point here)"


def walk(answer: float) -> dict:
    """A plain walk: a confirmation far into overload (48 offered, 35 completed), four held misses down
    to 36.6, the answer held; a short point and a lagged hold the count leaves out."""
    rows = [[48.0, 35.0, 400, "misses: ttft_p90 (its point's 60 requests and 340 more, 10 s of load in all)"],
            [45.7, 34.0, 300, "misses: ttft_p90" + HELD], [43.5, 20.0, 300, "client_lagged: the load generator"],
            [41.5, 34.5, 320, "misses: ttft_p90" + HELD], [39.5, 34.8, 500, "undecided: ttft_p90" + HELD],
            [37.6, 34.0, 700, "misses: ttft_p90" + HELD], [answer, answer, 1000, "meets" + HELD],
            [30.0, 29.0, 60, "meets"]]
    return {"seed": 0, "value": answer, "completed": 3580, "rows": rows, "message": "sustains ..."}


def test_the_bound_skips_the_held_misses_over_it_and_says_when_it_fell_under_the_answer():
    got = bound.counted(walk(35.8), 1.05 ** 3, 60)
    # 48 completed 35 -> bound 40.5: 45.7 and 41.5 skipped; 45.7's 34.0 -> 39.4: 39.5 skipped; 37.6 is under it
    assert got["skipped"] == [45.7, 41.5, 39.5] and got["spared"] == 300 + 320 + 500
    assert got["spared_less_landing"] == 300 + 320 and not got["under"]
    assert bound.counted(walk(35.8), 1.05, 60)["under"]  # one step over 34.0 is under 35.8
    assert bound.counted(walk(35.8), 1.05 ** 3, 1000)["skipped"] == []  # no held miss long enough to read


def test_answer_over_achieved_is_read_from_every_held_miss_of_a_points_requests():
    ratios = bound.answer_over_achieved([walk(35.8)], 60)
    assert len(ratios) == 5 and ratios[0] == 35.8 / 34.0 and ratios[-1] == 35.8 / 35.0
