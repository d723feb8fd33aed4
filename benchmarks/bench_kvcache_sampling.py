"""Does sampling the scheduler every step distort the engine? The kvcache stage reads block tables
after every engine step; this runs the same long-context workload on one in-process engine with
and without that sampling, alternating round by round so neighbours' load hits both alike, and
reports the wall-time overhead (target < 5%). It also reports the time spent inside the sampler
(measured directly, immune to run-to-run noise) and the sampler's cost at supernode scale on
synthetic block tables (hundreds of requests, a million blocks).

    .venv/bin/python benchmarks/bench_kvcache_sampling.py [--rounds 6] [--stage-workload]

Default workload: contexts 4096/2048/1024 + 2 shared-prefix + 4 short requests, 32 output
tokens each (2-15 s a run on a 2-core box, depending on its load); --stage-workload uses the
profile's own [kvcache] mix.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the figures readable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from day0.config.profile import load_profile  # noqa: E402
from day0.engine import InprocessEngine  # noqa: E402
from day0.stages import kvcache as kv  # noqa: E402


def fake_scheduler(requests: int, blocks_per_request: int, shared_blocks: int, block_size: int = 16) -> Any:
    """A V1 scheduler's shape (block tables of KVCacheBlock-like objects with ref_cnt), at any scale."""
    pool = SimpleNamespace(num_gpu_blocks=requests * blocks_per_request + 1, null_block=None, get_usage=lambda: 0.5)
    prefix = [SimpleNamespace(block_id=i, ref_cnt=requests // 2, is_null=False) for i in range(shared_blocks)]
    next_id = shared_blocks
    tables, reqs = {}, {}
    for r in range(requests):
        head = prefix if r % 2 == 0 else []  # half the requests share one prefix
        own = [SimpleNamespace(block_id=next_id + j, ref_cnt=1, is_null=False)
               for j in range(blocks_per_request - len(head))]
        next_id += len(own)
        tables[f"r{r}"] = head + own
        reqs[f"r{r}"] = SimpleNamespace(num_computed_tokens=blocks_per_request * block_size - 5, num_output_tokens=3)
    mgr = SimpleNamespace(block_size=block_size, req_to_blocks=tables)
    kvm = SimpleNamespace(coordinator=SimpleNamespace(single_type_managers=[mgr]), block_pool=pool)
    return SimpleNamespace(kv_cache_manager=kvm, requests=reqs, waiting=[])


def synthetic_sampler_cost(requests: int, blocks_per_request: int, shared_blocks: int, repeats: int = 10) -> float:
    """Seconds per SchedulerSampler.sample() call (block-table scan + count), with the workload state."""
    sched = fake_scheduler(requests, blocks_per_request, shared_blocks)
    sampler = kv.SchedulerSampler(sched)
    state = {rid: (64, False) for rid in sched.requests}
    sampler.sample(0.0, 0, state)
    t0 = time.perf_counter()
    for i in range(repeats):
        sampler.sample(0.0, i, state)
    return (time.perf_counter() - t0) / repeats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--rounds", type=int, default=6, help="pairs of (sampled, unsampled) runs")
    ap.add_argument("--stage-workload", action="store_true", help="the profile's own [kvcache] workload")
    args = ap.parse_args()

    profile = load_profile(args.profile)
    settings = profile.kvcache
    if not args.stage_workload:
        settings = settings.model_copy(update=dict(context_lengths=[4096, 2048, 1024], short_requests=4,
                                                   short_lengths=[64, 512], shared_prefix_tokens=1000,
                                                   shared_prefix_requests=2, output_tokens=32))
    size, specials = kv.workload_vocab(profile)
    engine = InprocessEngine(profile, log=lambda m: print(f"[bench] {m}", file=sys.stderr))
    engine.start()
    rows: list[tuple[str, float, int, float]] = []
    try:
        warm = kv.build_workload(settings, size, specials, salt="warm-up")
        kv.run_exact(engine.llm, warm, sample=False)  # first-call costs (allocator, kernels) out of the figures
        for rnd in range(args.rounds):
            order = (True, False) if rnd % 2 == 0 else (False, True)
            for sample in order:
                wl = kv.build_workload(settings, size, specials, salt=f"round-{rnd}-{sample}")
                run = kv.run_exact(engine.llm, wl, sample=sample)
                if run.error or run.rejected:
                    raise SystemExit(f"workload failed: {run.error or run.rejected}")
                rows.append(("sampled" if sample else "unsampled", run.wall_s, run.steps, run.sampling_s))
                print(f"round {rnd} {'sampled  ' if sample else 'unsampled'} wall {run.wall_s:7.3f} s  "
                      f"steps {run.steps:3d}  inside sampler {run.sampling_s * 1e3:7.2f} ms", flush=True)
    finally:
        engine.stop()

    on = [r[1] for r in rows if r[0] == "sampled"]
    off = [r[1] for r in rows if r[0] == "unsampled"]
    inside = sum(r[3] for r in rows if r[0] == "sampled")
    steps = sum(r[2] for r in rows if r[0] == "sampled")
    overhead = statistics.median(on) / statistics.median(off) - 1.0
    direct = inside / sum(on)
    print()
    print(f"workload: {len(kv.build_workload(settings, size, specials))} requests, contexts "
          f"{sorted(settings.context_lengths, reverse=True)} + shared prefix {settings.shared_prefix_tokens} + "
          f"{settings.short_requests} short, {settings.output_tokens} output tokens")
    print(f"median wall: sampled {statistics.median(on):.3f} s, unsampled {statistics.median(off):.3f} s "
          f"-> overhead {overhead * 100:+.2f}% (target < 5%)")
    print(f"run-to-run spread: sampled {min(on):.3f}-{max(on):.3f} s, unsampled {min(off):.3f}-{max(off):.3f} s "
          "(what the wall-time ratio cannot see below; the direct figure next can)")
    print(f"time inside the sampler: {inside * 1e3:.2f} ms over {steps} steps = {inside / steps * 1e6:.1f} us/step, "
          f"{direct * 100:.3f}% of sampled wall time")
    for n, blocks, shared in ((16, 512, 64), (64, 8192, 256), (256, 4096, 1024)):
        cost = synthetic_sampler_cost(n, blocks, shared)
        print(f"synthetic sampler: {n:4d} requests x {blocks:5d} blocks ({n * blocks / 1e6:.2f} M blocks, half sharing "
              f"{shared} prefix blocks): {cost * 1e3:.2f} ms per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
