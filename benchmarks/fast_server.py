"""A scripted OpenAI-style streaming server lean enough not to be the bottleneck of a client benchmark.

tests/support/sse_server.py is the tests' server: aiohttp's web framework, Prometheus histograms, every
fault on demand. At thousands of streamed messages a second its own overhead decides what is
measured, so the client ladder (bench_ladder.py) uses this one: a bare ``asyncio.Protocol``
(uvloop when installed) speaking just enough HTTP/1.1 (keep-alive, Content-Length bodies,
chunked SSE responses) for day0, ``vllm bench serve`` and GuideLLM, with pre-formatted chunks.

Every request streams ``max_tokens`` (or ``max_completion_tokens``) messages of one token: the
first ``--ttft-ms`` after the request arrived, then one every ``--gap-ms``, each timed from the
arrival (a late write never delays the next one's schedule). The server keeps the truth: per
request the perf_counter (CLOCK_MONOTONIC) instant it received it and wrote its first and last
token (``GET /_log``), and how late each write was against the script (``GET /_stats``: its own
ceiling; when that lateness grows the server, not the client, is the limit). ``POST /_reset``
clears both. A request is keyed by the index in a day0-style ``X-Request-Id``
(``day0-<phase>-<tag>-<index>``), else by its arrival number; the key is in every chunk's
``id`` (``cmpl-<key>``), which is how GuideLLM's records are matched to the log.

    python benchmarks/fast_server.py [--port 0] [--ttft-ms 50] [--gap-ms 5]   # prints LISTENING <port>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

_RID = re.compile(rb"^day0-\w+-[0-9a-f]+-(\d+)$")
_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")
_COMPLETION = (b'data: {"id":"cmpl-%d","object":"text_completion","created":0,"model":"scripted",'
               b'"choices":[{"index":0,"text":"tok ","logprobs":null,"finish_reason":%s}]%s}\n\n')
_CHAT = (b'data: {"id":"cmpl-%d","object":"chat.completion.chunk","created":0,"model":"scripted",'
         b'"choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":%s}]%s}\n\n')
_ROLE = (b'data: {"id":"cmpl-%d","object":"chat.completion.chunk","created":0,"model":"scripted",'
         b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n')
_USAGE = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}'
_FINAL = b'data: {"id":"cmpl-%d","object":"text_completion","created":0,"model":"scripted","choices":[]%s}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _json_response(obj: Any, status: str = "200 OK") -> bytes:
    body = json.dumps(obj).encode()
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), len(body), body))


class State:
    """The script, the log and the lateness of every write, shared by all connections."""

    def __init__(self, ttft_s: float, gap_s: float) -> None:
        self.ttft_s, self.gap_s = ttft_s, gap_s
        self.reset()

    def reset(self) -> None:
        self.arrivals = 0
        self.log: list[list[float]] = []  # [key, received, first write, last write, messages]
        self.late: list[float] = []  # seconds each write came after its scripted instant

    def key(self, rid: bytes | None) -> int:
        m = _RID.match(rid or b"")
        if m:
            return int(m.group(1))
        self.arrivals += 1
        return self.arrivals - 1


class Stream:
    """One streaming response: writes each message at its scripted instant on the loop's timer."""

    __slots__ = ("conn", "key", "t0", "n", "k", "chat", "usage", "cont", "prompt", "entry", "loop")

    def __init__(self, conn: "Conn", key: int, t0: float, n: int, chat: bool, usage: bool, cont: bool,
                 prompt: int) -> None:
        self.conn, self.key, self.t0, self.n, self.k = conn, key, t0, n, 0
        self.chat, self.usage, self.cont, self.prompt = chat, usage, cont, prompt
        self.entry = [key, t0, 0.0, 0.0, 0]
        conn.state.log.append(self.entry)
        self.loop = asyncio.get_running_loop()
        # the loop's clock may not be perf_counter's (uvloop): schedule by the offset between them
        self.loop.call_at(self._when(conn.state.ttft_s), self.emit)

    def _when(self, after_t0: float) -> float:
        return self.loop.time() + (self.t0 + after_t0 - time.perf_counter())

    def emit(self) -> None:
        st, tr = self.conn.state, self.conn.transport
        if tr.is_closing():
            return
        self.k += 1
        last = self.k >= self.n
        usage = _USAGE % (self.prompt, self.k, self.prompt + self.k) if self.cont else b""
        data = (_CHAT if self.chat else _COMPLETION) % (self.key, b'"length"' if last else b"null", usage)
        if last:
            data += _FINAL % (self.key, _USAGE % (self.prompt, self.k, self.prompt + self.k)) if self.usage else b""
            data += b"data: [DONE]\n\n"
        now = time.perf_counter()
        tr.write(_chunk(data) + (b"0\r\n\r\n" if last else b""))
        st.late.append(now - (self.t0 + st.ttft_s + (self.k - 1) * st.gap_s))
        e = self.entry
        if self.k == 1:
            e[2] = now
        e[3], e[4] = now, self.k
        if not last:
            self.loop.call_at(self._when(st.ttft_s + self.k * st.gap_s), self.emit)


class Conn(asyncio.Protocol):
    """One keep-alive connection: parse requests, answer control paths, start streams."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].split(b"\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            size = int(headers.get(b"content-length", b"0"))
            if len(self.buf) < end + 4 + size:
                return
            body = self.buf[end + 4:end + 4 + size]
            self.buf = self.buf[end + 4 + size:]
            parts = lines[0].split(b" ")
            self.handle(parts[0], parts[1] if len(parts) > 1 else b"/", headers, body)

    def handle(self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes) -> None:
        t0 = time.perf_counter()
        st = self.state
        if method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
            req = json.loads(body or b"{}")
            n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
            so = req.get("stream_options") or {}
            prompt = req.get("prompt") if "prompt" in req else req.get("messages", [])
            key = st.key(headers.get(b"x-request-id"))
            chat = path.endswith(b"chat/completions")
            self.transport.write(_HEAD + (_chunk(_ROLE % key) if chat else b""))
            Stream(self, key, t0, max(1, n), chat, bool(so.get("include_usage")),
                   bool(so.get("continuous_usage_stats")), len(prompt) if isinstance(prompt, list) else 1)
        elif path == b"/v1/models":
            self.transport.write(_json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]}))
        elif path == b"/health":
            self.transport.write(_json_response({}))
        elif path == b"/_log":
            self.transport.write(_json_response(st.log))
        elif path == b"/_stats":
            late = sorted(st.late)
            pick = (lambda q: late[min(len(late) - 1, int(q * len(late)))] * 1e3) if late else (lambda q: None)
            self.transport.write(_json_response({"messages": len(late), "late_p50_ms": pick(0.5),
                                                 "late_p99_ms": pick(0.99), "late_max_ms": pick(1.0)}))
        elif path == b"/_reset":
            st.reset()
            self.transport.write(_json_response({"ok": True}))
        else:
            self.transport.write(_json_response({"error": "not found"}, "404 Not Found"))


async def serve(port: int, ttft_ms: float, gap_ms: float) -> None:
    state = State(ttft_ms / 1000.0, gap_ms / 1000.0)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(state), "127.0.0.1", port, backlog=4096)
    print(f"LISTENING {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.buffer.read1(4096) else None)
    await stop.wait()  # stdin closed: the parent is gone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--gap-ms", type=float, default=5.0)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    a = ap.parse_args()
    if a.loop == "uvloop":
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(serve(a.port, a.ttft_ms, a.gap_ms))


if __name__ == "__main__":
    main()
