"""benchmarks/bench_capacity.py: the dense list's own requests judged by day0's rule, a tool's
answer read off its points, and the table over rounds (benchmarks/capacity_report.py): the figures
the side-by-side's closing ratios rest on."""

import argparse
import importlib.util
import sys

import pytest

from tests.support import REPO

spec = importlib.util.spec_from_file_location("bench_capacity", REPO / "benchmarks" / "bench_capacity.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)
import capacity_report as report  # noqa: E402  (on the path once bench_capacity is loaded)
import server_metrics  # noqa: E402

SLA = argparse.Namespace(percentile=99.0, ttft_limit_ms=300.0, tpot_limit_ms=40.0)


def dense_result(ttfts_ms: list[float], *, tpot_ms: float = 10.0, out: int = 8, failed: int = 0) -> dict:
    """What ``main_async`` returns with ``--save-detailed``, for requests sent 50 ms apart."""
    n = len(ttfts_ms)
    ttft = [t / 1000.0 for t in ttfts_ms]
    itl = [[tpot_ms / 1000.0] * (out - 1) for _ in range(n)]
    lat = [t + sum(g) for t, g in zip(ttft, itl)]
    errors = ["Internal Server Error" if i < failed else "" for i in range(n)]
    start = [0.05 * i for i in range(n)]
    return {"duration": max(s + x for s, x in zip(start, lat)), "completed": n - failed, "failed": failed,
            "ttfts": [0.0 if e else t for t, e in zip(ttft, errors)], "itls": [[] if e else g for g, e in zip(itl, errors)],
            "latencies": lat, "start_times": start, "queue_times": [0.0] * n, "errors": errors,
            "input_lens": [128] * n, "output_lens": [0 if e else out for e in errors], "request_rate": 20.0,
            "burstiness": 1.0, "max_concurrency": None}


@pytest.mark.parametrize("past, verdict", [(0, "meets"), (1, "undecided"), (6, "undecided"), (7, "misses")])
def test_dense_rate_is_judged_by_the_bounds_not_the_point_estimate(past, verdict):
    """300 requests: the p99's upper bound is the largest TTFT, its lower bound the seventh largest,
    so one slow request leaves the limit inside the interval and seven put it past it, whatever the
    point estimate (the third largest) says."""
    ttfts = [50.0 + i * 0.1 for i in range(300 - past)] + [900.0] * past
    got, bounds = bench.judged_by_day0(dense_result(ttfts), 20.0, SLA)
    assert got == verdict
    low, high = bounds["ttft_p99"]
    assert high == pytest.approx(900.0 if past else 79.9, abs=0.5)
    assert (low > SLA.ttft_limit_ms) == (past >= 7)


def test_a_failed_request_misses_and_tpot_is_judged_too():
    assert bench.judged_by_day0(dense_result([50.0] * 300, failed=1), 20.0, SLA)[0] == "misses"
    got, bounds = bench.judged_by_day0(dense_result([50.0] * 300, tpot_ms=45.0), 20.0, SLA)
    assert got == "misses" and bounds["tpot_p99"][0] == pytest.approx(45.0, abs=0.5)


def test_an_answer_is_the_highest_met_rate_below_the_first_not_met():
    points = [{"rate": 16, "verdict": "meets", "by_bounds": "meets"},
              {"rate": 17.6, "verdict": "meets", "by_bounds": "undecided"},
              {"rate": 19.4, "verdict": "meets", "by_bounds": "meets"},
              {"rate": 21.3, "verdict": "misses", "by_bounds": "misses"}]
    assert bench.highest_met(points) == (19.4, 21.3)
    # day0's rule: a straddled limit tops the bracket, so the met rate above it is not the answer
    assert bench.highest_met(points, "by_bounds", ("misses", "undecided")) == (16, 17.6)
    assert bench.highest_met(points[3:]) == (None, 21.3)


def ttft_histogram(counts: dict[float, int]) -> str:
    """/metrics text with vLLM's first-token histogram: ``counts`` per bucket bound (s), cumulated."""
    lines, total = ["# TYPE vllm:time_to_first_token_seconds histogram"], 0
    for le in (0.25, 0.5, 0.75, 1.0):
        total += counts.get(le, 0)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {total}')
    total += counts.get(float("inf"), 0)
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {total}',
              f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {total}',
              f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total * 0.1}']
    return "\n".join(lines) + "\n"


def test_first_tokens_past_the_limit_as_the_server_and_the_client_saw_them():
    """A 300 ms limit reads at the server's 500 ms bound; only the rate's own window counts."""
    before = ttft_histogram({0.25: 100, 0.75: 5})
    after = ttft_histogram({0.25: 390, 0.5: 5, 0.75: 8, float("inf"): 2})
    got = server_metrics.first_tokens_past(before, after, [0.1] * 296 + [0.45, 0.6, 0.9, 2.0], 300.0)
    assert got == {"bound_ms": 500.0, "server": 5, "server_n": 300, "client": 3}
    assert server_metrics.first_tokens_past(None, after, [0.1], 300.0) is None
    assert server_metrics.first_tokens_past(before, after, [0.1], 5000.0) is None  # no finite bound that high


def tool_round(tool: str, sustained: float | None, requests: int, **extra) -> dict:
    return bench.summary(tool, [{"rate": 16.0, "verdict": "meets"}], requests, 60.0) | {"sustained": sustained} | extra


def test_the_table_compares_medians_over_rounds_and_keeps_each_round():
    """A round without an answer is shown, not counted: day0's median is over the two it has, and
    its drift is its own highest over its lowest; the ratios divide day0's medians by the other's."""
    rounds = [{"day0": tool_round("day0", 40.0, 1500), "vllm": tool_round("vllm", 41.5, 3600)},
              {"vllm": tool_round("vllm", 45.65, 3900), "day0": tool_round("day0", 44.0, 1700)},
              {"day0": tool_round("day0", None, 900), "vllm": tool_round("vllm", 37.73, 3300)}]
    got = report.report(rounds, {"ttft_p99_ms": 300.0}, {"input_len": 128})
    day0, dense = got["tools"]["day0"], got["tools"]["vllm"]
    assert list(got["tools"]) == ["day0", "vllm"]
    assert day0["sustained"] == 42.0 and day0["rounds_sustained"] == [40.0, 44.0, None]
    assert day0["drift"] == pytest.approx(1.1) and day0["requests"] == 1500
    assert dense["sustained"] == 41.5 and dense["requests"] == 3600
    assert got["ratios_day0_over"]["vllm"] == {"sustained": pytest.approx(42.0 / 41.5),
                                               "requests": pytest.approx(1500 / 3600)}
    assert got["sla"] == {"ttft_p99_ms": 300.0} and len(got["rounds"]) == 3


def test_what_day0_spent_is_split_into_shares_of_the_other_tools_requests_in_the_same_round(capsys):
    parts = {"flat_out": 200, "short": 421, "held_met": 1348, "held_not_met": 1150}
    day0 = tool_round("day0", 44.92, 3131, by_part=parts)  # 12 more: its warm-up and measured phase
    rounds = [{"day0": day0, "vllm": tool_round("vllm", 38.51, 6000)},
              {"vllm": tool_round("vllm", 46.8, 7200), "day0": tool_round("day0", 46.06, 4248)}]
    got = report.report(rounds, {"ttft_p99_ms": 300.0}, {"input_len": 128})["day0_spend_shares"]["vllm"]
    assert got[0] == {"held_met": pytest.approx(1348 / 6000), "held_not_met": pytest.approx(1150 / 6000),
                      "short": pytest.approx(421 / 6000), "flat_out": pytest.approx(200 / 6000),
                      "rest": pytest.approx(12 / 6000)}
    assert got[1] is None  # a round whose day0 did not say (an older run) has no split
    assert ("day0's requests in round 1, as shares of vllm's: the hold that met 0.225, held misses 0.192, "
            "short points 0.070, flat out 0.033, the rest 0.002") in capsys.readouterr().out
    assert report.spend_shares(day0, tool_round("vllm", None, 0)) is None


def test_no_ratio_without_an_answer_on_both_sides():
    rounds = [{"day0": tool_round("day0", None, 900), "vllm": tool_round("vllm", 41.5, 3600,
                                                                         sustained_by_bounds=37.73)}]
    got = report.ratios({t: report.combined(t, [r[t] for r in rounds]) for t in rounds[0]})
    assert got == {"vllm": {"sustained": None, "requests": pytest.approx(900 / 3600), "sustained_by_bounds": None}}


def test_a_dense_rate_says_how_bursty_its_arrivals_were():
    point = {"rate": 50.21, "n": 300, "verdict": "misses", "ttft_ms": 589.4, "tpot_ms": 13.0, "offered_calmer": 0.03}
    assert "arrivals burstier than 97% of Poisson draws" in report.point_line(point)
    assert "Poisson draws" not in report.point_line(point | {"offered_calmer": None})


def test_a_held_answer_passes_only_when_every_limit_passed_and_says_which_did_not():
    """benchmarks/capacity_hold.py: the verdict over a hold's limits, and its printed line."""
    import capacity_hold as hold

    def held(*statuses: str) -> dict:
        limits = {f"m{i}_p99_ms": {"status": st, "ms": 250.0, "lower": 240.0, "upper": 260.0}
                  for i, st in enumerate(statuses)}
        return {"tool": "day0", "rate": 41.2, "requests": 7420, "wall_s": 184.0, "limits": limits,
                "windows_ms": [237.0, None], "why": ""}

    assert hold.verdict(held("pass", "pass")) == "pass"
    assert hold.verdict(held("pass", "fail")) == "fail" and hold.verdict(held("error", "fail")) == "fail"
    assert hold.verdict(held("pass", "error")) == "error" and hold.verdict(held()) == "error"  # nothing judged
    line = hold.hold_line(held("pass", "fail"), 30.0)
    assert line.startswith("    day0: 41.2 req/s held 7420 requests (184 s): FAIL")
    assert "m1_p99_ms 250.0 [240.0, 260.0] fail" in line and "per 30 s (ms): 237, -" in line


def test_a_limit_check_reads_its_estimate_from_the_evidence_when_undecided():
    """capacity_report.limit_figures, which bench_edge and capacity_hold read day0's checks with."""
    met = {"status": "pass", "value": 250.0, "evidence": {"bounds": {"lower": 240.0, "upper": 260.0}}}
    undecided = {"status": "error", "value": None,
                 "evidence": {"point_estimate": 301.0, "bounds": {"lower": 290.0, "upper": None}}}
    assert report.limit_figures(met) == {"status": "pass", "ms": 250.0, "lower": 240.0, "upper": 260.0}
    assert report.limit_figures(undecided) == {"status": "error", "ms": 301.0, "lower": 290.0, "upper": None}


def test_a_record_names_the_commit_it_ran_from_and_the_setup_that_sets_its_cost():
    """What capacity_runs.py reads to tell runs of other code or another question apart (the commit
    is the run record's own ``git_commit``, of the script's checkout)."""
    import re

    from day0.core.environment import git_commit

    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", git_commit(bench.ROOT) or ""), git_commit(bench.ROOT)
    a = argparse.Namespace(start_rate=16.0, dense_start=0.0, dense_step=1.05, dense_requests=300, rounds=2,
                           scripted_slots=0)
    assert bench.setup(a) == {"start_rate": 16.0, "dense_start": 16.0, "dense_step": 1.05, "dense_requests": 300,
                              "rounds": 2, "scripted_slots": 0}
    assert bench.setup(argparse.Namespace(**{**vars(a), "dense_start": 4.0}))["dense_start"] == 4.0
