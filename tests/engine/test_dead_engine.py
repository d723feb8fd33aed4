"""An engine whose core died behind a live front end: the run must call it dead, with the cause.

vLLM's API server outlives a crashed engine core: /health answers 503, every request 500 (measured
with expert parallelism on CPU, a segfault in the fused-MoE kernel). The server here is a labelled
fake, an HTTP server answering /health with a scripted status, beside the real log of that crash.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from day0.config.profile import load_profile
from day0.engine.engines import Engines
from day0.engine.handle import EngineError, EngineInfo
from day0.engine.server import ServerEngine
from tests.support import DATA


def _health_server(status: int) -> ThreadingHTTPServer:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def engine(tmp_path):
    """A ServerEngine whose process is a live stand-in and whose log is a real crash log."""
    procs, servers = [], []

    def make(health: int, log_name: str = "engine-ep-segfault.log") -> ServerEngine:
        server = _health_server(health)
        servers.append(server)
        eng = ServerEngine(load_profile("cpu-tiny"), tmp_path, lambda _: None)
        shutil.copy(DATA / log_name, eng.log_path)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        procs.append(proc)
        eng.procs = [("node0", proc, eng.log_path)]
        eng.info = EngineInfo(mode="server", view="http", model="m", served_model_name="m",
                              base_url=f"http://127.0.0.1:{server.server_address[1]}")
        return eng

    yield make
    for proc in procs:
        proc.kill()
        proc.wait()
    for server in servers:
        server.shutdown()


def test_a_front_end_answering_503_is_dead_and_names_the_crash(engine):
    reason = engine(503).alive()
    assert reason == ("vLLM server up but not serving (/health answered 503): "
                      "segmentation fault in cpu_fused_moe.cpp:242 (fused_moe_impl)")


def test_a_healthy_front_end_is_alive_whatever_its_log_says(engine):
    assert engine(200).alive() is None


def test_the_session_turns_a_dead_engine_into_the_error_every_later_stage_gets(engine, tmp_path):
    engines = Engines(load_profile("cpu-tiny"), tmp_path, lambda _: None)
    dead = engine(503)
    engines._engines["http"] = dead
    error = engines.dead()
    assert isinstance(error, EngineError) and "cpu_fused_moe.cpp:242" in str(error)
    assert "Segfault encountered" in error.log_excerpt
    assert dead.procs == []  # stopped at once, not left answering 500 until the session ends
    with pytest.raises(EngineError, match="cpu_fused_moe.cpp:242"):
        engines.http()  # no second start: the same cause, immediately
    assert engines.dead() is error  # a handle taken before the death fails later with the same cause


def test_a_serving_engine_is_not_declared_dead(engine, tmp_path):
    engines = Engines(load_profile("cpu-tiny"), tmp_path, lambda _: None)
    engines._engines["http"] = engine(200)
    assert engines.dead() is None and "http" in engines._engines


def test_a_port_answering_something_that_is_not_http_is_not_serving(engine):
    """What listens on the engine's port is not vLLM's server (a port drawn on a node that something
    else took): /health gets bytes that are not HTTP. A reason, not a traceback."""
    from tests.support.raw_server import raw_server

    eng = engine(200)
    listener, url = raw_server(lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"))
    try:
        eng.info = dataclasses.replace(eng.info, base_url=url)
        assert eng.alive() == ("vLLM server up but not serving (/health answered something that is not HTTP "
                               "(BadStatusLine)): segmentation fault in cpu_fused_moe.cpp:242 (fused_moe_impl)")
        assert eng._healthy() is False
    finally:
        listener.close()


@pytest.mark.parametrize("models", [[{"id": "m"}], {"data": ["m"]}, {"data": None}, {"data": [{"id": 3}]}])
def test_an_external_server_whose_model_list_is_not_openais_is_one_line(tmp_path, models):
    import json

    from day0.engine.external import ExternalEngine

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(models).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        profile = load_profile("cpu-tiny", overrides={"engine": {"mode": "external", "url": url}})
        with pytest.raises(EngineError) as err:
            ExternalEngine(profile, lambda _: None).start()
    finally:
        server.shutdown()
    assert str(err.value) == (f"external engine {url}: /v1/models is not OpenAI's model list "
                              f'({{"data": [{{"id": ...}}]}}): {models!r}')
