"""The side by side's table: each tool's answer over its rounds, and day0's ratios to the others.

Pure functions over the result dicts ``bench_capacity.py`` builds (a tool's ``summary``: its
points, sustained and first missed rate, requests, wall time), so the figures the closing ratios
rest on are read here and tested without a server (tests/harness/test_bench_capacity_script.py);
``bench_edge.py`` and ``bench_search_repeat.py`` format with the same ``fmt``.
"""

from __future__ import annotations

import statistics
from typing import Any


def fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def limit_figures(check: dict[str, Any]) -> dict[str, Any]:
    """A limited percentile's check from day0's ``--json``: its status, estimate (ms) and 95% bounds.
    An undecided check (``error``) has no value; it keeps its estimate in the evidence."""
    ev = check.get("evidence", {})
    bounds, told = ev.get("bounds", {}), check.get("value")
    return {"status": check["status"], "ms": ev.get("point_estimate") if told is None else told,
            "lower": bounds.get("lower"), "upper": bounds.get("upper")}


def combined(tool: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool's answer over its rounds: the median sustained rate of the rounds that had one (a
    round without is shown as "-" among the rounds), the median requests and wall time of one
    answer, and its drift."""
    rates = [r["sustained"] for r in rounds if r["sustained"]]
    misses = [r["first_miss"] for r in rounds if r["first_miss"]]
    return {"tool": tool, "sustained": statistics.median(rates) if rates else None,
            "first_miss": statistics.median(misses) if misses else None,
            "requests": round(statistics.median(r["requests"] for r in rounds)),
            "wall_s": round(statistics.median(r["wall_s"] for r in rounds), 1),
            "rounds_sustained": [r["sustained"] for r in rounds],
            "drift": max(rates) / min(rates) if len(rates) > 1 else None,
            "check": next((r["check"] for r in rounds if r.get("check", "pass") != "pass"), "pass"),
            "cache": max((r["cache"] for r in rounds if r.get("cache") is not None), default=None),
            **_by_bounds(rounds),
            "points": [p for r in rounds for p in r["points"]]}


def _by_bounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A dense list's answer under day0's rule over its rounds (median, and each round's); nothing
    for a tool whose points were not judged so."""
    if not any("sustained_by_bounds" in r for r in rounds):
        return {}
    each = [r.get("sustained_by_bounds") for r in rounds]
    rates = [x for x in each if x]
    return {"sustained_by_bounds": statistics.median(rates) if rates else None, "rounds_by_bounds": each}


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """day0 / each other tool, of the sustained rate and of the requests spent."""
    d0 = results.get("day0")
    out: dict[str, dict[str, float | None]] = {}
    for tool, r in results.items():
        if tool == "day0" or d0 is None or not r["points"]:
            continue
        out[tool] = {"sustained": _ratio(d0["sustained"], r["sustained"]),
                     "requests": _ratio(d0["requests"], r["requests"])}
        if "sustained_by_bounds" in r:
            out[tool]["sustained_by_bounds"] = _ratio(d0["sustained"], r["sustained_by_bounds"])
    return out


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


PARTS = {"held_met": "the hold that met", "held_not_met": "held misses", "short": "short points",
         "flat_out": "flat out"}


def spend_shares(day0: dict[str, Any], other: dict[str, Any]) -> dict[str, float] | None:
    """day0's requests in one round by what they served (its ``requests_by_part``, the rest being its
    warm-up and measured phase) as shares of another tool's requests in the same round: where "half
    the dense list's requests" is won or lost (docs/stages/capacity-evidence.md, "What a search
    spends"). None where day0 did not say or the other tool spent nothing."""
    parts = day0.get("by_part")
    if not parts or not other.get("requests"):
        return None
    shares = {k: parts.get(k, 0) / other["requests"] for k in PARTS}
    return {**shares, "rest": (day0["requests"] - sum(parts.values())) / other["requests"]}


def point_line(p: dict[str, Any]) -> str:
    if "bounds_ms" in p:
        figures = ", ".join(f"{k} {v} ms" for k, v in p["bounds_ms"].items())
        return f"    {p['rate']:>8.4g} req/s  {p['n']:>4} req  {figures}  -> {p['why']}"
    label = f" {p['strategy']}" if p.get("strategy") not in (None, "poisson") else ""
    line = (f"    {p['rate']:>8.4g} req/s{label}  {p['n']:>4} req  ttft {fmt(p['ttft_ms'], '.1f')} ms, "
            f"tpot {fmt(p['tpot_ms'], '.1f')} ms  -> {p['verdict']}")
    if "by_bounds" in p:
        figures = ", ".join(f"{k} {fmt(lo, '.1f')}-{fmt(hi, '.1f')}" for k, (lo, hi) in p["bounds_ms_95"].items())
        line += f"; by day0's rule {figures} ms -> {p['by_bounds']}"
    if p.get("offered_calmer") is not None:
        line += f"; arrivals burstier than {1 - p['offered_calmer']:.0%} of Poisson draws"
    if p.get("first_tokens_past"):
        q = p["first_tokens_past"]
        line += (f"; first tokens past {q['bound_ms']:g} ms: server {q['server']} of {q['server_n']}, "
                 f"vLLM bench {q['client']}")
    return line


def show(r: dict[str, Any]) -> None:
    """One tool's points and answer, printed as soon as it has run."""
    print(f"{r['tool']}: {r['note']}")
    for p in sorted(r["points"], key=lambda p: p["rate"]):
        print(point_line(p))
    print(f"  -> sustained {fmt(r['sustained'])} req/s, first missed {fmt(r['first_miss'])} req/s, "
          f"{r['requests']} requests, {r['wall_s']:.1f} s; prefix-cache hits {fmt(r.get('cache'), '.1%')} of the "
          "prompt tokens it sent", flush=True)
    if "sustained_by_bounds" in r:
        print(f"  -> its own requests judged by day0's rule (95% bounds, undecided tops the bracket): sustained "
              f"{fmt(r['sustained_by_bounds'])} req/s", flush=True)


def report(rounds: list[dict[str, dict[str, Any]]], sla: dict[str, float], workload: dict[str, Any]) -> dict[str, Any]:
    """The table (each tool over its rounds, in the first round's order) and the ratios; returns them
    with the SLA (limit key -> ms), the workload and every round as one object."""
    results = {t: combined(t, [r[t] for r in rounds]) for t in rounds[0]}
    head = (f"{'tool':<10} {'sustained req/s (rounds)':>28} {'first missed':>13} {'requests':>9} {'wall s':>7} "
            f"{'drift':>6} {'cache':>6}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in results.values():
        own = f"  (from its points; latency.capacity: {r['check']})" if r["check"] != "pass" else ""
        each = "/".join(fmt(x) for x in r["rounds_sustained"])
        print(f"{r['tool']:<10} {fmt(r['sustained']) + ' (' + each + ')':>28} {fmt(r['first_miss']):>13} "
              f"{r['requests']:>9} {r['wall_s']:>7.1f} {fmt(r['drift'], '.3f'):>6} {fmt(r['cache'], '.1%'):>6}{own}")
    print("(medians over the rounds; requests and wall time of one answer; drift: the tool's own highest / lowest "
          "sustained rate over its rounds; cache: the most of a round's prompt tokens the prefix cache served, '-' where "
          "nothing was looked up: the cache off)")
    rat, by_round = ratios(results), [ratios(r) for r in rounds]
    for tool, q in rat.items():
        each = [r[tool] for r in by_round if tool in r]
        per_round = ", ".join(fmt(r["sustained"], ".3f") for r in each)
        print(f"day0 / {tool}: sustained {fmt(q['sustained'], '.3f')} (by round: {per_round}), requests spent "
              f"{fmt(q['requests'], '.3f')}")
        if "sustained_by_bounds" in q:
            per_round = ", ".join(fmt(r.get("sustained_by_bounds"), ".3f") for r in each)
            print(f"day0 / {tool} with {tool}'s own requests judged by day0's rule: sustained "
                  f"{fmt(q['sustained_by_bounds'], '.3f')} (by round: {per_round})")
    spend = {tool: [spend_shares(r["day0"], r[tool]) if "day0" in r else None for r in rounds]
             for tool in rat}
    for tool, shares in spend.items():
        for i, s in enumerate(shares, 1):
            if s is not None:
                print(f"day0's requests in round {i}, as shares of {tool}'s: "
                      + ", ".join(f"{label} {s[k]:.3f}" for k, label in PARTS.items()) + f", the rest {s['rest']:.3f}")
    return {"sla": sla, "workload": workload, "tools": results, "rounds": rounds, "ratios_day0_over": rat,
            "day0_spend_shares": spend}
