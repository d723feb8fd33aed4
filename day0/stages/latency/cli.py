"""Stage 3 outside pytest: ``day0 latency --url ...`` (and ``python -m day0.stages.latency``)
drives the load at a URL, prints the figures and the SLA checks; exit 1 when a check fails."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from day0.client.workload import Vocab, read_vocab
from day0.config.latency import LatencySection, SlaSection
from day0.core.record import Check
from day0.core.stats import percentile
from day0.stages.latency.metrics import METRIC_TITLES
from day0.stages.latency.run import LatencyRun, run_latency


def _length_arg(text: str) -> int | list[int]:
    if ":" in text:
        lo, hi = text.split(":", 1)
        return [int(lo), int(hi)]
    return int(text)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``latency`` on an argparse subparsers object; ``args.func(args)`` runs it."""
    p = subparsers.add_parser("latency", help="measure TTFT/TPOT/ITL/E2E against an OpenAI-compatible URL",
                              description="Stage 3 outside pytest: drive load at URL, print the figures and "
                                          "the SLA checks; exit 1 when a check fails.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="served model name (default: first of /v1/models)")
    p.add_argument("--vocab-size", type=int, help="tokenizer vocabulary size (token ids stay below it)")
    p.add_argument("--tokenizer", type=Path, help="model/tokenizer folder to read vocab size and special ids from")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="OpenAI API to stream from (default: completions)")
    p.add_argument("--concurrency", type=int, help="closed-loop workers (or in-flight cap with --rate)")
    p.add_argument("--rate", type=float, help="open-loop request rate (req/s); switches to load=rate")
    p.add_argument("--burstiness", type=float, help="gamma shape of arrivals (1 = Poisson)")
    p.add_argument("--num-requests", type=int, help="measured requests")
    p.add_argument("--duration", type=float, help="stop scheduling after this many seconds")
    p.add_argument("--warmup", type=int, help="warm-up requests (excluded)")
    p.add_argument("--input-len", type=_length_arg, help="N or LO:HI tokens")
    p.add_argument("--output-len", type=_length_arg, help="N or LO:HI tokens")
    p.add_argument("--prefix-len", type=int, help="shared-prefix tokens")
    p.add_argument("--num-prefixes", type=int, help="distinct shared prefixes (round robin)")
    p.add_argument("--seed", type=int, help="seed of prompts and arrival times")
    p.add_argument("--no-continuous-usage", action="store_true", help="for servers that reject continuous_usage_stats")
    p.add_argument("--no-server-metrics", action="store_true", help="do not scrape /metrics")
    p.add_argument("--sweep-rates", help="comma-separated ascending rates for the SLA sweep")
    p.add_argument("--ttft-p99-ms", type=float, help="SLA: TTFT p99 limit (ms)")
    p.add_argument("--tpot-p99-ms", type=float, help="SLA: TPOT p99 limit (ms)")
    p.add_argument("--itl-p99-ms", type=float, help="SLA: ITL p99 limit (ms)")
    p.add_argument("--e2e-p99-ms", type=float, help="SLA: end-to-end p99 limit (ms)")
    p.add_argument("--min-output-throughput", type=float, help="tok/s")
    p.add_argument("--max-error-rate", type=float, help="SLA: failed fraction allowed (default 0)")
    p.add_argument("--json", type=Path, help="write the checks (run-record form) to this file")
    p.set_defaults(func=cli_main)
    return p


def settings_from_args(args: argparse.Namespace) -> tuple[LatencySection, SlaSection]:
    """The flags as ``[latency]`` and ``[sla]`` tables, validated as a profile's (SettingsError on a bad one)."""
    lat: dict[str, Any] = {}
    for attr, key in [("concurrency", "concurrency"), ("burstiness", "burstiness"), ("num_requests", "num_requests"),
                      ("duration", "duration_s"), ("warmup", "warmup_requests"), ("input_len", "input_len"),
                      ("output_len", "output_len"), ("prefix_len", "prefix_len"), ("num_prefixes", "num_prefixes"),
                      ("seed", "seed")]:
        v = getattr(args, attr, None)
        if v is not None:
            lat[key] = v
    lat["endpoint"] = args.endpoint
    if args.rate is not None:
        lat["load"] = "rate"
        lat["request_rate"] = args.rate
        lat.setdefault("concurrency", 0)
    if args.no_continuous_usage:
        lat["continuous_usage"] = False
    if args.no_server_metrics:
        lat["server_metrics"] = False
    if args.sweep_rates:
        lat["sweep_rates"] = [float(x) for x in args.sweep_rates.split(",") if x.strip()]
    sla: dict[str, Any] = {}
    for attr in ("ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms"):
        if getattr(args, attr) is not None:
            sla[attr] = getattr(args, attr)
    if args.min_output_throughput is not None:
        sla["min_output_throughput_tok_s"] = args.min_output_throughput
    if args.max_error_rate is not None:
        sla["max_error_rate"] = args.max_error_rate
    return LatencySection.from_table(lat), SlaSection.from_table(sla)


def format_report(run: LatencyRun, checks: Sequence[Check]) -> str:
    m = run.metrics
    pn = [k for k in m.stats["ttft"].percentiles]
    head = f"{'metric (ms)':<34}{'n':>7}{'mean':>10}{'std':>10}" + "".join(f"{k:>10}" for k in pn)
    st = run.settings
    load = (f"{st.concurrency} concurrent" if st.load == "concurrency" else
            f"{st.request_rate:g} req/s, burstiness {st.burstiness:g}" + (f", cap {st.concurrency}" if st.concurrency else ""))
    lines = [f"latency against {run.base_url} model={run.model} load: {load}; duration {m.duration_s:.2f} s",
             head, "-" * len(head)]

    def f(x: float) -> str:
        return f"{x:>10.3f}" if not math.isnan(x) else f"{'-':>10}"

    for key in ("ttft", "tpot", "itl", "itl_token", "e2e", "send_lag"):
        st = m.stats[key]
        lines.append(f"{METRIC_TITLES[key]:<34}{st.count:>7}{f(st.mean)}{f(st.std)}" + "".join(f(st.percentiles[k]) for k in pn))
    lines.append("")
    lines.append(f"requests: sent {m.sent}, completed {m.completed}, failed {m.failed}"
                 + (f" ({', '.join(f'{k}={v}' for k, v in m.errors.items())})" if m.errors else "")
                 + (f", not sent (duration bound) {m.not_sent}" if m.not_sent else ""))
    lines.append(f"throughput: {m.request_throughput:.3f} req/s, {m.output_throughput:.2f} output tok/s, "
                 f"{m.total_token_throughput:.2f} total tok/s"
                 + (f", goodput {m.goodput:.3f} req/s" if m.goodput is not None else ""))
    for reason, count in sorted(m.reasons.items(), key=lambda kv: -kv[1])[:3]:
        lines.append(f"  {count} x {reason}")
    lines.append(f"token counts: per message from {m.token_source}, totals from {m.output_tokens_source}")
    if run.server:
        lines.append("engine /metrics over the run: " + "; ".join(
            f"{k} mean {v.mean_ms:.3f} ms (n={v.count:g})" for k, v in run.server.items()))
    elif run.server_error:
        lines.append(f"engine /metrics: {run.server_error}")
    for pt in run.sweep:
        lines.append(f"sweep {pt.rate:g} req/s: ttft p99 {percentile(pt.metrics.samples['ttft'], 99):.2f} ms, "
                     f"errors {pt.metrics.error_rate:.3f} -> {'meets' if pt.meets_sla else 'misses ' + ','.join(pt.failing)}")
    lines.append("")
    for c in checks:
        lines.append(f"{c.status.upper():<6} {c.id:<28} {c.message}")
    return "\n".join(lines)


def cli_main(args: argparse.Namespace) -> int:
    try:
        settings, sla = settings_from_args(args)
        if args.vocab_size is not None:
            vocab: Vocab | int = Vocab(args.vocab_size)
        elif args.tokenizer is not None:
            vocab = read_vocab(args.tokenizer)
        else:
            print("day0 latency: pass --vocab-size N or --tokenizer DIR (token ids must stay inside the vocabulary)",
                  file=sys.stderr)
            return 2
    except ValueError as exc:
        print(f"day0 latency: {exc}", file=sys.stderr)
        return 2
    try:
        run = run_latency(args.url, args.model, vocab, settings, sla,
                          progress=lambda msg: print(f"... {msg}", file=sys.stderr))
    except RuntimeError as exc:
        print(f"day0 latency: {exc}", file=sys.stderr)
        return 2
    checks = run.checks()
    print(format_report(run, checks))
    if args.json:
        args.json.write_text(json.dumps([c.to_dict() for c in checks], indent=2) + "\n", encoding="utf-8")
    return 1 if any(c.failed for c in checks) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m day0.stages.latency --url ...`` (same as ``day0 latency``)."""
    parser = argparse.ArgumentParser(prog="day0")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cli(sub)
    args = parser.parse_args(["latency", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)
