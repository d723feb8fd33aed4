#!/usr/bin/env python3
"""Run `make demo` N times and `make test` M times, optionally beside K busy CPU processes, and
print one table of verdicts, failed checks and wall times.

A harness is trusted only if an unchanged system gets the same verdict every run; this is how we
check ours (the table goes into the closing note of any change that touches a measurement):

    python3 scripts/repeat.py --demo 10                 # ten quiet demos
    python3 scripts/repeat.py --demo 3 --test 3 --busy 2   # with two spinning processes beside them

Logs of every run go to reports/repeat/<stamp>/, the table to reports/repeat/<stamp>/table.md.
Exit 0 when every demo was ACCEPTED and every test run green, 1 otherwise. Standard library only,
so it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST_TAIL = re.compile(r"^=+ (.*\b(passed|failed|error|errors)\b.*) in [\d.]+s")
FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+)")


@dataclass
class Outcome:
    kind: str  # demo | test
    n: int
    busy: int
    rc: int
    wall_s: float
    verdict: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.verdict in ("ACCEPTED", "green")

    def row(self) -> str:
        return f"| {self.kind} {self.n} | {self.busy} | {self.verdict} | {self.wall_s:.0f} s | {self.detail or '-'} |"


def busy_processes(k: int) -> list[subprocess.Popen]:
    """K processes that each keep one core busy (the CI box shares its 2 cores with other work)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def run_make(target: str, log: Path, extra: list[str]) -> tuple[int, float]:
    start = time.monotonic()
    with log.open("w") as fh:
        rc = subprocess.call(["make", target, *extra], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    return rc, time.monotonic() - start


def demo_outcome(n: int, busy: int, rc: int, wall: float, started: float, out_dir: Path) -> Outcome:
    """The verdict and the checks that were not a pass, read from the run record the demo wrote."""
    run_json = out_dir / "latest" / "run.json"
    if not run_json.is_file() or run_json.stat().st_mtime < started:
        return Outcome("demo", n, busy, rc, wall, "NO RECORD", f"exit {rc}; no new {run_json}")
    run = json.loads(run_json.read_text())
    bad = [f"{c['id']} {c['status']}" for s in run["stages"] for c in s["checks"] if c["status"] in ("fail", "error")]
    skipped = sum(c["status"] == "skip" for s in run["stages"] for c in s["checks"])
    detail = "; ".join(bad) or f"{skipped} skipped"
    return Outcome("demo", n, busy, rc, wall, run["verdict"].upper(), f"{run['run_id']}: {detail}")


def test_outcome(n: int, busy: int, rc: int, wall: float, log: Path) -> Outcome:
    tail, failed = "no pytest summary line", []
    for line in log.read_text(errors="replace").splitlines():
        m = PYTEST_TAIL.match(line)
        if m:
            tail = m.group(1)
        f = FAILED_LINE.match(line)
        if f:
            failed.append(f.group(2))
    verdict = "green" if rc == 0 else "RED"
    return Outcome("test", n, busy, rc, wall, verdict, tail + (": " + ", ".join(failed) if failed else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=int, default=3, metavar="N", help="make demo runs (default 3)")
    ap.add_argument("--test", type=int, default=0, metavar="M", help="make test runs (default 0)")
    ap.add_argument("--busy", type=int, default=0, metavar="K", help="busy CPU processes beside every run")
    ap.add_argument("--out", default=str(ROOT / "reports"), help="the demo's run folder (default reports/)")
    ap.add_argument("make_args", nargs="*", help="passed to make, e.g. PYTEST_ARGS='-x'")
    args = ap.parse_args(argv)
    if args.demo < 0 or args.test < 0 or args.busy < 0:
        ap.error("--demo, --test and --busy must be >= 0")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    logs = ROOT / "reports" / "repeat" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    spinners = busy_processes(args.busy)
    try:
        for kind, count in (("demo", args.demo), ("test", args.test)):
            for n in range(1, count + 1):
                log = logs / f"{kind}-{n}.log"
                print(f"[repeat] make {kind} {n}/{count} (busy {args.busy}) -> {log}", file=sys.stderr, flush=True)
                started = time.time()
                rc, wall = run_make(kind, log, args.make_args)
                o = (demo_outcome(n, args.busy, rc, wall, started, Path(args.out)) if kind == "demo"
                     else test_outcome(n, args.busy, rc, wall, log))
                outcomes.append(o)
                print(f"[repeat] {o.row()}", file=sys.stderr, flush=True)
    finally:
        for p in spinners:
            p.kill()
    table = "\n".join(["| run | busy | verdict | wall | not passed / summary |", "|---|---|---|---|---|",
                       *(o.row() for o in outcomes)])
    (logs / "table.md").write_text(table + "\n")
    print(table)
    print(f"\n{sum(o.ok for o in outcomes)} of {len(outcomes)} runs clean; logs in {logs}")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
