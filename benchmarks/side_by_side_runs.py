"""Two whole Day0 runs at once, as the test suite's two xdist workers hold two engines: how long
each takes under each OpenMP wait policy (or any other environment), arm after arm.

`make test` runs its engine tests on one worker and its emulated-node tests on the other, so two
vLLM CPU engines (and day0's own torch work) share the box's cores for most of the suite. Each
round starts two default runs (cpu-tiny, `pytest -m day0`, the SLA widened as the e2e test does:
the question is time, not the verdict) under arm A, waits for both, then two under arm B, the
arms' order reversed every round (ABBA). Prints every run's wall and CPU seconds, then each arm's
median wall and the ratio A / B. Starts four engines at a time at most (two runs of two each):
take the engine lock on a shared box.

    flock /tmp/day0-engine.lock .venv/bin/python benchmarks/side_by_side_runs.py [--rounds 2] \\
        [--arm spin=] [--arm passive=OMP_WAIT_POLICY=PASSIVE]

2026-12-07 (AMD EPYC, 2 cores): spin 212-247 s a run, passive 98-110 s, over 3 rounds; the
script's own round (--rounds 1): medians 213.2 and 99.2 s, ratio 2.15
(docs/engine.md: the bullet "Spinning OpenMP threads ...").
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDE_SLA = ("sla.ttft_p90_ms=600000", "sla.tpot_p90_ms=60000", "sla.e2e_p90_ms=6000000",
            "sla.min_output_throughput_tok_s=0")
# the suite's own default (tests/conftest.py) is left out of every arm unless the arm sets it
CLEARED = ("OMP_WAIT_POLICY",)


@dataclass
class Arm:
    name: str
    env: dict[str, str]


@dataclass
class Run:
    arm: str
    wall_s: float
    passed: bool


def parse_arm(text: str) -> Arm:
    """``NAME=`` (the environment as it is, less CLEARED) or ``NAME=VAR=VALUE[,VAR=VALUE]``."""
    name, _, rest = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME= or NAME=VAR=VALUE[,VAR=VALUE]")
    env = {}
    for item in filter(None, rest.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not var:
            raise argparse.ArgumentTypeError(f"{text!r}: {item!r} is not VAR=VALUE")
        env[var] = value
    return Arm(name, env)


def start(arm: Arm, out: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update({"DAY0_COLLECT_ENV": "0", **arm.env})
    cmd = [sys.executable, "-m", "pytest", str(REPO / "day0" / "suites"), "-m", "day0", "--day0-profile", "cpu-tiny",
           "--day0-out", str(out), "-p", "no:cacheprovider", "-q"]
    for s in WIDE_SLA:
        cmd += ["--day0-set", s]
    with (out.parent / f"{out.name}.log").open("wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def pair(arm: Arm, work: Path, label: str) -> list[Run]:
    """Two runs of ``arm`` started together; each one's wall from its start to its own end."""
    t0 = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    ended: dict[int, Run] = {}
    try:
        for k in "ab":  # one by one: a second start that fails must not leave the first unstopped
            procs.append(start(arm, work / f"{label.replace(' ', '-')}-{k}"))
        while len(ended) < len(procs):  # each run's own end, whichever ends first
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = Run(arm.name, time.monotonic() - t0, p.returncode == 0)
            time.sleep(0.2)
    finally:  # stopped early (Ctrl-C, an error): SIGTERM is a Day0 run's own stop, which takes its engines down
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    runs = [ended[i] for i in range(len(procs))]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    for r in runs:
        print(f"{label}: {r.arm} {r.wall_s:.1f} s{'' if r.passed else ' (the run failed)'}"
              f"   (children's CPU so far {cpu.ru_utime + cpu.ru_stime:.0f} s)", flush=True)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arm", type=parse_arm, action="append",
                    help="NAME=VAR=VALUE[,...] (two arms; default: spin= and passive=OMP_WAIT_POLICY=PASSIVE)")
    a = ap.parse_args()
    arms = a.arm or [Arm("spin", {}), Arm("passive", {"OMP_WAIT_POLICY": "PASSIVE"})]
    if len(arms) != 2 or a.rounds < 1:
        ap.error("two arms and at least one round")
    runs: list[Run] = []
    tmp = Path(tempfile.mkdtemp(prefix="day0-side-by-side-"))
    try:
        for r in range(a.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                runs += pair(arm, tmp, f"round {r + 1} {arm.name}")
    except BaseException:
        print(f"kept {tmp}: stopped before the last round ended", file=sys.stderr)
        raise
    if all(x.passed for x in runs):
        shutil.rmtree(tmp)
    else:  # a failed run's time is no figure of its arm; its log and run folder are what to read
        print(f"kept {tmp}: a run failed (its .log beside its run folder)")
    walls = {arm.name: sorted(x.wall_s for x in runs if x.arm == arm.name and x.passed) for arm in arms}
    for name, w in walls.items():
        print(f"{name}: median {statistics.median(w):.1f} s over {len(w)} runs ({w[0]:.0f}-{w[-1]:.0f} s)" if w
              else f"{name}: no run passed")
    first, second = (arm.name for arm in arms)
    if walls[first] and walls[second]:
        print(f"ratio {first} / {second}: {statistics.median(walls[first]) / statistics.median(walls[second]):.2f}")
    return 0 if all(x.passed for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
