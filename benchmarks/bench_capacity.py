"""Capacity, side by side: day0's search vs a dense ``vllm bench serve`` rate list vs GuideLLM's sweep.

The question a team asks on Day 0 is "what request rate does one replica sustain within the SLA".
This script asks it of three tools in one run, against the same server (the cpu-tiny vLLM server,
started here, or ``--url``), with the same SLA (p99 TTFT and TPOT limits, ``--percentile`` for
another) and the same workload (``--input-len`` random tokens, ``--output-len`` tokens with EOS
ignored, open-loop Poisson arrivals), and prints what each answered and what the answer cost. The
server is run in first (``--server-warmup`` requests at each of ``--server-warmup-ramp`` times the
start rate): a fresh CPU server is several times slower for its first few hundred requests, and
the first tool would measure that.

- day0: ``day0 latency --search`` (the server's flat-out rate first, 200 requests at once, as the
  bracket's top; then bisection to 5% from half of it; each point the fewest requests whose order
  statistics bound the percentile, 299 for p99 at 95%, judged by those bounds, never by the point
  estimate; a point that has missed stops early; the answer judged over 30 s of load at its rate,
  its point's own included, as one sample, and below one that missed, held points one 5% step at
  a time). Its flat-out run, measured phase
  (``--day0-measure-requests``) and warm-up are counted in what it spent.
- vLLM: vLLM 0.32 has ``vllm bench sweep serve`` and ``serve_workload`` but no ``serve_sla``, and
  ``sweep`` only benchmarks servers it launches itself; so, a dense ``vllm bench serve`` rate list:
  from ``--start-rate`` (where day0 starts; ``--dense-start`` for another) up by ``--dense-step``
  (5%: a grid as coarse as the 10% agreement asked of it puts its answer anywhere up to a whole
  tolerance below the edge) until the first rate whose p99 point estimates miss a limit (down,
  when the first rate misses, until one meets), ``--dense-requests`` prompts a rate (default:
  day0's per point). Each rate's arrivals are ranked among fresh Poisson draws
  (``day0.core.stats.offered_burst``, "arrivals burstier than 92% of Poisson draws"): near the edge
  one draw's bursts decide a p99 over 300 requests, which is why the seed is drawn fresh each run
  unless ``--seed`` is given (a fixed one put the burstiest schedules of its rounds at 50.21 req/s,
  the cpu-tiny server's edge, in every run; docs/stages/capacity-evidence.md, "The dense list's seeds").
  What it costs depends on how far its start is from the answer, as day0's does. Every rate is
  vLLM's own ``main_async`` (its argument parser, random dataset, Poisson arrivals and figures),
  all in one fresh process: a ``vllm bench serve`` process per rate would spend ~20 s importing
  vLLM on a 2-core box. Each rate has its own seed, and ``vllm bench
  serve``'s ready-check request is counted. Each rate's own requests (``--save-detailed``) are
  also judged by day0's rule (95% order-statistic bounds; a rate whose bounds straddle a limit
  tops the bracket as day0's undecided point does): the dense list's answer under that rule,
  beside its point-estimate answer and at no extra request, tells a gap in what the two tools
  measured from a gap in how they judge. And the server is asked what it saw: per rate, how many
  first tokens its own histogram and vLLM bench each put past the histogram's bucket bound at or
  above the TTFT limit (``first_tokens_past``).
- GuideLLM (``--guidellm-path DIR``, where it was ``pip install --no-deps --target``-ed, see
  README.md; with guidellm==0.8.1 the missing dependencies here were: "culsans~=0.10.0" aiologic
  wrapt eval_type_backport faker ftfy wcwidth h2 hpack hyperframe msgpack sanic sanic-routing
  html5tagger tracerite aiofiles; skipped without): its ``sweep`` profile (a synchronous run, a
  throughput run, then Poisson rates spaced evenly between the two), ``--guidellm-requests`` a
  benchmark, ``--guidellm-workers`` processes (its default, 10, swamps a small box); sustained is
  its highest Poisson rate whose p99 TTFT and ITL (GuideLLM's ITL is day0's TPOT) meet the limits.

Rounds (``--rounds``, default 2): the tools run again in the reverse order, ABBA (day0, vLLM,
vLLM, day0), each round on fresh prompts. The server's edge moves by minutes on a shared box, and
moved more than 10% between two tools a minute apart in single runs here; with the order
reversed, a drift in time weighs on both tools alike, and each tool's own rounds say how far the
edge moved under it (its ``drift``: highest / lowest sustained rate of its rounds), which is the
floor under any agreement between tools.

``--scripted-slots N`` runs every tool against the scripted slot server instead
(``tests/support/sse_server.py``: N requests served at once, 165 ms each, the rest queued): its
capacity is known and its edge holds still, so what the tools answer there is the tools, not the
box (docs/stages/capacity-evidence.md has the runs).

The prefix cache. vLLM's random dataset builds a prompt from consecutive token ids at a random
offset, so on cpu-tiny's 384-token vocabulary prompts often share their first blocks: 72% of the
prompt tokens of one dense rate (300 prompts of 128 tokens, one seed) were prefix-cache hits
(measured 2026-12-04), while day0's nonce keeps its own near 0%. Served from the cache, vLLM's side
measured a lighter workload. So the server started here runs with prefix caching off
(``--prefix-caching`` keeps the profile's), and every tool's run records what the cache served
(``vllm:prefix_cache_hits`` / ``queries`` around it, the ``cache`` column), ``--url`` included.

Prints every tool's points, round by round, then a table (tool, sustained req/s as the median of
its rounds and each round's, first missed req/s, requests spent per answer, wall seconds, drift)
and the ratios day0/other of the median sustained rates and of the requests spent per answer;
``--json`` writes the same, with the commit the script ran from and the setup that sets each tool's
cost (``capacity_runs.py`` counts the targets over many such records: one run's ratio is a guess).
``--hold-s S`` then holds each tool's median answer for S seconds of unbroken load and judges it by
day0's rule (``capacity_hold.py``): which answer a replica sustains. The issue's targets: sustained
rates within 10%, day0's requests at most half the dense sweep's. Starts a vLLM engine: on a shared box take the engine lock. The figures move with
whatever else the box runs (the server and every client share its cores).

    flock /tmp/day0-engine.lock .venv/bin/python benchmarks/bench_capacity.py [--start-rate 16] \\
        [--ttft-limit-ms 300 --tpot-limit-ms 40] [--guidellm-path /tmp/guidellm-site] [--hold-s 180] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from capacity_report import report, show  # noqa: E402  (the table: pure, tested without a server)
from server_metrics import cache_share, first_tokens_past, metrics_text  # noqa: E402

TOOLS = ("day0", "vllm", "guidellm")
ROUND_SEED_STEP = 100  # round r's prompts and arrivals: seed + r x this (a dense list's rates use seed + i, i < 100)


# --------------------------------------------------------------------------- the server


@contextlib.contextmanager
def serving(a: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """(base URL, tokenizer folder): ``--url`` as given, else the cpu-tiny server started here and
    stopped at the end. The tokenizer is the cpu-tiny model's unless ``--tokenizer`` says."""
    from day0.config.profile import load_profile
    from day0.model.tiny import cached_model

    profile = load_profile("cpu-tiny")
    tok = a.tokenizer or cached_model(profile.model.tiny)
    if a.url:
        yield a.url.rstrip("/"), tok
        return
    if getattr(a, "scripted_slots", 0):
        with scripted_server(a) as url:
            yield url, tok
        return
    if not a.prefix_caching:  # the module docstring: vLLM's random prompts share blocks
        engine = profile.engine.model_copy(update={"args": {**profile.engine.args, "enable_prefix_caching": False}})
        profile = profile.model_copy(update={"engine": engine})
    from day0.engine.server import ServerEngine

    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        engine = ServerEngine(profile, Path(tmp), lambda msg: print(f"  {msg}", flush=True), name="capacity")
        try:
            yield engine.start().base_url, tok
        finally:
            engine.stop()


@contextlib.contextmanager
def scripted_server(a: argparse.Namespace) -> Iterator[str]:
    """The scripted slot server (``tests/support/sse_server.py``): ``--scripted-slots`` requests
    served at once, each 10 ms to its first token and 5 ms a token after it, the rest waiting for a
    slot (FIFO), so its capacity is known and its edge holds still: TTFT past it is a queue's wait,
    whatever else the box runs. ``--scripted-drift F,F,...`` moves the edge on a known schedule
    instead: each ``--scripted-drift-period`` window's requests take F times as long, as a shared
    host's do. Its first-token histogram and request gauges are vLLM's names."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from sse_server import Script, SSEServer, capacity, queue_edge, served_capacity

    script = Script(ttft_ms=[10.0], gaps_ms=[5.0], slots=a.scripted_slots, model_id=a.model,
                    drift=a.scripted_drift, drift_period_s=a.scripted_drift_period)
    with SSEServer(script) as srv:
        steady = capacity(script, a.output_len)
        moving = (f"; drifting every {a.scripted_drift_period:g} s through "
                  f"{', '.join(f'{steady / f:.2f}' for f in a.scripted_drift)} req/s" if a.scripted_drift else "")
        truth = queue_edge(script, a.ttft_limit_ms / 1000.0, a.output_len, a.percentile)
        print(f"  scripted slot server on {srv.url}: {a.scripted_slots} slots, capacity {steady:.2f} req/s as "
              f"scripted ({a.output_len} tokens a request){moving}; the highest rate whose p{a.percentile:g} TTFT "
              f"over a long run (200,000 requests, simulated as scripted) is within {a.ttft_limit_ms:g} ms: "
              f"{truth:.2f} req/s", flush=True)
        yield srv.url
        # its sleeps overshoot on a busy host: what it really sustained is the slots over the median hold
        print(f"scripted slot server: sustained {served_capacity(script, srv.log()):.2f} req/s as served (slots / "
              "the median time a request held one)", flush=True)


def warm_server(url: str, tok: Path, a: argparse.Namespace, rates: list[float] | None = None) -> None:
    """Run the server in before any tool measures it: a fresh cpu-tiny server answered its first
    few hundred requests far slower (measured here, 299 at 20 req/s: TTFT p99 1.3 s, then 0.15 s
    and 0.11 s over the next two batches of 299), so whichever tool ran first would measure that.
    ``--server-warmup`` requests at each of ``rates`` in turn (default: ``--start-rate``; day0's
    load generator), counted for no tool. After a warm-up at the start rate alone, day0's first
    round (the first tool to load the server near its edge) answered below its second in 6 of 7
    runs (0.68-0.93 of it); ramped to three times the start rate, 0.986, 1.032 and 0.894 (3 runs,
    2026-12-05; docs/stages/capacity-evidence.md)."""
    if not a.server_warmup:
        return
    for rate in rates or [a.start_rate]:
        cmd = [sys.executable, "-m", "day0.stages.latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
               "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--seed", str(a.seed + 1000),
               "--rate", f"{rate:g}", "--num-requests", str(a.server_warmup), "--warmup", "0",
               "--percentiles", f"50,{a.percentile:g}", "--no-server-metrics"]
        out, why, wall = run_child(cmd, a, ok=(0, 1))
        ttft = next((" ".join(line.split()) for line in out.splitlines() if line.startswith("Time to first token")), "")
        print(f"server warm-up: {a.server_warmup} requests at {rate:g} req/s in {wall:.0f} s, not counted"
              + (f"; {why}" if why else f"; {ttft} (n, mean, std, p50, p{a.percentile:g} ms)"), flush=True)


# --------------------------------------------------------------------------- shared helpers


def limits(a: argparse.Namespace) -> dict[str, float]:
    """The SLA every tool is judged by: metric -> limit (ms) at ``a.percentile``."""
    return {"ttft": a.ttft_limit_ms, "tpot": a.tpot_limit_ms}


def sla_table(a: argparse.Namespace) -> dict[str, float]:
    """The same SLA as day0's limit keys (``ttft_p99_ms``): its ``--limit`` flags, its ``[sla]``
    table for judging a dense rate by day0's rule, and the ``--json`` record's ``sla``."""
    from day0.client.prom import pct_name

    return {f"{m}_{pct_name(a.percentile)}_ms": v for m, v in limits(a).items()}


def meets(ttft: float | None, tpot: float | None, ok: bool, a: argparse.Namespace) -> bool:
    """A point estimate within every limit and no failed request (how vLLM and GuideLLM are judged)."""
    return ok and ttft is not None and tpot is not None and ttft <= a.ttft_limit_ms and tpot <= a.tpot_limit_ms


def highest_met(points: list[dict[str, Any]], key: str = "verdict",
                over: tuple[str, ...] = ("misses",)) -> tuple[float | None, float | None]:
    """(the highest rate whose ``key`` meets below the lowest whose ``key`` is in ``over``, that
    lowest rate): a tool's answer from its points."""
    tops = [p["rate"] for p in points if p.get(key) in over]
    first = min(tops) if tops else None
    met = [p["rate"] for p in points if p.get(key) == "meets" and (first is None or p["rate"] < first)]
    return (max(met) if met else None), first


def summary(tool: str, points: list[dict[str, Any]], requests: int, wall: float, note: str = "",
            **extra: Any) -> dict[str, Any]:
    """A tool's answer from its points: the highest meeting rate below its lowest missing one."""
    sustained, first_miss = highest_met(points)
    return {"tool": tool, "sustained": sustained, "first_miss": first_miss, "requests": requests,
            "wall_s": round(wall, 1), "points": points, "note": note, **extra}


def judged_by_day0(res: dict[str, Any], rate: float, a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """A dense rate's own requests (``main_async``'s result with ``--save-detailed``) judged as day0
    judges a search point: read by day0's importer of vLLM bench results, measured by its metrics,
    judged by its ``judge_point`` (95% order-statistic bounds; "undecided" when a limit lies between
    them). Returns (verdict, limit key -> [lower, upper] ms). Over 300 requests a p99's upper bound
    is their largest value, its lower bound the seventh largest: the same data under the rule
    day0's answer is held to, so a gap left between the tools under it is in what they measured,
    not in how they judge."""
    from day0.config.latency import SlaSection
    from day0.stages.latency.from_vllm import read_vllm
    from day0.stages.latency.judging import judge_point
    from day0.stages.latency.metrics import compute_metrics

    sla = SlaSection.from_table(sla_table(a))
    run = read_vllm(Path(f"main_async at {rate:g} req/s"), res, "dense")
    point = judge_point(rate, compute_metrics(run.phase, [50.0, a.percentile]), sla, queue=False)
    return point.verdict, {k: list(v) for k, v in point.bounds.items()}


def run_child(cmd: list[str], a: argparse.Namespace, env: dict[str, str] | None = None,
              ok: tuple[int, ...] = (0,), live: bool = False,
              started: Callable[[int], object] | None = None) -> tuple[str, str, float]:
    """Run a tool's process; (stdout, what went wrong or "", wall seconds). Past ``--tool-timeout-s``
    its whole process group is killed (GuideLLM's workers outlive a killed parent) and what it
    printed so far is kept; an exit code outside ``ok`` is a failure. ``live``: its stderr
    (progress lines) goes straight to this process's. ``started`` is told its pid (bench_edge.py
    watches its CPU)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None if live else subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    if started is not None:
        started(proc.pid)
    try:
        out, err = proc.communicate(timeout=a.tool_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return out or "", f"stopped at --tool-timeout-s {a.tool_timeout_s:g}", time.monotonic() - t0
    told = "its output above" if live else " ".join((err or "").split())[-600:]
    why = f"failed (rc {proc.returncode}): {told}" if proc.returncode not in ok else ""
    return out or "", why, time.monotonic() - t0


def per_point(a: argparse.Namespace, day0: dict[str, Any] | None) -> int:
    """The requests a point of the other tools: day0's per search point, as its run reported it
    (``--requests``, else the fewest that bound the percentile: 299 for p99), or that count
    computed here when day0 did not run."""
    from day0.core.stats import samples_to_bound

    told = day0.get("requests_per_point") if day0 else None
    return told or a.requests or samples_to_bound(a.percentile, 0.95)


# --------------------------------------------------------------------------- day0


def day0_command(url: str, tok: Path, a: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "day0.stages.latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
           "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--seed", str(a.seed),
           "--rate", f"{a.start_rate:g}", "--num-requests", str(a.day0_measure_requests), "--warmup", str(a.warmup),
           "--search", "--search-start-rate", f"{a.start_rate:g}", "--percentiles", f"50,{a.percentile:g}",
           "--json", str(out)]
    cmd += [arg for key, limit in sla_table(a).items() for arg in ("--limit", f"{key}={limit:g}")]
    return cmd + (["--search-requests", str(a.requests)] if a.requests else [])


def run_day0(url: str, tok: Path, a: argparse.Namespace) -> dict[str, Any]:
    """``day0 latency --search`` in its own process (exit 1 = a check failed, still an answer); its
    points from the capacity check's evidence."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "day0.json"
        _, why, wall = run_child(day0_command(url, tok, a, out), a, ok=(0, 1), live=True)
        checks = json.loads(out.read_text()) if out.exists() else []
    cap = next((c for c in checks if c["id"] == "latency.capacity"), None)
    if cap is None:
        return summary("day0", [], 0, wall, why or "no latency.capacity check in its output")
    ev = cap["evidence"]
    cols, n = ev["table"]["columns"], ev["requests_per_point"]
    col = {c.split(" ")[0]: i for i, c in enumerate(cols)}
    points = []
    for row in ev["table"]["rows"]:
        err = row[col["error"]] if "error" in col and isinstance(row[col["error"]], (int, float)) else 0.0
        ran = round(row[2] / (1.0 - err)) if err < 1 else n  # completed + failed: an early-stopped point ran fewer
        bounds = {k: row[i] for k, i in col.items() if k.startswith(("ttft_", "tpot_"))}
        points.append({"rate": row[0], "achieved": row[1], "n": ran, "completed": row[2],
                       "verdict": str(row[-1]).split(":")[0],
                       "bounds_ms": bounds, "why": str(row[-1])})
    # a confirmation's row holds its point's requests too: the search's own count sends each once
    spent = a.warmup + a.day0_measure_requests + ev.get("requests_sent", sum(p["n"] for p in points))
    note = (f"{len(points)} search points of up to {n} requests (a point that has missed stops early; its cancelled "
            f"in-flight requests not counted) + {a.warmup} warm-up + {a.day0_measure_requests} measured; "
            f"latency.capacity {cap['status']}: {cap['message']}")
    told = summary("day0", points, spent, wall, note, requests_per_point=n, check=cap["status"],
                   by_part=ev.get("requests_by_part"))
    # the check's own answer: a short point that met above a confirmation that did not is no answer
    told["sustained"] = cap.get("value") if cap["status"] == "pass" else None
    # and its first load not met: a point stopped once it could not meet is undecided, not a miss
    told["first_miss"] = highest_met(points, over=("misses", "undecided"))[1]
    return told


# --------------------------------------------------------------------------- vLLM (the child process)


def vllm_argv(url: str, a: argparse.Namespace, rate: float, seed: int) -> list[str]:
    """``vllm bench serve``'s arguments for one rate of the dense list."""
    return ["--backend", "vllm", "--base-url", url, "--model", a.model, "--tokenizer", str(a.tokenizer),
            "--dataset-name", "random", "--random-input-len", str(a.input_len), "--random-output-len",
            str(a.output_len), "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(a.dense_requests),
            "--request-rate", f"{rate:g}", "--seed", str(seed), "--percentile-metrics", "ttft,tpot",
            "--metric-percentiles", f"{a.percentile:g}", "--disable-tqdm", "--save-detailed"]


async def vllm_dense(url: str, a: argparse.Namespace) -> None:
    """The dense rate list, one JSON line a rate: up by ``dense_step`` from ``start_rate`` until a
    rate misses (down until one meets when the first misses), at most ``dense_max_points``."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from day0.core.stats import offered_burst

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    word = f"{a.percentile:g}"
    rate, first = a.dense_start or a.start_rate, None
    for i in range(a.dense_max_points):
        args = parser.parse_args(vllm_argv(url, a, rate, a.seed + i))
        before = metrics_text(url)
        with contextlib.redirect_stdout(sys.stderr):  # vLLM's own report: stdout is this process's answer
            res = await main_async(args)
        past = first_tokens_past(before, metrics_text(url), res["ttfts"], a.ttft_limit_ms)
        ttft, tpot = res.get(f"p{word}_ttft_ms"), res.get(f"p{word}_tpot_ms")
        ok = res["completed"] == a.dense_requests and not res.get("failed")
        verdict = "meets" if meets(ttft, tpot, ok, a) else "misses"
        by_bounds, bounds = judged_by_day0(res, rate, a)
        offered = offered_burst(sorted(res["start_times"]))
        print(json.dumps({"rate": round(rate, 4), "n": a.dense_requests + 1 + args.num_warmups,
                          "completed": res["completed"], "verdict": verdict, "ttft_ms": ttft, "tpot_ms": tpot,
                          "achieved": res["request_throughput"], "by_bounds": by_bounds,
                          "bounds_ms_95": bounds, "first_tokens_past": past,
                          "offered_calmer": offered.calmer if offered else None}), flush=True)
        first = first or verdict
        if verdict != first:
            return
        rate = rate * a.dense_step if first == "meets" else rate / a.dense_step


def run_vllm(url: str, tok: Path, a: argparse.Namespace) -> dict[str, Any]:
    """The dense list in a fresh process (this script with ``--tool vllm``)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--tool", "vllm", "--url", url,
           "--tokenizer", str(tok), "--dense-requests", str(a.dense_requests), "--seed", str(a.seed)]
    out, why, wall = run_child(cmd, a)
    points = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    told = f"{len(points)} rates of {points[0]['n']} requests (the ready check included)" if points else "no rate"
    return summary("vllm", points, sum(p["n"] for p in points), wall, f"{why}; {told}" if why else told,
                   sustained_by_bounds=highest_met(points, "by_bounds", ("misses", "undecided"))[0])


# --------------------------------------------------------------------------- GuideLLM


def guidellm_command(url: str, tok: Path, a: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, "-m", "guidellm", "run", "--backend", f"kind=openai_http,target={url},model={a.model}",
            "--profile", f"kind=sweep,sweep_size={a.guidellm_sweep_size},strategy_type=poisson",
            "--constraint", f"kind=max_requests,count={a.guidellm_requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tok}", "--seed", f"kind=static,value={a.seed}",
            "--data", f"kind=synthetic_text,prompt_tokens={a.input_len},output_tokens={a.output_len}",
            "--output", f"kind=json,path={out}", "--disable-console"]


def guidellm_points(report: dict[str, Any], a: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """Every benchmark of the sweep as a point (only the Poisson ones judged), and the requests sent."""
    key = f"p{a.percentile:g}".replace(".", "")
    points, spent = [], 0
    for b in report["benchmarks"]:
        strat, reqs, m = b["config"]["strategy"], b["requests"], b["metrics"]
        n = sum(len(reqs.get(g) or []) for g in ("successful", "errored", "incomplete"))
        spent += n
        ttft = m["time_to_first_token_ms"]["successful"]["percentiles"].get(key)
        tpot = m["inter_token_latency_ms"]["successful"]["percentiles"].get(key)
        ok = not reqs.get("errored") and not reqs.get("incomplete")
        poisson = strat.get("type_") == "poisson"
        verdict = ("meets" if meets(ttft, tpot, ok, a) else "misses") if poisson else "not judged"
        rate = strat.get("rate") if poisson else m["requests_per_second"]["successful"]["mean"]
        points.append({"rate": round(rate, 4), "n": n, "strategy": strat.get("type_"), "verdict": verdict,
                       "ttft_ms": ttft, "tpot_ms": tpot})
    return points, spent


def run_guidellm(url: str, tok: Path, a: argparse.Namespace) -> dict[str, Any]:
    """GuideLLM's sweep in its own process, from the folder it was installed into."""
    if not a.guidellm_path or not Path(a.guidellm_path, "guidellm").is_dir():
        why = "no --guidellm-path" if not a.guidellm_path else f"no guidellm package under {a.guidellm_path}"
        return summary("guidellm", [], 0, 0.0, f"skipped ({why}; benchmarks/README.md says how to install it)")
    env = {**os.environ, "PYTHONPATH": str(a.guidellm_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "GUIDELLM__MAX_WORKER_PROCESSES": str(a.guidellm_workers)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "g.json"
        _, why, wall = run_child(guidellm_command(url, tok, a, out), a, env)
        if not out.exists():
            return summary("guidellm", [], 0, wall, why or "no report written")
        points, spent = guidellm_points(json.loads(out.read_text()), a)
    return summary("guidellm", points, spent, wall, f"sweep of {len(points)} benchmarks of {a.guidellm_requests} "
                                                   "requests (synchronous and throughput not judged)")


# --------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    from day0.client.workers import usable_cores

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--url", help="a running server's base URL (default: start the cpu-tiny server here)")
    ap.add_argument("--model", default="day0-tiny", help="served model name")
    ap.add_argument("--tokenizer", type=Path, help="model folder (default: the cpu-tiny model day0 builds)")
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens, every tool")
    ap.add_argument("--output-len", type=int, default=32, help="output tokens (EOS ignored), every tool")
    ap.add_argument("--percentile", type=float, default=99.0, help="the SLA's percentile")
    ap.add_argument("--ttft-limit-ms", type=float, default=300.0, help="TTFT limit at --percentile")
    ap.add_argument("--tpot-limit-ms", type=float, default=40.0, help="TPOT limit at --percentile")
    ap.add_argument("--start-rate", type=float, default=16.0,
                    help="req/s where day0's search and the dense list start (default: a little below the cpu-tiny "
                         "server's capacity for the default SLA on a 2-core box, so the run stays short)")
    ap.add_argument("--requests", type=int, default=0,
                    help="day0's requests a search point (default: the fewest bounding the percentile, 299 for p99)")
    ap.add_argument("--day0-measure-requests", type=int, default=10,
                    help="day0 latency's measured phase before its search (at --start-rate)")
    ap.add_argument("--warmup", type=int, default=2, help="day0's warm-up requests")
    ap.add_argument("--server-warmup", type=int, default=300,
                    help="requests run into the server at each rate of --server-warmup-ramp before any tool measures "
                         "it (0: none)")
    ap.add_argument("--server-warmup-ramp", default="1,2,3", type=lambda v: [float(x) for x in v.split(",")],
                    help="the warm-up runs --server-warmup requests at each of these multiples of --start-rate in turn "
                         "(default 1,2,3: the batches the tools will make near the edge, not only those at the start)")
    ap.add_argument("--dense-start", type=float, default=0.0,
                    help="req/s where the dense list starts (default: --start-rate, where day0 starts too)")
    ap.add_argument("--dense-step", type=float, default=1.05,
                    help="factor between the dense list's rates (default 1.05: half the 10%% agreement it is asked)")
    ap.add_argument("--dense-requests", type=int, default=0,
                    help="prompts a dense rate (default: as many as day0's search points had)")
    ap.add_argument("--dense-max-points", type=int, default=40, help="at most this many rates (from 16 req/s in "
                    "5%% steps, the 40th is 107 req/s)")
    ap.add_argument("--guidellm-path", type=Path, default=os.environ.get("GUIDELLM_PATH"),
                    help="folder GuideLLM was pip-installed into with --target (skipped without)")
    ap.add_argument("--guidellm-sweep-size", type=int, default=10, help="benchmarks in GuideLLM's sweep")
    ap.add_argument("--guidellm-requests", type=int, default=0,
                    help="requests a GuideLLM benchmark (default: as many as day0's search points had)")
    ap.add_argument("--guidellm-workers", type=int, default=usable_cores(),
                    help="GuideLLM's worker processes (its default, 10, swamps a small box; default: the usable cores)")
    ap.add_argument("--scripted-slots", type=int, default=0,
                    help="run against the scripted slot server instead (this many slots, 165 ms a 32-token request: a "
                         "known capacity and an edge that holds still; no warm-up)")
    ap.add_argument("--scripted-drift", default=[], type=lambda v: [float(x) for x in v.split(",")],
                    help="with --scripted-slots: service-time factors, one a window, cycled (a moving edge)")
    ap.add_argument("--scripted-drift-period", type=float, default=5.0, help="seconds a --scripted-drift window")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="start the cpu-tiny server with its prefix cache on (default off: vLLM's random prompts share "
                         "blocks on its 384-token vocabulary, see the docstring)")
    ap.add_argument("--seed", type=int, help="prompts and arrivals (round r: seed + 100 r; a dense rate i: + i); "
                    "default: drawn fresh and printed, since a seed reused run after run reuses its bursts")
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of every tool, the order reversed each round (ABBA); medians are compared")
    ap.add_argument("--skip", default="", help=f"comma-separated, of: {', '.join(TOOLS)}")
    ap.add_argument("--tool-timeout-s", type=float, default=900.0)
    ap.add_argument("--hold-s", type=float, default=0.0, help="then hold each tool's answer this long on day0's "
                    "load generator, judged by day0's rule (benchmarks/capacity_hold.py; default 0: not)")
    ap.add_argument("--hold-window-s", type=float, default=30.0, help="the server's TTFT shown per window of this")
    ap.add_argument("--json", type=Path, help="write the table, the points and the ratios here")
    ap.add_argument("--tool", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1_000_000)
    if a.rounds < 1:
        ap.error(f"--rounds: at least 1, got {a.rounds}")
    if a.scripted_drift and (not a.scripted_slots or min(a.scripted_drift) <= 0 or a.scripted_drift_period <= 0):
        ap.error("--scripted-drift: factors above 0, a period above 0, and --scripted-slots")
    return a


def run_round(url: str, tok: Path, a: argparse.Namespace, number: int, skip: set[str]) -> dict[str, dict[str, Any]]:
    """Every tool once, in TOOLS' order in even rounds and reversed in odd ones, on the round's seed,
    each with the prefix-cache share of its own run."""
    runners = {"day0": run_day0, "vllm": run_vllm, "guidellm": run_guidellm}
    order = [t for t in TOOLS if t not in skip]
    ra = argparse.Namespace(**{**vars(a), "seed": a.seed + number * ROUND_SEED_STEP})
    results: dict[str, dict[str, Any]] = {}
    for tool in order if number % 2 == 0 else order[::-1]:
        if tool != "day0":  # the others measure each rate with as many requests as day0's points had
            a.dense_requests = a.dense_requests or per_point(a, results.get("day0"))
            a.guidellm_requests = a.guidellm_requests or per_point(a, results.get("day0"))
            ra.dense_requests, ra.guidellm_requests = a.dense_requests, a.guidellm_requests
        print(f"\nround {number + 1}/{a.rounds}, {tool}: running against {url} ...", flush=True)
        before = metrics_text(url)
        results[tool] = runners[tool](url, tok, ra)
        results[tool]["cache"] = cache_share(before, metrics_text(url))
        show(results[tool])
    return {t: results[t] for t in order}


def main() -> int:
    a = parse_args()
    if a.tool == "vllm":
        asyncio.run(vllm_dense(a.url, a))
        return 0
    skip = set(a.skip.split(","))
    p = f"p{a.percentile:g}"
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; SLA: TTFT {p} <= "
          f"{a.ttft_limit_ms:g} ms, TPOT {p} <= {a.tpot_limit_ms:g} ms, no failed request; workload: {a.input_len} "
          f"random prompt tokens, {a.output_len} output tokens (EOS ignored), Poisson arrivals; seed {a.seed} "
          f"(--seed {a.seed} repeats these prompts and arrivals)", flush=True)
    t0 = time.monotonic()
    with serving(a) as (url, tok):
        if not a.scripted_slots:  # a script has nothing to warm
            warm_server(url, tok, a, [a.start_rate * k for k in a.server_warmup_ramp])
        rounds = [run_round(url, tok, a, r, skip) for r in range(a.rounds)]
        out = report(rounds, sla_table(a), {"input_len": a.input_len, "output_len": a.output_len,
                                            "arrivals": "poisson", "ignore_eos": True})
        if a.hold_s:
            from capacity_hold import hold_each

            out["holds"] = hold_each(url, tok, a, out["tools"], run_child, metrics_text, sla_table(a))
    print(f"\nrun time {time.monotonic() - t0:.0f} s (server start included); load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    if a.json:
        from day0.core.environment import git_commit  # the run record's own: the commit, "-dirty" if changed

        a.json.write_text(json.dumps({"seed": a.seed, "code": git_commit(ROOT), "setup": setup(a), **out}, indent=1)
                          + "\n")
    return 0


def setup(a: argparse.Namespace) -> dict[str, Any]:
    """What sets a run's cost besides the SLA and workload: where each tool starts, the dense list's
    grid, its requests a rate, the rounds, and a scripted server's slots (0: the cpu-tiny server)."""
    return {"start_rate": a.start_rate, "dense_start": a.dense_start or a.start_rate, "dense_step": a.dense_step,
            "dense_requests": a.dense_requests, "rounds": a.rounds, "scripted_slots": a.scripted_slots}


if __name__ == "__main__":
    raise SystemExit(main())
