"""Hostile inputs, part 4: misbehaving streaming servers and bad arguments to ``day0 latency``.

A deployment that answers with error pages, torn streams, garbage or nothing at all must never
produce a passing latency run, must not hang the client, and an unusable URL or key is one line
with exit 2. The server is the scripted one (tests/support/sse_server.py), in its own process, with a
script set per case; ``day0 latency`` runs under the corpus's time and memory bounds (hostile.py).
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from tests.support import hostile
from tests.support.sse_server import Script

BASE = ["latency", "--vocab-size", "300", "--num-requests", "4", "--warmup", "2", "--concurrency", "2",
        "--output-len", "4", "--input-len", "8", "--no-server-metrics"]


def _checks(path: Path) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(path.read_text())}


# Every measured request misbehaves in one way: the run fails on the error rate, names the kind,
# and no figure is reported as a pass over zero samples.
@pytest.mark.parametrize("kind,reason", [("http500", "http_error"), ("drop", "dropped_stream"),
                                         ("malformed", "malformed_event"), ("error_event", "server_error")])
def test_every_request_misbehaves(server, tmp_path, kind, reason):
    server.set_script(Script(errors={str(i): kind for i in range(4)}))
    out = hostile.day0(*BASE, "--url", server.url, "--json", tmp_path / "c.json")
    assert out.code == 1, out.explain()
    checks = _checks(tmp_path / "c.json")
    assert checks["latency.error_rate"]["status"] == "fail" and reason in checks["latency.error_rate"]["message"]
    assert checks["latency.ttft_p99"]["status"] != "pass"
    assert "Traceback" not in out.stderr


def test_one_bad_request_in_four_fails_a_zero_error_sla(server, tmp_path):
    server.set_script(Script(errors={"2": "drop"}))
    out = hostile.day0(*BASE, "--url", server.url, "--json", tmp_path / "c.json")
    assert out.code == 1, out.explain()
    assert _checks(tmp_path / "c.json")["latency.error_rate"]["value"] == pytest.approx(0.25)


@pytest.mark.parametrize("kind", ["http500", "malformed", "drop"])
def test_a_warm_up_that_fails_entirely_fails_the_run(server, tmp_path, kind):
    """Warm-up results were discarded unread: 4 of 4 HTTP 500s left the run at exit 0."""
    server.set_script(Script(errors={"warmup:0": kind, "warmup:1": kind}))
    out = hostile.day0(*BASE, "--url", server.url, "--json", tmp_path / "c.json")
    assert out.code == 1, out.explain()
    warm = _checks(tmp_path / "c.json")["latency.warmup"]
    assert warm["status"] == "fail" and "every one of the 2 warm-up requests failed" in warm["message"]


def test_a_partly_failed_warm_up_is_named(server, tmp_path):
    server.set_script(Script(errors={"warmup:1": "http500"}))
    out = hostile.day0(*BASE, "--url", server.url, "--json", tmp_path / "c.json")
    assert out.code == 0, out.explain()
    warm = _checks(tmp_path / "c.json")["latency.warmup"]
    assert warm["status"] == "pass" and warm["message"].startswith("warning: 1 of 2 warm-up requests failed")


def test_a_stalled_stream_is_cut_by_the_stall_timeout_not_waited_for(server, tmp_path):
    """A server that stops sending mid-stream for 30 s: the request fails as a stall once the
    client's stall timeout (1 s here) passes; nobody waits the 30 s."""
    server.set_script(Script(errors={"1": "stall"}, stall_s=30.0))
    out = hostile.day0(*BASE, "--url", server.url, "--stall-timeout", "1", "--json", tmp_path / "c.json",
                       timeout_s=25)
    assert out.code == 1, out.explain()
    rate = _checks(tmp_path / "c.json")["latency.error_rate"]
    assert rate["status"] == "fail" and "timeout: 1" in rate["message"]


def test_a_request_timeout_bounds_a_slow_first_token(server, tmp_path):
    server.set_script(Script(ttft_ms=[20.0, 20_000.0]))
    out = hostile.day0(*BASE, "--url", server.url, "--request-timeout", "1", "--json", tmp_path / "c.json",
                       timeout_s=25)
    assert out.code == 1, out.explain()
    assert _checks(tmp_path / "c.json")["latency.error_rate"]["status"] == "fail"


def test_a_stall_inside_the_timeout_is_judged_by_the_sla(server, tmp_path):
    """A 3 s pause under a 60 s stall timeout is latency, not an error: the TPOT limit catches it."""
    server.set_script(Script(errors={"1": "stall"}, stall_s=3.0))
    out = hostile.day0(*BASE, "--url", server.url, "--tpot-p99-ms", "200", "--json", tmp_path / "c.json")
    assert out.code == 1, out.explain()
    assert _checks(tmp_path / "c.json")["latency.tpot_p99"]["status"] == "fail"


def test_no_usage_and_no_continuous_usage_still_counts_tokens(server, tmp_path):
    server.set_script(Script(usage=False, continuous_usage=False))
    out = hostile.day0(*BASE, "--url", server.url, "--no-continuous-usage", "--json", tmp_path / "c.json")
    assert out.code in (0, 1), out.explain()
    assert "Traceback" not in out.stderr


# --------------------------------------------------------------------------- unusable URLs and keys


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url,problem", [
    ("not a url", "not an http(s) URL"),
    ("ftp://example.invalid/x", "not an http(s) URL"),
    ("http://", "not an http(s) URL"),
    ("http://127.0.0.1:99999", "port"),
    ("http://127.0.0.1:abc", "port"),
])
def test_malformed_urls_are_refused(url, problem):
    hostile.refused(hostile.day0(*BASE, "--url", url, "--model", "m"), "--url", problem=problem)


def test_nothing_listening_is_unusable_not_a_measurement():
    url = f"http://127.0.0.1:{_closed_port()}"
    hostile.refused(hostile.day0(*BASE, "--url", url, "--model", "m"), url, problem="cannot connect")


def test_a_server_that_accepts_and_says_nothing_does_not_hang(tmp_path):
    """A TCP listener that never answers: /v1/models times out after the stall timeout (the read
    timeout of every request); the command ends with one line naming the URL."""
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(16)
        url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
        out = hostile.day0(*BASE, "--url", url, "--stall-timeout", "2", timeout_s=60)
    line = hostile.refused(out, url, problem="cannot list models")
    assert "Timeout" in line


def test_a_server_that_answers_garbage_for_models(tmp_path):
    """Not HTTP at all: bytes and a close. The model list cannot be read; one line names the URL."""
    stop = threading.Event()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    lsock.settimeout(0.2)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"\x00\xffNOT HTTP\r\n\r\n" * 10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
        out = hostile.day0(*BASE, "--url", url)
    finally:
        stop.set()
        t.join(5)
        lsock.close()
    line = hostile.refused(out, url, problem="cannot list models")
    assert "\x00" not in line


def test_an_unset_api_key_variable_is_refused(server):
    hostile.refused(hostile.day0(*BASE, "--url", server.url, "--api-key-env", "DAY0_NO_SUCH_VARIABLE"),
                    "--api-key-env", "DAY0_NO_SUCH_VARIABLE", problem="not set")


def test_a_key_pasted_where_its_variable_goes_is_refused_without_repeating_it(server):
    """--api-key-env takes a variable's name; a key given there came back in the refusal before."""
    out = hostile.day0(*BASE, "--url", server.url, "--api-key-env", "sk-Pasted-Canary-0452")
    hostile.refused(out, "--api-key-env", problem="not an environment variable name")
    assert "sk-Pasted-Canary-0452" not in out.stdout + out.stderr
    # a hex key is a valid name: refused as not set, and not named, since it is not in capitals
    hexkey = "e3b0c44298fc1c149afbf4c8996fb924"
    out = hostile.day0(*BASE, "--url", server.url, "--api-key-env", hexkey)
    hostile.refused(out, "--api-key-env", problem="not set")
    assert hexkey not in out.stdout + out.stderr


def test_the_api_key_is_sent_and_never_printed(server, tmp_path):
    """--api-key-env: the key goes out as a bearer header (the scripted server logs the header it
    saw) and appears in neither the output nor the JSON checks."""
    server.set_script(Script())
    key = "sk-streaming-canary-0451"
    out = hostile.day0(*BASE, "--url", server.url, "--api-key-env", "DAY0_TEST_KEY", "--json", tmp_path / "c.json",
                       env={"DAY0_TEST_KEY": key})
    assert out.code == 0, out.explain()
    assert key not in out.stdout + out.stderr and key not in (tmp_path / "c.json").read_text()
    seen = {entry.get("authorization") for entry in server.log()}
    assert seen == {f"Bearer {key}"}


@pytest.mark.parametrize("flag,value,problem", [
    ("--num-requests", "-1", "--num-requests"),
    ("--concurrency", "-1", "concurrency"),
    ("--rate", "0", "--rate: "),
    ("--input-len", "9:3", "--input-len: "),
    ("--vocab-size", "0", "--vocab-size"),
])
def test_bad_load_flags_are_one_line(server, flag, value, problem):
    args = [a for a in BASE]
    if flag in args:
        i = args.index(flag)
        args[i + 1] = value
    else:
        args += [flag, value]
    hostile.refused(hostile.day0(*args, "--url", server.url), problem=problem)
