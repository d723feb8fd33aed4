"""benchmarks/side_by_side_runs.py: its arms and its timing of two runs started together (no engine:
the runs here are `sleep`s)."""

import argparse
import importlib.util
import subprocess
import sys
import time as real_time
import types

import pytest

from tests.support import REPO

spec = importlib.util.spec_from_file_location("side_by_side_runs", REPO / "benchmarks" / "side_by_side_runs.py")
side = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = side
spec.loader.exec_module(side)


def test_an_arm_is_a_name_and_its_environment():
    assert side.parse_arm("spin=") == side.Arm("spin", {})
    assert side.parse_arm("passive=OMP_WAIT_POLICY=PASSIVE,X=1") == side.Arm("passive", {"OMP_WAIT_POLICY": "PASSIVE",
                                                                                         "X": "1"})
    for bad in ("=X=1", "a=X", "a==1"):
        with pytest.raises(argparse.ArgumentTypeError, match="VAR=VALUE|NAME="):
            side.parse_arm(bad)


def test_each_run_of_a_pair_is_timed_to_its_own_end(tmp_path, monkeypatch):
    """The first-started run ends last here: waiting on them in order would time the second run to the
    first's end."""
    lengths = iter([1.2, 0.1])
    monkeypatch.setattr(side, "start", lambda arm, out: subprocess.Popen(["sleep", str(next(lengths))]))
    slow, fast = side.pair(side.Arm("a", {}), tmp_path, "round 1 a")
    assert slow.passed and fast.passed
    assert fast.wall_s < slow.wall_s, (fast, slow)  # in order, the fast one would be timed to the slow one's end


def test_an_arm_gets_only_its_own_wait_policy(tmp_path, monkeypatch):
    """tests/conftest.py sets OMP_WAIT_POLICY=PASSIVE for the suite: the spinning arm must not inherit it."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    seen = []
    monkeypatch.setattr(side.subprocess, "Popen", lambda cmd, **kw: seen.append(kw["env"]))
    side.start(side.Arm("spin", {}), tmp_path / "spin-a")
    side.start(side.Arm("passive", {"OMP_WAIT_POLICY": "PASSIVE"}), tmp_path / "passive-a")
    assert "OMP_WAIT_POLICY" not in seen[0] and seen[1]["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_pair_stopped_early_stops_both_runs(tmp_path, monkeypatch):
    """Ctrl-C (or a failing second start) in the middle: no Day0 run, and so no engine, is left running."""
    started = []

    def start(arm, out):
        started.append(subprocess.Popen(["sleep", "600"]))
        return started[-1]

    monkeypatch.setattr(side, "start", start)
    real_sleep, interrupts = real_time.sleep, [KeyboardInterrupt()]

    def sleep(seconds):  # the poll's first sleep is interrupted; subprocess's own waits sleep as usual
        if interrupts:
            raise interrupts.pop()
        real_sleep(seconds)

    # the script's own `time` only: another thread's sleep elsewhere in the worker is left alone
    monkeypatch.setattr(side, "time", types.SimpleNamespace(monotonic=real_time.monotonic, sleep=sleep))
    with pytest.raises(KeyboardInterrupt):
        side.pair(side.Arm("a", {}), tmp_path, "round 1 a")
    assert len(started) == 2 and all(p.returncode is not None for p in started)

    def second_fails(arm, out):
        if started[2:]:
            raise OSError("no room for the log")
        return start(arm, out)

    monkeypatch.setattr(side, "start", second_fails)
    with pytest.raises(OSError):
        side.pair(side.Arm("a", {}), tmp_path, "round 2 a")
    assert len(started) == 3 and started[2].returncode is not None
