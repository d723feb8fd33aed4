"""The measured run's engine view is read from two /metrics scrapes: a scrape pair that cannot be
compared (the server restarted between them) leaves the client's figures measured and the engine's
view marked not measured with the reason, instead of throwing the whole run away. The server is a
labelled fake: a threaded HTTP server streaming a fixed 4-token answer and a scripted /metrics."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from day0.config.latency import LatencySection
from day0.stages.latency.run import run_latency

TTFT = "vllm:time_to_first_token_seconds"
STREAM = b"".join(b"data: %s\n\n" % e for e in (
    *(b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":%d}}' % k for k in (1, 2, 3, 4)),
    b'{"choices":[],"usage":{"completion_tokens":4,"prompt_tokens":4}}', b"[DONE]"))


def histogram(n: int) -> bytes:
    return (f'# TYPE {TTFT} histogram\n{TTFT}_bucket{{le="0.1"}} {n}\n{TTFT}_bucket{{le="+Inf"}} {n}\n'
            f"{TTFT}_sum {n * 0.01}\n{TTFT}_count {n}\n").encode()


@pytest.fixture
def restarting_server() -> Iterator[str]:
    """/metrics counts 100 requests at the first scrape and 5 at every later one: an engine that
    restarted between the run's two scrapes."""
    scrapes = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            scrapes[0] += 1
            self.answer(histogram(100 if scrapes[0] == 1 else 5), "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.answer(STREAM, "text/event-stream")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_restart_between_the_scrapes_keeps_the_client_figures(restarting_server):
    settings = LatencySection.from_table({"num_requests": 8, "warmup_requests": 0, "concurrency": 2,
                                          "input_len": 4, "output_len": 4, "workers": 1})
    run = run_latency(restarting_server, "m", 100, settings)
    assert run.metrics.completed == 8
    assert run.server is None
    assert run.server_error == f"{TTFT}: counts went down between scrapes (server restarted?)"
