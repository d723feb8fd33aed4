"""Stage 3 (latency): metrics as vLLM's serving benchmark defines them, the SLA judge, the CLI.

Definitions (docs/metrics.md, ``## Latency``), per successful request, times from the
*scheduled* send time:

- TTFT: to the first streamed message that carries at least one generated token.
- E2E: to the last message that carries a generated token.
- TPOT: (E2E - TTFT) / (output_tokens - 1), output_tokens = the server's ``usage``; none when
  a request produced a single token.
- ITL (per message): gaps between consecutive token-carrying messages, pooled over requests.
- ITL (per token): a message carrying k tokens that arrived g after the previous one counts
  k gaps of g/k; the first message's extra tokens count as 0. Summed per request this is
  exactly E2E - TTFT over (tokens - 1), so its mean is the token-weighted TPOT.
- Throughput: measured requests (tokens) / phase duration (t=0 to the last stream's end).
- Goodput: successful requests that met every per-request SLO at once, per second.

Failed requests are counted by kind and reason and kept out of every latency statistic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from day0.client.loadgen import (
    ClientOptions,
    LoadShape,
    PhaseResult,
    RequestResult,
    fetch_models,
    make_session,
    run_phase,
    token_source,
)
from day0.client.prom import PromError, ServerFigure, pct_name, scrape, server_view
from day0.client.workload import Vocab, WorkloadSpec, as_text, build_requests, read_vocab
from day0.core.record import Check, measured
from day0.core.stats import percentile

SOURCE = "http"
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
METRIC_TITLES = {
    "ttft": "Time to first token",
    "tpot": "Time per output token",
    "itl": "Inter-token latency (per message)",
    "itl_token": "Inter-token latency (per token)",
    "e2e": "End-to-end request latency",
    "send_lag": "Client send lag (scheduled -> sent)",
}
MAX_POOLED_SAMPLES = 20_000  # pooled ITL samples kept in evidence (stride-downsampled beyond)


class SettingsError(ValueError):
    """A [latency] or [sla] value that cannot work; the message names the key."""


# --------------------------------------------------------------------------- settings


@dataclass
class LatencySettings:
    """The profile's ``[latency]`` table (field names are the TOML keys)."""

    endpoint: str = "completions"  # completions | chat
    load: str = "concurrency"  # concurrency (closed loop) | rate (open loop)
    concurrency: int = 4  # workers in concurrency mode; in-flight cap in rate mode (0 = none)
    request_rate: float = 1.0  # req/s in rate mode (inf = all at once)
    burstiness: float = 1.0  # gamma shape of inter-arrival gaps; 1 = Poisson
    num_requests: int = 32  # measured requests
    duration_s: float = 300.0  # stop scheduling new measured requests after this
    warmup_requests: int = 2  # run to completion first, excluded from every statistic
    input_len: int | list[int] = 128  # tokens; [lo, hi] = uniform
    output_len: int | list[int] = 32
    prefix_len: int = 0  # > 0: shared-prefix workload
    num_prefixes: int = 1
    seed: int = 0
    special_token_ids: list[int] = field(default_factory=list)
    request_timeout_s: float = 300.0
    stall_timeout_s: float = 60.0
    ignore_eos: bool = True
    continuous_usage: bool = True  # vLLM per-chunk usage; turn off for servers that reject it
    return_token_ids: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key_env: str = ""  # name of an environment variable holding a bearer token
    percentiles: list[float] = field(default_factory=lambda: [50.0, 90.0, 95.0, 99.0, 99.9])
    server_metrics: bool = True  # scrape /metrics before/after and compare
    agreement_rel: float = 0.25  # client vs engine means may differ by rel * client + 3 standard errors
    sweep_rates: list[float] = field(default_factory=list)  # SLA sweep: ascending req/s
    sweep_requests: int = 0  # requests per sweep step (0 = num_requests)

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> SettingsError:
            return SettingsError(f"latency.{key}: {why} (got {getattr(self, key)!r})")

        if self.endpoint not in ("completions", "chat"):
            raise bad("endpoint", "expected 'completions' or 'chat'")
        if self.load not in ("concurrency", "rate"):
            raise bad("load", "expected 'concurrency' or 'rate'")
        if self.load == "concurrency" and self.concurrency < 1:
            raise bad("concurrency", "must be >= 1 with load = 'concurrency'")
        if self.concurrency < 0:
            raise bad("concurrency", "must be >= 0")
        if not self.request_rate > 0:
            raise bad("request_rate", "must be > 0")
        if not self.burstiness > 0:
            raise bad("burstiness", "must be > 0")
        if self.num_requests < 1:
            raise bad("num_requests", "must be >= 1")
        if self.warmup_requests < 0:
            raise bad("warmup_requests", "must be >= 0")
        for key in ("duration_s", "request_timeout_s", "stall_timeout_s"):
            if not getattr(self, key) > 0:
                raise bad(key, "must be > 0")
        for p in self.percentiles:
            if not 0 <= p <= 100:
                raise bad("percentiles", "each must be within [0, 100]")
        if any(not r > 0 for r in self.sweep_rates) or list(self.sweep_rates) != sorted(self.sweep_rates):
            raise bad("sweep_rates", "must be positive and ascending")
        try:
            self.workload().validate()
        except ValueError as exc:
            raise SettingsError(f"latency.{exc}") from None

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> "LatencySettings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise SettingsError(f"latency.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        return cls(**table)

    def workload(self) -> WorkloadSpec:
        return WorkloadSpec(self.input_len, self.output_len, self.prefix_len, self.num_prefixes, self.seed)

    def shape(self, rate: float | None = None) -> LoadShape:
        """The measured load, or (``rate`` given) a sweep step: open loop, capped only when
        the profile's own load is open loop with a cap."""
        if rate is None:
            return LoadShape(mode=self.load, concurrency=self.concurrency,  # type: ignore[arg-type]
                             request_rate=self.request_rate, burstiness=self.burstiness, seed=self.seed,
                             duration_s=self.duration_s)
        cap = self.concurrency if self.load == "rate" else 0
        return LoadShape(mode="rate", concurrency=cap, request_rate=rate, burstiness=self.burstiness,
                         seed=self.seed, duration_s=self.duration_s)

    def client(self) -> ClientOptions:
        headers = {}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise SettingsError(f"latency.api_key_env: environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        return ClientOptions(endpoint=self.endpoint, ignore_eos=self.ignore_eos,  # type: ignore[arg-type]
                             continuous_usage=self.continuous_usage, return_token_ids=self.return_token_ids,
                             extra_body=dict(self.extra_body), headers=headers,
                             request_timeout_s=self.request_timeout_s, stall_timeout_s=self.stall_timeout_s)


_LIMIT_KEY = re.compile(r"^(ttft|tpot|itl|e2e)_p(\d+(?:[._]\d+)?)_ms$")


@dataclass
class SlaSettings:
    """The profile's ``[sla]`` table. Latency limits are ``<metric>_p<NN>_ms`` keys.

    The common ones are fields; any other percentile (``ttft_p90_ms``, ``tpot_p99_9_ms``) goes
    through :meth:`from_table` into ``limits``. For goodput a request is good when it meets the
    loosest limit set for each of TTFT, TPOT and E2E (DistServe's per-request SLO).
    """

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    min_output_throughput_tok_s: float | None = None
    min_request_throughput_req_s: float | None = None
    min_goodput_req_s: float | None = None
    max_error_rate: float = 0.0
    limits: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.limits:
            if not _LIMIT_KEY.match(key):
                raise SettingsError(f"sla.{key}: not a '<ttft|tpot|itl|e2e>_p<NN>_ms' limit")
        for f in fields(self):
            v = getattr(self, f.name)
            vals = v.items() if isinstance(v, dict) else [(f.name, v)]
            for k, x in vals:
                if x is not None and (not isinstance(x, (int, float)) or isinstance(x, bool) or x < 0):
                    raise SettingsError(f"sla.{k}: expected a non-negative number, got {x!r}")
        if not 0 <= self.max_error_rate <= 1:
            raise SettingsError(f"sla.max_error_rate: must be within [0, 1], got {self.max_error_rate}")

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> "SlaSettings":
        known = {f.name for f in fields(cls)} - {"limits"}
        direct = {k: v for k, v in table.items() if k in known}
        limits = dict(table.get("limits") or {})
        for k, v in table.items():
            if k in known or k == "limits":
                continue
            if not _LIMIT_KEY.match(k):
                raise SettingsError(f"sla.{k}: unknown key (use <ttft|tpot|itl|e2e>_p<NN>_ms or one of "
                                    f"{', '.join(sorted(known))})")
            limits[k] = v
        return cls(**direct, limits=limits)

    def latency_limits(self) -> list[tuple[str, float, float]]:
        """(metric, percentile, limit ms) for every latency limit set, in a stable order."""
        out: dict[tuple[str, float], float] = {}
        items = [(f"{m}_p99_ms", getattr(self, f"{m}_p99_ms")) for m in METRICS] + list(self.limits.items())
        for key, val in items:
            if val is None:
                continue
            m = _LIMIT_KEY.match(key)
            assert m is not None
            out[(m.group(1), float(m.group(2).replace("_", ".")))] = float(val)
        return [(m, p, v) for (m, p), v in sorted(out.items(), key=lambda kv: (METRICS.index(kv[0][0]), kv[0][1]))]

    def per_request_slo(self) -> dict[str, float]:
        """Loosest limit per metric (ms), used to call one request good or not."""
        slo: dict[str, float] = {}
        for metric, _, limit in self.latency_limits():
            if metric in ("ttft", "tpot", "e2e"):
                slo[metric] = max(slo.get(metric, 0.0), limit)
        return slo


# --------------------------------------------------------------------------- statistics


@dataclass
class Stats:
    """Summary of one latency distribution in ms (std is the population std, as numpy's)."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    percentiles: dict[str, float]

    def get(self, p: float) -> float:
        key = pct_name(p)
        if key in self.percentiles:
            return self.percentiles[key]
        raise KeyError(key)


def summarize(values: Sequence[float], percentiles: Iterable[float]) -> Stats:
    v = sorted(values)
    n = len(v)
    if n == 0:
        return Stats(0, math.nan, math.nan, math.nan, math.nan, {pct_name(p): math.nan for p in percentiles})
    mean = math.fsum(v) / n
    var = math.fsum((x - mean) ** 2 for x in v) / n
    return Stats(n, mean, math.sqrt(var), v[0], v[-1],
                 {pct_name(p): percentile(v, p, presorted=True) for p in percentiles})


def per_token_itl(msg_t: Sequence[float], msg_n: Sequence[int]) -> list[float]:
    """Per-token gaps: k tokens arriving g after the previous message count k times g/k."""
    out: list[float] = []
    if not msg_t:
        return out
    out.extend([0.0] * (msg_n[0] - 1))
    for i in range(1, len(msg_t)):
        g = (msg_t[i] - msg_t[i - 1]) / msg_n[i]
        out.extend([g] * msg_n[i])
    return out


def tpot_of(r: RequestResult) -> float | None:
    if not r.ok or r.output_tokens <= 1 or r.ttft is None or r.e2e is None:
        return None
    return (r.e2e - r.ttft) / (r.output_tokens - 1)


@dataclass
class LatencyMetrics:
    """Client-side figures of one measured phase (latencies in ms)."""

    sent: int
    completed: int
    failed: int
    not_sent: int
    errors: dict[str, int]  # kind -> count
    reasons: dict[str, int]  # specific reason -> count
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    good_requests: int | None
    goodput: float | None
    slo_ms: dict[str, float]
    stats: dict[str, Stats]  # ttft, tpot, itl, itl_token, e2e, send_lag, ttft_from_send
    samples: dict[str, list[float]]  # per-request ms: ttft, tpot, e2e, send_lag, ttft_from_send; pooled itl
    sample_offsets_s: list[float]  # scheduled time of each successful request since t=0
    token_source: str
    output_tokens_source: str
    count_mismatches: int
    offered_rate: float | None
    failures: list[dict[str, Any]]  # first few failed requests, for the record

    @property
    def error_rate(self) -> float:
        return self.failed / self.sent if self.sent else 0.0


def compute_metrics(phase: PhaseResult, percentiles: Iterable[float], slo_ms: dict[str, float] | None = None) -> LatencyMetrics:
    pcts = list(percentiles)
    ok = [r for r in phase.results if r.ok]
    bad = [r for r in phase.results if not r.ok]
    ms = 1000.0
    ttft = [r.ttft * ms for r in ok]  # type: ignore[operator]
    e2e = [r.e2e * ms for r in ok]  # type: ignore[operator]
    lag = [r.send_lag * ms for r in ok]
    ttft_send = [(r.ttft - r.send_lag) * ms for r in ok]  # type: ignore[operator]
    tpots = [tpot_of(r) for r in ok]
    tpot = [t * ms for t in tpots if t is not None]
    itl: list[float] = []
    itl_tok: list[float] = []
    for r in ok:
        itl.extend((b - a) * ms for a, b in zip(r.msg_t, r.msg_t[1:]))
        itl_tok.extend(g * ms for g in per_token_itl(r.msg_t, r.msg_n))
    errors: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in bad:
        errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
        key = r.reason or r.error or "unknown"
        reasons[key] = reasons.get(key, 0) + 1
    slo = dict(slo_ms or {})
    good: int | None = None
    if slo:
        good = 0
        for r, t in zip(ok, tpots):
            vals = {"ttft": r.ttft * ms, "tpot": (t or 0.0) * ms, "e2e": r.e2e * ms}  # type: ignore[operator]
            if all(vals[m] <= lim for m, lim in slo.items()):
                good += 1
    dur = phase.duration
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum((r.prompt_tokens if r.prompt_tokens is not None else r.input_len) for r in ok)
    out_src = "usage" if all(r.output_tokens_source == "usage" for r in ok) else "messages"
    stats = {
        "ttft": summarize(ttft, pcts),
        "tpot": summarize(tpot, pcts),
        "itl": summarize(itl, pcts),
        "itl_token": summarize(itl_tok, pcts),
        "e2e": summarize(e2e, pcts),
        "send_lag": summarize(lag, pcts),
        "ttft_from_send": summarize(ttft_send, pcts),
    }
    offered = None
    if phase.shape.mode == "rate" and phase.target_offsets:
        offered = phase.shape.request_rate
    return LatencyMetrics(
        sent=len(phase.results), completed=len(ok), failed=len(bad), not_sent=phase.not_sent,
        errors=errors, reasons=reasons, duration_s=dur, input_tokens=in_tokens, output_tokens=out_tokens,
        request_throughput=len(ok) / dur, output_throughput=out_tokens / dur,
        total_token_throughput=(in_tokens + out_tokens) / dur,
        good_requests=good, goodput=(good / dur) if good is not None else None, slo_ms=slo,
        stats=stats,
        samples={"ttft": ttft, "tpot": tpot, "e2e": e2e, "send_lag": lag, "ttft_from_send": ttft_send,
                 "itl": itl, "itl_token": itl_tok},
        sample_offsets_s=[r.scheduled - phase.started for r in ok],
        token_source=token_source(phase.results), output_tokens_source=out_src,
        count_mismatches=sum(1 for r in ok if r.count_mismatch), offered_rate=offered,
        failures=[{"index": r.index, "error": r.error, "reason": r.reason,
                   "after_ms": round((r.finished - r.scheduled) * ms, 3), "tokens_seen": sum(r.msg_n)}
                  for r in bad[:20]],
    )


# --------------------------------------------------------------------------- server agreement


AGREEMENT_SIGMAS = 3.0  # standard errors of the client mean added to the relative tolerance


def agreement_allowance(rel: float, mean_ms: float, std_ms: float, count: int) -> float:
    """How far two views of the same span may sit apart in this run: a relative part for what the
    views legitimately time differently, plus the run's own noise (3 standard errors of the mean),
    so a busy machine widens the allowance instead of failing the check. No fixed milliseconds."""
    se = std_ms / math.sqrt(count) if count > 0 and math.isfinite(std_ms) else 0.0
    return rel * abs(mean_ms) + AGREEMENT_SIGMAS * se


@dataclass
class Agreement:
    """One metric seen from both sides. ``one_sided``: only the engine reporting *more* than the
    client is a measurement error (the engine's TTFT span lies inside the client's)."""

    metric: str
    client_mean_ms: float
    server_mean_ms: float
    allowed_ms: float
    client_count: int
    server_count: float
    server_source: str
    one_sided: bool = False

    @property
    def diff_ms(self) -> float:
        """The disagreement that counts: engine above client (one-sided), else the absolute gap."""
        d = self.server_mean_ms - self.client_mean_ms
        return max(0.0, d) if self.one_sided else abs(d)

    @property
    def ok(self) -> bool:
        return self.diff_ms <= self.allowed_ms


# client figure each server histogram is compared with (TTFT from the actual send: the server
# cannot see time a request spent waiting in the client)
_AGREEMENT_PAIRS = {"ttft": "ttft_from_send", "itl": "itl", "tpot": "tpot"}


def agreements(metrics: LatencyMetrics, server: dict[str, ServerFigure], rel: float) -> list[Agreement]:
    """Client vs engine means. The TTFT gap is front-end overhead (HTTP, tokenization, the API
    server's event loop; :func:`frontend_overhead_check`), so TTFT disagrees only when the engine
    reports more than the client saw; ITL and TPOT time the same tokens and must match."""
    out = []
    for smetric, cmetric in _AGREEMENT_PAIRS.items():
        fig = server.get(smetric)
        st = metrics.stats[cmetric]
        if fig is None or fig.count <= 0 or st.count == 0:
            continue
        out.append(Agreement(smetric, st.mean, fig.mean_ms, agreement_allowance(rel, st.mean, st.std, st.count),
                             st.count, fig.count, fig.source, one_sided=smetric == "ttft"))
    return out


# --------------------------------------------------------------------------- the run


@dataclass
class SweepPoint:
    rate: float
    metrics: LatencyMetrics
    meets_sla: bool
    failing: list[str]


@dataclass
class LatencyRun:
    """Everything one latency stage measured; :meth:`checks` turns it into run-record checks."""

    base_url: str
    model: str
    settings: LatencySettings
    sla: SlaSettings
    metrics: LatencyMetrics
    warmup: LatencyMetrics | None
    server: dict[str, ServerFigure] | None
    server_error: str | None
    sweep: list[SweepPoint] = field(default_factory=list)

    def checks(self) -> list[Check]:
        return latency_checks(self)


def _latency_status_checks(metrics: LatencyMetrics, sla: SlaSettings) -> list[str]:
    """Ids of the SLA limits a phase misses (used by the sweep)."""
    failing = []
    for metric, p, limit in sla.latency_limits():
        st = metrics.stats[metric]
        v = st.get(p) if pct_name(p) in st.percentiles else percentile(metrics.samples[metric], p)
        if not (v <= limit):
            failing.append(f"{metric}_{pct_name(p)}")
    if metrics.error_rate > sla.max_error_rate:
        failing.append("error_rate")
    if metrics.completed == 0:
        failing.append("no_completed_requests")
    return failing


async def measure_latency(
    base_url: str,
    model: str | None,
    vocab: Vocab | int,
    settings: LatencySettings | None = None,
    sla: SlaSettings | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> LatencyRun:
    """Warm up, scrape /metrics, run the measured phase, scrape again, optionally sweep."""
    s = settings or LatencySettings()
    sla = sla or SlaSettings()
    say = progress or (lambda _msg: None)
    if isinstance(vocab, int):
        vocab = Vocab(vocab, frozenset(s.special_token_ids))
    elif s.special_token_ids:
        vocab = Vocab(vocab.size, vocab.special_ids | frozenset(s.special_token_ids))
    spec = s.workload()
    opts = s.client()
    pcts = sorted(set(s.percentiles) | {p for _, p, _ in sla.latency_limits()} | {50.0, 99.0})

    def requests(n: int, stream: str):
        reqs = build_requests(spec, vocab, n, stream=stream)
        return as_text(reqs, s.seed) if s.endpoint == "chat" else reqs

    # no connection cap in the HTTP client: the load shape bounds what is in flight, and a cap
    # here would queue requests invisibly (that wait would look like server latency)
    async with make_session(opts, limit=0) as session:
        if not model:
            names = await fetch_models(session, base_url)
            if not names:
                raise RuntimeError(f"{base_url}/v1/models lists no model; pass the served model name")
            model = names[0]
        warm = None
        if s.warmup_requests:
            say(f"warm-up: {s.warmup_requests} requests")
            wphase = await run_phase(session, base_url, model, requests(s.warmup_requests, "warmup"),
                                     s.shape(), opts, phase="warmup")
            warm = compute_metrics(wphase, pcts)
        before = after = None
        server_error = None
        if s.server_metrics:
            try:
                before = await scrape(session, base_url)
            except PromError as exc:
                server_error = str(exc)
        say(f"measure: {s.num_requests} requests, load={s.load}")
        phase = await run_phase(session, base_url, model, requests(s.num_requests, "main"), s.shape(), opts)
        metrics = compute_metrics(phase, pcts, sla.per_request_slo())
        server = None
        if s.server_metrics and server_error is None:
            try:
                after = await scrape(session, base_url)
                server = server_view(before, after, percentiles=pcts)  # type: ignore[arg-type]
                if not server:
                    server_error = "/metrics has no vllm:* latency histograms (not a vLLM server?)"
            except PromError as exc:
                server_error = str(exc)
        sweep: list[SweepPoint] = []
        for rate in s.sweep_rates:
            n = s.sweep_requests or s.num_requests
            say(f"sweep: {rate:g} req/s, {n} requests")
            sp = await run_phase(session, base_url, model, requests(n, f"sweep{rate:g}"), s.shape(rate), opts,
                                 phase="sweep")
            sm = compute_metrics(sp, pcts, sla.per_request_slo())
            failing = _latency_status_checks(sm, sla)
            sweep.append(SweepPoint(rate, sm, not failing, failing))
            if failing:
                break
    return LatencyRun(base_url, model, s, sla, metrics, warm, server, server_error, sweep)


def run_latency(base_url: str, model: str | None, vocab: Vocab | int, settings: LatencySettings | None = None,
                sla: SlaSettings | None = None, *, progress: Callable[[str], None] | None = None) -> LatencyRun:
    """Blocking entry point for the suite and the CLI (runs its own event loop)."""
    return asyncio.run(measure_latency(base_url, model, vocab, settings, sla, progress=progress))


# --------------------------------------------------------------------------- checks


def _stats_table(metrics: LatencyMetrics, keys: Sequence[str]) -> dict[str, Any]:
    any_stats = metrics.stats[keys[0]]
    pnames = list(any_stats.percentiles)
    rows = []
    for k in keys:
        st = metrics.stats[k]
        rows.append([METRIC_TITLES.get(k, k), st.count, _r(st.mean), _r(st.std)] + [_r(st.percentiles[p]) for p in pnames])
    return {"columns": ["metric (ms)", "n", "mean", "std"] + pnames, "rows": rows}


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


def _downsample(values: list[float], cap: int = MAX_POOLED_SAMPLES) -> list[float]:
    if len(values) <= cap:
        return values
    step = len(values) / cap
    return [values[int(i * step)] for i in range(cap)]


def _check_id(metric: str, p: float) -> str:
    return f"latency.{metric}_{pct_name(p).replace('.', '_')}"


def latency_checks(run: LatencyRun) -> list[Check]:
    """The stage's checks: one per latency limit (p99 of each metric always), errors,
    throughput, goodput, server agreement, token accounting and the optional sweep."""
    m, sla, s = run.metrics, run.sla, run.settings
    checks: list[Check] = []
    note = ""
    if m.token_source == "content":
        note = " (per-message token counts from non-empty text: the server gave no per-chunk usage)"
    limits = {(metric, p): lim for metric, p, lim in sla.latency_limits()}
    wanted = dict(limits)
    for metric in METRICS:
        wanted.setdefault((metric, 99.0), None)  # type: ignore[arg-type]
    for (metric, p), limit in sorted(wanted.items(), key=lambda kv: (METRICS.index(kv[0][0]), kv[0][1])):
        st = m.stats[metric]
        samples = m.samples[metric]
        value = percentile(samples, p) if samples else None
        evidence: dict[str, Any] = {
            "samples": [round(x, 4) for x in (_downsample(samples) if metric == "itl" else samples)],
            "table": _stats_table(m, [metric] + (["itl_token"] if metric == "itl" else [])
                                  + (["send_lag", "ttft_from_send"] if metric == "ttft" else [])),
            "stats": asdict(st),
            "definition": _DEFINITIONS[metric],
        }
        if metric == "itl" and len(samples) > MAX_POOLED_SAMPLES:
            evidence["samples_downsampled_from"] = len(samples)
        if metric in ("ttft", "e2e"):
            evidence["charts"] = [{
                "kind": "scatter", "title": f"{metric.upper()} per request over the run",
                "x_label": "scheduled send (s since start)", "y_label": f"{metric.upper()} (ms)", "x_log": False,
                "series": [{"name": metric, "x": [round(x, 4) for x in m.sample_offsets_s],
                            "y": [round(x, 4) for x in samples]}],
                "reference": [{"y": limit, "label": f"SLA {pct_name(p)}"}] if limit is not None else [],
            }]
        title = f"{METRIC_TITLES[metric]} {pct_name(p)}"
        cid = _check_id(metric, p)
        if value is None:
            why = "no successful request" if metric != "tpot" else "no successful request with more than one token"
            checks.append(Check(id=cid, title=title, status="error" if limit is not None else "skip",
                                limit=limit, unit="ms", direction="lower_is_better",
                                message=f"{why}; nothing to measure", evidence=evidence, source=SOURCE))
            continue
        msg = ""
        if limit is None:
            msg = f"measured {value:.4g} ms over {len(samples)} samples (no SLA limit set){note}"
        elif note:
            verb = "meets" if value <= limit else "misses"
            msg = f"{value:.4g} ms {verb} the limit (<= {limit:g} ms){note}"
        checks.append(measured(cid, title, _r(value), limit, unit="ms", direction="lower_is_better",
                               message=msg, evidence=evidence, source=SOURCE, performance=True))

    # errors
    err_rows = [[k, v] for k, v in sorted(m.reasons.items(), key=lambda kv: -kv[1])]
    err_msg = (f"{m.failed} of {m.sent} requests failed ({', '.join(f'{k}: {v}' for k, v in sorted(m.errors.items()))}); "
               f"limit {sla.max_error_rate:.4g}") if m.failed else f"0 of {m.sent} requests failed"
    checks.append(measured("latency.error_rate", "Failed request fraction", round(m.error_rate, 6), sla.max_error_rate,
                           unit="fraction", direction="lower_is_better",
                           message=err_msg,
                           evidence={"errors": m.errors, "table": {"columns": ["reason", "count"], "rows": err_rows},
                                     "failures": m.failures, "sent": m.sent, "not_sent_duration_bound": m.not_sent},
                           source=SOURCE))
    if m.sent == 0:
        checks[-1].status = "error"
        checks[-1].message = "no request was sent; check latency.duration_s and num_requests"

    load_table = {"columns": ["figure", "value"], "rows": [
        ["load", s.load], ["concurrency", s.concurrency],
        ["offered rate (req/s)", m.offered_rate], ["duration (s)", _r(m.duration_s)],
        ["completed", m.completed], ["input tokens", m.input_tokens], ["output tokens", m.output_tokens],
        ["output tokens from", m.output_tokens_source], ["per-message tokens from", m.token_source],
        ["send lag p50 (ms)", _r(m.stats["send_lag"].percentiles.get("p50"))],
        ["send lag p99 (ms)", _r(m.stats["send_lag"].percentiles.get("p99"))],
        ["total token throughput (tok/s)", _r(m.total_token_throughput)],
    ]}
    checks.append(measured("latency.output_throughput", "Output token throughput", _r(m.output_throughput),
                           sla.min_output_throughput_tok_s, unit="tok/s", direction="higher_is_better",
                           evidence={"table": load_table, "output_tokens": m.output_tokens,
                                     "duration_s": m.duration_s}, source=SOURCE, performance=True))
    checks.append(measured("latency.request_throughput", "Completed request throughput", _r(m.request_throughput),
                           sla.min_request_throughput_req_s, unit="req/s", direction="higher_is_better",
                           evidence={"table": load_table, "offered_rate": m.offered_rate}, source=SOURCE,
                           performance=True))
    if m.goodput is None:
        checks.append(Check(id="latency.goodput", title="Goodput (requests meeting every SLO per second)",
                            status="skip", unit="req/s", direction="higher_is_better",
                            message="no TTFT/TPOT/E2E limit in [sla]; goodput needs a per-request SLO",
                            source=SOURCE))
    else:
        checks.append(measured(
            "latency.goodput", "Goodput (requests meeting every SLO per second)", _r(m.goodput), sla.min_goodput_req_s,
            unit="req/s", direction="higher_is_better",
            message=(f"{m.good_requests} of {m.sent} requests met every SLO "
                     f"({', '.join(f'{k} <= {v:g} ms' for k, v in m.slo_ms.items())}): {m.goodput:.4g} req/s"
                     + (f"; limit >= {sla.min_goodput_req_s:g}" if sla.min_goodput_req_s is not None else "")),
            evidence={"good_requests": m.good_requests, "slo_ms": m.slo_ms, "sent": m.sent}, source=SOURCE,
            performance=True))

    checks.append(_agreement_check(run))
    overhead = frontend_overhead_check(run)
    if overhead is not None:
        checks.append(overhead)
    checks.append(_token_accounting_check(m))
    if run.sweep:
        checks.append(_sweep_check(run))
    return checks


_TOKEN_SOURCE_TEXT = {
    "token_ids": "per-message token counts from token_ids on each chunk",
    "continuous_usage": "per-message token counts from cumulative usage on each chunk",
    "content": "per-message token counts fall back to non-empty text: a token that is an incomplete UTF-8 "
               "sequence is not seen (server lacks continuous_usage_stats)",
}


def _token_accounting_check(m: LatencyMetrics) -> Check:
    title = "Tokens per streamed message known exactly"
    if m.token_source == "none":
        return Check(id="latency.token_accounting", title=title, status="skip",
                     message="no successful request to account tokens for", source=SOURCE)
    msg = (_TOKEN_SOURCE_TEXT[m.token_source] + f"; output totals from {m.output_tokens_source}"
           + (f"; {m.count_mismatches} requests' per-message counts disagree with usage" if m.count_mismatches else ""))
    return measured("latency.token_accounting", title, m.token_source, None, unit="", direction="exact",
                    message=msg, evidence={"token_source": m.token_source, "output_tokens_source": m.output_tokens_source,
                                           "count_mismatches": m.count_mismatches}, source=SOURCE)


def _agreement_check(run: LatencyRun) -> Check:
    title = "Client and engine (/metrics) latency agree"
    if not run.settings.server_metrics:
        return Check(id="latency.server_agreement", title=title, status="skip",
                     message="server_metrics = false", source="http+metrics")
    if run.server_error or not run.server:
        return Check(id="latency.server_agreement", title=title, status="skip",
                     message=f"no engine view: {run.server_error or 'no histograms'}", source="http+metrics")
    ags = agreements(run.metrics, run.server, run.settings.agreement_rel)
    rows = []
    for metric, fig in run.server.items():
        cm = _AGREEMENT_PAIRS.get(metric, metric)
        st = run.metrics.stats.get(cm)
        ag = next((a for a in ags if a.metric == metric), None)
        rows.append([metric, fig.source, _r(st.mean if st else None), _r(fig.mean_ms),
                     _r(st.percentiles.get("p50") if st else None), _r(fig.quantiles_ms.get("p50")),
                     _r(st.percentiles.get("p99") if st else None), _r(fig.quantiles_ms.get("p99")),
                     st.count if st else None, fig.count,
                     _r(ag.diff_ms) if ag else None, _r(ag.allowed_ms) if ag else None,
                     ("ok" if ag.ok else "DISAGREE") if ag else "not judged"])
    evidence = {"table": {"columns": ["metric", "server metric", "client mean", "server mean", "client p50",
                                      "server p50 (interp.)", "client p99", "server p99 (interp.)",
                                      "client n", "server n", "|diff| mean", "allowed", "verdict"], "rows": rows},
                "note": "client TTFT here is from the actual send (the engine cannot see client queueing); the "
                        "TTFT gap is front-end overhead (latency.frontend_overhead), judged only when the engine "
                        "reports more than the client; server percentiles are interpolated within histogram buckets"}
    if not ags:
        return Check(id="latency.server_agreement", title=title, status="skip",
                     message="no comparable histogram had observations", evidence=evidence, source="http+metrics")
    worst = max(ags, key=lambda a: a.diff_ms / a.allowed_ms if a.allowed_ms else math.inf)
    bad = [a for a in ags if not a.ok]
    msg = "; ".join(f"{a.metric}: client {a.client_mean_ms:.4g} vs engine {a.server_mean_ms:.4g} ms"
                    f" ({'engine excess' if a.one_sided else '|diff|'} {a.diff_ms:.3g}"
                    f" {'>' if not a.ok else '<='} {a.allowed_ms:.3g})" for a in ags)
    if bad:
        msg = "DISAGREE " + msg
    return measured("latency.server_agreement", title, _r(worst.diff_ms), _r(worst.allowed_ms), unit="ms",
                    direction="lower_is_better", message=msg, evidence=evidence, source="http+metrics")


def frontend_overhead_check(run: LatencyRun) -> Check | None:
    """Client TTFT (from the send) minus the engine's TTFT, as a figure of its own: what HTTP,
    tokenization and the API server's event loop add before the engine sees the request. It grows
    on a busy host; that is a fact about the deployment, not a disagreement of the two views."""
    fig = (run.server or {}).get("ttft")
    st = run.metrics.stats["ttft_from_send"]
    if not run.settings.server_metrics or fig is None or fig.count <= 0 or st.count == 0:
        return None
    overhead = st.mean - fig.mean_ms
    return measured("latency.frontend_overhead", "Front-end overhead before the engine (mean, TTFT gap)",
                    _r(overhead), None, unit="ms", direction="lower_is_better", performance=True,
                    message=(f"{overhead:.4g} ms per request between the client's send and the engine's arrival "
                             f"(client TTFT {st.mean:.4g} ms vs engine {fig.mean_ms:.4g} ms, means over "
                             f"{st.count} and {fig.count:g} requests)"),
                    evidence={"client_ttft_from_send_mean_ms": _r(st.mean), "engine_ttft_mean_ms": _r(fig.mean_ms),
                              "engine_metric": fig.source, "client_n": st.count, "engine_n": fig.count},
                    source="http+metrics")


def _sweep_check(run: LatencyRun) -> Check:
    sla = run.sla
    passing = [p.rate for p in run.sweep if p.meets_sla]
    best = max(passing) if passing else 0.0
    lims = sla.latency_limits()
    series = []
    refs = []
    for metric, p, limit in lims or [("ttft", 99.0, None), ("tpot", 99.0, None)]:  # type: ignore[list-item]
        series.append({"name": f"{metric} {pct_name(p)}", "x": [pt.rate for pt in run.sweep],
                       "y": [_r(percentile(pt.metrics.samples[metric], p)) for pt in run.sweep]})
        if limit is not None:
            refs.append({"y": limit, "label": f"{metric} {pct_name(p)} limit"})
    rows = [[pt.rate, _r(pt.metrics.request_throughput), _r(percentile(pt.metrics.samples["ttft"], 99)),
             _r(percentile(pt.metrics.samples["tpot"], 99)), _r(pt.metrics.error_rate),
             "meets" if pt.meets_sla else "misses: " + ", ".join(pt.failing)] for pt in run.sweep]
    last = run.sweep[-1]
    msg = (f"highest swept rate meeting the SLA: {best:g} req/s" +
           ("" if last.meets_sla else f"; {last.rate:g} req/s misses ({', '.join(last.failing)})")
           + ("" if lims else " (no latency limit set: only errors judged)"))
    return measured("latency.sla_sweep", "Highest request rate meeting the SLA", best, None, unit="req/s",
                    direction="higher_is_better", message=msg,
                    evidence={"charts": [{"kind": "line", "title": "Latency vs offered request rate",
                                          "x_label": "offered rate (req/s)", "y_label": "ms", "x_log": False,
                                          "series": series, "reference": refs}],
                              "table": {"columns": ["offered req/s", "achieved req/s", "ttft p99", "tpot p99",
                                                    "error rate", "SLA"], "rows": rows}},
                    source=SOURCE)


_DEFINITIONS = {
    "ttft": "scheduled send -> first streamed message carrying >= 1 generated token",
    "tpot": "(e2e - ttft) / (usage.completion_tokens - 1), per request with > 1 token",
    "itl": "gap between consecutive token-carrying messages, pooled over requests",
    "e2e": "scheduled send -> last token-carrying message",
}


# --------------------------------------------------------------------------- CLI


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
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--concurrency", type=int, help="closed-loop workers (or in-flight cap with --rate)")
    p.add_argument("--rate", type=float, help="open-loop request rate (req/s); switches to load=rate")
    p.add_argument("--burstiness", type=float, help="gamma shape of arrivals (1 = Poisson)")
    p.add_argument("--num-requests", type=int)
    p.add_argument("--duration", type=float, help="stop scheduling after this many seconds")
    p.add_argument("--warmup", type=int, help="warm-up requests (excluded)")
    p.add_argument("--input-len", type=_length_arg, help="N or LO:HI tokens")
    p.add_argument("--output-len", type=_length_arg, help="N or LO:HI tokens")
    p.add_argument("--prefix-len", type=int, help="shared-prefix tokens")
    p.add_argument("--num-prefixes", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-continuous-usage", action="store_true", help="for servers that reject continuous_usage_stats")
    p.add_argument("--no-server-metrics", action="store_true", help="do not scrape /metrics")
    p.add_argument("--sweep-rates", help="comma-separated ascending rates for the SLA sweep")
    p.add_argument("--ttft-p99-ms", type=float)
    p.add_argument("--tpot-p99-ms", type=float)
    p.add_argument("--itl-p99-ms", type=float)
    p.add_argument("--e2e-p99-ms", type=float)
    p.add_argument("--min-output-throughput", type=float, help="tok/s")
    p.add_argument("--max-error-rate", type=float)
    p.add_argument("--json", type=Path, help="write the checks (run-record form) to this file")
    p.set_defaults(func=cli_main)
    return p


def settings_from_args(args: argparse.Namespace) -> tuple[LatencySettings, SlaSettings]:
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
    return LatencySettings(**lat), SlaSettings(**sla)


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

