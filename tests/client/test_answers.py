"""What day0 reads whole from a server it does not time (/metrics, /v1/models) is bounded in size
and in time: a hostile or broken server answering without end, or a byte at a time, is one error
naming the URL, not a client that grows without bound (a probe grew it to 18 GB) or waits for ever.
The servers are labelled fakes: a raw socket answering with a scripted body."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest

from day0.client import prom
from day0.client.stream import ClientOptions, data_events, fetch_models, make_session
from tests.support.raw_server import raw_server


def _serve(kind: str) -> tuple[socket.socket, str]:
    """An HTTP/1.1 200 whose body never ends: ``flood`` sends 64 KiB chunks as fast as it can,
    ``drip`` a byte every 0.2 s (each read well inside any read timeout)."""
    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        while True:
            if kind == "flood":
                conn.sendall(b"# HELP x y\n" * 6000)
            else:
                conn.sendall(b"#")
                time.sleep(0.2)

    return raw_server(endless)


async def _both(url: str) -> tuple[BaseException | None, BaseException | None]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=5)) as session:
        out: list[BaseException | None] = []
        for call in (prom.scrape(session, url), fetch_models(session, url)):
            try:
                await call
                out.append(None)
            except Exception as exc:  # noqa: BLE001 (what each raised is the assertion)
                out.append(exc)
        return out[0], out[1]


@pytest.mark.parametrize("kind", ["flood", "drip"])
def test_an_answer_without_end_is_one_error_naming_the_url(monkeypatch, kind):
    monkeypatch.setattr(prom, "ANSWER_MAX_BYTES", 1 << 20)
    monkeypatch.setattr(prom, "ANSWER_MAX_S", 2.0)
    listener, url = _serve(kind)
    try:
        metrics, models = asyncio.run(_both(url))
    finally:
        listener.close()
    why = "ValueError: its answer goes on past 1 MiB" if kind == "flood" else "TimeoutError"
    assert isinstance(metrics, prom.PromError) and str(metrics).startswith(f"{url}/metrics: {why}"), metrics
    assert isinstance(models, RuntimeError) and str(models).startswith(f"{url}/v1/models: cannot list models ({why}")


@pytest.mark.parametrize("kind", ["flood", "drip"])
def test_the_blocking_scrape_is_bounded_the_same_way(monkeypatch, kind):
    """scrape_sync (kvcache, weights) read until its size cap: a drip inside its per-read timeout held
    those stages for ever. It runs on a thread here so that, unbounded, the test fails, not hangs."""
    import threading

    monkeypatch.setattr(prom, "ANSWER_MAX_BYTES", 1 << 20)
    monkeypatch.setattr(prom, "ANSWER_MAX_S", 2.0)
    listener, url = _serve(kind)
    out: list[BaseException | str] = []

    def scrape() -> None:
        try:
            out.append(prom.scrape_sync(url))
        except Exception as exc:  # noqa: BLE001 (what it raised is the assertion)
            out.append(exc)

    worker = threading.Thread(target=scrape, daemon=True)
    worker.start()
    worker.join(30)
    listener.close()
    why = "its answer goes on past 1 MiB" if kind == "flood" else "TimeoutError: its answer took past 2 s"
    assert out, "scrape_sync still reading after 30 s"
    assert isinstance(out[0], prom.PromError) and str(out[0]) == f"{url}/metrics: {why}", out


def test_a_stream_read_through_make_session_ends_at_its_request_timeout():
    """Parity and agents read streams through data_events on make_session's session: a server sending
    an event every 0.1 s for ever (each read inside the stall timeout) held them for ever; now the
    session's total timeout, request_timeout_s, ends it with a TimeoutError their callers report."""
    def drip(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        while True:
            conn.sendall(b'data: {"choices": [{"text": "a"}]}\n\n')
            time.sleep(0.1)

    async def read(url: str) -> tuple[asyncio.Task, int]:
        got = 0

        async def consume() -> None:
            nonlocal got
            opts = ClientOptions(request_timeout_s=1.0, stall_timeout_s=5.0)
            async with make_session(opts) as session, session.post(url, json={}) as resp:
                async for _ in data_events(resp):
                    got += 1

        task = asyncio.ensure_future(consume())
        await asyncio.wait({task}, timeout=30)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return task, got

    listener, url = raw_server(drip)
    try:
        task, got = asyncio.run(read(url + "/v1/completions"))
    finally:
        listener.close()
    assert got > 0 and not task.cancelled() and isinstance(task.exception(), TimeoutError), task


def _in_thread(url: str) -> list[BaseException | str]:
    """scrape_sync's answer (or what it raised) on a thread joined for 30 s, so a scrape the deadline
    does not stop fails the test instead of hanging it."""
    import threading

    out: list[BaseException | str] = []

    def scrape() -> None:
        try:
            out.append(prom.scrape_sync(url, timeout_s=1.0))
        except Exception as exc:  # noqa: BLE001 (what it raised is the assertion)
            out.append(exc)

    worker = threading.Thread(target=scrape, daemon=True)
    worker.start()
    worker.join(30)
    return out


def test_a_head_trickled_inside_the_read_timeout_ends_at_the_deadline(monkeypatch):
    """urlopen bounded only the body by ANSWER_MAX_S: a status line and headers sent a byte every
    0.2 s (each read inside the 1 s read timeout) held a 2 s deadline for the whole head (38 s)."""
    monkeypatch.setattr(prom, "ANSWER_MAX_S", 2.0)

    def trickle(conn: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100_000:
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    listener, url = raw_server(trickle)
    try:
        out = _in_thread(url)
    finally:
        listener.close()
    assert out, "scrape_sync still reading its head after 30 s"
    assert isinstance(out[0], prom.PromError), out
    assert str(out[0]) == f"{url}/metrics: TimeoutError: its answer took past 2 s"


def test_a_redirect_is_followed_and_a_loop_of_them_refused():
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nvllm:x 1\n")

    target, target_url = raw_server(answer)

    def moved(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {target_url}/metrics/\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())

    def loop(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /metrics\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    first, first_url = raw_server(moved)
    again, again_url = raw_server(loop)
    try:
        assert _in_thread(first_url) == ["vllm:x 1\n"]
        out = _in_thread(again_url)
    finally:
        for s in (target, first, again):
            s.close()
    assert isinstance(out[0], prom.PromError) and str(out[0]) == f"{again_url}/metrics: ValueError: more than 5 redirects"
