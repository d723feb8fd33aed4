"""Client CPU per streamed message: day0's one-process load generator on uvloop and on asyncio.

The ladder (bench_ladder.py) judges timing tails, which a host that preempts its vCPUs for
milliseconds decides on its own; CPU time per message is what a loop costs whatever the host does,
and what bounds how many streams one process can time. Same scripted server
(benchmarks/fast_server.py: TTFT 50 ms, then one token every 5 ms), same Poisson schedule and
prompts for both loops, run in turn (uvloop, asyncio, uvloop, ...); each phase's
``time.process_time()`` over the messages it read. Prints each run, the medians and the
asyncio/uvloop ratio pair by pair.

    .venv/bin/python benchmarks/bench_client_cpu.py [--pairs 5] [--rate 150] [--requests 600] [--no-spin]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.client.loadgen import ClientOptions, LoadShape, make_session, run_phase  # noqa: E402
from day0.client.loops import run  # noqa: E402
from day0.client.workload import WorkloadSpec, build_requests  # noqa: E402

VOCAB = 300


async def cpu_per_message(url: str, a: argparse.Namespace, seed: int) -> tuple[float, int]:
    """(client CPU microseconds per streamed message, requests that succeeded) of one phase."""
    opts = ClientOptions()
    async with make_session(opts) as s:
        warm = build_requests(WorkloadSpec(32, a.output_len, seed=99), VOCAB, 8)
        await run_phase(s, url, "scripted", warm, LoadShape(concurrency=8), opts, phase="warmup")
        reqs = build_requests(WorkloadSpec(32, a.output_len, seed=seed), VOCAB, a.requests)
        shape = LoadShape(mode="rate", request_rate=a.rate, concurrency=0, seed=seed, precise_timing=not a.no_spin)
        cpu0 = time.process_time()
        phase = await run_phase(s, url, "scripted", reqs, shape, opts, phase="measure")
        cpu = time.process_time() - cpu0
    messages = sum(len(r.msg_t) for r in phase.results)
    return cpu / max(messages, 1) * 1e6, sum(r.ok for r in phase.results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rate", type=float, default=150.0)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--no-spin", action="store_true", help="plain sleeps to each send (no precise timing spin)")
    a = ap.parse_args()
    srv = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fast_server.py")], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    url = f"http://127.0.0.1:{int(srv.stdout.readline().split()[1])}"  # type: ignore[union-attr]
    figures: dict[str, list[float]] = {"uvloop": [], "asyncio": []}
    try:
        for i in range(a.pairs):
            for kind in figures:
                us, ok = run(cpu_per_message(url, a, seed=i), kind)  # type: ignore[arg-type]
                figures[kind].append(us)
                print(f"{kind:8} pair {i}: {us:.2f} us client CPU per message ({ok}/{a.requests} ok)", flush=True)
    finally:
        if srv.stdin:
            srv.stdin.close()
        srv.wait(timeout=10)
    ratios = [x / y for x, y in zip(figures["asyncio"], figures["uvloop"])]
    print(f"median us/message: uvloop {statistics.median(figures['uvloop']):.2f}, asyncio "
          f"{statistics.median(figures['asyncio']):.2f}; asyncio/uvloop per pair {[round(r, 2) for r in ratios]}, "
          f"median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
