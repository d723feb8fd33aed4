"""The engine's own latency view: Prometheus histograms scraped from ``/metrics``.

Histograms are cumulative since the server started, so a run's view is the bucket-wise
difference of a scrape taken after the run and one taken before. Means come from the
``_sum``/``_count`` deltas (exact); percentiles are interpolated inside buckets the way
Prometheus' ``histogram_quantile`` does it, so they are only as fine as the bucket edges.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import math
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from day0.core.record import one_line

# What each client-side metric is compared with, in order of preference (names without suffix).
SERVER_METRICS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    # per engine step of a request, i.e. between token-carrying messages; the older name
    # meant the same thing before vLLM renamed it
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),  # per request: decode / (n - 1)
    "e2e": ("vllm:e2e_request_latency_seconds",),
}


class PromError(ValueError):
    """Unreadable or inconsistent metrics; the message names the URL or metric."""


@dataclass
class Histogram:
    """A cumulative histogram: ``buckets`` are (upper bound, cumulative count), +Inf last."""

    name: str
    buckets: list[tuple[float, float]] = field(default_factory=list)
    sum: float = 0.0
    count: float = 0.0

    @property
    def total(self) -> float:
        return self.buckets[-1][1] if self.buckets else self.count

    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> float:
        return histogram_quantile(q, self.buckets)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q.

    The lowest bucket starts at 0 (unless its bound is <= 0); a rank that lands in the +Inf
    bucket returns the highest finite bound, as Prometheus does.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if not buckets or not math.isinf(buckets[-1][0]):
        raise PromError("histogram has no +Inf bucket")
    total = buckets[-1][1]
    if total <= 0 or len(buckets) < 2:
        return math.nan
    rank = q * total
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start = 0.0 if b == 0 else buckets[b - 1][0]
    prev = 0.0 if b == 0 else buckets[b - 1][1]
    end, cum = buckets[b]
    in_bucket = cum - prev
    if in_bucket <= 0:
        return end
    return start + (end - start) * (rank - prev) / in_bucket


# How much of the parser's complaint a PromError keeps: it quotes the offending line whole, and a
# line of /metrics may run to ANSWER_MAX_BYTES, once printed as one "line" of 4,000,047 characters.
EXCERPT_CHARS = 200


def samples(text: str, labels: dict[str, str] | None = None) -> list[Sample]:
    """Every sample of an exposition whose labels include ``labels``; PromError (one line, the
    parser's complaint cut to ``EXCERPT_CHARS`` with its length) for a text that is not an
    exposition. The one place /metrics text is parsed."""
    want = labels or {}
    try:
        found = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception as exc:  # the parser raises bare ValueErrors with the offending line
        why = str(exc)
        size = f" ({len(why)} characters)" if len(why) > EXCERPT_CHARS else ""
        raise PromError(f"not a Prometheus exposition: {one_line(why, EXCERPT_CHARS)}{size}") from None
    return [s for s in found if all(s.labels.get(k) == v for k, v in want.items())]


def parse_histograms(text: str, labels: dict[str, str] | None = None) -> dict[str, Histogram]:
    """Every histogram in an exposition, summed over label sets (engines, ranks) that match.

    Grouping goes by sample name (``*_bucket`` with an ``le`` label), so an exposition without
    ``# TYPE`` lines still parses.
    """
    out: dict[str, Histogram] = {}
    bucket_acc: dict[str, dict[float, float]] = {}
    for s in samples(text, labels):
        name = s.name
        if name.endswith("_bucket") and "le" in s.labels:
            base = name[: -len("_bucket")]
            try:
                le = float(s.labels["le"])
            except ValueError:
                raise PromError(f"{name}: bucket bound le={s.labels['le'][:40]!r} is not a number") from None
            acc = bucket_acc.setdefault(base, {})
            acc[le] = acc.get(le, 0.0) + s.value
        elif name.endswith("_sum"):
            out.setdefault(name[:-4], Histogram(name[:-4])).sum += s.value
        elif name.endswith("_count"):
            out.setdefault(name[:-6], Histogram(name[:-6])).count += s.value
    for base, acc in bucket_acc.items():
        h = out.setdefault(base, Histogram(base))
        h.buckets = sorted(acc.items())
    return {k: h for k, h in out.items() if h.buckets}


def delta(before: Histogram | None, after: Histogram) -> Histogram:
    """What was observed between two scrapes; a decrease means the server restarted."""
    if before is None:
        return Histogram(after.name, list(after.buckets), after.sum, after.count)
    b = dict(before.buckets)
    if set(b) - {le for le, _ in after.buckets}:
        raise PromError(f"{after.name}: bucket bounds changed between scrapes")
    buckets = [(le, c - b.get(le, 0.0)) for le, c in after.buckets]
    d = Histogram(after.name, buckets, after.sum - before.sum, after.count - before.count)
    if d.count < 0 or any(c < 0 for _, c in buckets):
        raise PromError(f"{after.name}: counts went down between scrapes (server restarted?)")
    return d


@dataclass
class ServerFigure:
    """One server-side latency distribution over the run, in milliseconds."""

    metric: str  # ttft | itl | tpot | e2e
    source: str  # the Prometheus metric name used
    count: float
    mean_ms: float
    quantiles_ms: dict[str, float]  # "p50" -> ms, interpolated from buckets
    bucket_bounds_ms: list[float]


def server_view(before: str | None, after: str, *, labels: dict[str, str] | None = None,
                percentiles: Iterable[float] = (50, 90, 99)) -> dict[str, ServerFigure]:
    """Server TTFT/ITL/TPOT/E2E over the interval between two /metrics texts."""
    h_before = parse_histograms(before, labels) if before is not None else {}
    h_after = parse_histograms(after, labels)
    out: dict[str, ServerFigure] = {}
    pcts = list(percentiles)
    for metric, names in SERVER_METRICS.items():
        present = [(n, delta(h_before.get(n), h_after[n])) for n in names if n in h_after]
        if not present:
            continue
        # preferred name first, but not one that saw nothing when another did (both exported)
        name, d = next(((n, d) for n, d in present if d.count > 0), present[0])
        out[metric] = ServerFigure(
            metric=metric,
            source=name,
            count=d.count,
            mean_ms=d.mean() * 1000.0,
            quantiles_ms={pct_name(p): d.quantile(p / 100.0) * 1000.0 for p in pcts},
            bucket_bounds_ms=[le * 1000.0 for le, _ in d.buckets if math.isfinite(le)],
        )
    return out


def pct_name(p: float) -> str:
    """99 -> 'p99', 99.9 -> 'p99.9' (the names used in check ids use '_' for '.').

    The digits are the float's shortest repr, written without an exponent (1e-05 -> 'p0.00001')
    and without a trailing '.0': two distinct percentiles always get distinct names. ``{p:g}``
    kept 6 significant digits, so 99.99999 and 99.99998 were both 'p100': one check id for two
    limits, and a column named for a percentile no limit asked for."""
    text = format(Decimal(repr(float(p))), "f")
    return f"p{text[:-2] if text.endswith('.0') else text}"


# What day0 reads whole from a server it does not time (/metrics, a model list): vLLM's answers are
# kilobytes. One that answers without end, or a byte a second (each read inside the session's read
# timeout), is refused, not read into memory for ever: a probe once grew day0 to 18 GB.
ANSWER_MAX_BYTES = 16 << 20
ANSWER_MAX_S = 60.0


async def read_answer(session, url: str) -> tuple[int, bytes]:  # session: aiohttp.ClientSession
    """(status, body) of a GET: the body of a 200 (empty for any other status), at most
    ``ANSWER_MAX_BYTES``, the whole answer within ``ANSWER_MAX_S``; ValueError or TimeoutError past them."""
    async with asyncio.timeout(ANSWER_MAX_S), session.get(url) as resp:
        if resp.status != 200:
            return resp.status, b""
        if (resp.content_length or 0) > ANSWER_MAX_BYTES:
            raise ValueError(f"its answer is {resp.content_length} bytes, past {ANSWER_MAX_BYTES >> 20} MiB")
        body = bytearray()
        async for chunk in resp.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > ANSWER_MAX_BYTES:
                raise ValueError(f"its answer goes on past {ANSWER_MAX_BYTES >> 20} MiB")
        return 200, bytes(body)


async def scrape(session, base_url: str) -> str:  # session: aiohttp.ClientSession
    """GET /metrics as text; raises PromError naming the URL when it cannot be read."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        status, body = await read_answer(session, url)
    except Exception as exc:
        raise PromError(f"{url}: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise PromError(f"{url}: HTTP {status}")
    return body.decode("utf-8", "replace")


def scrape_sync(base_url: str, timeout_s: float = 10.0) -> str:
    """:func:`scrape` without an event loop: GET /metrics as text, at most ``ANSWER_MAX_BYTES``, the
    whole answer (connect, status line, headers, redirects, body) within ``ANSWER_MAX_S``, each read
    within ``timeout_s``; PromError naming the URL. urlopen bounded only the body by the deadline: a
    server trickling its headers a byte every 0.5 s (inside a 1 s read timeout) held a 2 s deadline 38 s."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        status, body = _get_within(url, timeout_s, time.monotonic() + ANSWER_MAX_S)
    except Exception as exc:
        raise PromError(f"{url}: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise PromError(f"{url}: HTTP {status}")
    if len(body) > ANSWER_MAX_BYTES:
        raise PromError(f"{url}: its answer goes on past {ANSWER_MAX_BYTES >> 20} MiB")
    return body.decode("utf-8", "replace")


REDIRECTS_MAX = 5  # as the async scrape, a redirect is followed (an older vLLM sent /metrics to /metrics/)
_REDIRECTS = (301, 302, 303, 307, 308)


def _get_within(url: str, read_s: float, deadline: float) -> tuple[int, bytes]:
    """(status, body of a 200, read past ``ANSWER_MAX_BYTES`` by at most one read) of a GET, every
    step before ``deadline``: TimeoutError past it, ValueError for what cannot be fetched."""
    for _ in range(REDIRECTS_MAX + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url[:200]!r} is not an http(s) URL")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname, parts.port, timeout=_left(read_s, deadline))
        raw: socket.socket | None = None
        try:
            conn.connect()
            raw = conn.sock
            conn.sock = _DeadlineSocket(raw, read_s, deadline)
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            resp = conn.getresponse()
            location = resp.getheader("Location")
            if resp.status in _REDIRECTS and location:
                url = urllib.parse.urljoin(url, location)
                continue
            if resp.status != 200:
                return resp.status, b""
            body = bytearray()
            while len(body) <= ANSWER_MAX_BYTES and (chunk := resp.read1(1 << 16)):
                body += chunk
            return 200, bytes(body)
        finally:
            conn.close()
            if raw is not None:
                raw.close()
    raise ValueError(f"more than {REDIRECTS_MAX} redirects")


def _left(read_s: float, deadline: float) -> float:
    """The timeout of the next socket step: ``read_s``, cut to what is left before ``deadline``;
    TimeoutError (the deadline's message) when nothing is."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"its answer took past {ANSWER_MAX_S:g} s")
    return min(read_s, left)


class _DeadlineReader(io.RawIOBase):
    """A socket's reads for http.client (status line, headers, chunk sizes, body), each given
    :func:`_left`, so no read, however slow its bytes come, carries the answer past its deadline."""

    def __init__(self, sock: socket.socket, read_s: float, deadline: float) -> None:
        super().__init__()
        self.sock, self.read_s, self.deadline = sock, read_s, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # buf: a writable buffer (memoryview)
        self.sock.settimeout(_left(self.read_s, self.deadline))
        try:
            return self.sock.recv_into(buf)
        except TimeoutError:
            _left(self.read_s, self.deadline)  # the deadline's message when it was the deadline
            raise


class _DeadlineSocket:
    """A connected socket whose ``makefile`` (what http.client reads the answer through) is a
    :class:`_DeadlineReader`; sending goes to the socket. Its ``close`` does nothing: http.client
    closes the connection as soon as it reads ``Connection: close``, before the body is read through
    the reader (a socket's own makefile defers that close), so :func:`_get_within` closes it last."""

    def __init__(self, sock: socket.socket, read_s: float, deadline: float) -> None:
        self._sock, self._read_s, self._deadline = sock, read_s, deadline

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._read_s, self._deadline))

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(_left(self._read_s, self._deadline))
        self._sock.sendall(data)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


# vLLM's prefix-cache counters (v1/metrics/loggers.py), in tokens: of the prompt tokens the
# scheduler looked up, how many it found cached. Exposed with prometheus_client's ``_total``.
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"


def parse_counters(text: str, names: Iterable[str], labels: dict[str, str] | None = None) -> dict[str, float]:
    """The named counters' values, summed over label sets (engines, ranks) that match; a counter
    absent from the exposition is absent from the result (an engine without it is not a zero)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for s in samples(text, labels):
        base = s.name.removesuffix("_total")
        if base in wanted and s.name != base + "_created":
            out[base] = out.get(base, 0.0) + s.value
    return out


@dataclass(frozen=True)
class PrefixCacheWindow:
    """Prefix-cache lookups between two scrapes, in tokens."""

    hits: float
    queries: float

    @property
    def share(self) -> float:
        """Hit tokens over looked-up prompt tokens; NaN when nothing was looked up."""
        return self.hits / self.queries if self.queries > 0 else math.nan


def prefix_cache_window(before: str | None, after: str, *,
                        labels: dict[str, str] | None = None) -> PrefixCacheWindow | None:
    """The prefix-cache hits and queries between two /metrics texts; None when the server does not
    export the counters. A counter that went down means the server restarted (PromError)."""
    names = (PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES)
    a = parse_counters(after, names, labels)
    if set(a) != set(names):
        return None
    b = parse_counters(before, names, labels) if before is not None else {}
    hits, queries = a[PREFIX_CACHE_HITS] - b.get(PREFIX_CACHE_HITS, 0.0), a[PREFIX_CACHE_QUERIES] - b.get(
        PREFIX_CACHE_QUERIES, 0.0)
    if hits < 0 or queries < 0:
        raise PromError("vllm:prefix_cache_*: counts went down between scrapes (server restarted?)")
    return PrefixCacheWindow(hits, queries)
