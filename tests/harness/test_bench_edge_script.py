"""benchmarks/bench_edge.py: the ABBA order, the overlap count and the per-arm summary its
closing lines (and docs/stages/capacity-evidence.md's figures) rest on, and the client-CPU window."""

import importlib.util
import os
import sys

import pytest

from tests.support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
spec = importlib.util.spec_from_file_location("bench_edge", REPO / "benchmarks" / "bench_edge.py")
edge = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = edge
spec.loader.exec_module(edge)


def run(arm: str, p: float | None, lo: float | None, hi: float | None, cores: float | None = 0.1) -> dict:
    return {"arm": arm, "p_ms": p, "lower": lo, "upper": hi, "client_cores": cores}


def test_schedule_alternates_the_order_so_drift_weighs_on_both_arms():
    assert edge.schedule(["day0", "vllm"], 3) == ["day0", "vllm", "vllm", "day0", "day0", "vllm"]
    assert edge.schedule(["day0"], 2) == ["day0", "day0"]


def test_overlapping_pairs_counts_only_runs_with_both_bounds():
    runs = [run("day0", 150, 120, 160), run("day0", 155, 150, 170), run("day0", 600, 580, 620),
            run("day0", None, 40, None)]  # the last could not be bounded: not in any pair
    assert edge.overlapping_pairs(runs) == (1, 3)
    touching = [run("day0", 1, 10, 20), run("day0", 1, 20, 30)]
    assert edge.overlapping_pairs(touching) == (1, 1)


def test_summary_gives_each_arm_its_median_range_and_the_ratio():
    runs = [run("day0", 100, 90, 110, 0.1), run("vllm", 200, 180, 220, 0.2), run("vllm", 400, 380, 420, 0.3),
            run("day0", 300, 290, 310, 0.1)]
    out = edge.summarise(runs, ["day0", "vllm"])
    assert out["arms"]["day0"] == {"median_ms": 200, "range_ms": [100, 300], "overlapping_pairs": [0, 1],
                                   "client_cores": 0.1}
    assert out["arms"]["vllm"]["median_ms"] == 300
    assert out["ratio"] == {"of": "day0 / vllm", "median_ms": round(200 / 300, 3), "client_cores": round(0.1 / 0.25, 3)}
    assert edge.summarise(runs[:1], ["day0"])["ratio"] == {}


def test_arms_are_checked_before_a_server_starts(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_edge.py", "--arms", "day0,vllm+run-in"])
    with pytest.raises(SystemExit) as stopped:
        edge.parse_args()
    assert stopped.value.code == 2
    assert "--arms: distinct names of day0, day0+flat-out, day0+run-in, vllm" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["bench_edge.py", "--arms", "day0,day0+run-in", "--rate", "40"])
    a = edge.parse_args()
    assert a.arms == ["day0", "day0+run-in"] and a.run_in_rate == 36.0


def test_client_cores_counts_only_the_intervals_the_rest_of_the_box_was_busy():
    """An import that keeps one core busy while the server idles is not the load phase; the load
    phase is where the box ran more than the client did."""
    w = edge.CpuWatch(busy_cores=0.5)
    # (t, box busy s, client s): 0-1 s the client imports alone, 1-3 s the server runs 1.8 cores
    w.samples = [(0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (2.0, 3.0, 1.2), (3.0, 5.0, 1.4)]
    assert w.client_cores() == 0.2
    assert edge.CpuWatch().client_cores() is None


def test_tree_cpu_reads_this_process():
    assert edge.tree_cpu_s(os.getpid()) > 0
    assert edge.box_busy_s() > 0
