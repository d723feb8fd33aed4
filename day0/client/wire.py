"""HTTP/1.1 streams read where the bytes arrive: the transport of every timed request.

A load generator's timestamps are only as good as the moment it looks at the socket. Through
aiohttp a chunk is parsed by the connection's protocol, queued in a stream buffer, and seen by the
request's coroutine one loop iteration later, after every other callback of that iteration: the
first token of the 100th stream ready at once is stamped after 99 others were parsed. Here the
socket's ``data_received`` stamps the chunk and hands it, in the same call, to the request's own
reader (``day0.client.stream``: the SSE framing and the token count); HTTP itself is parsed by
httptools (llhttp, uvicorn's parser). Measured against ``benchmarks/fast_server.py`` (docs/stages/
latency.md, "Load workers"): two thirds of the client CPU per streamed message that vLLM bench's
aiohttp reader spends (day0's aiohttp path spent as much as it), which is what bounds how many
streams one process can time.

Only what a timed request needs: a POST with a JSON body, keep-alive connections per origin
(expired under the server's keep-alive, as before), TLS for https, chunked and Content-Length
bodies (a close-delimited 200 counts as cut: no OpenAI-style server sends one; a close-delimited
error answer is its status, as a proxy or a plain HTTP/1.0 server sends one). Everything else
day0 asks a server (model lists, /metrics, payloads it reads rather than times) goes through
aiohttp (``day0.client.stream.make_session``).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from dataclasses import dataclass
from typing import Callable, Mapping
from urllib.parse import urlsplit

import httptools

# Idle connections are not reused after this long, under the server's own keep-alive (vLLM's
# VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): one reused while the server closes it fails a request that
# the server never saw (seen a few seconds after a 200-request burst left 200 idle connections).
KEEPALIVE_S = 4.0
ERROR_BODY_BYTES = 2048  # what a non-200 answer keeps of its body: enough for the server's reason
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name (RFC 9110 token)

OnBody = Callable[[bytes, float], None]  # a 200 answer's body bytes, and the perf_counter they arrived at


class WireError(Exception):
    """A request that failed on the wire; ``kind`` is one of day0.client.stream.ERROR_KINDS."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


@dataclass(frozen=True, slots=True)
class Target:
    """Where one URL's requests go: a connection's origin and the request line's path."""

    scheme: str
    host: str
    port: int
    path: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_target(url: str) -> Target:
    """The target of an http(s) URL; ValueError naming the URL when it is not one this can send to."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    if parts.username or parts.password:
        raise ValueError(f"{url!r}: credentials in a URL are not sent; pass them as a header")
    port = parts.port or (443 if parts.scheme == "https" else 80)  # a bad port raises ValueError itself
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname, port, path)


def request_head(target: Target, headers: Mapping[str, str], body_len: int) -> bytes:
    """A POST's request line and headers; the caller's headers override the defaults (by name, any
    case). A header that would break the framing (CR, LF or NUL, a name that is not a token) is a
    ValueError naming it, never sent."""
    fields = {"host": ("Host", target.host_header), "user-agent": ("User-Agent", "day0"),
              "content-type": ("Content-Type", "application/json"), "accept": ("Accept", "text/event-stream")}
    for name, value in headers.items():
        if not _TOKEN.match(name) or any(c in str(value) for c in "\r\n\0"):
            raise ValueError(f"header {name!r}: not a valid HTTP header name or value")
        fields[name.lower()] = (name, str(value))
    fields["content-length"] = ("Content-Length", str(body_len))
    lines = [f"POST {target.path} HTTP/1.1"] + [f"{n}: {v}" for n, v in fields.values()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


@dataclass(slots=True)
class Answer:
    """A finished exchange: its status, and for a non-200 the start of its body (a 200's body went
    to the reader as it arrived)."""

    status: int
    body: bytes = b""


class _Exchange:
    """One request and its answer on a connection: httptools' callbacks land here, and a 200's body
    goes to ``reader`` in the same call, stamped with the instant its chunk came off the socket."""

    __slots__ = ("reader", "done", "parser", "last_read", "now", "status", "error_body", "failure", "keep_alive")

    def __init__(self, reader: OnBody, done: asyncio.Future[Answer], now: float) -> None:
        self.reader, self.done = reader, done
        self.parser = httptools.HttpResponseParser(self)
        self.last_read = self.now = now
        self.status = 0  # 0: no response head yet
        self.error_body = bytearray()
        self.failure: BaseException | None = None  # what the reader raised inside a callback
        self.keep_alive = False

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        if self.status != 200:
            if len(self.error_body) < ERROR_BODY_BYTES:
                self.error_body += data[:ERROR_BODY_BYTES - len(self.error_body)]
            return
        try:
            self.reader(data, self.now)
        except BaseException as exc:
            self.failure = exc  # httptools wraps it; the connection hands on the original
            raise

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if not self.done.done():
            self.done.set_result(Answer(self.status, bytes(self.error_body)))

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one exchange on it at a time (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.watch: asyncio.TimerHandle | None = None  # the exchange's stall check
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: whatever they are, the connection cannot be reused
            self.abort()
            return
        ex.last_read = ex.now = time.perf_counter()
        try:
            ex.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self.fail(ex.failure or WireError("client_error", "the stream's reader failed"))
        except httptools.HttpParserError as exc:
            self.fail(WireError("dropped_stream", f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex = self.exchange
        if ex is not None and not ex.done.done():
            why = f" ({type(exc).__name__}: {exc})" if exc else ""
            if ex.status and ex.status != 200:  # an error answer whose body ends at the close: its status
                ex.done.set_result(Answer(ex.status, bytes(ex.error_body)))
            elif ex.status:
                ex.fail(WireError("dropped_stream", f"server disconnected mid-response{why}"))
            else:
                ex.fail(WireError("connection", f"server closed the connection before answering{why}"))

    def check_stall(self, ex: _Exchange, stall_s: float) -> None:
        """Fail the exchange once no byte came for ``stall_s``; else look again when that could be.
        One timer per exchange, moved only when it fires: nothing per chunk."""
        if ex is not self.exchange or ex.done.done():
            return
        quiet = time.perf_counter() - ex.last_read
        if quiet >= stall_s:
            self.fail(WireError("timeout", f"no data for {stall_s:g} s (stalled)"))
        else:
            self.watch = asyncio.get_running_loop().call_later(stall_s - quiet, self.check_stall, ex, stall_s)

    def fail(self, exc: BaseException) -> None:
        if self.exchange is not None:
            self.exchange.fail(exc)
        self.abort()

    def abort(self) -> None:
        """Close at once: a request cut mid-stream closes its connection, so the server aborts it."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close an idle connection politely (FIN, not RST): nothing is in flight on it."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class StreamPool:
    """The keep-alive connections of one run's timed requests, per origin: ``async with``.

    No connection cap: the load shape bounds what is in flight, and a cap here would queue requests
    invisibly (that wait would look like server latency)."""

    def __init__(self, connect_timeout_s: float = 10.0, *, keepalive_s: float = KEEPALIVE_S,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: the context https connections use (default: the system's trust store, verified)."""
        self.connect_timeout_s, self.keepalive_s = connect_timeout_s, keepalive_s
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._targets: dict[str, Target] = {}
        self._tls = tls

    async def __aenter__(self) -> "StreamPool":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection, and give the loop a turn so their transports finish closing."""
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)

    def target(self, url: str) -> Target:
        """``parse_target(url)``, parsed once per URL."""
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = parse_target(url)
        return t

    async def post(self, target: Target, head: bytes, body: bytes, reader: OnBody, stall_timeout_s: float) -> Answer:
        """Send one request and wait for its whole answer; a 200's body goes to ``reader`` chunk by
        chunk as it arrives. WireError on the wire's failures; what ``reader`` raises, as it is.
        Cancelled, it closes the connection."""
        conn = await self._acquire(target)
        loop = asyncio.get_running_loop()
        ex = _Exchange(reader, loop.create_future(), time.perf_counter())
        conn.exchange = ex
        assert conn.transport is not None
        conn.transport.write(head + body)
        conn.watch = loop.call_later(stall_timeout_s, conn.check_stall, ex, stall_timeout_s)
        reusable = False
        try:
            answer = await ex.done
            reusable = ex.keep_alive
            return answer
        finally:
            if conn.watch is not None:
                conn.watch.cancel()
            conn.exchange = conn.watch = None
            if reusable and not conn.closed:
                conn.idle_since = time.perf_counter()
                self._idle.setdefault(target.origin, []).append(conn)
            else:
                conn.abort()
                self._open.discard(conn)

    async def _acquire(self, target: Target) -> _Connection:
        """The most recently used idle connection still inside ``keepalive_s``, else a new one."""
        idle = self._idle.get(target.origin)
        now = time.perf_counter()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
            self._open.discard(conn)
        return await self._connect(target)

    async def _connect(self, target: Target) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if target.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Connection, target.host, target.port, ssl=tls,
                                                       server_hostname=target.host if tls else None)
        except TimeoutError:
            raise WireError("connection", f"could not connect to {target.host_header} within "
                                          f"{self.connect_timeout_s:g} s") from None
        except OSError as exc:  # refused, unreachable, name not found, TLS refused
            raise WireError("connection", f"{target.host_header}: {type(exc).__name__}: {exc}") from None
        self._open.add(conn)
        return conn
