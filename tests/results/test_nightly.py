"""A real nightly on the CPU target: three pytest runs of the collective sweep (gloo ranks on
loopback, no vLLM engine, ~15-20 s each), the later two compared with the first. One earlier run
is a history shorter than ``compare.history_runs``, so only gross changes count (a factor of 2,
or the tolerance where that is wider).

The slowdown is injected through a real profile knob, not test-only code: the third run sets
``collectives.min_bytes``/``max_bytes`` to 16 KiB, where all_reduce is latency-bound, so the
busbw the ``collectives.all_reduce.busbw`` check reports drops ~25x (measured 2026-12-06: 1.11
GB/s at 16 MiB, 0.040 at 16 KiB; 0.99 and 0.012 with two busy processes beside them). At 64 KiB
it dropped only 7.4x idle, and in one CI run, with the emulated-node collective tests on the other
worker, under 2x: a baseline slowed by its neighbours leaves a small injected slowdown inside the
gross factor. (``collectives.dtype = "float16"`` slows gloo's reduction only ~2x, and on this
shared 2-core box two identical runs were measured up to 2.4x apart in busbw under the other
helpers' load, so one run per side cannot tell a 2x slowdown from noise here.) For the same
reason the nightly profile below gives busbw a wide 70% tolerance, wider than the gross factor; a
dedicated runner keeps the default 5%.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from day0.core.record import load
from day0.results import compare, history
from tests.support import REPO

pytestmark = pytest.mark.engine  # two whole Day0 runs compared: no engine test beside them (tests/conftest.py)

PROFILE = """
extends = "cpu-tiny"
name = "nightly-sim"

[collectives]
ops = ["all_reduce"]
min_bytes = "16M"
max_bytes = "16M"
iters = 20
tp_equivalence = false

[collectives.expected_busbw.intra_node]  # a floor both runs meet: only the comparison can reject
all_reduce = 0.001

[compare.tolerances]
"collectives.*.busbw" = "70%"
"""
SLOWER = ["--day0-set", 'collectives.min_bytes="16K"', "--day0-set", 'collectives.max_bytes="16K"']


def nightly(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "day0/suites", "-m", "day0 and collectives", "-k", "exact_and_fast",
         "--day0-profile", str(tmp_path / "nightly.toml"), "--day0-out", str(out), "-q", "-p", "no:cacheprovider",
         *extra],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    return proc, (out / "latest").resolve() / "run.json"


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="day0")
    compare.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_a_slowdown_is_flagged_and_an_identical_run_is_not(tmp_path, capsys):
    (tmp_path / "nightly.toml").write_text(PROFILE)
    a, run_a = nightly(tmp_path)
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    b, run_b = nightly(tmp_path, "--day0-baseline", str(run_a))
    c, run_c = nightly(tmp_path, "--day0-baseline", str(run_a), *SLOWER)
    ra, rb, rc = load(run_a), load(run_b), load(run_c)
    seen = "busbw GB/s: " + ", ".join(
        f"{what} {next(ch.value for ch in r.checks() if ch.id == 'collectives.all_reduce.busbw')}"
        for what, r in (("baseline", ra), ("identical", rb), ("slowed", rc)))

    # identical configuration: compared, not flagged, the job stays green
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    assert rb.stage("regression").verdict == "pass" and rb.verdict == ra.verdict == "incomplete", seen
    assert not compare.regressed(rb)

    # injected slowdown: flagged, the run is rejected and pytest exits 1
    assert c.returncode == 1, c.stdout[-3000:] + c.stderr[-3000:]
    assert rc.verdict == "rejected" and rc.reason.startswith("stage regression fail: regression.baseline")
    failed = {ch.id: ch for ch in rc.stage("regression").checks if ch.failed}
    assert set(failed) == {"regression.baseline", "regression.collectives.all_reduce.busbw"}, seen
    bw = failed["regression.collectives.all_reduce.busbw"]
    assert "history median" in bw.message and "tolerance 70% (collectives.*.busbw)" in bw.message
    assert bw.evidence["gross"] and bw.evidence["runs"] == 1  # one earlier run: gross changes only
    assert rc.stage("collectives").verdict == "pass"  # the stage itself still meets its own floor
    assert "REJECTED" in c.stdout and "regression.collectives.all_reduce.busbw" in c.stdout

    # the report shows the comparison and the trend over the three runs
    html = (run_c.parent / "report.html").read_text()
    assert 'id="regression"' in html and "collectives.all_reduce.busbw over the last 3 runs" in html
    assert "collectives.min_bytes" in html  # the profile change is named next to the comparison

    # every run is in the history, numbered, with its verdict in the name
    folder = history.folder_for(tmp_path / "reports" / "history", rc)
    assert [(e.number, e.verdict) for e in history.entries(folder)] == \
        [(1, "incomplete"), (2, "incomplete"), (3, "rejected")]

    # the same decision from the command line, from the run records alone
    assert _cli(["compare", str(run_c), "--baseline", str(run_a)]) == 1
    assert _cli(["compare", str(run_b), "--baseline", str(run_a)]) == 0
    assert _cli(["compare", str(run_b), "--baseline", "latest-accepted"]) == 2  # no accepted run yet
    out = capsys.readouterr()
    assert "REGRESSION  collectives.all_reduce.busbw" in out.out
    assert "no latest-accepted run in" in out.err


@pytest.fixture(autouse=True)
def _needs_gloo():
    pytest.importorskip("torch.distributed")
