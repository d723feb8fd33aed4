"""Where is the bottleneck: the highest request rate each client times first tokens within 1 ms.

One run, side by side, against the same lean scripted server (benchmarks/fast_server.py, its own
process; TTFT 50 ms, then one token every 5 ms, 64 tokens, Poisson arrivals by default):

- the server's own ceiling: a null client (raw sockets, no parsing) at each rate, how late the
  server wrote its tokens against its script (when that grows, the server is the limit), and the
  null client's own TTFT error, judged as every client's is (one process that parses nothing but
  reads through asyncio's stream reader, a loop iteration after the bytes arrived: day0, stamping
  in ``data_received``, times rates it misses; docs/stages/latency.md, "Load workers");
- day0 as it runs by default (``latency.workers = 0``: at each rate the worker count
  ``day0.client.workers.auto_workers`` picks, shown per row), with 1 load worker, and with N
  (``--workers``, default: the usable cores);
- day0 with N load workers and a stop rule on each phase that never fires (``day0xN+stop``), as a
  capacity search's points run: each request then crosses the worker's pipe as a JSON line as it
  ends, for the rule in the parent; the ratio to day0xN is what that stream costs;
- ``vllm bench serve`` (its ``benchmark()`` function, in a fresh process);
- GuideLLM (``--guidellm-path DIR``: where it was ``pip install --target``-ed; skipped without).

Each client runs in a fresh process. Per request the server logs (CLOCK_MONOTONIC) when it wrote
the first token; the TTFT error is when the client says it noticed it minus that write: day0
``scheduled + TTFT``, vLLM ``start + TTFT``, GuideLLM ``first_token_iteration`` (wall clock,
converted with this host's wall-minus-monotonic offset). A rate is sustained when every request
succeeded and the TTFT error p99 is under ``--tol-ms``, over ``rate x --seconds`` requests and at
least ``--min-requests`` (299, so the p99 is not a step's single worst request); a miss is retried
once with another seed, and a client's ladder stops at its first miss. GuideLLM runs its rates in
one invocation (its start-up is ~20 s), so it runs them all. Send lag (scheduled to sent) is shown where a tool
records it (day0, GuideLLM; vLLM keeps no scheduled time). Figures move with other processes on
a shared box: the load average is printed; rerun before drawing conclusions.

    .venv/bin/python benchmarks/bench_ladder.py [--rates 50,100,...] [--seconds 2] [--guidellm-path DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 300
TOOLS = ("day0", "day0x1", "day0xN", "day0xN+stop", "vllm", "guidellm")


# --------------------------------------------------------------------------- the server


class Server:
    """fast_server.py in its own process, with its control paths."""

    def __init__(self, ttft_ms: float, gap_ms: float) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fast_server.py"), "--ttft-ms",
                                      str(ttft_ms), "--gap-ms", str(gap_ms)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def call(url: str, path: str, post: bool = False) -> Any:
    req = urllib.request.Request(url + path, data=b"" if post else None, method="POST" if post else "GET")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def first_writes(url: str) -> dict[int, float]:
    """Request key -> perf_counter instant the server wrote its first token."""
    return {int(e[0]): e[2] for e in call(url, "/_log") if e[4] > 0}


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else math.nan


def row(tool: str, rate: float, n: int, ok: int, errs: list[float], lags: list[float] | None, url: str,
        sends: list[float]) -> dict[str, Any]:
    stats = call(url, "/_stats")
    span = max(sends) - min(sends) if len(sends) > 1 else 0.0
    return {"tool": tool, "rate": rate, "n": n, "ok": ok, "err_p50": pct(errs, 50), "err_p99": pct(errs, 99),
            "lag_p99": pct(lags, 99) if lags is not None else None, "achieved": (len(sends) - 1) / span if span else None,
            "server_late_p99": stats["late_p99_ms"], "messages": stats["messages"]}


def step_requests(rate: float, a: argparse.Namespace) -> int:
    """Arrivals in a step: ``rate`` x ``--seconds``, and never fewer than ``--min-requests`` (299, the
    count day0's own SLA judging needs to bound a p99). A step of 2 s at 25 req/s is 50 requests, and
    their p99 is their worst one: one late wake-up of the host decided it whatever the client did."""
    return max(a.min_requests, int(rate * a.seconds))


def sustained(r: dict[str, Any], tol_ms: float) -> bool:
    return r["ok"] == r["n"] and r["n"] > 0 and r["err_p99"] < tol_ms


# --------------------------------------------------------------------------- the clients


def requests(n: int, out_len: int, seed: int) -> list[Any]:
    from day0.client.workload import WorkloadSpec, build_requests

    return build_requests(WorkloadSpec(32, out_len, seed=seed), VOCAB, n)


async def day0_ladder(url: str, a: argparse.Namespace, workers: int | None, watched: bool = False) -> None:
    """``workers`` load processes, or ``None``: day0's default (``latency.workers = 0``), the count
    ``auto_workers`` picks for each rate, as the latency stage and ``day0 latency`` would.
    ``watched``: each measured phase carries a stop rule that never fires, as a capacity search's
    points carry one, so on a pool every request crosses a pipe as a line as it ends (the cost
    that arm measures)."""
    from day0.client.loadgen import ClientOptions, LoadShape, make_streams, run_phase
    from day0.client.workers import WorkerPool, auto_workers, client_cores

    opts = ClientOptions()
    tool = ("day0" if workers is None else "day0x1" if workers == 1 else f"day0x{workers}") + ("+stop" if watched else "")
    until = (lambda r: False) if watched else None
    pools: dict[int, Any] = {}
    async with make_streams(opts) as s, contextlib.AsyncExitStack() as stack:

        async def phase(reqs: list[Any], shape: Any, name: str) -> Any:
            n = workers or auto_workers(shape, a.output_len, client_cores(url))
            if n == 1:
                return await run_phase(s, url, "scripted", reqs, shape, opts, phase=name, until=until)
            if n not in pools:  # started outside the timed phase, as the stage starts its pool
                pools[n] = await stack.enter_async_context(WorkerPool(n, a.loop))
            return await pools[n].run_phase(url, "scripted", reqs, shape, opts, phase=name, until=until)

        await phase(requests(8, a.output_len, 99), LoadShape(concurrency=8), "warmup")
        for rate in a.rate_list:
            for attempt in range(2):
                n = step_requests(rate, a)
                # exact: vLLM's bench rescales its schedule to the rate, so both offer the same load
                # (as drawn, seed 1's 299 gaps offer 29.7 req/s at 25)
                shape = LoadShape(mode="rate", request_rate=rate, concurrency=0, seed=a.seed + attempt,
                                  precise_timing=not a.no_spin, exact_rate=True)
                used = workers or auto_workers(shape, a.output_len, client_cores(url))
                if used not in (1, *pools):
                    await phase(requests(8, a.output_len, 99), shape, "warmup")  # a new pool's first requests
                call(url, "/_reset", post=True)
                ph = await phase(requests(n, a.output_len, a.seed + attempt), shape, "measure")
                fw = first_writes(url)
                errs = [(r.scheduled + r.ttft - fw[r.index]) * 1e3 for r in ph.results if r.ok and r.index in fw]
                out = row(tool, rate, n, sum(r.ok for r in ph.results), errs,
                          [r.send_lag * 1e3 for r in ph.results], url, [r.sent for r in ph.results])
                out["workers"] = used
                if sustained(out, a.tol_ms):
                    break
            print(json.dumps(out), flush=True)
            if not sustained(out, a.tol_ms):
                return


async def vllm_ladder(url: str, a: argparse.Namespace) -> None:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    kw = dict(task_type=TaskType.GENERATION, endpoint_type="openai", api_url=url + "/v1/completions",
              base_url=url, model_id="scripted", model_name="scripted", tokenizer=None, logprobs=None,
              burstiness=1.0, disable_tqdm=True, profile=False, selected_percentile_metrics=["ttft"],
              selected_percentiles=[99.0], ignore_eos=True, goodput_config_dict={}, max_concurrency=None,
              lora_modules=None, extra_headers=None, extra_body=None, ready_check_timeout_sec=0)

    def samples(n: int, seed: int) -> list[Any]:
        return [SampleRequest(prompt=r.prompt, prompt_len=r.input_len, expected_output_len=r.output_len,
                              request_id=f"day0-measure-000000-{r.index}") for r in requests(n, a.output_len, seed)]

    with contextlib.redirect_stdout(io.StringIO()):
        await benchmark(input_requests=samples(8, 99), request_rate=math.inf, num_warmups=0, **kw)
    for rate in a.rate_list:
        for attempt in range(2):
            n = step_requests(rate, a)
            call(url, "/_reset", post=True)
            np.random.seed(a.seed + attempt)
            with contextlib.redirect_stdout(io.StringIO()):
                res = await benchmark(input_requests=samples(n, a.seed + attempt), request_rate=rate, num_warmups=0, **kw)
            fw = first_writes(url)
            errs = [(start + ttft - fw[i]) * 1e3 for i, (ttft, err, start)
                    in enumerate(zip(res["ttfts"], res["errors"], res["start_times"])) if not err and i in fw]
            out = row("vllm", rate, n, sum(1 for e in res["errors"] if not e), errs, None, url, list(res["start_times"]))
            if sustained(out, a.tol_ms):
                break
        print(json.dumps(out), flush=True)
        if not sustained(out, a.tol_ms):
            return


def wall_offset() -> float:
    """This host's time.time() minus time.perf_counter(), the median of a few close readings."""
    reads = []
    for _ in range(9):
        p0 = time.perf_counter()
        w = time.time()
        p1 = time.perf_counter()
        reads.append(w - (p0 + p1) / 2)
    return statistics.median(reads)


def guidellm_ladder(url: str, a: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """GuideLLM's own ladder, one invocation over every rate; rows matched to the server's log by
    the ``cmpl-<key>`` id it records per request."""
    from day0.model.tiny import TinySpec, cached_model

    tok = cached_model(TinySpec())
    rates = [r for r in a.rate_list if r <= a.guidellm_max_rate]
    call(url, "/_reset", post=True)
    offset = wall_offset()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "guidellm", "run", "--backend", f"kind=openai_http,target={url},model=scripted",
               "--profile", f"kind=poisson,rate={rates[0]:g}", "--override", "profile.rate",
               ",".join(f"{r:g}" for r in rates), "--constraint",
               f"kind=max_duration,seconds={max(a.seconds, a.min_requests / rates[0]):g}",
               "--tokenizer", f"kind=huggingface_auto,model={tok}",
               "--data", f"kind=synthetic_text,prompt_tokens=32,output_tokens={a.output_len}",
               "--output", f"kind=json,path={tmp}/g.json", "--disable-console"]
        env = {**os.environ, "PYTHONPATH": str(a.guidellm_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"guidellm failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
        report = json.loads(Path(tmp, "g.json").read_text())
    fw = first_writes(url)
    for rate, b in zip(rates, report["benchmarks"]):
        good, bad = b["requests"]["successful"], b["requests"]["errored"]
        errs, lags, sends = [], [], []
        for r in good:
            t, key = r["info"]["timings"], int(str(r["response_id"]).rsplit("-", 1)[1])
            if key in fw and t.get("first_token_iteration"):
                errs.append((t["first_token_iteration"] - offset - fw[key]) * 1e3)
            if t.get("targeted_start"):  # GuideLLM leaves it 0 for some requests (seen at a ladder's first rate)
                lags.append((t["request_start"] - t["targeted_start"]) * 1e3)
            sends.append(t["request_start"])
        out = row("guidellm", rate, len(good) + len(bad), len(good), errs, lags, url, sends)
        out["incomplete"] = len(b["requests"]["incomplete"])
        out["server_late_p99"] = None  # one log for the whole invocation: per-rate lateness is not separable
        yield out


# --------------------------------------------------------------------------- the server's ceiling


async def null_client(url: str, rate: float, n: int, out_len: int, seed: int) -> tuple[int, dict[int, float]]:
    """Send ``n`` Poisson-timed streaming requests on raw keep-alive sockets and read each response
    to its end without parsing it: the cheapest client there is. Returns how many completed, and
    per request the instant it first read a ``data:`` line (its TTFT notice, as the clients' rows)."""
    from day0.client.workload import arrival_offsets

    host, port = url.removeprefix("http://").split(":")
    free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    noticed: dict[int, float] = {}
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        conn = free.pop() if free else await asyncio.open_connection(host, int(port))
        body = json.dumps({"model": "scripted", "prompt": [1] * 32, "max_tokens": out_len, "stream": True}).encode()
        conn[1].write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"X-Request-Id: day0-measure-000000-%d\r\nContent-Length: %d\r\n\r\n%s" % (i, len(body), body))
        tail = b""
        while not tail.endswith(b"0\r\n\r\n"):
            chunk = await conn[0].read(65536)
            if not chunk:
                return
            if i not in noticed and b"data:" in tail + chunk:
                noticed[i] = time.perf_counter()
            tail = (tail + chunk)[-16:]
        done += 1
        free.append(conn)

    t0 = time.perf_counter()
    tasks = []
    for i, off in enumerate(arrival_offsets(n, rate, 1.0, seed, exact=True)):
        delay = t0 + off - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    for _, w in free:
        w.close()
    return done, noticed


def server_ceiling(url: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    """The server alone: how late it writes its tokens at each rate, driven by the null client, and
    the null client's own TTFT error, judged as the clients' rows are."""
    rows = []
    for rate in a.rate_list:
        n = step_requests(rate, a)
        call(url, "/_reset", post=True)
        ok, noticed = asyncio.run(null_client(url, rate, n, a.output_len, a.seed))
        st = call(url, "/_stats")
        fw = first_writes(url)
        errs = [(t - fw[i]) * 1e3 for i, t in noticed.items() if i in fw]
        rows.append({"rate": rate, "n": n, "ok": ok, "late_p50": st["late_p50_ms"], "late_p99": st["late_p99_ms"],
                     "msgs_s": rate * a.output_len, "err_p99": pct(errs, 99)})
        if not sustained(rows[-1], a.tol_ms):  # past the null client's own ceiling
            break
    return rows


# --------------------------------------------------------------------------- orchestration


def run_tool(tool: str, url: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    """One client's ladder in a fresh process (imports done, then gc.freeze(), as each tool gets)."""
    args = [arg for arg in sys.argv[1:]]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tool", tool, "--url", url, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.tool_timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        print(f"{tool}: stopped at --tool-timeout-s {a.tool_timeout_s:g}")
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        print(f"{tool}: failed (rc {proc.returncode}): {' '.join(proc.stderr.split())[-600:]}")
    return rows


def tool_main(a: argparse.Namespace) -> int:
    with contextlib.redirect_stderr(io.StringIO()):
        if a.tool == "vllm":
            import vllm.benchmarks.serve  # noqa: F401  (import cost outside the timed runs)
    gc.collect()
    gc.freeze()
    if a.tool == "guidellm":
        for out in guidellm_ladder(a.url, a):
            print(json.dumps(out), flush=True)
    elif a.tool == "vllm":
        asyncio.run(vllm_ladder(a.url, a))
    else:
        from day0.client.loops import run

        workers = {"day0": None, "day0x1": 1}.get(a.tool, a.workers)
        run(day0_ladder(a.url, a, workers, watched=a.tool.endswith("+stop")), a.loop)
    return 0


def report(results: dict[str, list[dict[str, Any]]], ceiling: list[dict[str, Any]], a: argparse.Namespace) -> None:
    if ceiling:
        print("\nserver alone (null client): rate, messages/s, server write lateness p50/p99 ms, the null "
              "client's TTFT error p99 ms")
    for c in ceiling:
        print(f"  {c['rate']:>6g} req/s {c['msgs_s']:>8.0f} msg/s  {c['ok']}/{c['n']} ok  late p50 "
              f"{c['late_p50']:.3f} p99 {c['late_p99']:.3f}  err p99 {c['err_p99']:.3f}"
              f"{'' if sustained(c, a.tol_ms) else '  <- not sustained'}")
    head = (f"{'rate':>6} | {'client':<9} {'ok':>11} {'err p50':>8} {'err p99':>8} {'lag p99':>8} {'achieved':>9} "
            f"{'srv late p99':>12}")
    print("\n" + head + "\n" + "-" * len(head))
    for rate in a.rate_list:
        for tool, rows in results.items():
            for r in (r for r in rows if r["rate"] == rate):
                lag = "n/a" if r["lag_p99"] is None else f"{r['lag_p99']:.3f}"
                late = "-" if r.get("server_late_p99") is None else f"{r['server_late_p99']:.3f}"
                ach = "-" if r["achieved"] is None else f"{r['achieved']:.1f}"
                label = f"day0 ({r['workers']}w)" if tool == "day0" else tool
                print(f"{rate:>6g} | {label:<9} {r['ok']:>5}/{r['n']:<5} {r['err_p50']:>8.3f} {r['err_p99']:>8.3f} "
                      f"{lag:>8} {ach:>9} {late:>12}{'' if sustained(r, a.tol_ms) else '  <- not sustained'}")
    best = {t: max((r["rate"] for r in rows if sustained(r, a.tol_ms)), default=0.0) for t, rows in results.items()}
    print()
    for t, b in best.items():
        print(f"{t}: highest sustained rate {b:g} req/s ({b * a.output_len:,.0f} streamed tokens/s)")
    if ceiling:
        ceil = max((c["rate"] for c in ceiling if c["ok"] == c["n"] and c["late_p99"] <= a.tol_ms * 2), default=0.0)
        null = max((c["rate"] for c in ceiling if sustained(c, a.tol_ms)), default=0.0)
        print(f"server alone: keeps its writes within {2 * a.tol_ms:g} ms p99 up to {ceil:g} req/s of the ladder"
              + (" (the top of the ladder)" if ceil == a.rate_list[-1] else ""))
        # not a bound on the clients: it is one process on the default asyncio loop, and a client of
        # several processes has passed a rate it missed (the host's scheduling, not parsing, is the limit)
        print(f"null client (one process, raw sockets, no parsing): highest sustained rate {null:g} req/s")
    ref = best.get("vllm")
    for t in (t for t in best if t.startswith("day0")):
        for other in ("vllm", "guidellm"):
            if other in best:
                print(f"ratio {t} / {other}: " + (f"{best[t] / best[other]:.2f}" if best[other] else "n/a (0 sustained)"))
    many = [t for t in best if t.startswith("day0x") and t != "day0x1" and not t.endswith("+stop")]
    if "day0x1" in best and many and best["day0x1"]:
        print(f"ratio {many[0]} / day0x1: {best[many[0]] / best['day0x1']:.2f}")
    if many and f"{many[0]}+stop" in best and best[many[0]]:
        print(f"ratio {many[0]}+stop / {many[0]} (each request streamed to a stop rule, as a search point's): "
              f"{best[many[0] + '+stop'] / best[many[0]]:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"best": best, "ceiling": ceiling, "rows": results, "ref": ref}, indent=1))


def main() -> int:
    from day0.client.workers import usable_cores
    from day0.core.stats import samples_to_bound

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,100,200,300,400,600,800,1200,1600")
    ap.add_argument("--seconds", type=float, default=2.0, help="arrivals per rate ~ rate x seconds")
    ap.add_argument("--min-requests", type=int, default=samples_to_bound(99.0),
                    help="arrivals per rate at least (default 299: the fewest that bound a p99 at 95%%)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--gap-ms", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol-ms", type=float, default=1.0, help="TTFT error p99 that still counts as sustained")
    ap.add_argument("--workers", type=int, default=usable_cores(), help="day0's N (default: the usable cores)")
    ap.add_argument("--skip", default="", help=f"comma-separated, of: {', '.join(TOOLS)}, ceiling")
    ap.add_argument("--guidellm-path", type=Path, default=os.environ.get("GUIDELLM_PATH"),
                    help="folder GuideLLM was pip-installed into with --target (skipped without)")
    ap.add_argument("--guidellm-max-rate", type=float, default=400.0, help="GuideLLM runs every rate up to this")
    ap.add_argument("--tool-timeout-s", type=float, default=300.0)
    ap.add_argument("--no-spin", action="store_true", help="day0 without precise send timing (plain asyncio sleeps)")
    ap.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                    help="day0's event loop (day0.client.loops; auto: uvloop where installed)")
    ap.add_argument("--json", help="write every figure here as JSON")
    ap.add_argument("--tool", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.rate_list = [float(x) for x in a.rates.split(",")]
    if a.tool:
        return tool_main(a)
    skip = set(a.skip.split(","))
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; day0's loop: {a.loop}; "
          f"server: TTFT "
          f"{a.ttft_ms:g} ms, {a.output_len} tokens {a.gap_ms:g} ms apart, Poisson arrivals; sustained = all ok "
          f"and TTFT error p99 < {a.tol_ms:g} ms")
    srv = Server(a.ttft_ms, a.gap_ms)
    results: dict[str, list[dict[str, Any]]] = {}
    t0 = time.monotonic()
    try:
        ceiling = [] if "ceiling" in skip else server_ceiling(srv.url, a)
        for tool in TOOLS:
            if tool in skip or (tool == "guidellm" and not a.guidellm_path):
                continue
            name = tool.replace("xN", f"x{a.workers}")
            results[name] = run_tool(tool, srv.url, a)
    finally:
        srv.close()
    report(results, ceiling, a)
    print(f"\nladder time {time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.2f} at the end")
    if not a.guidellm_path:
        print("guidellm: skipped (no --guidellm-path)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
