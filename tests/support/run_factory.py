"""Fixture run records built in code with day0.core.record classes, so they cannot drift from the contract.

Verdicts and reasons are derived with ``day0.core.record.stage_verdict``/``run_verdict`` (never
written by hand), and numbers come from seeded generators: a test that reads a value back
from a report compares it with what the factory produced.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from day0.core.record import (
    Check,
    RunRecord,
    StageRecord,
    measured,
    run_verdict,
    stage_verdict,
)

HOSTILE = '<script>alert("x")</script> & <b>bold</b>'  # must come out escaped, never as markup

ENVIRONMENT = {
    "host": "cpu-box-01",
    "devices": [{"name": "CPU (2 cores, AVX-512)", "memory_gib": 24}],
    "topology": {"nodes": 1, "devices_per_node": 1, "interconnect": "loopback"},
    "vllm": "0.32.0",
    "torch": "2.13.0+cpu",
    "python": "3.11.9",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
}

PROFILE = {
    "name": "cpu-tiny-fixture",
    "model": {"source": "path", "path": "/models/tiny-llama", "served_model_name": "tiny-llama"},
    "engine": {"mode": "inprocess", "args": {"dtype": "float32", "enforce_eager": True, "block_size": 32}},
    "topology": {"nodes": 1, "devices_per_node": 1, "interconnect": "loopback", "expected_busbw_gbps": 5.0},
    "sla": {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 200.0},
    "kvcache": {"fragmentation_limit": 0.05},
    "report": {"signatories": [{"name": "Ada Lovelace", "role": "Infra lead"}, "Grace Hopper, SRE"]},
}


def samples(n: int, seed: int, median: float = 120.0, spread: float = 0.35) -> list[float]:
    """Log-normal latencies (ms), the usual shape of TTFT/TPOT distributions."""
    rng = random.Random(seed)
    return [round(median * rng.lognormvariate(0.0, spread), 3) for _ in range(n)]


def p(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def weights_checks(ok: bool = True) -> list[Check]:
    ranks = ["rank 0", "rank 1"]
    return [
        measured("weights.shards_present", "Every shard in the index exists", 3 if ok else 2, 3,
                 unit="shards", direction="exact", source="static",
                 evidence={"table": {"columns": ["shard", "bytes", "sha256"],
                                     "rows": [[f"model-0000{i}-of-00003.safetensors", 1_000_000 + i, f"{i:064x}"]
                                              for i in range(1, 4)]}}),
        measured("weights.load_time_s", "Engine load time", 31.5, 120.0, unit="s",
                 direction="lower_is_better", source="engine",
                 evidence={"charts": [
                     {"kind": "bar", "title": "Load time per rank", "x_label": "rank", "y_label": "s",
                      "series": [{"name": "load", "x": ranks, "y": [31.5, 30.9]}], "reference": []},
                     {"kind": "bar", "title": "Memory per rank", "x_label": "rank", "y_label": "GiB",
                      "series": [{"name": "weights", "x": ranks, "y": [1.2, 1.2]},
                                 {"name": "KV cache", "x": ranks, "y": [1.0, 1.0]}],
                      "reference": [{"y": 3.0, "label": "planned 3 GiB"}]}]}),
    ]


def collectives_checks(ok: bool = True) -> list[Check]:
    sizes = [2**k for k in range(10, 31)]
    busbw = [min(4.6, 5.0 * s / (s + 2**20)) for s in sizes]
    if not ok:
        busbw = [b * 0.4 for b in busbw]
    peak = max(busbw)
    return [
        measured("collectives.all_reduce_correct", "all_reduce results exact", 0, 0, unit="wrong elements",
                 direction="exact", source="torch.distributed"),
        measured("collectives.all_reduce_busbw", "all_reduce bus bandwidth at large sizes", round(peak, 3), 4.0,
                 unit="GB/s", direction="higher_is_better", source="torch.distributed",
                 evidence={"charts": [{"kind": "line", "title": "all_reduce busbw vs message size",
                                       "x_label": "bytes", "y_label": "GB/s", "x_log": True,
                                       "series": [{"name": "busbw", "x": sizes, "y": busbw}],
                                       "reference": [{"y": 5.0, "label": "expected 5 GB/s"}]}],
                           "transport": "gloo/tcp"}),
    ]


def latency_checks(n: int = 2000, ok: bool = True, seed: int = 7) -> list[Check]:
    ttft = samples(n, seed, median=150.0 if ok else 1800.0)
    tpot = samples(max(1, n // 2), seed + 1, median=25.0, spread=0.2)
    checks = [
        measured("latency.ttft_p99", "TTFT p99", round(p(ttft, 99), 3), 2000.0, unit="ms",
                 direction="lower_is_better", source="http", evidence={"samples": ttft}),
        measured("latency.tpot_p99", "TPOT p99", round(p(tpot, 99), 3), 200.0, unit="ms",
                 direction="lower_is_better", source="http",
                 evidence={"samples": tpot, "formula": "(e2e - ttft) / (output_tokens - 1)"}),
        measured("latency.output_throughput", "Output token throughput", 812.5, 100.0, unit="tok/s",
                 direction="higher_is_better", source="http"),
    ]
    if not ok:
        checks[0].message = f"TTFT p99 {checks[0].value} ms misses the SLA (<= 2000 ms) {HOSTILE}"
        checks[0].evidence["log_excerpt"] = "\n".join(
            [f"INFO 11-30 09:{i:02d}:00 scheduler: waiting=64 running=8" for i in range(20)]
            + [f"WARNING queue saturated {HOSTILE}"]
        )
    return checks


def kvcache_checks(ok: bool = True, points: int = 300) -> list[Check]:
    t = [round(i * 0.5, 2) for i in range(points)]
    frag = [0.01 + 0.02 * ((i * 37) % 11) / 11 for i in range(points)]
    usage = [min(0.95, i / points) for i in range(points)]
    value = max(frag) if ok else 0.09
    return [
        measured("kvcache.fragmentation_max", "PagedAttention fragmentation at long context", round(value, 4), 0.05,
                 unit="fraction", direction="lower_is_better", source="scheduler",
                 evidence={"charts": [
                     {"kind": "line", "title": "Fragmentation over time", "x_label": "s", "y_label": "fraction",
                      "series": [{"name": "fragmentation", "x": t, "y": frag}],
                      "reference": [{"y": 0.05, "label": "limit 5%"}]},
                     {"kind": "line", "title": "KV cache usage over time", "x_label": "s", "y_label": "fraction",
                      "series": [{"name": "usage", "x": t, "y": usage}], "reference": []}],
                     "block_size": 32}),
    ]


def blocked(ids: Sequence[str], why: str) -> list[Check]:
    return [Check(id=i, title=i.split(".")[-1], status="blocked", message=why) for i in ids]


def make_record(stages: dict[str, list[Check]], finished: bool = True, run_id: str = "run-fixture") -> RunRecord:
    recs = [StageRecord(name, stage_verdict(checks), checks) for name, checks in stages.items()]
    for s in recs:
        for c in s.checks:
            c.stage = s.name
    verdict, reason = run_verdict(recs, finished)
    return RunRecord(
        run_id=run_id,
        started_at="2026-11-30T09:00:00.000+00:00",
        finished_at="2026-11-30T09:12:34.000+00:00" if finished else None,
        verdict=verdict,
        reason=reason,
        environment=dict(ENVIRONMENT),
        profile=dict(PROFILE),
        stages=recs,
        notes={"engine_startup_s": 31.5, "engine": {"mode": "inprocess", "pid": 4242}},
    )


def accepted() -> RunRecord:
    return make_record({"weights": weights_checks(), "collectives": collectives_checks(),
                        "latency": latency_checks(), "kvcache": kvcache_checks()}, run_id="run-accepted")


def rejected() -> RunRecord:
    return make_record({"weights": weights_checks(), "collectives": collectives_checks(),
                        "latency": latency_checks(ok=False), "kvcache": kvcache_checks()}, run_id="run-rejected")


def incomplete() -> RunRecord:
    """The run died during latency: no run_finished event, kvcache never ran."""
    return make_record({"weights": weights_checks(), "collectives": collectives_checks(),
                        "latency": latency_checks()[:1], "kvcache": []}, finished=False, run_id="run-incomplete")


def blocked_stages() -> RunRecord:
    """Weights failed, so every later stage is blocked (the default gating)."""
    why = "blocked: stage weights failed (weights.shards_present)"
    return make_record({
        "weights": weights_checks(ok=False),
        "collectives": blocked(["collectives.all_reduce_correct", "collectives.all_reduce_busbw"], why),
        "latency": blocked(["latency.ttft_p99", "latency.tpot_p99"], why),
        "kvcache": blocked(["kvcache.fragmentation_max"], why),
    }, run_id="run-blocked")


def huge(n_samples: int = 100_000, n_stages: int = 5, kv_points: int = 20_000) -> RunRecord:
    """Benchmark-sized: ``n_samples`` TTFT samples (plus half as many TPOT), ``kv_points`` points
    per KV-cache time series, ``n_stages`` stages (those beyond the four are soak stages)."""
    stages: dict[str, list[Check]] = {
        "weights": weights_checks(), "collectives": collectives_checks(),
        "latency": latency_checks(n=n_samples), "kvcache": kvcache_checks(points=kv_points),
    }
    for k in range(max(0, n_stages - 4)):
        stages[f"soak{k + 1}"] = [measured(f"soak{k + 1}.errors", "Errors during soak", 0, 0, unit="requests")]
    return make_record(dict(list(stages.items())[:n_stages]), run_id="run-huge")


def write(record: RunRecord, directory: Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return record.write(directory / "run.json")
