"""Harness overhead of the collectives sweep: day0's reported busbw vs a bare torch.distributed loop.

Both sides run gloo all_reduce at the same size, warm-up and iteration count, on the same ranks
count, alternating round by round so that load from neighbours hits both alike; the figure is
median(day0 busbw) / median(bare busbw) (target >= 0.95). It also times the whole default CPU
sweep (all ops, default sizes), which the demo runs.

    .venv/bin/python benchmarks/bench_collectives_overhead.py [--size 4M] [--ranks 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from day0.stages.collectives import CollectivesSection, free_port, parse_size, run_local  # noqa: E402
from day0.stages.collectives.busbw import busbw_gbps, plan  # noqa: E402

BARE = r"""
import json, sys, time, datetime
import torch, torch.distributed as dist
rank, n, port, elems, warm, iters = (int(x) for x in sys.argv[1:7])
dist.init_process_group("gloo", rank=rank, world_size=n, init_method=f"tcp://127.0.0.1:{port}",
                        timeout=datetime.timedelta(seconds=120))
buf = torch.ones(elems, dtype=torch.float32)
for _ in range(warm):
    dist.all_reduce(buf)
dist.barrier()
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(buf)
dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
dist.all_reduce(dt, op=dist.ReduceOp.MAX)
if rank == 0:
    print(json.dumps({"time_s": dt.item()}))
dist.destroy_process_group()
"""


def bare_round(n: int, size: int, warm: int, iters: int) -> float:
    """Seconds per all_reduce from a minimal loop in n fresh processes (max over ranks)."""
    elems = plan("all_reduce", size, 4, n).elements
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs = [subprocess.Popen([sys.executable, "-c", BARE, str(r), str(n), str(port), str(elems), str(warm), str(iters)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
             for r in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"bare loop failed: {[o[1][-300:] for o in outs]}")
    return float(json.loads(outs[0][0].strip().splitlines()[-1])["time_s"])


def day0_round(n: int, size: int, warm: int, iters: int, out: Path) -> float:
    s = CollectivesSection(ops=["all_reduce"], min_bytes=size, max_bytes=size, warmup_iters=warm, iters=iters,
                            backend="gloo", timeout_s=120.0)
    result = run_local(s, n, out)
    if result.fault is not None:
        raise SystemExit(f"day0 run failed: {result.fault.message}")
    [row] = result.rows
    return row.time_us / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4M", help="all_reduce size S (the CPU default sweep's largest)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--skip-sweep", action="store_true", help="do not time the whole default sweep")
    a = ap.parse_args()
    size = parse_size(a.size)
    n = a.ranks
    S = plan("all_reduce", size, 4, n).size_bytes
    day0_t, bare_t = [], []
    with tempfile.TemporaryDirectory(prefix="day0-bench-coll-") as tmp:
        for i in range(a.rounds):
            first, second = (day0_t, bare_t) if i % 2 == 0 else (bare_t, day0_t)  # alternate who goes first
            for sink in (first, second):
                if sink is day0_t:
                    sink.append(day0_round(n, size, a.warmup, a.iters, Path(tmp) / f"r{i}"))
                else:
                    sink.append(bare_round(n, size, a.warmup, a.iters))
            print(f"round {i}: day0 {busbw_gbps('all_reduce', S, day0_t[-1], n):.3f} GB/s  "
                  f"bare {busbw_gbps('all_reduce', S, bare_t[-1], n):.3f} GB/s", flush=True)
        d_bw = statistics.median(busbw_gbps("all_reduce", S, t, n) for t in day0_t)
        b_bw = statistics.median(busbw_gbps("all_reduce", S, t, n) for t in bare_t)
        print(f"gloo all_reduce S={S} B, {n} ranks, {a.iters} iters x {a.rounds} rounds (median):")
        print(f"  day0 busbw {d_bw:.3f} GB/s | bare loop busbw {b_bw:.3f} GB/s | ratio {d_bw / b_bw:.3f} (target >= 0.95)")
        if not a.skip_sweep:
            t0 = time.perf_counter()
            result = run_local(CollectivesSection(backend="gloo"), n, Path(tmp) / "sweep")
            wall = time.perf_counter() - t0
            print(f"default CPU sweep: {len(result.rows)} points, all ops, {n} ranks: wall {wall:.1f} s "
                  f"(sweep {result.duration_s or float('nan'):.1f} s, rest is process start + torch import); "
                  f"fault: {result.fault.message if result.fault else 'none'}")
            for op in result.ops:
                rows = [r for r in result.rows if r.op == op]
                if rows:
                    top = max(r.size_bytes for r in rows)
                    best = max(r.busbw_gbps for r in rows if r.size_bytes == top)
                    print(f"  {op:>15}: busbw {best:.3f} GB/s at {top} B, #wrong {sum(r.wrong or 0 for r in rows)}")


if __name__ == "__main__":
    main()
