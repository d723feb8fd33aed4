"""``vllm bench serve --save-result --save-detailed`` JSON as day0's own phase of requests.

vLLM (``vllm/benchmarks/serve.py``) keeps, per request: ``ttfts`` (s from its send), ``itls``
(the gaps between chunks carrying choices), ``latencies`` (send to the last such chunk),
``start_times`` (perf_counter at the send), ``queue_times`` (the wait for a ``--max-concurrency``
slot before it), ``input_lens``, ``output_lens`` (the server's usage when it sent one) and
``errors`` ("" on success). day0 rebuilds each request's message instants from them, timed from
the scheduled send (vLLM's start minus its queue time), so the stage's own definitions apply.
Without ``--save-detailed`` the file holds summaries only: refused, naming the missing key.
"""

from __future__ import annotations

import math
from array import array
from itertools import accumulate
from pathlib import Path
from typing import Any

from day0.client.loadgen import LoadShape, PhaseResult, RequestResult
from day0.config.latency import LatencySection
from day0.stages.latency.imported import (
    MAX_DURATION_S,
    WINDOW_SLACK_S,
    Doc,
    ImportedRun,
    LeftOut,
    check_request_count,
    check_tokens,
    check_window,
    error_kind,
    holding_window,
)

TOOL = "vllm bench serve"
DETAILED = "ttfts"
_HINT = "vllm bench serve writes per-request figures only with --save-result --save-detailed"
_FACTS = ("date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
          "completed", "failed", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
          "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms")
NOTES = [
    "TTFT and E2E here run from the scheduled send, which vLLM does not record: its send minus its "
    "client queue time (the --max-concurrency wait); vLLM's own TTFT starts at the send, and any lag of its "
    "arrival loop is in neither (coordinated omission)",
    "a message is a chunk carrying choices, each counted as one token as vLLM counts it (empty text included); "
    "output token totals are vLLM's (the server's usage when it sent one)",
    "success is vLLM's verdict: a stream that carried a token and raised no exception counts as completed, "
    "including one that ended with an error event in the stream",
]


def looks_like_vllm(obj: Any) -> bool:
    return isinstance(obj, dict) and "duration" in obj and "completed" in obj and "benchmarks" not in obj


def read_vllm(path: Path, obj: dict[str, Any], label: str) -> ImportedRun:
    """One saved ``vllm bench serve`` result (an object of the file) as an :class:`ImportedRun`."""
    doc = Doc(path, _HINT)
    n = len(doc.listed(obj, DETAILED))
    check_request_count(doc, (DETAILED,), n)
    for key in ("itls", "latencies", "start_times", "errors", "input_lens", "output_lens"):
        doc.listed(obj, key, length=n)
    doc.listed(obj, "queue_times", length=n, default=None)  # older vLLM versions did not write it
    duration = doc.seconds(obj, "duration")
    if duration <= 0 < n:
        raise doc.fail(("duration",), "a window of 0 s cannot hold the requests it times (the throughputs "
                                      "would be infinite); expected a number > 0")
    left = LeftOut()
    read = [left.keep(lambda i=i: _request(doc, obj, i)) for i in range(n)]
    ended = max((r.finished for r in read if r is not None), default=0.0)
    started = ended - duration  # the window ends at the last request's end (vLLM's benchmark_duration)
    kept = [left.keep(lambda r=r: check_window(doc, r, ("start_times", r.index), ("latencies", r.index),
                                               started, ended)) for r in read if r is not None]
    results = [r for r in kept if r is not None]
    left.refuse_if_nothing_left(len(results))
    results.sort(key=lambda r: (r.scheduled, r.index))
    started, ended = holding_window(results, started, ended)
    settings = _settings(doc, obj, n)
    shape = LoadShape(mode=settings.load, concurrency=settings.concurrency, request_rate=settings.request_rate,
                      burstiness=settings.burstiness, arrivals="vllm")
    phase = PhaseResult("measure", shape, results, started, ended, 0,
                        [r.scheduled - started for r in results] if settings.load == "rate" else [])
    facts = [(k, obj[k]) for k in _FACTS if k in obj and not isinstance(obj[k], (list, dict))]
    return ImportedRun(TOOL, None, path, label, phase, settings, notes=list(NOTES), facts=facts, left_out=left)


def _request(doc: Doc, obj: dict[str, Any], i: int) -> RequestResult:
    """Request ``i``: vLLM's send minus its queue wait is the scheduled time day0 measures from."""
    start = doc.number(obj, "start_times", i)
    wait = doc.seconds(obj, "queue_times", i, default=0.0, none_ok=True) or 0.0
    claimed = doc.count(obj, "output_lens", i, none_ok=True) or 0  # 0 or null: the server sent no usage
    r = RequestResult(i, "measure", start - wait, start, doc.count(obj, "input_lens", i) or 0, claimed)
    latency = doc.seconds(obj, "latencies", i, none_ok=True)
    r.finished = start + (latency or 0.0)
    err = doc.text(obj, "errors", i)
    if err:
        r.error, r.reason = error_kind(err)
        return r
    ttft = doc.seconds(obj, "ttfts", i)
    gaps = _gaps(doc, obj, i)
    r.msg_t = array("d", accumulate(gaps, initial=wait + ttft))  # t += gap, as each message came
    t = r.msg_t[-1]
    doc.span(("itls", i), t - wait, f" from the send to the last token (ttfts[{i}] + itls[{i}])")
    if latency is not None and wait + latency + WINDOW_SLACK_S < t:  # vLLM: the last chunk's instant - send
        raise doc.outside(("latencies", i), f"{latency:.6g} s, before the request's last token at {t - wait:.6g} s "
                                            f"(ttfts[{i}] + itls[{i}]): a request cannot end before it streamed")
    if claimed:  # vLLM bench counts a chat stream's role chunk as a message: at least one token per gap
        check_tokens(doc, ("output_lens", i), claimed, len(gaps), len(r.msg_t))
    r.msg_n = array("B", b"\x01") * len(r.msg_t)  # one token a message: a byte each, not a list's 8
    r.output_tokens = r.expected_output_len or len(r.msg_t)
    r.output_tokens_source = "usage" if r.expected_output_len else "messages"
    r.prompt_tokens = r.input_len
    r.token_source = "content"
    r.ok = True
    return r


def _gaps(doc: Doc, obj: dict[str, Any], i: int) -> list[Any]:
    """``itls[i]``, every gap a duration (:meth:`Doc.seconds`). Checked for the whole list at once
    (their types, least and greatest value), since a long run holds millions: a gap at a time is
    only for naming the first that is not (strict_json already refused NaN and infinities)."""
    gaps: list[Any] = doc.listed(obj, "itls", i)
    if not set(map(type, gaps)) <= {float, int} or (gaps and not 0 <= min(gaps) <= max(gaps) <= MAX_DURATION_S):
        for k in range(len(gaps)):
            doc.seconds(obj, "itls", i, k)
    return gaps


def _settings(doc: Doc, obj: dict[str, Any], n: int) -> LatencySection:
    """The load vLLM offered, as a ``[latency]`` table: open loop at ``request_rate`` ("inf": all at
    once), capped by ``max_concurrency``; all at once under a cap is a closed loop of that many."""
    raw = doc.get(obj, "request_rate", default="inf")
    rate = math.inf if raw == "inf" else doc.number(obj, "request_rate", minimum=0.0)
    cap = doc.count(obj, "max_concurrency", default=None)
    burst = doc.number(obj, "burstiness", default=1.0)
    if burst <= 0:  # vLLM's gamma shape: refused under the file's key, not the [latency] key it becomes
        raise doc.outside(("burstiness",), f"expected a number > 0, got {burst!r}")
    table: dict[str, Any] = {"load": "rate", "request_rate": rate if rate > 0 else math.inf,
                             "concurrency": int(cap or 0), "burstiness": float(burst), "arrivals": "vllm",
                             "num_requests": max(1, n), "warmup_requests": 0, "server_metrics": False}
    if math.isinf(rate) and cap:
        table.update(load="concurrency", request_rate=1.0)
    return LatencySection.from_table(table)
