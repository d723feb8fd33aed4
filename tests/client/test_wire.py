"""The timed requests' HTTP/1.1 transport (day0.client.wire), against a raw loopback server.

The server here is a labelled fake: an asyncio server in the test's own loop that answers each
request with bytes the test wrote by hand (split, malformed, cut, slow), so every framing case and
every failure is exact. Timing accuracy is proven elsewhere, against a scripted server in its own
process (tests/client/test_loadgen.py).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import time
from pathlib import Path
from typing import Awaitable, Callable

import pytest

from day0.client.loadgen import ClientOptions, stream_one
from day0.client.wire import StreamPool, Target, parse_target, request_head
from day0.client.workload import Request
from day0.stages.latency.metrics import per_token_itl, tpot_of

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
REQ = Request(index=0, prompt=[1, 2, 3], input_len=3, output_len=2)


def sse(*events: dict | str) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n" for e in events)


def token(text: str, done: int) -> dict:
    return {"choices": [{"index": 0, "text": text}], "usage": {"prompt_tokens": 3, "completion_tokens": done}}


STREAM = sse(token("a", 1), token("b", 2), {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
             "[DONE]")


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and Content-Length body), or b"" at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


class Fake:
    """A loopback server running ``handler`` per connection; counts connections, keeps requests."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler, self.tls = handler, tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> "Fake":
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(r, w)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/v1/completions"


def answering(*responses: bytes, byte_by_byte: bool = False, keep: list[bytes] | None = None) -> Handler:
    """Answer successive requests on a connection with ``responses``, then wait for EOF."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for resp in responses:
            req = await read_request(r)
            if not req:
                return
            if keep is not None:
                keep.append(req)
            for piece in ([resp[i:i + 1] for i in range(len(resp))] if byte_by_byte else [resp]):
                w.write(piece)
                await w.drain()
        await r.read()

    return handler


async def one(pool: StreamPool, url: str, opts: ClientOptions | None = None, rid: str = "day0-t-0"):
    return await stream_one(pool, url, REQ, "m", opts or ClientOptions(), scheduled=time.perf_counter(), phase="t",
                            request_id=rid)


def test_a_stream_split_at_every_byte_is_read_whole():
    async def go():
        async with Fake(answering(OK_HEAD + chunked(STREAM), byte_by_byte=True)) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert res.ok, res.reason
    assert res.msg_n == [1, 1] and res.output_tokens == 2 and res.token_source == "continuous_usage"
    assert 0 < res.msg_t[0] <= res.msg_t[1]


def test_keep_alive_reuses_a_connection_until_it_has_idled_too_long():
    async def run(keepalive_s: float) -> tuple[int, list[bool]]:
        keep: list[bytes] = []
        async with Fake(answering(*[OK_HEAD + chunked(STREAM)] * 3, keep=keep)) as f, \
                StreamPool(keepalive_s=keepalive_s) as pool:
            oks = [(await one(pool, f.url(), rid=f"day0-t-{i}")).ok for i in range(3)]
        assert [b"X-Request-Id: day0-t-%d" % i in req for i, req in enumerate(keep)] == [True] * len(keep)
        return f.connections, oks

    assert asyncio.run(run(60.0)) == (1, [True] * 3)
    assert asyncio.run(run(0.0)) == (3, [True] * 3)  # never reused once idle: a new connection each


@pytest.mark.parametrize(("response", "kind", "reason"), [
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 24\r\n\r\n{\"error\": \"overloaded\"}\n",
     "http_error", 'http_503: {"error": "overloaded"}'),
    (OK_HEAD + b"zz\r\n" + STREAM, "dropped_stream", "malformed HTTP response"),
    (OK_HEAD + chunked(STREAM[:40])[:-5], "dropped_stream", "server disconnected mid-response"),
    (OK_HEAD + chunked(sse(token("a", 1))), "dropped_stream", "stream ended before [DONE]"),
    (OK_HEAD + chunked(sse(token("a", 1)) + b"data: {\"choi"), "dropped_stream", "stream ended mid-event before [DONE]"),
    (OK_HEAD + chunked(b"data: {not json\n\n"), "malformed_event", "malformed event"),
    (b"", "connection", "server closed the connection before answering"),
    (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\nupstream overloaded\n",
     "http_error", "http_503: upstream overloaded"),  # its body ends at the close
], ids=["http_503", "bad_chunk_size", "cut_mid_body", "no_done", "cut_mid_event", "not_json", "closed_unanswered",
        "http_503_ended_by_close"])
def test_each_broken_answer_is_one_failed_request_that_names_why(response, kind, reason):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(response)
        await w.drain()  # then close: the fake's handler returns

    async def go():
        async with Fake(handler) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert (res.ok, res.error) == (False, kind) and reason in res.reason, res.reason


@pytest.mark.parametrize(("event", "reason"), [
    (b"[" * 100_000, "malformed event: '[[["),
    (b'{"choices": [], "usage": {"completion_tokens": 1e999}}', "usage.completion_tokens is 'inf', not a token count"),
], ids=["nested_past_the_stack", "infinite_usage"])
def test_an_event_python_cannot_take_in_is_that_requests_malformed_event(event, reason):
    """json.loads of 100,000 brackets raises RecursionError and int(1e999) OverflowError: neither is
    a ValueError, and each once left stream_one and ended the whole phase."""
    async def go():
        async with Fake(answering(OK_HEAD + chunked(sse(token("a", 1), event.decode(), "[DONE]"), 4096))) as f, \
                StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert (res.ok, res.error) == (False, "malformed_event") and res.reason.startswith(reason), res.reason


def test_a_final_usage_past_max_tokens_fails_the_request_not_the_figures():
    """REQ asks for 2 tokens: 2 streamed, then a final usage of 200 (100x the truth) cannot be true."""
    body = sse(token("a", 1), token("b", 2), {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 200}},
               "[DONE]")

    async def go():
        async with Fake(answering(OK_HEAD + chunked(body))) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert (res.ok, res.error) == (False, "malformed_event")
    assert res.reason == "usage.completion_tokens 200 is past the request's max_tokens 2"


def _text_messages(k: int, *final_usage: int) -> bytes:
    """``k`` completion messages with text and no usage, then a final usage when given."""
    tail = [{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": u}} for u in final_usage]
    return OK_HEAD + chunked(sse(*[{"choices": [{"index": 0, "text": "a"}]}] * k, *tail, "[DONE]"), 4096)


@pytest.mark.parametrize("final_usage", [(), (2,)], ids=["no_usage", "final_usage_2"])
def test_text_messages_past_max_tokens_fail_the_request(final_usage):
    """REQ asks for 2 tokens; a server ignoring it streamed 400 text messages and passed with 400
    output tokens (no usage) or with ok and no count_mismatch (a final usage of 2)."""
    async def go():
        async with Fake(answering(_text_messages(400, *final_usage))) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert (res.ok, res.error) == (False, "malformed_event")
    assert res.reason == "messages counted as tokens 3 is past the request's max_tokens 2"


@pytest.mark.parametrize(("messages", "usage", "mismatch"), [
    (3, 2, True),  # more one-token messages than usage counts: the per-message figures are not its tokens
    (2, 5, False),  # several tokens a message: what counting by messages expects
    (4, 4, False),
])
def test_text_messages_above_usage_are_a_count_mismatch(messages, usage, mismatch):
    async def go():
        async with Fake(answering(_text_messages(messages, usage))) as f, StreamPool() as pool:
            return await one(pool, f.url(), ClientOptions(extra_body={"max_tokens": 8}))

    res = asyncio.run(go())
    assert res.ok, res.reason
    assert (res.token_source, res.output_tokens, len(res.msg_t)) == ("content", usage, messages)
    assert res.count_mismatch is mismatch


def test_a_closing_usage_after_text_messages_counts_no_token_twice():
    """Older llama.cpp chat streams: one-token deltas without usage, then the closing ``delta: {}``
    with finish_reason and usage, no ``choices: []`` chunk. Before: that closing chunk counted every
    token again (msg_n [1, 1, 2], output_tokens 4 of 2, E2E at the closing chunk, TPOT a third of
    the gap), since a usage's growth was measured from the previous usage, not from what was counted."""
    delta = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
    closing = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}

    async def paced(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD)
        for event in (delta, delta, closing, "[DONE]"):
            w.write(chunked(sse(event), 4096)[:-5])  # one chunk of the body, the terminating one withheld
            await w.drain()
            await asyncio.sleep(0.02)
        w.write(b"0\r\n\r\n")
        await r.read()

    async def go():
        async with Fake(paced) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert res.ok, res.reason
    assert (res.msg_n, res.output_tokens, res.token_source) == ([1, 1], 2, "content")
    # with no usage-only chunk, the closing chunk's usage is the total, and it agrees with the messages
    assert (res.output_tokens_source, res.count_mismatch) == ("usage", False)
    assert tpot_of(res) == pytest.approx(res.msg_t[1] - res.msg_t[0])
    assert len(per_token_itl(res.msg_t, res.msg_n)) == res.output_tokens - 1


def test_a_prompt_count_of_400_digits_fails_the_request_not_the_phase():
    """Before: the count was believed, and the phase's token throughput raised OverflowError
    ("int too large to convert to float"), which ended `day0 latency` with a traceback."""
    huge = '{"choices": [], "usage": {"prompt_tokens": 1' + "0" * 400 + ', "completion_tokens": 2}}'
    body = sse(token("a", 1), token("b", 2), huge, "[DONE]")

    async def go():
        async with Fake(answering(OK_HEAD + chunked(body, 4096))) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert (res.ok, res.error) == (False, "malformed_event")
    assert res.reason.startswith("usage.prompt_tokens is '1000") and res.reason.endswith("not a token count")


def test_a_line_without_end_is_that_requests_malformed_event_at_the_cap(monkeypatch):
    """A 200 whose ``data:`` line never ends was kept whole until request_timeout_s (300 s)."""
    from day0.client import sse as sse_mod

    monkeypatch.setattr(sse_mod, "EVENT_MAX_BYTES", 1 << 20)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + b"6\r\ndata: \r\n")
        block = b"x" * (64 << 10)
        while True:
            w.write(b"%x\r\n%s\r\n" % (len(block), block))
            await w.drain()

    async def go():
        async with Fake(handler) as f, StreamPool() as pool:
            return await one(pool, f.url(), ClientOptions(request_timeout_s=60))

    res = asyncio.run(go())
    assert (res.ok, res.error) == (False, "malformed_event")
    assert res.reason == "a line of the event stream goes on past 1 MiB without an end"


def test_whatever_a_streams_reader_raises_fails_that_request_only(monkeypatch):
    """stream_one never raises: an exception no branch foresaw is that request's client_error."""
    from day0.client import stream

    def boom(self, data: str) -> int:
        raise ZeroDivisionError("unforeseen")

    monkeypatch.setattr(stream.TokenAccountant, "tokens_in", boom)

    async def go():
        async with Fake(answering(OK_HEAD + chunked(STREAM))) as f, StreamPool() as pool:
            return await one(pool, f.url())

    res = asyncio.run(go())
    assert (res.ok, res.error, res.reason) == (False, "client_error", "ZeroDivisionError: unforeseen")


def test_a_cancelled_request_closes_its_connection_so_the_server_stops():
    async def go():
        eof = asyncio.Event()

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await read_request(r)
            w.write(OK_HEAD + b"%x\r\n%s\r\n" % (len(sse(token("a", 1))), sse(token("a", 1))))
            await w.drain()
            await r.read()  # returns at the client's close
            eof.set()

        async with Fake(handler) as f, StreamPool() as pool:
            task = asyncio.create_task(one(pool, f.url()))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(eof.wait(), 5)
            return eof.is_set()

    assert asyncio.run(go())


def test_a_stalled_answer_times_out_on_the_stall_limit_not_the_total():
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + b"%x\r\n%s\r\n" % (len(sse(token("a", 1))), sse(token("a", 1))))
        await w.drain()
        await asyncio.sleep(10)

    async def go():
        async with Fake(handler) as f, StreamPool() as pool:
            return await one(pool, f.url(), ClientOptions(stall_timeout_s=0.3, request_timeout_s=30))

    res = asyncio.run(go())
    assert (res.error, res.reason) == ("timeout", "no data for 0.3 s (stalled)")
    assert res.msg_n == [1] and 0.3 <= res.finished - res.sent < 5


def test_a_header_that_would_break_the_framing_is_refused_before_anything_is_sent():
    async def go():
        async with Fake(answering(OK_HEAD + chunked(STREAM))) as f, StreamPool() as pool:
            res = await one(pool, f.url(), ClientOptions(headers={"X-Tenant": "a\r\nX-Admin: 1"}))
        return res, f.connections

    res, connections = asyncio.run(go())
    assert res.error == "client_error" and "'X-Tenant'" in res.reason and connections == 0


def test_request_head_and_targets():
    t = parse_target("http://[::1]:8000/v1/completions?x=1")
    assert t == Target("http", "::1", 8000, "/v1/completions?x=1") and t.host_header == "[::1]:8000"
    assert parse_target("https://example.org/v1").host_header == "example.org"
    head = request_head(parse_target("http://h:80/p"), {"content-type": "application/json; x=1", "Authorization": "Bearer k"}, 12)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /p HTTP/1.1" and "Host: h" in lines and "Content-Length: 12" in lines
    assert "content-type: application/json; x=1" in lines and "Content-Type: application/json" not in lines
    assert head.endswith(b"\r\n\r\n")
    for bad in ("ftp://h/x", "http:///x", "http://user:pw@h/x", "http://h:99999/x"):
        with pytest.raises(ValueError):
            parse_target(bad)


def self_signed(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the fake server's TLS context, a client context trusting only its certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return server, ssl.create_default_context(cafile=str(tmp / "cert.pem"))


def test_https_is_verified_and_streams_like_http(tmp_path):
    server_tls, trusting = self_signed(tmp_path)

    async def go(pool_tls: ssl.SSLContext | None):
        async with Fake(answering(OK_HEAD + chunked(STREAM)), tls=server_tls) as f, StreamPool(tls=pool_tls) as pool:
            return await one(pool, f.url("https"))

    res = asyncio.run(go(trusting))
    assert res.ok and res.msg_n == [1, 1], res.reason
    res = asyncio.run(go(None))  # the system's trust store has never heard of it
    assert res.error == "connection" and "CERTIFICATE_VERIFY_FAILED" in res.reason, res.reason
