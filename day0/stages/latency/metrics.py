"""Stage 3's metrics: what each latency figure means and how one measured phase is summarized.

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
- Throughput: completed requests (their tokens) / phase duration: t=0 of the arrival process
  to the end of the last measured stream, succeeded or failed (a request that times out at the
  end stretches the window by its wait, as in vLLM's bench).
- Goodput: successful requests that met every per-request SLO at once, per second
  (``SlaSection.per_request_slo``).

Failed requests are counted by kind and reason and kept out of every latency statistic.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Iterable, Sequence

from day0.client.loadgen import PhaseResult, RequestResult, token_source
from day0.client.prom import pct_name
from day0.config.latency import LIMIT_METRICS
from day0.core.stats import ordered, percentile

SOURCE = "http"  # the engine view the figures come from (the in-process run relabels its checks)
METRICS: tuple[str, ...] = LIMIT_METRICS  # ttft, tpot, itl, e2e: the ones an [sla] limit names
METRIC_TITLES = {
    "ttft": "Time to first token",
    "tpot": "Time per output token",
    "itl": "Inter-token latency (per message)",
    "itl_token": "Inter-token latency (per token)",
    "e2e": "End-to-end request latency",
    "send_lag": "Client send lag (scheduled -> sent)",
}
DEFINITIONS = {
    "ttft": "scheduled send -> first streamed message carrying >= 1 generated token",
    "tpot": "(e2e - ttft) / (usage.completion_tokens - 1), per request with > 1 token",
    "itl": "gap between consecutive token-carrying messages, pooled over requests",
    "e2e": "scheduled send -> last token-carrying message",
}


def rounded(x: float | None, nd: int = 3) -> float | None:
    """A figure as the record keeps it: ``nd`` decimals, NaN and None as None."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


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
    v = ordered(values)
    n = len(v)
    if n == 0:
        return Stats(0, math.nan, math.nan, math.nan, math.nan, {pct_name(p): math.nan for p in percentiles})
    mean, std = mean_std(values)
    return Stats(n, mean, std, float(v[0]), float(v[-1]),
                 {pct_name(p): percentile(v, p, presorted=True) for p in percentiles})


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std of ``values`` (not empty), raising for no finite input: a square or
    a sum past 1.8e308 (a gap of 1e200 s squared in ms) raised OverflowError out of an import; then
    every value is taken relative to the largest, each square at most 4, the std inf only where it
    is past a float itself. Over ``values`` as given, not sorted (fsum is exact in any order): an
    array yields Python floats, whose ``** 2`` is the one a list always had (numpy's is off by an
    ulp now and then)."""
    n = len(values)
    try:
        mean = math.fsum(values) / n
        return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in values) / n)
    except OverflowError:
        scale = max(abs(x) for x in values)
        m = math.fsum(x / scale for x in values) / n
        return m * scale, math.sqrt(math.fsum((x / scale - m) ** 2 for x in values) / n) * scale


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


def itl_samples(ok: Sequence[RequestResult]) -> tuple[array[float], array[float]]:
    """ITL per message and per token (ms) over ``ok``, as compact arrays: a long run or an imported
    file has millions of gaps, and a list would hold each as a float object (32 bytes, not 8).
    Where every message carried one token the two are the same numbers, and the same array (never
    written to after this)."""
    ms = 1000.0
    itl: array[float] = array("d")
    for r in ok:
        itl.extend((b - a) * ms for a, b in pairwise(r.msg_t))
    if all(not r.msg_n or min(r.msg_n) == 1 == max(r.msg_n) for r in ok):
        return itl, itl  # per_token_itl's g / 1 * ms is the message's gap, bit for bit
    itl_tok: array[float] = array("d")
    for r in ok:
        itl_tok.extend(g * ms for g in per_token_itl(r.msg_t, r.msg_n))
    return itl, itl_tok


def tpot_of(r: RequestResult) -> float | None:
    if not r.ok or r.output_tokens <= 1 or r.ttft is None or r.e2e is None:
        return None
    return (r.e2e - r.ttft) / (r.output_tokens - 1)


def ttft_without_stalls(r: RequestResult) -> float | None:
    """What the TTFT was at least, had the client's loop run: the time it stalled through taken out."""
    return None if r.ttft is None else r.ttft - r.stalled_to_first


def e2e_without_stalls(r: RequestResult) -> float | None:
    return None if r.e2e is None else r.e2e - r.stalled_to_last


def tpot_without_stalls(r: RequestResult) -> float | None:
    """At least: a stall delayed the last token's read by no more than the time stalled through
    while in flight, and the first token was read no earlier than it came."""
    if tpot_of(r) is None:
        return None
    return max(r.e2e - r.stalled_to_last - r.ttft, 0.0) / (r.output_tokens - 1)  # type: ignore[operator]


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
    samples: dict[str, Sequence[float]]  # per-request ms: ttft, tpot, e2e, send_lag, ttft_from_send, e2e_from_send,
    # ttft_without_stalls, e2e_without_stalls, tpot_without_stalls (the client loop's stalls taken out:
    # what each was at least); pooled itl, itl_token
    sample_offsets_s: Sequence[float]  # scheduled time of each successful request since t=0
    token_source: str
    output_tokens_source: str
    count_mismatches: int
    offered_rate: float | None
    failures: list[dict[str, Any]]  # first few failed requests, for the record
    workers: int = 1  # load-generator processes that drove the phase
    loop_stall_ms: float | None = None  # the longest the client's event loop did not run (None: not watched)
    missing: dict[str, str] = field(default_factory=dict)  # metric -> why it has no samples (an import)

    @property
    def error_rate(self) -> float:
        return self.failed / self.sent if self.sent else 0.0


def compute_metrics(phase: PhaseResult, percentiles: Iterable[float], slo_ms: dict[str, float] | None = None) -> LatencyMetrics:
    pcts = list(percentiles)
    ok = [r for r in phase.results if r.ok]
    bad = [r for r in phase.results if not r.ok]
    ms = 1000.0
    # Per-request samples are compact arrays (8 bytes a value, not a list's 32): an import holds
    # ten of them for each of up to a million requests, beside the requests themselves.
    ttft = array("d", (r.ttft * ms for r in ok))  # type: ignore[operator]
    e2e = array("d", (r.e2e * ms for r in ok))  # type: ignore[operator]
    lag = array("d", (r.send_lag * ms for r in ok))
    ttft_send = array("d", ((r.ttft - r.send_lag) * ms for r in ok))  # type: ignore[operator]
    e2e_send = array("d", ((r.e2e - r.send_lag) * ms for r in ok))  # type: ignore[operator]
    # the client's own stalls taken out (each request's, as its loop's watch stamped it)
    ttft_free = array("d", (ttft_without_stalls(r) * ms for r in ok))  # type: ignore[operator]
    e2e_free = array("d", (e2e_without_stalls(r) * ms for r in ok))  # type: ignore[operator]
    tpots = [tpot_of(r) for r in ok]
    tpot = array("d", (t * ms for t in tpots if t is not None))
    tpot_free = array("d", (t * ms for t in map(tpot_without_stalls, ok) if t is not None))
    itl, itl_tok = itl_samples(ok)
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
                 "e2e_from_send": e2e_send,
                 "ttft_without_stalls": ttft_free, "e2e_without_stalls": e2e_free, "tpot_without_stalls": tpot_free,
                 "itl": itl, "itl_token": itl_tok},
        sample_offsets_s=array("d", (r.scheduled - phase.started for r in ok)),
        token_source=token_source(phase.results), output_tokens_source=out_src,
        count_mismatches=sum(1 for r in ok if r.count_mismatch), offered_rate=offered,
        failures=[{"index": r.index, "error": r.error, "reason": r.reason,
                   "after_ms": round((r.finished - r.scheduled) * ms, 3), "tokens_seen": sum(r.msg_n)}
                  for r in bad[:20]],
        workers=phase.workers, loop_stall_ms=phase.loop_stall_ms,
    )


def pooled(first: LatencyMetrics, more: LatencyMetrics) -> LatencyMetrics:
    """Two phases at one offered load as one sample: the second's requests after the first's (its
    offsets shifted by the first's duration), counts and samples summed, figures recomputed over both.
    A capacity search's answer holds over its point and the requests measured at that load after it.
    The loop stall is the second phase's: the first was judged with its own already."""
    pcts = [float(k[1:]) for k in first.stats["ttft"].percentiles]
    samples = {k: _joined(first.samples.get(k, []), more.samples.get(k, [])) for k in (*first.samples, *more.samples)}
    dur = first.duration_s + more.duration_s
    completed = first.completed + more.completed
    ins, outs = first.input_tokens + more.input_tokens, first.output_tokens + more.output_tokens
    good = None if first.good_requests is None or more.good_requests is None else first.good_requests + more.good_requests

    def summed(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {k: a.get(k, 0) + b.get(k, 0) for k in (*a, *b)}

    return LatencyMetrics(
        sent=first.sent + more.sent, completed=completed, failed=first.failed + more.failed,
        not_sent=first.not_sent + more.not_sent, errors=summed(first.errors, more.errors),
        reasons=summed(first.reasons, more.reasons), duration_s=dur, input_tokens=ins, output_tokens=outs,
        request_throughput=completed / dur, output_throughput=outs / dur, total_token_throughput=(ins + outs) / dur,
        good_requests=good, goodput=None if good is None else good / dur, slo_ms=first.slo_ms,
        stats={k: summarize(samples.get(k, []), pcts) for k in first.stats}, samples=samples,
        sample_offsets_s=_joined(first.sample_offsets_s, [t + first.duration_s for t in more.sample_offsets_s]),
        token_source=first.token_source, output_tokens_source=first.output_tokens_source,
        count_mismatches=first.count_mismatches + more.count_mismatches, offered_rate=first.offered_rate,
        failures=(first.failures + more.failures)[:20], workers=max(first.workers, more.workers),
        loop_stall_ms=more.loop_stall_ms, missing=first.missing)


def _joined(a: Sequence[float], b: Sequence[float]) -> Sequence[float]:
    """Two phases' samples of one metric, one after the other (a list, or an array where either is one)."""
    if isinstance(a, array) or isinstance(b, array):
        return array("d", a) + array("d", b)
    return [*a, *b]
