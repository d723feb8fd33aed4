"""Is the capacity answer reproducible: the same ``day0 latency --search`` several times in a row
against one cpu-tiny vLLM server (the embedded target), each run timed.

The issue's bar: the search finishes in under 3 minutes on 2 cores and three runs agree within 15%.
Prints each run's wall time, verdict, answer, points and requests, and at the end the spread of the
answers (highest / lowest). A shared box's own speed moves between runs a minute apart, so each run
also prints its lowest-load point's TTFT bounds: when those differ between runs, the server's speed
did, and the answers follow it. Each search first measures what the server completes flat out that
minute (``--search-saturation-requests``, 200 at once by default) and the script reads that figure
from the check's evidence; each answer is also shown as a share of it, and that share's spread is
the search's own, with the server's drift taken out. ``--saturation-requests N`` adds a flat-out
run of the script's own (at ``--saturation-concurrency``) before each search, for an arm that
switches the search's off. The server is run in first (``--server-warmup`` requests, as in
bench_capacity.py). Starts a vLLM engine unless ``--url`` names one: on a shared box take the
engine lock.

    flock /tmp/day0-engine.lock .venv/bin/python benchmarks/bench_search_repeat.py [--runs 3] \\
        [--versus=--drawn-rates] [-- extra day0 latency arguments, e.g. --search-probe-requests 0]

``--versus=ARGS`` (with the "=", since ARGS starts with a dash) runs a second arm with those
arguments on top, the two in ABBA order on the same seeds, and prints each arm's spread: does a
setting make the answer more reproducible, on one server, with the box's drift shared.
``--versus-tree DIR`` makes the second arm another checkout's day0 (``git worktree add DIR
COMMIT``; its own load workers too): a change paired against its parent, same server, same seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_capacity  # noqa: E402  (the server and its warm-up: one answer for both scripts)
from capacity_report import fmt  # noqa: E402


def command(url: str, tok: Path, a: argparse.Namespace, seed: int, out: Path, arm: list[str]) -> list[str]:
    """The documented search (docs/stages/latency.md, "Capacity search"), on its own seed, with the
    arm's own arguments."""
    return [sys.executable, "-m", "day0.cli", "latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
            "--input-len", a.input_len, "--output-len", "32", "--limit", f"ttft_p90_ms={a.ttft_limit_ms:g}",
            "--limit", f"tpot_p90_ms={a.tpot_limit_ms:g}", "--search", "--search-start-rate", f"{a.start_rate:g}",
            "--search-requests", str(a.requests), "--seed", str(seed), "--json", str(out), *a.extra, *arm]


def tree_env(tree: Path | None) -> dict[str, str] | None:
    """The environment that imports day0 from ``tree``: first on the path, and the working folder
    (this checkout, for ``-m``) left off it; None: this checkout's."""
    return None if tree is None else {**os.environ, "PYTHONPATH": str(tree.resolve()), "PYTHONSAFEPATH": "1"}


def one_run(url: str, tok: Path, a: argparse.Namespace, seed: int, arm: list[str],
            tree: Path | None = None) -> dict:
    """One search in its own process (bench_capacity's runner: a run past ``--run-timeout-s`` has
    its whole process group killed, load workers included; exit 1 is a failed check, still an answer),
    with day0 from ``tree`` when given."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "checks.json"
        _, why, wall = bench_capacity.run_child(command(url, tok, a, seed, out, arm),
                                                argparse.Namespace(tool_timeout_s=a.run_timeout_s),
                                                env=tree_env(tree), ok=(0, 1))
        checks = json.loads(out.read_text()) if out.exists() else []
    cap = next((c for c in checks if c["id"] == "latency.capacity"), None)
    if cap is None:
        return {"seed": seed, "wall_s": round(wall, 1), "status": "none", "value": None,
                "message": why or "no latency.capacity check in its output"}
    rows = cap["evidence"]["table"]["rows"]
    sat = cap["evidence"].get("saturation") or {}
    return {"seed": seed, "wall_s": round(wall, 1), "status": cap["status"], "value": cap.get("value"),
            "search_saturation_req_s": sat.get("req_s") if sat.get("applies") else None,
            "points": len(rows), "completed": sum(r[2] for r in rows), "lowest_point": rows[0][:4] if rows else None,
            "message": cap["message"], "rows": rows, "order": cap["evidence"].get("order")}


def saturation(url: str, tok: Path, a: argparse.Namespace, seed: int) -> float | None:
    """Requests a second the server completes with ``--saturation-concurrency`` in flight (a
    closed loop: no queue can grow, the server is simply kept busy), on the search's own prompt
    lengths and a seed no search uses. None when switched off or when the run gave no figure."""
    if not a.saturation_requests:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "checks.json"
        cmd = [sys.executable, "-m", "day0.stages.latency", "--url", url, "--model", a.model, "--tokenizer", str(tok),
               "--input-len", a.input_len, "--output-len", "32", "--seed", str(seed + 2000),
               "--concurrency", str(a.saturation_concurrency), "--num-requests", str(a.saturation_requests),
               "--warmup", "0", "--no-server-metrics", "--json", str(out)]
        bench_capacity.run_child(cmd, argparse.Namespace(tool_timeout_s=a.run_timeout_s), ok=(0, 1))
        checks = json.loads(out.read_text()) if out.exists() else []
    return next((c.get("value") for c in checks if c["id"] == "latency.request_throughput"), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the runs' seeds are this and the next --runs - 1 (another set of draws than an earlier run's)")
    ap.add_argument("--model", default="day0-tiny")
    ap.add_argument("--input-len", default="64:512", help="prompt tokens, N or LO:HI")
    ap.add_argument("--ttft-limit-ms", type=float, default=1000.0, help="TTFT p90 limit")
    ap.add_argument("--tpot-limit-ms", type=float, default=100.0, help="TPOT p90 limit")
    ap.add_argument("--start-rate", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=60, help="requests a full search point")
    ap.add_argument("--server-warmup", type=int, default=300, help="requests run into the server first (0: none)")
    ap.add_argument("--warmup-rate", type=float, default=8.0, help="req/s of the server's warm-up")
    ap.add_argument("--warmup-input-len", default="128", help="prompt tokens of the server's warm-up, N or LO:HI")
    ap.add_argument("--saturation-requests", type=int, default=0,
                    help="requests of a flat-out measurement of this script's own before each search, for an "
                         "arm whose search measures none (--search-saturation-requests 0); default 0: the "
                         "search's own figure")
    ap.add_argument("--saturation-concurrency", type=int, default=16, help="in flight then (cpu-tiny's max_num_seqs)")
    ap.add_argument("--url", help="a server already running (e.g. started with other settings); default: start cpu-tiny's")
    ap.add_argument("--run-timeout-s", type=float, default=600.0)
    ap.add_argument("--json", type=Path, help="write the runs here")
    ap.add_argument("--versus", metavar="ARGS", help="a second arm: these day0 latency arguments on top, the two arms "
                                                     "in ABBA rounds on the same seeds, --runs each")
    ap.add_argument("--versus-tree", type=Path, metavar="DIR",
                    help="a second arm: day0 from this checkout (a git worktree of another commit), same seeds")
    ap.add_argument("extra", nargs="*", help="after --: more day0 latency arguments, every run")
    a = ap.parse_args()
    if a.versus_tree is not None and not (a.versus_tree / "day0" / "__init__.py").is_file():
        # else the arm would import this checkout's day0 (installed editable) and pair a change with itself
        ap.error(f"--versus-tree {a.versus_tree}: no day0 package there (git worktree add DIR COMMIT)")
    # what bench_capacity's server and warm-up read; the profile's prefix cache stays on (day0 alone
    # runs here, and its nonce keeps its prompts out of the cache)
    server = argparse.Namespace(url=a.url, tokenizer=None, model=a.model, prefix_caching=True,
                                server_warmup=a.server_warmup, start_rate=a.warmup_rate,
                                input_len=a.warmup_input_len, output_len=32, seed=0, percentile=90.0,
                                tool_timeout_s=a.run_timeout_s)
    arms = {"A": [], "B": shlex.split(a.versus or "")} if a.versus or a.versus_tree else {"A": []}
    trees = {"B": a.versus_tree}
    runs = []
    with bench_capacity.serving(server) as (url, tok):
        bench_capacity.warm_server(url, tok, server)
        for i, (name, seed) in enumerate(schedule(a.runs, list(arms), a.first_seed)):
            own = saturation(url, tok, a, seed)
            r = one_run(url, tok, a, seed, arms[name], trees.get(name))
            flat_out = r["search_saturation_req_s"] or own
            r |= {"arm": name, "saturation_req_s": flat_out}
            r["share"] = r["value"] / flat_out if r["value"] and r["status"] == "pass" and flat_out else None
            runs.append(r)
            print(f"run {i + 1} (arm {name}, seed {seed}): {r['wall_s']:.0f} s, {r['status']}, "
                  f"{r['value'] if r['value'] is not None else '-'} req/s, {r.get('points', 0)} points, "
                  f"{r.get('completed', 0)} requests completed; flat out {flat_out or '-'} req/s, the answer "
                  f"{fmt(r['share'], '.3f')} of it; lowest point (offered, achieved, completed, "
                  f"ttft bounds): {r.get('lowest_point')}\n    {r['message']}", flush=True)
    spreads: dict[str, dict[str, float | None]] = {}
    for name, extra in arms.items():
        mine = [r for r in runs if r["arm"] == name]
        answers = [r["value"] for r in mine if r["status"] == "pass" and r["value"]]
        flat = [r["saturation_req_s"] for r in mine if r["saturation_req_s"]]
        shares = [r["share"] for r in mine if r["share"]]
        spreads[name] = {"answers": spread(answers), "flat_out": spread(flat), "shares": spread(shares)}
        label = f"arm {name} ({' '.join(extra) or 'as documented'}" + (
            f", day0 from {trees[name]})" if trees.get(name) else ")")
        shown = {k: fmt(v, ".3f") for k, v in spreads[name].items()}
        print(f"\n{label}: answers {answers}; spread (highest / lowest) {shown['answers']}\n"
              f"  flat out {flat} req/s, spread {shown['flat_out']} (the server's own drift)\n"
              f"  answer / flat out {[round(x, 3) for x in shares]}, spread {shown['shares']} "
              "(the search's, the drift taken out)")
    print(f"wall: {[r['wall_s'] for r in runs]} s")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "spread": spreads}, indent=1) + "\n")
    return 0


def spread(values: list[float]) -> float | None:
    return max(values) / min(values) if len(values) > 1 else None


def schedule(runs: int, arms: list[str], first_seed: int = 0) -> list[tuple[str, int]]:
    """(arm, seed) in run order, seeds from ``first_seed``: one arm, each run on its own seed; two
    arms in ABBA rounds, both arms on the same seeds (a paired comparison: the same prompts and
    arrival draws), so a drift of the box over the runs falls on both alike."""
    if len(arms) == 1:
        return [(arms[0], first_seed + i) for i in range(runs)]
    first, second = arms
    order = []
    for r in range((runs + 1) // 2):
        order += [(first, 2 * r), (second, 2 * r), (second, 2 * r + 1), (first, 2 * r + 1)]
    return [(arm, first_seed + i) for arm, i in order if i < runs]


if __name__ == "__main__":
    raise SystemExit(main())
