"""In-process benchmarks under pytest-benchmark: `make bench` runs and stores them
(--benchmark-autosave); the nightly recipe compares with --benchmark-compare-fail (docs/ci.md).

They time day0's own hot paths on synthetic inputs, so a slowdown in the harness shows as a
failed comparison rather than as a slower nightly that nobody can explain. The benchmarks that
pair day0 with another tool in one run (vLLM bench, sha256sum, matplotlib, bare gloo) stay
scripts beside this file and print their ratios.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "tests" / "support")]

pytest.importorskip("pytest_benchmark", reason="make bench installs day0[bench]")


def test_render_a_report_of_100k_samples(benchmark, tmp_path):
    from day0.results.report import render

    import run_factory as rf

    src = rf.write(rf.huge(n_samples=100_000, n_stages=5), tmp_path / "run")
    out = benchmark.pedantic(render, args=(src, tmp_path / "report.html"), rounds=3, iterations=1)
    assert out.stat().st_size < 5 * 1024 * 1024


def test_audit_the_headers_of_200k_tensors(benchmark, tmp_path):
    from bench_weights_audit import synthesize

    from day0.stages.weights import audit

    root, n = synthesize(tmp_path, shards=64, tensors=200_000)
    checks = benchmark.pedantic(audit, args=(root,), rounds=3, iterations=1)
    assert n >= 190_000 and not [c for c in checks if c.failed]


def test_parse_sse_of_a_long_stream(benchmark):
    from day0.client.loadgen import SSEParser

    chunk = {"choices": [{"index": 0, "text": "tok", "finish_reason": None}],
             "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}}
    stream = b"".join(b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n" for _ in range(20_000))
    pieces = [stream[i:i + 1500] for i in range(0, len(stream), 1500)]  # MTU-sized reads

    def parse() -> int:
        parser = SSEParser()
        return sum(len(parser.feed(p)) for p in pieces)

    assert benchmark(parse) == 20_000


def test_busbw_over_a_sweep(benchmark):
    from day0.core.collective_ops import OPS
    from day0.stages.collectives.busbw import busbw_gbps

    sizes = [1 << k for k in range(10, 34)]

    def sweep() -> float:
        return sum(busbw_gbps(op, s, 1e-3, n) for op in OPS.runnable() for s in sizes for n in (2, 8, 32, 72))

    assert benchmark(sweep) > 0


@pytest.mark.parametrize("requests, blocks, shared", [(64, 128, 0), (256, 64, 1024)])
def test_sample_the_kv_cache_once(benchmark, requests, blocks, shared):
    from bench_kvcache_sampling import fake_scheduler

    from day0.stages import kvcache as kv

    sched = fake_scheduler(requests, blocks, shared)
    sampler = kv.SchedulerSampler(sched)
    state = {rid: (64, False) for rid in sched.requests}
    sample = benchmark(sampler.sample, 0.0, 0, state)
    assert sample.allocated_tokens > 0
