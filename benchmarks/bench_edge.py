"""One rate near the server's edge, measured again and again in alternating arms (day0 and ``vllm
bench serve``; or day0 on an idle server and right after a sustained load): is a gap between two
capacity answers in the tools, or in the server's state at the moment each one measured?

bench_capacity.py compares two answers, each formed from points measured minutes apart. This
script holds everything else still: one rate (``--rate``), the same request count, each tool on
its own fixed seed (the same prompts and arrival times every repeat, ``--fresh-seeds`` to vary
them), the arms (``--arms``, default ``day0,vllm``) alternating ABBA, ``--repeats`` of each. An arm
is a tool, ``day0`` or ``vllm``; ``day0+run-in`` puts ``--run-in-s`` seconds of unmeasured load at
``--run-in-rate`` (day0's load generator, fresh prompts) right before each of its runs, as the
dense rate list reaches its upper rates after minutes of load where each of day0's search points
starts after a pause; ``day0+flat-out`` puts ``--flat-out-requests`` sent at once (a closed loop,
as the search's own flat-out run, which comes right before its first point) there instead. Per run it prints the p-th percentile TTFT (``--percentile``, 99) with its
95% order-statistic interval (day0's own check, with the burst factor of its slowest tenth,
``tail_bursts``; vLLM bench's per-request figures judged by the same ``percentile_bounds``), the
server's own view over the run (its first-token and queue-time histograms,
``vllm:time_to_first_token_seconds`` and ``vllm:request_queue_time_seconds``: mean and
bucket-interpolated percentiles), and the CPU the client's process tree used while the rest of the
box (the server) ran at least half a core.

Two questions, answered at the end:
- Between the arms: the first arm / the second of the median percentile, and of the client's
  CPU. An effect of the arm shows as one arm's runs all above the other's.
- Within each arm: of the pairs of its runs (the same workload, minutes apart), how many
  intervals overlap. A 95% interval that described the server would overlap nearly always; where
  they do not, the server's state moved between runs by more than the interval allows, and any
  single measurement near the edge carries that.

Before every vLLM bench run the server idles while the child imports vLLM (~10 s here); day0's
runs wait ``--pause-s`` (default 10) first, so both start from the same idle. day0's fixed-rate
run offers its schedule as drawn (its default seed's 299 arrivals at 47 req/s: 47.53 req/s), vLLM
bench rescales its own to exactly the rate. With the same seed
the prompts repeat: the server started here has prefix caching off, and each run prints what the
cache served (``--url``: keep it off there too). Starts a vLLM engine unless ``--url``: on a
shared box take the engine lock.

    flock /tmp/day0-engine.lock .venv/bin/python benchmarks/bench_edge.py --rate 47 [--repeats 4] \\
        [--requests 299] [--ttft-limit-ms 300] [--arms day0,day0+run-in --run-in-s 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_capacity  # noqa: E402  (the server, its warm-up, the child runner and vLLM bench's rate)
import server_metrics  # noqa: E402
from capacity_report import fmt, limit_figures  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
RUN_IN, FLAT_OUT = "+run-in", "+flat-out"
QUEUE_METRIC = "vllm:request_queue_time_seconds"  # not among day0's client-comparable server metrics


# --------------------------------------------------------------------------- the client's CPU


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and its live descendants, from /proc."""
    parent: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d.name)] = f
            parent.setdefault(int(f[1]), []).append(int(d.name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += (int(stats[pid][11]) + int(stats[pid][12])) / TICK
        todo += parent.get(pid, [])
    return total


def box_busy_s() -> float:
    """CPU seconds every core of the box has spent not idle (/proc/stat's first line)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / TICK  # all but idle and iowait; guest time is inside user


@dataclass
class CpuWatch:
    """Samples a client process tree and the box every ``period`` s; ``client_cores`` is the
    client's CPU over the intervals in which the rest of the box (the server, when it runs here)
    ran at least ``busy_cores``: its load phase, so a tool's start-up (vLLM bench's ~10 s import)
    does not dilute the figure."""

    period: float = 0.25
    busy_cores: float = 0.5
    samples: list[tuple[float, float, float]] = field(default_factory=list)

    def watch(self, pid: int) -> threading.Thread:
        def loop() -> None:
            while os.path.exists(f"/proc/{pid}"):
                try:
                    self.samples.append((time.monotonic(), box_busy_s(), tree_cpu_s(pid)))
                except OSError:
                    return
                time.sleep(self.period)

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t

    def client_cores(self) -> float | None:
        spans = [(t2 - t1, c2 - c1) for (t1, b1, c1), (t2, b2, c2) in zip(self.samples, self.samples[1:])
                 if t2 > t1 and c2 >= c1 and ((b2 - b1) - (c2 - c1)) / (t2 - t1) >= self.busy_cores]
        busy = sum(dt for dt, _ in spans)
        return round(sum(dc for _, dc in spans) / busy, 3) if busy > 0 else None


# --------------------------------------------------------------------------- one run of an arm


def server_view(before: str | None, after: str | None, p: float) -> dict[str, list[float]]:
    """The server's histograms over one run: name -> [mean, p50, p-th percentile (ms, bucket-
    interpolated), count]; empty when /metrics could not be read. TTFT as day0's own server view
    reads it (``day0.client.prom.server_view``), the queue time beside it."""
    from day0.client.prom import PromError, delta, parse_histograms, pct_name
    from day0.client.prom import server_view as prom_view

    if before is None or after is None:
        return {}
    try:
        figures = prom_view(before, after, percentiles=(50, p))
        queue = parse_histograms(after).get(QUEUE_METRIC)
        queue = delta(parse_histograms(before).get(QUEUE_METRIC), queue) if queue is not None else None
    except PromError:
        return {}
    out = {}
    if "ttft" in figures:
        f = figures["ttft"]
        out["ttft"] = [round(f.mean_ms, 1), round(f.quantiles_ms["p50"], 1), round(f.quantiles_ms[pct_name(p)], 1),
                       round(f.count)]
    if queue is not None:
        out["queue"] = [round(queue.mean() * 1000, 1), round(queue.quantile(0.5) * 1000, 1),
                        round(queue.quantile(p / 100.0) * 1000, 1), round(queue.total)]
    return out


def day0_cmd(url: str, tok: Path, a: argparse.Namespace, seed: int, out: Path) -> list[str]:
    """A fixed-rate run of day0's latency stage, the limit judged by its 95% bounds."""
    from day0.client.prom import pct_name

    key = f"ttft_{pct_name(a.percentile)}_ms"  # a limit key takes '.' or '_' (day0.config.latency.LIMIT_KEY)
    return [sys.executable, "-m", "day0.stages.latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
            "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--seed", str(seed),
            "--rate", f"{a.rate:g}", "--num-requests", str(a.requests), "--warmup", "0", "--no-fresh-prompts",
            "--percentiles", f"50,{a.percentile:g}", "--limit", f"{key}={a.ttft_limit_ms:g}", "--json", str(out)]


def vllm_cmd(url: str, tok: Path, a: argparse.Namespace, seed: int) -> list[str]:
    """One rate of bench_capacity's dense list (vLLM's own ``main_async``), in a fresh process."""
    return [sys.executable, str(ROOT / "benchmarks" / "bench_capacity.py"), "--tool", "vllm", "--url", url,
            "--model", a.model, "--tokenizer", str(tok), "--input-len", str(a.input_len), "--output-len",
            str(a.output_len), "--percentile", f"{a.percentile:g}", "--ttft-limit-ms", f"{a.ttft_limit_ms:g}",
            "--dense-start", f"{a.rate:g}", "--dense-max-points", "1", "--dense-requests", str(a.requests),
            "--seed", str(seed)]


def read_day0(out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """The TTFT check's point estimate and bounds from day0's checks file."""
    checks = json.loads(out.read_text()) if out.exists() else []
    key = f"ttft_p{a.percentile:g}".replace(".", "_")
    c = next((c for c in checks if c["id"].endswith(key)), None)
    if c is None:
        return {"note": f"no {key} check in day0's output"}
    told = limit_figures(c)
    bursts = c.get("evidence", {}).get("tail_bursts") or {}
    return {"p_ms": told["ms"], "lower": told["lower"], "upper": told["upper"], "status": told["status"],
            "burst_factor": bursts.get("factor")}


def read_vllm(stdout: str, a: argparse.Namespace) -> dict[str, Any]:
    """The rate's JSON line from bench_capacity's vLLM child: its point estimate, day0's bounds."""
    line = next((json.loads(x) for x in stdout.splitlines() if x.startswith("{")), None)
    if line is None:
        return {"note": "vLLM bench printed no result"}
    from day0.client.prom import pct_name

    lo, hi = line["bounds_ms_95"].get(f"ttft_{pct_name(a.percentile)}", [None, None])  # judge_point's keys
    return {"p_ms": line["ttft_ms"], "lower": lo, "upper": hi, "status": line["by_bounds"]}


def before_run(kind: str, url: str, tok: Path, a: argparse.Namespace, seed: int) -> str:
    """Unmeasured load right before a run: ``--run-in-s`` at ``--run-in-rate`` (RUN_IN, what the
    server has been doing when a dense list's upper rate starts) or ``--flat-out-requests`` at once
    (FLAT_OUT, what it has just done when a search's first point starts). Returns what went wrong,
    or ""."""
    load = (["--rate", f"{a.run_in_rate:g}", "--num-requests", str(math.ceil(a.run_in_rate * a.run_in_s))]
            if kind == RUN_IN else ["--concurrency", str(a.flat_out_requests), "--num-requests",
                                    str(a.flat_out_requests)])
    cmd = [sys.executable, "-m", "day0.stages.latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
           "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--seed", str(seed), *load,
           "--warmup", "0", "--no-server-metrics"]
    return bench_capacity.run_child(cmd, a, ok=(0, 1))[1]


def one_run(arm: str, url: str, tok: Path, a: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Run one arm once at ``--rate``: its percentile and interval, the server's view, the client's CPU."""
    tool, plus, rest = arm.partition("+")
    kind = plus + rest  # "", RUN_IN or FLAT_OUT
    cpu = CpuWatch()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "checks.json"
        why_in = before_run(kind, url, tok, a, seed + 5000) if kind else ""
        if tool == "day0" and not kind:
            time.sleep(a.pause_s)
        before = server_metrics.metrics_text(url)
        cmd = day0_cmd(url, tok, a, seed, out) if tool == "day0" else vllm_cmd(url, tok, a, seed)
        stdout, why, wall = bench_capacity.run_child(cmd, a, ok=(0, 1), started=cpu.watch)
        after = server_metrics.metrics_text(url)
        told = read_day0(out, a) if tool == "day0" else read_vllm(stdout, a)
    why = "; ".join(w for w in (f"{kind[1:]} {why_in}" if why_in else "", why) if w)
    return {"arm": arm, "seed": seed, **told, "server": server_view(before, after, a.percentile),
            "cache": server_metrics.cache_share(before, after), "client_cores": cpu.client_cores(),
            "wall_s": round(wall, 1), **({"why": why} if why else {})}


# --------------------------------------------------------------------------- the answer


def schedule(arms: list[str], repeats: int) -> list[str]:
    """ABBA: the arms in order, then reversed, ``repeats`` times each."""
    out: list[str] = []
    for i in range(repeats):
        out += arms if i % 2 == 0 else arms[::-1]
    return out


def overlapping_pairs(runs: list[dict[str, Any]]) -> tuple[int, int]:
    """(pairs of runs whose intervals overlap, pairs with both intervals known)."""
    known = [r for r in runs if r.get("lower") is not None and r.get("upper") is not None]
    pairs = list(combinations(known, 2))
    return sum(1 for x, y in pairs if max(x["lower"], y["lower"]) <= min(x["upper"], y["upper"])), len(pairs)


def summarise(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per arm: the median and range of its percentile, its overlapping pairs, its client's
    median CPU; and the first arm / the second of the medians."""
    per: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        ps = [r["p_ms"] for r in mine if r.get("p_ms") is not None]
        cores = [r["client_cores"] for r in mine if r.get("client_cores") is not None]
        over, pairs = overlapping_pairs(mine)
        per[arm] = {"median_ms": statistics.median(ps) if ps else None, "range_ms": [min(ps), max(ps)] if ps else None,
                    "overlapping_pairs": [over, pairs], "client_cores": statistics.median(cores) if cores else None}
    ratio: dict[str, Any] = {}
    if len(arms) > 1:
        x, y = per[arms[0]], per[arms[1]]
        ratio = {"of": f"{arms[0]} / {arms[1]}"}
        for k in ("median_ms", "client_cores"):
            ratio[k] = round(x[k] / y[k], 3) if x[k] and y[k] else None
    return {"arms": per, "ratio": ratio}


def run_line(r: dict[str, Any], p: float) -> str:
    if "note" in r:
        return f"  {r['arm']:<12} seed {r['seed']}: {r['note']}{'; ' + r['why'] if r.get('why') else ''}"
    s = r["server"]
    srv = (f"server ttft mean {s['ttft'][0]} p50 {s['ttft'][1]} p{p:g} ~{s['ttft'][2]} ms over {s['ttft'][3]}"
           if "ttft" in s else "server: no /metrics")
    if "queue" in s:
        srv += f", queue mean {s['queue'][0]} ms"
    bursts = f", bursts x{r['burst_factor']:.2f}" if r.get("burst_factor") else ""
    return (f"  {r['arm']:<12} seed {r['seed']}: p{p:g} TTFT {fmt(r['p_ms'], '.1f')} ms, 95% "
            f"{fmt(r['lower'], '.1f')}..{fmt(r['upper'], '.1f')} ({r['status']}{bursts}); "
            f"{srv}; client {fmt(r['client_cores'], '.2f')} cores; cache "
            f"{fmt(r['cache'], '.1%')}; {r['wall_s']} s")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rate", type=float, default=47.0, help="the one request rate every run offers")
    ap.add_argument("--repeats", type=int, default=4, help="runs of each arm")
    ap.add_argument("--requests", type=int, default=299, help="requests a run (299 bound a p99 at 95%%)")
    ap.add_argument("--percentile", type=float, default=99.0)
    ap.add_argument("--ttft-limit-ms", type=float, default=300.0, help="the limit day0's check judges")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=11, help="day0's seed; vLLM bench's is this + 1000")
    ap.add_argument("--fresh-seeds", action="store_true", help="a new seed every repeat")
    ap.add_argument("--pause-s", type=float, default=10.0, help="idle before each day0 run (vLLM bench's import)")
    ap.add_argument("--arms", default="day0,vllm", type=lambda v: v.split(","),
                    help=f"what alternates: day0, vllm, day0{RUN_IN}, day0{FLAT_OUT} (that load right before each run)")
    ap.add_argument("--run-in-s", type=float, default=120.0, help=f"seconds of unmeasured load before a {RUN_IN} run")
    ap.add_argument("--run-in-rate", type=float, help="its rate (default: 0.9 x --rate)")
    ap.add_argument("--flat-out-requests", type=int, default=200, help=f"sent at once before a {FLAT_OUT} run")
    ap.add_argument("--url")
    ap.add_argument("--model", default="day0-tiny")
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--start-rate", type=float, default=16.0, help="the server warm-up's base rate")
    ap.add_argument("--server-warmup", type=int, default=300)
    ap.add_argument("--server-warmup-ramp", default="1,2,3", type=lambda v: [float(x) for x in v.split(",")])
    ap.add_argument("--prefix-caching", action="store_true", help="keep the profile's prefix cache (off here)")
    ap.add_argument("--tool-timeout-s", type=float, default=300.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    a.scripted_slots = 0  # bench_capacity.serving's other server: not this script's question
    if a.repeats < 1 or a.requests < 1:
        ap.error("--repeats and --requests: at least 1")
    known = {"day0", "vllm", f"day0{RUN_IN}", f"day0{FLAT_OUT}"}
    if not a.arms or set(a.arms) - known or len(set(a.arms)) != len(a.arms):
        ap.error(f"--arms: distinct names of {', '.join(sorted(known))} (vLLM bench's ~10 s import would idle the "
                 f"server after the load before it), got {','.join(a.arms)}")
    a.run_in_rate = a.run_in_rate or 0.9 * a.rate
    return a


def main() -> int:
    a = parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {a.rate:g} req/s, {a.requests} "
          f"requests a run, {a.repeats} runs each of {', '.join(a.arms)} (ABBA); p{a.percentile:g} TTFT, limit "
          f"{a.ttft_limit_ms:g} ms" + (f"; run-in {a.run_in_s:g} s at {a.run_in_rate:g} req/s"
                                      if any(x.endswith(RUN_IN) for x in a.arms) else "")
          + (f"; {a.flat_out_requests} at once before each {FLAT_OUT} run" if any(x.endswith(FLAT_OUT) for x in a.arms)
             else ""), flush=True)
    runs: list[dict[str, Any]] = []
    with bench_capacity.serving(a) as (url, tok):
        bench_capacity.warm_server(url, tok, a, [a.start_rate * k for k in a.server_warmup_ramp])
        for i, arm in enumerate(schedule(a.arms, a.repeats)):
            seed = a.seed + (1000 if arm == "vllm" else 0) + (i if a.fresh_seeds else 0)
            runs.append(one_run(arm, url, tok, a, seed))
            print(run_line(runs[-1], a.percentile), flush=True)
    out = summarise(runs, a.arms)
    for arm, s in out["arms"].items():
        rng = "-" if s["range_ms"] is None else f"{s['range_ms'][0]:.0f}..{s['range_ms'][1]:.0f}"
        print(f"{arm}: p{a.percentile:g} TTFT median {fmt(s['median_ms'], '.1f')} ms (range {rng}); "
              f"intervals overlapping in {s['overlapping_pairs'][0]} of {s['overlapping_pairs'][1]} pairs of runs; "
              f"client {fmt(s['client_cores'], '.2f')} cores")
    if out["ratio"]:
        q = out["ratio"]
        print(f"{q['of']}: median p{a.percentile:g} TTFT {fmt(q['median_ms'], '.3f')}, "
              f"client CPU {fmt(q['client_cores'], '.3f')}")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, **out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
