"""benchmarks/bench_late_spells.py: what its "recur" and server-count columns (and docs/stages/capacity-evidence.md's
"Late first tokens come in spells") rest on, without a server."""

import importlib.util
import sys

from tests.support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
spec = importlib.util.spec_from_file_location("bench_late_spells", REPO / "benchmarks" / "bench_late_spells.py")
spells = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = spells
spec.loader.exec_module(spells)


def spell(start: float, end: float) -> dict:
    return {"start_s": start, "end_s": end, "late": 1}


def test_a_spell_recurs_when_one_of_the_others_lies_within_near_s_of_its_span():
    first = [spell(5.5, 5.7), spell(23.2, 23.5), spell(40.0, 40.0)]
    replay = [spell(5.9, 6.0), spell(22.6, 22.65), spell(41.0, 41.0)]
    # 5.9 is 0.2 s after 5.7; 22.65 is 0.55 s before 23.2 (not within 0.5); 41.0 is a second off
    assert spells.recur(first, replay, 0.5) == 1
    assert spells.recur(first, replay, 0.6) == 2
    assert spells.recur(first, [], 0.5) == 0 and spells.recur([], replay, 0.5) == 0


def exposition(counts: dict[float, int], total: int) -> str:
    name = "vllm:time_to_first_token_seconds"
    rows = [f'{name}_bucket{{le="{le}"}} {n}' for le, n in sorted(counts.items())]
    return "\n".join([*rows, f'{name}_bucket{{le="+Inf"}} {total}', f"{name}_count {total}", f"{name}_sum 1.0"])


def test_the_server_count_is_past_the_largest_bucket_bound_at_or_under_the_limit():
    before = exposition({0.1: 10, 0.25: 20, 0.5: 25}, 30)
    after = exposition({0.1: 110, 0.25: 170, 0.5: 190}, 200)  # 170 requests between: 150 by 0.25 s, 20 past
    assert spells.past_bound(before, after, 300.0) == (250.0, 20)
    assert spells.past_bound(before, after, 500.0) == (500.0, 5)  # a bound equal to the limit is its own
    assert spells.past_bound(before, after, 50.0) is None  # no bucket at or under 50 ms
    assert spells.past_bound(before, "", 300.0) is None  # no histogram
