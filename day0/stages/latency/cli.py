"""Stage 3 outside pytest: ``day0 latency --url ...`` (and ``python -m day0.stages.latency``)
drives the load at a URL, prints the figures and the SLA checks; ``day0 latency import FILE``
judges a ``vllm bench serve`` or GuideLLM result by the same SLA. Exit 0 when every check passes,
1 when one fails (or could not measure), 2 on unusable input (one line naming it).

Every ``[latency]`` and ``[sla]`` key a person tunes per run has a flag; ``--help`` gives each
with its unit. The flags become the same tables a profile holds and are validated by the same
models (``day0.config.latency``), so a bad value is the profile's one-line error.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Sequence

from day0.client.workers import AUTO_MESSAGES_PER_WORKER, usable_cores
from day0.client.workload import Vocab, read_vocab
from day0.config.errors import SettingsError
from day0.config.latency import GOODPUT_METRICS, LIMIT_FORM, SLA_PRESETS, LatencySection, SlaSection
from day0.config.profile import Profile, key_variable_problem, shown_variable
from day0.core.events import EVENTS_FILE, export_path
from day0.core.inputs import refusal, term_safe
from day0.core.numbers import whole_number
from day0.core.outputs import write_file
from day0.core.record import RUN_FILE, Check
from day0.core.redact import Redactor
from day0.core.stats import percentile
from day0.core.terminal import Terminal
from day0.engine import Endpoint, EngineError
from day0.stages.latency.capacity import CHECK_ID as CAPACITY
from day0.stages.latency.capacity import point_load, why_not_met
from day0.stages.latency.checks import latency_checks
from day0.stages.latency.importing import FORMATS, import_checks, read_result, write_run
from day0.stages.latency.judging import lag_text
from day0.stages.latency.measurement import CLIENT_LAGGED, LatencyRun
from day0.stages.latency.metrics import METRIC_TITLES, LatencyMetrics
from day0.stages.latency.run import report_percentiles, run_latency
from day0.stages.latency.settings import EngineContext


def _length_arg(text: str) -> int | list[int]:
    if ":" in text:
        lo, hi = text.split(":", 1)
        return [int(lo), int(hi)]
    return int(text)


def _floats(text: str) -> list[float]:
    """A flag's comma-separated numbers, as an argparse ``type``: argparse turns the
    ArgumentTypeError into its one usage line naming the flag (exit 2); called after parsing it
    would escape every handler as a traceback."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 50,99, got {text!r}") from None


def add_sla_flags(p: argparse.ArgumentParser) -> None:
    """The ``[sla]`` limits and the reported percentiles, shared by a live run and an import."""
    g = p.add_argument_group("SLA (a figure outside its limit fails the run; units in capitals)")
    for metric, what in (("ttft", "time to first token"), ("tpot", "time per output token"),
                         ("itl", "inter-token latency, per message"), ("e2e", "end-to-end latency")):
        g.add_argument(f"--{metric}-p99-ms", type=float, metavar="MS", help=f"{what}, p99 limit in ms")
    g.add_argument("--limit", action="append", metavar="KEY=MS",
                   help=f"a latency limit at any percentile, {LIMIT_FORM} (p99_9 = p99.9), in ms; repeatable, "
                        "e.g. --limit ttft_p90_ms=800 --limit tpot_p50_ms=40")
    g.add_argument("--min-output-throughput", type=float, metavar="TOK/S", help="output tokens per second, at least")
    g.add_argument("--min-request-throughput", type=float, metavar="REQ/S",
                   help="completed requests per second, at least")
    g.add_argument("--min-goodput", type=float, metavar="REQ/S",
                   help="requests meeting every per-request SLO, per second, at least")
    g.add_argument("--goodput", metavar="METRIC:MS,...",
                   help="the per-request SLO goodput judges, each metric at exactly this limit in ms, e.g. "
                        "ttft:500,tpot:50 (vLLM's --goodput; e2el = e2e); default: the loosest limit set per metric")
    g.add_argument("--sla-preset", choices=list(SLA_PRESETS), metavar="NAME",
                   help="MLPerf's p99 TTFT/TPOT limits for a benchmark model: " + ", ".join(SLA_PRESETS)
                        + " (--ttft-p99-ms and --tpot-p99-ms win)")
    g.add_argument("--max-error-rate", type=float, metavar="FRACTION", help="failed requests / sent allowed (default 0)")
    g.add_argument("--confidence", type=float, metavar="C",
                   help="of the order-statistic bounds each limited percentile is judged by (default 0.95): a limit "
                        "passes when the upper bound is within it, fails when the lower bound is past it")
    g.add_argument("--percentiles", type=_floats, metavar="P,P,...",
                   help="percentiles reported for every metric (default 50,90,95,99,99.9; limits add theirs)")


def add_schedule_flags(g: Any) -> None:
    """The open loop's arrival schedule (docs/metrics.md, "Arrivals")."""
    g.add_argument("--rate", type=float, metavar="REQ/S", help="open-loop request rate; switches to load=rate")
    g.add_argument("--burstiness", type=float, metavar="SHAPE", help="gamma shape of the gaps (1 = Poisson)")
    g.add_argument("--arrivals", choices=["immediate", "vllm"],
                   help="open loop's first arrival: immediate = at t=0, no rescale (default); vllm = after one "
                        "gap, rescaled so the last lands at n/rate, as vllm bench serve does")
    g.add_argument("--drawn-rates", action="store_const", const=False, dest="exact_rates",
                   help="sweep steps and search points as drawn, not rescaled to offer exactly their rate")


def add_search_flags(g: Any) -> None:
    """``[latency.search]`` on the command line: any of these turns the capacity search on."""
    g.add_argument("--search", action="store_true",
                   help="search the highest request rate meeting every SLA limit (bracketing, then bisection; "
                        "each point judged by --confidence bounds on the limited percentiles)")
    g.add_argument("--search-over", choices=["rate", "concurrency"],
                   help="what the search varies: open-loop request rate (default) or closed-loop concurrency")
    g.add_argument("--search-start-rate", type=float, metavar="REQ/S", help="the search's first rate (default 1)")
    g.add_argument("--search-start-concurrency", type=whole_number(1), metavar="N",
                   help="the first concurrency of a --search-over concurrency (default 1)")
    g.add_argument("--devices", type=whole_number(1), default=1, metavar="N",
                   help="devices serving --url (the capacity answer's output tok/s per device; default 1)")
    g.add_argument("--search-requests", type=whole_number(1), metavar="N",
                   help="requests a search point (default: the fewest that bound the limited percentile: 299 "
                        "for p99)")
    g.add_argument("--search-probe-requests", type=whole_number(0), metavar="N",
                   help="requests a point of the upward climb, which only has to not miss (default 32; 0 = every "
                        "point full-sized)")
    g.add_argument("--search-saturation-requests", type=whole_number(0), metavar="N",
                   help="a rate search first measures what the server completes flat out over N requests and "
                        "misses every rate at or past it (default 200; 0 = off: the climb from --search-start-rate)")
    g.add_argument("--search-saturation-concurrency", type=whole_number(0), metavar="N",
                   help="requests in flight while measuring saturation (default 0: all at once)")
    g.add_argument("--search-saturation-max-requests", type=whole_number(0), metavar="N",
                   help="while none of the flat-out run's requests wait (the server's batch holds them all), run "
                        "it again with twice as many, up to N (default 3200: vLLM's max_num_seqs is 1024 by "
                        "default on an H100)")
    g.add_argument("--search-confirm-requests", type=whole_number(0), metavar="N",
                   help="with the flat-out figure: before the search ends on a rate, its point goes on to N "
                        "requests in all, judged as one sample (default: 300 or twice --search-requests, whichever "
                        "is more; 0 = off)")
    g.add_argument("--search-confirm-s", type=float, metavar="S",
                   help="with the flat-out figure: the answer is judged over at least S seconds of load at its "
                        "rate, its point's own included, as one sample (default 30; 0 = by "
                        "--search-confirm-requests alone; MLPerf's server runs last 600)")
    g.add_argument("--target-rate", type=float, metavar="REQ/S",
                   help="the load the launch must serve: the search reports the replicas it needs")


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``latency`` (and ``latency import``) on an argparse subparsers object."""
    p = subparsers.add_parser("latency", help="measure TTFT/TPOT/ITL/E2E against an OpenAI-compatible URL, or "
                                              "import a vllm bench serve / GuideLLM result",
                              description="Stage 3 outside pytest: drive load at --url, print the figures and the "
                                          "SLA checks; exit 1 when a check fails, 2 on unusable input. "
                                          "'day0 latency import FILE' judges another tool's result instead.")
    p.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000 (required to measure)")
    p.add_argument("--model", help="served model name (default: first of /v1/models)")
    p.add_argument("--vocab-size", type=whole_number(2), metavar="N", help="tokenizer vocabulary size (token ids stay below it)")
    p.add_argument("--tokenizer", type=Path, metavar="DIR", help="model folder to read vocab size and special ids from")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="OpenAI API to stream from (default: completions)")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", type=whole_number(0), metavar="N", help="closed-loop requests in flight (or the "
                                                                   "in-flight cap with --rate; 0 = none)")
    add_schedule_flags(load)
    load.add_argument("--num-requests", type=whole_number(1), metavar="N",
                      help="measured requests (default: the fewest that bound every limited percentile, at least "
                           "32: 299 for a p99 limit at 95%%)")
    load.add_argument("--duration", type=float, metavar="S", help="stop scheduling after this many seconds")
    load.add_argument("--warmup", type=whole_number(0), metavar="N", help="warm-up requests (run first, excluded)")
    load.add_argument("--input-len", type=_length_arg, metavar="N|LO:HI", help="prompt tokens")
    load.add_argument("--output-len", type=_length_arg, metavar="N|LO:HI", help="generated tokens")
    load.add_argument("--prefix-len", type=whole_number(0), metavar="TOKENS", help="shared-prefix tokens")
    load.add_argument("--num-prefixes", type=whole_number(1), metavar="N", help="distinct shared prefixes (round robin)")
    load.add_argument("--seed", type=whole_number(0), help="seed of prompts and arrival times")
    load.add_argument("--sweep-rates", type=_floats, metavar="REQ/S,...", help="comma-separated ascending rates for the SLA sweep")
    add_search_flags(load)
    load.add_argument("--no-fresh-prompts", action="store_true",
                      help="the seed's prompts exactly, run after run (default: a per-run nonce at the front of "
                           "every prompt, so a repeated run is not served from the prefix cache)")
    load.add_argument("--dataset", metavar="sharegpt:PATH",
                      help="prompt and output lengths (tokens) from a local ShareGPT JSON file")
    load.add_argument("--length-mix", choices=["long_context"],
                      help="prompt lengths log-uniform from 4096 tokens to --max-model-len minus the output")
    load.add_argument("--max-model-len", type=whole_number(1), metavar="TOKENS",
                      help="the engine's context length (long-context mix, dataset filter)")
    load.add_argument("--block-size", type=whole_number(1), metavar="TOKENS",
                      help="the engine's KV block: the prefix-cache share's allowance per request (default 16)")
    client = p.add_argument_group("client")
    client.add_argument("--workers", type=whole_number(0), metavar="N",
                        help="load-generator processes, each with its own event loop, splitting one schedule "
                             f"(default 0 = one per {AUTO_MESSAGES_PER_WORKER:g} offered streamed messages/s, at "
                             f"most the usable cores, {usable_cores()} here, less one when the server runs on "
                             "this host too)")
    client.add_argument("--request-timeout", type=float, metavar="S",
                        help="seconds a request may take in all before it counts as failed (default 300)")
    client.add_argument("--stall-timeout", type=float, metavar="S",
                        help="seconds without a byte mid-stream before the request counts as stalled (default 60)")
    client.add_argument("--api-key-env", dest="key_variable", metavar="NAME",
                        help="environment variable holding the server's API key, as a profile's "
                             "engine.api_key_env (sent as a bearer token; the key itself never goes on a "
                             "command line)")
    client.add_argument("--no-continuous-usage", action="store_true",
                        help="for servers that reject continuous_usage_stats")
    client.add_argument("--no-server-metrics", action="store_true", help="do not scrape /metrics")
    add_sla_flags(p)
    p.add_argument("--json", type=Path, metavar="FILE", help="write the checks (run-record form) to this file")
    p.set_defaults(func=cli_main)
    sub = p.add_subparsers(dest="latency_command", title="subcommand", metavar="import")
    imp = sub.add_parser("import", help="judge a vllm bench serve (--save-result --save-detailed) or GuideLLM "
                                        "JSON result by the same SLA",
                         description="Read another tool's result and run the latency checks on it with the same "
                                     "definitions and SLA as a live run; exit 1 when a check fails, 2 when the file "
                                     "cannot be used.")
    imp.add_argument("file", type=Path, help="vllm bench serve result JSON, or GuideLLM's benchmarks JSON")
    imp.add_argument("--format", choices=FORMATS, default="auto", help="what wrote the file (default: detected)")
    imp.add_argument("--benchmark", type=whole_number(0), metavar="N",
                     help="which run, when the file holds several (GuideLLM's benchmarks, appended vLLM results)")
    add_sla_flags(imp)
    imp.add_argument("--json", type=Path, metavar="FILE", help="write the checks (run-record form) to this file")
    imp.add_argument("--out", type=Path, metavar="DIR",
                     help="write a run folder (events.jsonl, run.json) that 'day0 report DIR' renders")
    imp.set_defaults(func=import_main)
    return p


_LATENCY_FLAGS = [("concurrency", "concurrency"), ("burstiness", "burstiness"), ("num_requests", "num_requests"),
                  ("duration", "duration_s"), ("warmup", "warmup_requests"), ("input_len", "input_len"),
                  ("output_len", "output_len"), ("prefix_len", "prefix_len"), ("num_prefixes", "num_prefixes"),
                  ("seed", "seed"), ("request_timeout", "request_timeout_s"), ("stall_timeout", "stall_timeout_s"),
                  ("workers", "workers"), ("arrivals", "arrivals"), ("exact_rates", "exact_rates"),
                  ("percentiles", "percentiles"),
                  ("dataset", "dataset"), ("length_mix", "length_mix")]


_SEARCH_FLAGS = [("search_start_rate", "start_rate"), ("search_over", "over"),
                 ("search_start_concurrency", "start_concurrency"), ("search_requests", "requests"),
                 ("target_rate", "target_rate"), ("search_probe_requests", "probe_requests"),
                 ("search_saturation_requests", "saturation_requests"),
                 ("search_saturation_concurrency", "saturation_concurrency"),
                 ("search_saturation_max_requests", "saturation_max_requests"),
                 ("search_confirm_requests", "confirm_requests"), ("search_confirm_s", "confirm_s")]
_SLA_FLAGS = [(a, a) for a in ("ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms", "max_error_rate", "confidence")]
_SLA_RENAMED = [("min_output_throughput", "min_output_throughput_tok_s"),
                ("min_request_throughput", "min_request_throughput_req_s"), ("min_goodput", "min_goodput_req_s")]


def key_flags() -> dict[str, str]:
    """Settings key path -> the flag that sets it: a refusal on the command line names what was typed."""
    dests = {f"latency.{key}": attr for attr, key in _LATENCY_FLAGS}
    dests |= {f"latency.search.{key}": attr for attr, key in _SEARCH_FLAGS}
    dests |= {f"sla.{key}": attr for attr, key in _SLA_FLAGS + _SLA_RENAMED}
    dests |= {"latency.request_rate": "rate", "latency.sweep_rates": "sweep_rates", "latency.search": "search",
              "latency.exact_rates": "drawn_rates",
              "sla.preset": "sla_preset", "sla.limits": "limit", "sla.goodput_slo_ms": "goodput"}
    return {key: "--" + dest.replace("_", "-") for key, dest in dests.items()}


def as_flag(exc: SettingsError) -> SettingsError:
    """``latency.percentiles.0: why`` -> ``--percentiles (item 1): why``; a key no flag sets as it was.
    Only the settings key is split off: what follows it is the user's own text, kept verbatim (a
    limit's key ``ttft_p99.9_ms`` came out as ``ttft_p99 9_ms`` when the whole path was split on dots)."""
    key, sep, why = str(exc).partition(": ")
    flags = key_flags()
    known = [k for k in flags if key == k or key.startswith(k + ".")]
    if not known or not sep:
        return exc
    prefix = max(known, key=len)
    rest = key[len(prefix) + 1:]
    where = f" (item {int(rest) + 1})" if rest.isdigit() else f" {rest}" if rest else ""
    return SettingsError(f"{flags[prefix]}{where}: {why}")


def settings_from_args(args: argparse.Namespace) -> tuple[LatencySection, SlaSection]:
    """The flags as ``[latency]`` and ``[sla]`` tables, validated as a profile's (SettingsError naming the flag)."""
    try:
        latency = _latency_table(args)
    except SettingsError as exc:
        raise as_flag(exc) from None
    return latency, sla_from_args(args)  # which names its own flags


def _latency_table(args: argparse.Namespace) -> LatencySection:
    lat: dict[str, Any] = {key: getattr(args, attr) for attr, key in _LATENCY_FLAGS
                           if getattr(args, attr, None) is not None}
    lat["endpoint"] = args.endpoint
    if args.rate is not None:
        lat["load"] = "rate"
        lat["request_rate"] = args.rate
        lat.setdefault("concurrency", 0)
    if args.no_continuous_usage:
        lat["continuous_usage"] = False
    if args.no_server_metrics:
        lat["server_metrics"] = False
    if args.no_fresh_prompts:
        lat["fresh_prompts"] = False
    if args.sweep_rates:
        lat["sweep_rates"] = args.sweep_rates
    search = {key: getattr(args, attr) for attr, key in _SEARCH_FLAGS if getattr(args, attr, None) is not None}
    if args.search or search:
        lat["search"] = search
    return LatencySection.from_table(lat)


def endpoint_from_args(args: argparse.Namespace) -> Endpoint:
    """The deployment at ``--url`` as an ``[engine]`` table (``mode = "external"``) with
    ``engine.api_key_env`` from ``--api-key-env``: the one key setting, read where a profile's is
    (:class:`day0.engine.Endpoint`). SettingsError naming the flag when that variable is not set."""
    engine: dict[str, Any] = {"mode": "external", "url": args.url}
    if problem := key_variable_problem(args.key_variable):  # said before the profile repeats the value
        raise SettingsError(f"--api-key-env: {problem}")
    if args.key_variable:
        engine["api_key_env"] = args.key_variable
    profile = Profile.model_validate({"name": "day0-latency", "engine": engine})
    try:
        return Endpoint.for_profile(profile, args.url, args.model or "")
    except EngineError:
        raise SettingsError(f"--api-key-env: environment variable {shown_variable(args.key_variable)} is not set (export it, "
                            "or leave the flag out for an open deployment)") from None


def sla_from_args(args: argparse.Namespace) -> SlaSection:
    """The SLA flags as an ``[sla]`` table (SettingsError naming the flag)."""
    sla: dict[str, Any] = {"preset": args.sla_preset} if args.sla_preset else {}
    for attr, key in _SLA_FLAGS + _SLA_RENAMED:
        if getattr(args, attr) is not None:
            sla[key] = getattr(args, attr)
    for item in args.limit or []:
        key, sep, value = item.partition("=")
        try:
            sla.setdefault("limits", {})[key.strip()] = float(value)
        except ValueError:
            raise SettingsError(f"--limit {item!r}: expected KEY=MS, e.g. ttft_p90_ms=800") from None
        if not sep:
            raise SettingsError(f"--limit {item!r}: expected KEY=MS, e.g. ttft_p90_ms=800")
    if args.goodput:
        sla["goodput_slo_ms"] = _goodput_arg(args.goodput)
    try:
        return SlaSection.from_table(sla)
    except SettingsError as exc:
        raise as_flag(exc) from None


def _goodput_arg(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        metric, sep, value = item.partition(":")
        metric = "e2e" if metric == "e2el" else metric
        try:
            out[metric] = float(value) if sep else math.nan
        except ValueError:
            out[metric] = math.nan
        if metric not in GOODPUT_METRICS or not out[metric] > 0:
            raise SettingsError(f"--goodput {item!r}: expected METRIC:MS with METRIC one of "
                                f"{', '.join(GOODPUT_METRICS)} and MS > 0, e.g. ttft:500,tpot:50")
    return out


def format_figures(m: LatencyMetrics, head: str) -> list[str]:
    """The statistics table and the request counts of one phase, for a terminal."""
    pn = list(m.stats["ttft"].percentiles)
    cols = f"{'metric (ms)':<34}{'n':>7}{'mean':>10}{'std':>10}" + "".join(f"{k:>10}" for k in pn)
    lines = [head, cols, "-" * len(cols)]

    def f(x: float) -> str:
        return f"{x:>10.3f}" if not math.isnan(x) else f"{'-':>10}"

    for key in ("ttft", "tpot", "itl", "itl_token", "e2e", "send_lag"):
        st = m.stats[key]
        lines.append(f"{METRIC_TITLES[key]:<34}{st.count:>7}{f(st.mean)}{f(st.std)}" + "".join(f(st.percentiles[k]) for k in pn))
    lines.append("")
    lines.append(f"requests: sent {m.sent}, completed {m.completed}, failed {m.failed}"
                 + (f" ({', '.join(f'{k}={v}' for k, v in m.errors.items())})" if m.errors else "")
                 + (f", not sent {m.not_sent}" if m.not_sent else ""))
    lines.append(f"throughput: {m.request_throughput:.3f} req/s, {m.output_throughput:.2f} output tok/s, "
                 f"{m.total_token_throughput:.2f} total tok/s over {m.duration_s:.3f} s"
                 + (f", goodput {m.goodput:.3f} req/s" if m.goodput is not None else ""))
    for reason, count in sorted(m.reasons.items(), key=lambda kv: -kv[1])[:3]:
        lines.append(f"  {count} x {reason}")
    return lines


def load_text(st: LatencySection) -> str:
    """The offered load in words: closed loop, or rate, burstiness, first arrival and cap."""
    return (f"{st.concurrency} concurrent" if st.load == "concurrency" else
            f"{st.request_rate:g} req/s, burstiness {st.burstiness:g}, arrivals {st.arrivals}"
            + (f", cap {st.concurrency}" if st.concurrency else ""))


def format_report(run: LatencyRun, checks: Sequence[Check], show: Callable[[str], str] = term_safe) -> str:
    """The run for a terminal, each line through ``show`` before the lines are joined: the URL, the
    model id, error bodies and reasons are the server's text, and one of them holding a newline
    must not become a line of its own (``show``: :meth:`day0.core.terminal.Terminal.line`, which
    also redacts)."""
    m = run.metrics
    lines = format_figures(m, f"latency against {run.base_url} model={run.model} load: {load_text(run.settings)}; "
                              f"{m.workers} load worker{'s' if m.workers > 1 else ''}; duration {m.duration_s:.2f} s")
    lines.append(f"token counts: per message from {m.token_source}, totals from {m.output_tokens_source}")
    if run.server:
        lines.append("engine /metrics over the run: " + "; ".join(
            f"{k} mean {v.mean_ms:.3f} ms (n={v.count:g})" for k, v in run.server.items()))
    elif run.server_error:
        lines.append(f"engine /metrics: {run.server_error}")
    if run.cache is not None and run.cache.window is not None and run.cache.window.queries > 0:
        w = run.cache.window
        lines.append(f"prefix cache over the run: {w.hits:g} of {w.queries:g} prompt tokens hit ({w.share:.1%}; "
                     f"limit {run.cache.limit:.1%}{'' if run.cache.fresh else ', fresh prompts off'})")
    for pt in run.sweep:
        lines.append(f"sweep {pt.rate:g} req/s: ttft p99 {percentile(pt.metrics.samples['ttft'], 99):.2f} ms, "
                     f"errors {pt.metrics.error_rate:.3f} -> {'meets' if pt.meets_sla else 'misses ' + ','.join(pt.failing)}")
    for sp in sorted(run.search.points if run.search else [], key=lambda x: x.load):
        bounds = ", ".join(f"{k} {'?' if lo is None else f'{lo:.1f}'}..{'?' if hi is None else f'{hi:.1f}'} ms"
                           for k, (lo, hi) in sp.bounds.items())
        sent = f"{sp.metrics.sent} requests" + (f": {sp.extends} + {sp.metrics.sent - sp.extends}" if sp.extends
                                                else ", held from its start" if sp.held else "")
        lines.append(f"search {point_load(run.search, sp.load)} ({sent}): {bounds} -> {sp.verdict}"
                     + (f" ({why_not_met(sp)})" if sp.misses else f" ({lag_text(sp)})" if sp.verdict == CLIENT_LAGGED
                        else ""))
    told = next((c.evidence.get("answer") for c in checks if c.id == CAPACITY and c.status == "pass"), "")
    if told:
        lines.append(f"capacity: {told}")
    lines.append("")
    lines += [f"{c.status.upper():<6} {c.id:<28} {c.message}" for c in checks]
    return "\n".join(map(show, lines))


def cli_main(args: argparse.Namespace) -> int:
    # what the server says (a 401 body quoting the Bearer token, its model id) is printed and
    # exported through the key's redactor: the key by value, every other secret by shape
    term = Terminal(Redactor.from_sources(env_names=[args.key_variable or ""]))
    try:
        if not args.url:
            raise ValueError("--url: required to measure (or 'day0 latency import FILE' to judge a result)")
        if args.json:
            export_path(args.json, "--json")  # before the load, which a refusal after it would lose
        settings, sla = settings_from_args(args)
        endpoint = endpoint_from_args(args)
        if args.vocab_size is not None:
            if args.vocab_size < 2:
                raise ValueError(f"--vocab-size {args.vocab_size}: must be at least 2 (token ids are drawn below it)")
            vocab: Vocab | int = Vocab(args.vocab_size)
        elif args.tokenizer is not None:
            vocab = read_vocab(args.tokenizer)
        else:
            term.print("day0 latency: pass --vocab-size N or --tokenizer DIR (token ids must stay inside the "
                       "vocabulary)", err=True)
            return 2
        reachable(args.url)
    except ValueError as exc:
        term.print(f"day0 latency: {exc}", err=True)
        return 2
    for flag, value in (("--max-model-len", args.max_model_len), ("--block-size", args.block_size),
                        ("--devices", args.devices)):
        if value is not None and value < 1:
            term.print(f"day0 latency: {flag} {value}: must be at least 1", err=True)
            return 2
    ctx = EngineContext(args.tokenizer, args.max_model_len, args.block_size)
    try:
        run = run_latency(endpoint.base_url, args.model, vocab, settings, sla, headers=endpoint.headers,
                          progress=lambda msg: term.print(f"... {msg}", err=True), ctx=ctx)
    except (RuntimeError, ValueError) as exc:  # InputError (an unusable dataset), SettingsError
        term.print(f"day0 latency: {exc}", err=True)
        return 2
    run.devices = args.devices
    checks = latency_checks(run)
    term.block(format_report(run, checks, show=term.line))
    if args.json:
        write_file(args.json, term.json([c.to_dict() for c in checks]) + "\n")
    return 1 if any(c.failed for c in checks) else 0


def import_main(args: argparse.Namespace) -> int:
    """``day0 latency import FILE``: the file's run through the stage's checks; --json, --out as asked."""
    term = Terminal()  # the file is another tool's: its labels, paths and notes are printed redacted, escaped
    try:
        outs = [("--json", args.json)] + [("--out", Path(args.out) / name) for name in (RUN_FILE, EVENTS_FILE) if args.out]
        for flag, path in outs:
            if path:
                export_path(path, flag)
        sla = sla_from_args(args)
        try:
            pcts = report_percentiles(LatencySection.from_table(
                {"percentiles": args.percentiles} if args.percentiles is not None else {}), sla)
        except SettingsError as exc:
            raise as_flag(exc) from None
        run = read_result(args.file, args.format, args.benchmark)
        metrics, checks = import_checks(run, sla, pcts)
        term.print(f"{run.tool} {run.label}: {run.path}",
                   *format_figures(metrics, f"imported {run.tool} run, load: {load_text(run.settings)}"),
                   *(f"note: {note}" for note in run.notes), "",
                   *(f"{c.status.upper():<6} {c.id:<28} {c.message}" for c in checks))
        if args.json:
            write_file(args.json, term.json([c.to_dict() for c in checks]) + "\n")
        if args.out:
            record = write_run(args.out, run, checks, sla)
            term.print(f"run folder: {args.out} (verdict {record.verdict}; render it with: day0 report {args.out})")
    except (ValueError, OSError) as exc:  # InputError and SettingsError are ValueErrors
        print(refusal(exc, term.redactor), file=sys.stderr)
        return 2
    return 1 if any(c.failed for c in checks) else 0


def reachable(url: str, timeout_s: float = 10.0) -> None:
    """Refuse (ValueError, one line naming the URL) a URL that is not http(s) or where nothing
    listens: an unreachable deployment is unusable input, not a measured failure of 100% errors."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r}: not an http(s) URL (e.g. http://127.0.0.1:8000)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"--url {url!r}: the port is not a number in 1-65535") from None
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(f"--url {url}: cannot connect to {parts.hostname}:{port} "
                         f"({exc.strerror or type(exc).__name__})") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m day0.stages.latency --url ...`` (same as ``day0 latency``)."""
    parser = argparse.ArgumentParser(prog="day0")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cli(sub)
    args = parser.parse_args(["latency", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)
