"""GuideLLM's benchmark report JSON (``guidellm run --output kind=json``) as day0's own phase.

GuideLLM (0.8, report schema version 2) keeps per request ``info.timings``: ``targeted_start``
(when its scheduler meant to send), ``request_start``, ``first_token_iteration`` and
``last_token_iteration`` (wall-clock seconds), with ``output_tokens`` from the server's usage,
grouped as ``requests.successful``, ``errored`` and ``incomplete`` (in flight when the benchmark
ended; GuideLLM leaves them out of its figures, and so does the import). It keeps no instant of
the messages in between, so ITL per message cannot be recomputed: named as missing, never guessed.
A report that kept a sample of the requests (``sample_size``) is refused: percentiles of a sample
are not the run's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from day0.client.loadgen import LoadShape, PhaseResult, RequestResult
from day0.config.latency import LatencySection
from day0.stages.latency.imported import (
    Doc,
    ImportedRun,
    LeftOut,
    check_request_count,
    check_tokens,
    check_window,
    error_kind,
    holding_window,
)

TOOL = "guidellm"
TIMINGS = ("info", "timings")
MISSING_ITL = ("GuideLLM records no per-message times, only the first and last token of each request "
               "(its 'ITL' is a per-request mean over the decode: day0's TPOT)")
NOTES = [
    "TTFT and E2E here run from GuideLLM's targeted start (its scheduled send, day0's definition); GuideLLM's own "
    "TTFT starts at its request start, so the two differ by its dispatch delay",
    "E2E ends at the last token (GuideLLM's request latency ends when the response closes)",
    "requests GuideLLM marked incomplete (cut off when the benchmark ended) are left out, as GuideLLM leaves them "
    "out of its own figures; they show as not sent",
]


def looks_like_guidellm(obj: Any) -> bool:
    return (isinstance(obj, dict) and isinstance(obj.get("benchmarks"), list)
            and isinstance(obj.get("metadata"), dict) and "guidellm_version" in obj["metadata"])


def benchmark_labels(obj: dict[str, Any]) -> list[str]:
    """One label per benchmark of a report (its strategy and rate), for a person choosing one."""
    out = []
    for b in obj.get("benchmarks") or []:
        config = b.get("config") if isinstance(b, dict) else None
        strat = config.get("strategy") if isinstance(config, dict) else None
        strat = strat if isinstance(strat, dict) else {}
        rate = strat.get("rate", strat.get("streams"))
        out.append(f"{strat.get('type_', '?')}" + (f"@{rate:g}" if isinstance(rate, (int, float)) else ""))
    return out


def read_guidellm(path: Path, obj: dict[str, Any], index: int) -> ImportedRun:
    """Benchmark ``index`` of a GuideLLM report as an :class:`ImportedRun`."""
    doc = Doc(path)
    b = doc.obj(obj, "benchmarks", index)
    bd = doc.at("benchmarks", index)  # reads from b name their whole key path
    groups = {g: bd.listed(b, "requests", g, default=[]) or [] for g in ("successful", "errored", "incomplete")}
    check_request_count(bd, ("requests",), len(groups["successful"]) + len(groups["errored"]))
    for g in ("successful", "errored"):
        total = bd.number(b, "metrics", "request_totals", g, default=None)
        if total is not None and len(groups[g]) < total:
            raise bd.fail(("requests", g), f"{len(groups[g])} of {int(total)} requests kept (GuideLLM sampled "
                          "them: sample_size); the per-request checks need every one")
    start = bd.number(b, "scheduler_metrics", "measure_start_time")
    end = bd.number(b, "scheduler_metrics", "measure_end_time", minimum=start)
    bd.span(("scheduler_metrics", "measure_end_time"), end - start, " after measure_start_time")
    if end <= start and (groups["successful"] or groups["errored"]):
        raise bd.fail(("scheduler_metrics", "measure_end_time"), "a window of 0 s (measure_end_time = "
                      "measure_start_time) cannot hold the requests it times (the throughputs would be infinite)")
    left = LeftOut()
    results = _read(bd, groups, left, start, end)
    left.refuse_if_nothing_left(len(results))
    results.sort(key=lambda r: (r.scheduled, r.index))
    start, end = holding_window(results, start, end)
    settings = _settings(bd, b, len(results))
    shape = LoadShape(mode=settings.load, concurrency=settings.concurrency, request_rate=settings.request_rate,
                      burstiness=settings.burstiness)
    phase = PhaseResult("measure", shape, results, start, end, len(groups["incomplete"]),
                        [r.scheduled - start for r in results] if settings.load == "rate" else [])
    version = doc.text(obj, "metadata", "guidellm_version", default=None)
    facts = [("guidellm_version", version), ("strategy", benchmark_labels(obj)[index]), ("duration", end - start),
             ("successful", len(groups["successful"])), ("errored", len(groups["errored"])),
             ("incomplete", len(groups["incomplete"]))]
    for metric in ("time_to_first_token_ms", "inter_token_latency_ms", "request_latency"):
        for stat in ("mean", "median"):
            v = bd.get(b, "metrics", metric, "successful", stat, default=None)
            if isinstance(v, (int, float)):
                facts.append((f"{stat} {metric}", v))
    return ImportedRun(TOOL, version, path, f"benchmark {index} ({benchmark_labels(obj)[index]})", phase, settings,
                       missing={"itl": MISSING_ITL}, notes=list(NOTES), facts=facts, left_out=left)


def _read(bd: Doc, groups: dict[str, list[Any]], left: LeftOut, start: float, end: float) -> list[RequestResult]:
    """The successful and errored requests, each within its domain and the measured window; the rest
    left out and named in ``left``."""
    out: list[RequestResult | None] = []
    for i, r in enumerate(groups["successful"]):
        d = bd.at("requests", "successful", i)
        out.append(left.keep(lambda d=d, i=i, r=r: check_window(
            d, _request(d, i, r), (*TIMINGS, "request_start"), (*TIMINGS, "last_token_iteration"), start, end)))
    base = len(groups["successful"])
    for i, r in enumerate(groups["errored"]):
        d = bd.at("requests", "errored", i)
        out.append(left.keep(lambda d=d, i=i, r=r: _failed(d, base + i, r)))
    return [r for r in out if r is not None]


def _times(doc: Doc, r: Any) -> tuple[float, float]:
    """(scheduled, sent) of a request: its targeted start (its request start when it has none)."""
    sent = doc.number(r, *TIMINGS, "request_start")
    target = doc.number(r, *TIMINGS, "targeted_start", default=None)
    return (sent if target is None else target), sent


def _end(doc: Doc, r: Any, sent: float) -> float | None:
    """When the request ended (``request_end_time``), never before it was sent, nor longer after it
    than a request lasts (:meth:`Doc.span`)."""
    end = doc.number(r, "request_end_time", default=None)
    if end is not None and end < sent:
        raise doc.outside(("request_end_time",), f"{end - sent:.6g} s after its request_start: a request "
                                                 "cannot end before it starts")
    if end is not None:
        doc.span(("request_end_time",), end - sent, " after its request_start")
    return end


def _not_before(doc: Doc, keys: tuple[Any, ...], t: float, earlier: float, name: str) -> None:
    """A token's instant ``t`` after the ``earlier`` one it follows, by a duration a request can take."""
    if t < earlier:
        raise doc.outside(keys, f"{t - earlier:.6g} s after its {name}: a token cannot precede it")
    doc.span(keys, t - earlier, f" after its {name}")


def _request(doc: Doc, index: int, r: Any) -> RequestResult:
    scheduled, sent = _times(doc, r)
    first = doc.number(r, *TIMINGS, "first_token_iteration", default=None)
    last = doc.number(r, *TIMINGS, "last_token_iteration", default=None)
    claimed = doc.count(r, "output_tokens", default=None)
    iterations = doc.count(r, *TIMINGS, "token_iterations", default=None)
    prompt = doc.count(r, "prompt_tokens", default=None)
    end = _end(doc, r, sent)
    res = RequestResult(index, "measure", scheduled, sent, prompt or 0, claimed or 0)
    res.finished = end or last or sent
    if first is None:
        res.error, res.reason = "no_tokens", "GuideLLM saw no token (non-streaming, or an empty reply)"
        return res
    _not_before(doc, (*TIMINGS, "first_token_iteration"), first, sent, "request_start")
    _not_before(doc, (*TIMINGS, "first_token_iteration"), first, scheduled, "targeted_start")
    last = first if last is None else last
    _not_before(doc, (*TIMINGS, "last_token_iteration"), last, first, "first_token_iteration")
    if end is not None and end < last:
        raise doc.outside(("request_end_time",), f"{end - last:.6g} s after its last_token_iteration: a request "
                                                 "cannot end before its last token")
    if iterations == 0:
        raise doc.outside((*TIMINGS, "token_iterations"), "0, but GuideLLM recorded a first token")
    at_least = 2 if last > first else 1  # two token instants are two tokens
    out = claimed or iterations or at_least
    keys = ("output_tokens",) if claimed else (*TIMINGS, "token_iterations")
    check_tokens(doc, keys, out, at_least, iterations or at_least)  # without token_iterations: the instants
    res.msg_t = [first - scheduled] + ([last - scheduled] if last > first else [])
    res.msg_n = [1] * len(res.msg_t)  # the instants it recorded; the count is never spread per token
    res.output_tokens, res.output_tokens_source = out, "usage"
    res.prompt_tokens = prompt
    res.token_source, res.ok = "content", True
    return res


def _failed(doc: Doc, index: int, r: Any) -> RequestResult:
    scheduled, sent = _times(doc, r)
    message = doc.text(r, "info", "error", default=None) or "GuideLLM marked the request errored"
    res = RequestResult(index, "measure", scheduled, sent, 0, 0)
    res.finished = _end(doc, r, sent) or sent
    res.error, res.reason = error_kind(message)
    return res


def _settings(doc: Doc, b: dict[str, Any], n: int) -> LatencySection:
    """GuideLLM's strategy as a ``[latency]`` table: poisson and constant are open loop (constant:
    evenly spaced, burstiness inf), concurrent and synchronous closed loop, throughput all at once."""
    strat = doc.obj(b, "config", "strategy")
    sd = doc.at("config", "strategy")  # its reads name their whole key path
    kind = sd.text(strat, "type_")
    table: dict[str, Any] = {"num_requests": max(1, n), "warmup_requests": 0, "server_metrics": False}
    if kind in ("poisson", "constant"):
        table.update(load="rate", concurrency=0, request_rate=float(sd.number(strat, "rate", minimum=0.0) or math.inf),
                     burstiness=1.0 if kind == "poisson" else math.inf)
    elif kind in ("concurrent", "synchronous"):
        streams = sd.count(strat, "streams", default=1) or 1
        table.update(load="concurrency", concurrency=max(1, streams))
    else:
        table.update(load="rate", concurrency=0, request_rate=math.inf)
    return LatencySection.from_table(table)
