"""Client CPU per streamed message: day0's load generator (uvloop, asyncio) and vLLM bench's reader.

The ladder (bench_ladder.py) judges timing tails, which a host that preempts its vCPUs for
milliseconds decides on its own; CPU time per message is what a client costs whatever the host
does, and what bounds how many streams one process can time. Same scripted server
(benchmarks/fast_server.py: TTFT 50 ms, then one token every 5 ms), same Poisson schedule and
prompts for every client, run in turn within each pair; each phase's ``time.process_time()`` over
the messages it read. ``vllm`` is vLLM bench's own request function
(``async_request_openai_completions``: aiohttp, one ``json.loads`` per message) driven on the same
schedule from a uvloop loop; it asks for no per-chunk usage, so its messages are the shorter ones.
Prints each run, the medians and, pair by pair, each client's figure over day0 on uvloop.

    .venv/bin/python benchmarks/bench_client_cpu.py [--pairs 5] [--rate 150] [--requests 600] [--no-spin]
        [--clients uvloop,asyncio,vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.client.loadgen import ClientOptions, LoadShape, make_streams, run_phase, sleep_until  # noqa: E402
from day0.client.loops import run  # noqa: E402
from day0.client.workload import WorkloadSpec, build_requests  # noqa: E402

VOCAB = 300


async def cpu_per_message(url: str, a: argparse.Namespace, seed: int) -> tuple[float, int]:
    """(client CPU microseconds per streamed message, requests that succeeded) of one phase."""
    opts = ClientOptions()
    async with make_streams(opts) as s:
        warm = build_requests(WorkloadSpec(32, a.output_len, seed=99), VOCAB, 8)
        await run_phase(s, url, "scripted", warm, LoadShape(concurrency=8), opts, phase="warmup")
        reqs = build_requests(WorkloadSpec(32, a.output_len, seed=seed), VOCAB, a.requests)
        shape = LoadShape(mode="rate", request_rate=a.rate, concurrency=0, seed=seed, precise_timing=not a.no_spin)
        cpu0 = time.process_time()
        phase = await run_phase(s, url, "scripted", reqs, shape, opts, phase="measure")
        cpu = time.process_time() - cpu0
    messages = sum(len(r.msg_t) for r in phase.results)
    return cpu / max(messages, 1) * 1e6, sum(r.ok for r in phase.results)


async def vllm_cpu_per_message(url: str, a: argparse.Namespace, seed: int) -> tuple[float, int]:
    """The same as :func:`cpu_per_message` for vLLM bench's request function, on the same schedule."""
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    def inputs(reqs: list) -> list:
        return [RequestFuncInput(prompt=r.prompt, api_url=f"{url}/v1/completions", prompt_len=r.input_len,
                                 output_len=r.output_len, model="scripted", ignore_eos=True) for r in reqs]

    shape = LoadShape(mode="rate", request_rate=a.rate, concurrency=0, seed=seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:  # as vLLM bench opens it
        warm = inputs(build_requests(WorkloadSpec(32, a.output_len, seed=99), VOCAB, 8))
        await asyncio.gather(*(async_request_openai_completions(x, s) for x in warm))
        reqs = inputs(build_requests(WorkloadSpec(32, a.output_len, seed=seed), VOCAB, a.requests))
        offsets = shape.offsets(len(reqs)) or []
        cpu0, t0, tasks = time.process_time(), time.perf_counter(), []
        for x, off in zip(reqs, offsets):
            await sleep_until(t0 + off, not a.no_spin)
            tasks.append(asyncio.create_task(async_request_openai_completions(x, s)))
        outs = await asyncio.gather(*tasks)
        cpu = time.process_time() - cpu0
    messages = sum(len(o.itl) + 1 for o in outs if o.success)
    return cpu / max(messages, 1) * 1e6, sum(o.success for o in outs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rate", type=float, default=150.0)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--no-spin", action="store_true", help="plain sleeps to each send (no precise timing spin)")
    ap.add_argument("--clients", default="uvloop,asyncio,vllm",
                    help="of: uvloop, asyncio (day0 on that loop), vllm (vLLM bench's request function, on uvloop)")
    a = ap.parse_args()
    srv = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fast_server.py")], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    url = f"http://127.0.0.1:{int(srv.stdout.readline().split()[1])}"  # type: ignore[union-attr]
    figures: dict[str, list[float]] = {c: [] for c in a.clients.split(",")}
    unknown = set(figures) - {"uvloop", "asyncio", "vllm"}
    if unknown or "uvloop" not in figures:
        ap.error(f"--clients: uvloop and any of asyncio, vllm (got {a.clients!r})")
    try:
        for i in range(a.pairs):
            for kind in figures:
                if kind == "vllm":
                    us, ok = run(vllm_cpu_per_message(url, a, seed=i), "uvloop")
                else:
                    us, ok = run(cpu_per_message(url, a, seed=i), kind)  # type: ignore[arg-type]
                figures[kind].append(us)
                print(f"{kind:8} pair {i}: {us:.2f} us client CPU per message ({ok}/{a.requests} ok)", flush=True)
    finally:
        if srv.stdin:
            srv.stdin.close()
        srv.wait(timeout=10)
    print("median us/message: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in figures.items()))
    for kind in figures.keys() - {"uvloop"}:
        ratios = [x / y for x, y in zip(figures[kind], figures["uvloop"])]
        print(f"{kind}/uvloop per pair {[round(r, 2) for r in ratios]}, median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
