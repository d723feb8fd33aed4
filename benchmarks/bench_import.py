"""What ``day0 latency import`` costs as its file grows: the real command's wall time and peak
resident memory on ``vllm bench serve --save-detailed`` results of several sizes, beyond what the
same command takes for the 12-request fixture (the interpreter and day0's own code).

    .venv/bin/python benchmarks/bench_import.py [--sizes 3000x100,6000x100] [--digits N] [--runs 3]
                                                [--tree DIR] [--keep DIR]

Each size is ``requests x output tokens`` (tests/support/vllm_results.py writes them as vLLM does:
full-precision floats, 4 characters of text a token; ``--digits 4`` writes the gaps with 4
decimals, the file densest in gaps per byte). Each command runs ``--runs`` times, in turn, and the
medians are printed, with the memory per byte of file and the slope between the sizes. ``--tree``
runs another checkout's day0 (``git worktree add DIR COMMIT``: a change against its parent).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from vllm_results import detailed_result  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "vllm-bench-detailed.json"
SLA = ["--ttft-p99-ms", "2000", "--tpot-p99-ms", "100", "--itl-p99-ms", "50"]


# Runs the command and reports its wall time, exit code and peak RSS (KiB). A process of its own,
# small: a child's peak RSS starts at its parent's RSS when it forked, and this script's own, which
# holds the files it wrote, would otherwise be every command's floor.
PROBE = """import os, subprocess, sys, time
t0 = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
print(time.perf_counter() - t0, child.returncode, usage.ru_maxrss)
"""


def measure(tree: Path, path: Path, out: Path) -> tuple[float, int]:
    """(wall s, peak RSS bytes) of one ``day0 latency import`` of ``path`` with ``tree``'s day0."""
    cmd = [sys.executable, "-m", "day0.cli", "latency", "import", str(path), *SLA, "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(tree)}  # and run from it: ``-m`` puts the working folder first
    proc = subprocess.run([sys.executable, "-c", PROBE, *cmd], env=env, cwd=tree, capture_output=True, text=True)
    fields = proc.stdout.split()
    if proc.returncode != 0 or len(fields) != 3 or fields[1] not in ("0", "1"):  # 1: a check failed (a verdict)
        raise SystemExit(f"{path}: {proc.stdout.strip()} {proc.stderr[-2000:]}")
    return float(fields[0]), int(fields[2]) * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3000x100,6000x100", help="requests x output tokens, comma-separated")
    ap.add_argument("--digits", type=int, default=None, help="decimals of each gap (default: a float's repr)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose day0 runs")
    ap.add_argument("--keep", type=Path, default=None, help="write the files here (default: a temporary folder)")
    a = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        where = a.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        files = [FIXTURE]
        for requests, tokens in sizes:
            files.append(where / f"vllm-{requests}x{tokens}{'' if a.digits is None else f'-d{a.digits}'}.json")
            files[-1].write_text(json.dumps(detailed_result(requests, tokens, digits=a.digits)))
        runs: dict[Path, list[tuple[float, int]]] = {f: [] for f in files}
        for _ in range(a.runs):  # in turn, so a busy spell of the machine falls on every size
            for f in files:
                runs[f].append(measure(a.tree, f, Path(tmp) / "checks.json"))
        med = {f: (statistics.median(w for w, _ in r), statistics.median(m for _, m in r)) for f, r in runs.items()}
        base = med[FIXTURE][1]
        print(f"day0 from {a.tree}; {a.runs} runs each, medians; baseline (the 12-request fixture): "
              f"{base / 2**20:.0f} MiB, {med[FIXTURE][0]:.2f} s")
        print(f"{'file':<28} {'MB':>7} {'wall s':>7} {'peak MiB':>9} {'beyond base / file byte':>24}")
        for f in files[1:]:
            size = f.stat().st_size
            wall, peak = med[f]
            print(f"{f.name:<28} {size / 1e6:>7.1f} {wall:>7.2f} {peak / 2**20:>9.0f} {(peak - base) / size:>24.2f}")
        if len(files) > 2:
            (s0, (_, p0)), (s1, (_, p1)) = ((files[1].stat().st_size, med[files[1]]),
                                            (files[-1].stat().st_size, med[files[-1]]))
            print(f"slope between the first and the last size: {(p1 - p0) / (s1 - s0):.2f} bytes of memory per byte")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
