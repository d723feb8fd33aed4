"""Where do a server's late first tokens come from: its arrivals, or its host?

Near the edge a capacity search's short points meet at rates its 30 s holds do not
(docs/stages/capacity-evidence.md, "Late first tokens come in spells"). This script asks why, on one server:
after a run-in and a flat-out run (day0's own, ``day0.stages.latency.saturation``), each of
``--shares`` of the flat-out rate is held for ``--hold-s`` seconds three times: a Poisson schedule,
the same schedule again on fresh prompts (the replay), and a fresh schedule. Each hold's TTFTs past
``--ttft-limit-ms`` are grouped into spells (``day0.stages.latency.spells``, the search's own), and
the script prints, per hold:

- how many first tokens were late, in how many spells, the largest, and the arrivals the schedule
  offered in the second before it (as a multiple of the rate, and the share of the hold's seconds
  it was busier than);
- the server's own count past its histogram's bucket bound at or under the limit
  (``vllm:time_to_first_token_seconds``; 250 ms for a 300 ms limit) beside the client's count past
  the same bound: whether the client saw lateness the server did not;
- for the replay and the fresh schedule, how many of the first hold's spells have a spell of theirs
  within ``--near-s`` seconds (``recur``). Spells that follow the arrivals recur in the replay and
  not in the fresh schedule; spells of the host's own stalls recur in neither.

Starts the cpu-tiny vLLM server (prefix caching off, as in bench_capacity.py) unless ``--url`` names
one: on a shared box take the engine lock.

    flock /tmp/day0-engine.lock .venv/bin/python benchmarks/bench_late_spells.py [--shares 0.7,0.8,0.9] \\
        [--hold-s 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_capacity import serving  # noqa: E402  (the same server)
from server_metrics import ttft_window  # noqa: E402  (read the same way)

PASSES = ("first", "replay", "fresh")


def recur(first: list[dict[str, Any]], other: list[dict[str, Any]], near_s: float) -> int:
    """How many of ``first``'s spells have one of ``other``'s within ``near_s`` of their span."""
    return sum(any(o["start_s"] <= f["end_s"] + near_s and o["end_s"] >= f["start_s"] - near_s for o in other)
               for f in first)


def past_bound(before: str, after: str, limit_ms: float) -> tuple[float, int] | None:
    """(the server histogram's largest finite bucket bound at or under the limit, in ms; the first tokens
    it counted past it between the scrapes); None without such a bucket (or histogram)."""
    d = ttft_window(before, after)
    bounds = [le for le, _ in d.buckets if le * 1000.0 <= limit_ms] if d is not None else []
    if not bounds:
        return None
    return bounds[-1] * 1000.0, round(d.total - dict(d.buckets)[bounds[-1]])


async def holds(url: str, a: argparse.Namespace) -> dict[str, Any]:
    from day0.client.loadgen import ClientOptions, LoadShape, make_session, make_streams, run_phase
    from day0.client.prom import scrape
    from day0.client.workload import WorkloadSpec, build_requests, new_nonce, read_vocab
    from day0.config.profile import load_profile
    from day0.stages.latency.saturation import measure_saturation, settle
    from day0.stages.latency.spells import late_spells
    from day0.stages.latency.stage import workload_vocab

    vocab = (read_vocab(a.tokenizer) if a.tokenizer else a.vocab_size if a.url
             else workload_vocab(load_profile("cpu-tiny")))
    opts = ClientOptions(endpoint="completions", ignore_eos=True)
    spec = WorkloadSpec(input_len=a.input_len, output_len=a.output_len, nonce=new_nonce())
    out: dict[str, Any] = {"holds": []}
    async with make_session(opts) as session, make_streams(opts) as streams:
        async def phase(reqs: list[Any], shape: LoadShape, name: str) -> Any:
            return await run_phase(streams, url, a.model, reqs, shape, opts, phase=name)

        for i, rate in enumerate(a.warmup_rates):  # a fresh CPU server is slow for its first few hundred requests
            await phase(build_requests(spec, vocab, a.warmup, stream=f"warm{i}"),
                        LoadShape(mode="rate", concurrency=0, request_rate=rate, seed=a.seed, stream=f"warm{i}"), "warmup")
        sat, _ = await measure_saturation(
            lambda shape: phase(build_requests(spec, vocab, 200, stream="saturation"), shape, "saturation"),
            session, url, 200, 0, a.seed)
        print(f"server: {sat.text()}", flush=True)
        if not sat.req_s:
            raise SystemExit(f"no flat-out rate: {sat.why}")
        out["flat_out"] = sat.req_s
        for share in a.shares:
            rate, first = share * sat.req_s, None
            for which in PASSES:
                schedule = f"hold{share:g}" + ("-fresh" if which == "fresh" else "")
                reqs = build_requests(spec, vocab, int(rate * a.hold_s), stream=f"hold{share:g}-{which}")
                await settle(session, url)
                before = await scrape(session, url)
                ph = await phase(reqs, LoadShape(mode="rate", concurrency=0, request_rate=rate, seed=a.seed,
                                                 exact_rate=True, stream=schedule), "hold")
                await asyncio.sleep(1.0)  # the server's histogram trails its last responses
                after = await scrape(session, url)
                ok = [r for r in ph.results if r.ok and r.ttft is not None]
                offsets, ttfts = [r.scheduled - ph.started for r in ok], [r.ttft * 1000.0 for r in ok]
                spells = [asdict(s) for s in late_spells(offsets, ttfts, a.ttft_limit_ms, rate)]
                server = past_bound(before, after, a.ttft_limit_ms)
                row = {"share": share, "rate": round(rate, 2), "pass": which, "requests": len(ph.results),
                       "completed": len(ok), "late": sum(s["late"] for s in spells), "spells": spells,
                       "bound_ms": server[0] if server else None, "server_past": server[1] if server else None,
                       "client_past": sum(1 for t in ttfts if server and t > server[0]),
                       "loop_stall_ms": ph.loop_stall_ms}
                if which == "first":
                    first = spells
                else:
                    row["recur"] = recur(first or [], spells, a.near_s)
                show(row, len(first or []))
                out["holds"].append(row)
    return out


def show(row: dict[str, Any], first_spells: int) -> None:
    spells = row["spells"]
    largest = max(spells, key=lambda s: s["late"]) if spells else None
    print(f"{row['share']:>5g} {row['rate']:>7.2f} req/s {row['pass']:<6} {row['completed']:>5} done, "
          f"{row['late']:>4} late in {len(spells):>2} spells"
          + (f" (largest {largest['late']} at {largest['start_s']:.1f}-{largest['end_s']:.1f} s" + (
              f"; the second before: {largest['ratio']}x the rate, busier than {largest['busier']} of the hold's"
              if largest["busier"] is not None else "; in the hold's first second") + ")" if largest else "")
          + f"; past {row['bound_ms']:g} ms: server {row['server_past']}, client {row['client_past']}"
          + (f"; recur {row['recur']} of {first_spells}" if "recur" in row else ""), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start the cpu-tiny server)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the cpu-tiny model's)")
    ap.add_argument("--vocab-size", type=int, default=384,
                    help="token ids of --url's prompts stay below this (without --tokenizer)")
    ap.add_argument("--prefix-caching", action="store_true", help="keep the profile's prefix caching")
    ap.add_argument("--model", default="day0-tiny", help="served model name")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--shares", type=lambda v: [float(x) for x in v.split(",")], default=[0.6, 0.65, 0.7],
                    help="rates to hold, as shares of the flat-out rate")
    ap.add_argument("--hold-s", type=float, default=30.0)
    ap.add_argument("--ttft-limit-ms", type=float, default=300.0)
    ap.add_argument("--near-s", type=float, default=0.5, help="spells this close count as the same")
    ap.add_argument("--warmup", type=int, default=300, help="run-in requests at each --warmup-rates")
    ap.add_argument("--warmup-rates", type=lambda v: [float(x) for x in v.split(",")], default=[16.0, 32.0, 48.0])
    ap.add_argument("--seed", type=int, default=0, help="the schedules' seed (the replay repeats each)")
    ap.add_argument("--json", type=Path, help="write every hold here")
    a = ap.parse_args()
    with serving(a) as (url, _tok):
        out = asyncio.run(holds(url, a))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
