"""Do the side by side's answers hold over minutes? (``bench_capacity.py --hold-s S``)

Each tool's answer is a rate that met over a few seconds of load: a point of 300 requests at 45
req/s lasts under 7 s. A replica serves for hours, through whatever slow spells its server has.
So after the rounds each tool's median answer is held for ``--hold-s`` seconds of unbroken load
(day0's load generator at that rate, fresh prompts, the same workload and SLA), and judged by
day0's rule over all of its requests (95% order-statistic bounds: ``pass`` when every upper bound
is within its limit, ``fail`` when a lower bound is past it, ``error`` in between). Beside it, the
server's own p-th percentile first-token time over each ``--hold-window-s`` window (its
``vllm:time_to_first_token_seconds`` histogram, bucket-interpolated, so coarse): whether a miss is
one slow spell or every window. MLPerf's server scenario runs 600 s for the same reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from capacity_report import fmt, limit_figures


def windows(url: str, every_s: float, percentile: float, done: threading.Event,
            scrape: Callable[[str], str | None]) -> list[float | None]:
    """The server's p-th percentile TTFT (ms) over each ``every_s`` window until ``done``; None for
    a window /metrics could not be read over."""
    from day0.client.prom import PromError, pct_name, server_view

    out: list[float | None] = []
    before = scrape(url)
    while not done.wait(every_s):
        after = scrape(url)
        try:
            view = server_view(before, after, percentiles=(percentile,)) if before and after else {}
        except PromError:
            view = {}
        out.append(round(view["ttft"].quantiles_ms[pct_name(percentile)], 1) if "ttft" in view else None)
        before = after
    return out


def hold(url: str, tok: Path, a: argparse.Namespace, tool: str, rate: float, seed: int,
         run_child: Callable[..., tuple[str, str, float]], scrape: Callable[[str], str | None],
         limits: dict[str, float]) -> dict[str, Any]:
    """``rate`` held for ``a.hold_s`` seconds: each limited percentile's estimate, bounds and status,
    the server's windows, and what went wrong ("" when nothing)."""
    n = math.ceil(rate * a.hold_s)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "checks.json"
        cmd = [sys.executable, "-m", "day0.stages.latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
               "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--seed", str(seed),
               "--rate", f"{rate:g}", "--num-requests", str(n), "--duration", f"{max(300.0, 2 * a.hold_s):g}",
               "--warmup", "0", "--percentiles", f"50,{a.percentile:g}", "--json", str(out)]
        cmd += [arg for key, limit in limits.items() for arg in ("--limit", f"{key}={limit:g}")]
        done = threading.Event()
        seen: list[list[float | None]] = []
        watcher = threading.Thread(target=lambda: seen.append(windows(url, a.hold_window_s, a.percentile, done,
                                                                      scrape)), daemon=True)
        watcher.start()
        _, why, wall = run_child(cmd, a, ok=(0, 1))
        done.set()
        watcher.join()
        checks = json.loads(out.read_text()) if out.exists() else []
    by_id = {c["id"]: c for c in checks}
    ids = {key: f"latency.{key.removesuffix('_ms')}" for key in limits}  # ttft_p99_ms -> latency.ttft_p99
    judged = {key: limit_figures(by_id[check_id]) for key, check_id in ids.items() if check_id in by_id}
    return {"tool": tool, "rate": rate, "requests": n, "wall_s": round(wall, 1), "limits": judged,
            "windows_ms": seen[0] if seen else [], "why": why or ("" if judged else "no limited check in its output")}


def verdict(h: dict[str, Any]) -> str:
    """``pass`` when every limit passed, ``fail`` when one failed, else ``error`` (undecided or unmeasured)."""
    statuses = [j["status"] for j in h["limits"].values()]
    if statuses and all(s == "pass" for s in statuses):
        return "pass"
    return "fail" if "fail" in statuses else "error"


def hold_line(h: dict[str, Any], window_s: float) -> str:
    """One held answer, as printed."""
    figures = "; ".join(f"{k} {fmt(j['ms'], '.1f')} [{fmt(j['lower'], '.1f')}, {fmt(j['upper'], '.1f')}] {j['status']}"
                        for k, j in h["limits"].items())
    wins = ", ".join(fmt(w, ".0f") for w in h["windows_ms"])
    return (f"{h['tool']:>8}: {h['rate']:.4g} req/s held {h['requests']} requests ({h['wall_s']:.0f} s): "
            f"{verdict(h).upper()}  {figures}\n          server's TTFT per {window_s:g} s (ms): {wins or '-'}"
            + (f"\n          {h['why']}" if h["why"] else ""))


def hold_each(url: str, tok: Path, a: argparse.Namespace, tools: dict[str, dict[str, Any]],
              run_child: Callable[..., tuple[str, str, float]], scrape: Callable[[str], str | None],
              limits: dict[str, float]) -> list[dict[str, Any]]:
    """Each tool's median answer (``tools``: capacity_report's per-tool results) held in turn, on
    seeds no round used (``a.seed`` + 5000 + i), each printed as it ends."""
    print(f"\nholding each answer for {a.hold_s:g} s of unbroken load (day0's load generator, day0's rule)",
          flush=True)
    held = []
    for i, r in enumerate(x for x in tools.values() if x["sustained"]):
        held.append(hold(url, tok, a, r["tool"], r["sustained"], a.seed + 5000 + i, run_child, scrape, limits))
        print(hold_line(held[-1], a.hold_window_s), flush=True)
    return held
