"""The server's own /metrics, read around a benchmark's runs: its prefix-cache window and its
first-token histogram. One reader for every bench script that asks the server what it saw
(bench_capacity, bench_edge, bench_late_spells); each returns None where /metrics could not be
read, so a run is shown without those figures rather than lost."""

from __future__ import annotations

import math
from typing import Any

from day0.client.prom import SERVER_METRICS, PromError, delta, parse_histograms, prefix_cache_window, scrape_sync


def metrics_text(url: str) -> str | None:
    """The server's /metrics text, for the prefix-cache window around a tool's run and the server's
    first-token histogram around a dense rate; None when it cannot be read (the run is then shown
    without those)."""
    try:
        return scrape_sync(url)
    except PromError:
        return None


def cache_share(before: str | None, after: str | None) -> float | None:
    """Of the prompt tokens the server looked up between the two scrapes, the share it found cached."""
    if before is None or after is None:
        return None
    try:
        window = prefix_cache_window(before, after)
    except PromError:
        return None
    return round(window.share, 4) if window is not None and window.queries > 0 else None


def ttft_window(before: str | None, after: str | None) -> Any:
    """The server's own first-token histogram (``vllm:time_to_first_token_seconds``, from the
    request's arrival in the engine to its first token) between two /metrics scrapes; None when
    either could not be read or parsed, or has no such histogram."""
    name = SERVER_METRICS["ttft"][0]
    if before is None or after is None:
        return None
    try:
        h = parse_histograms(after).get(name)
        return None if h is None else delta(parse_histograms(before).get(name), h)
    except PromError:
        return None


def first_tokens_past(before: str | None, after: str | None, ttfts_s: list[float],
                      limit_ms: float) -> dict[str, float] | None:
    """Of one dense rate's first tokens, how many the server's own histogram (:func:`ttft_window`)
    and vLLM bench's client put past the histogram's first bucket bound at or above the TTFT
    limit (500 ms for 300): the server as the arbiter when the two clients disagree near the edge.
    The scrape right after a rate can miss its last few requests (here it counted 299 of the 301
    a rate sent, its ready check included: the server's histogram trails its last responses).
    None when /metrics could not be read or has no such bucket."""
    d = ttft_window(before, after)
    if d is None:
        return None
    bound = next((le for le, _ in d.buckets if math.isfinite(le) and le * 1000.0 >= limit_ms), None)
    if bound is None:
        return None
    return {"bound_ms": bound * 1000.0, "server": round(d.total - dict(d.buckets)[bound]), "server_n": round(d.total),
            "client": sum(1 for t in ttfts_s if t and t > bound)}
