"""A loopback OpenAI-style streaming server with a scripted timing schedule (tests only).

It runs in its own process so its timing does not share an event loop or the GIL with the
client under test. Each request's schedule is a pure function of the script and the request
index (from the ``X-Request-Id`` header the load generator sends), so a test can compute the
truth it expects the client to report: see :func:`schedule`. The server also keeps what it
actually emitted (``GET /_log``) and exposes vLLM-named Prometheus histograms of its own
emission times on ``/metrics`` (optionally biased, to provoke a disagreement).

Run: ``python tests/support/sse_server.py [--script JSON]``; prints ``LISTENING <port>``, serves on
127.0.0.1 until SIGTERM or until its stdin closes (so a dead parent never leaves it behind).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

# vLLM's bucket edges (v1/metrics/loggers.py) so interpolation behaves like against vLLM.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0]
ERROR_KINDS = ("http500", "drop", "malformed", "stall", "error_event")


@dataclass
class Script:
    """The schedule and misbehaviour of every request; JSON-able so it crosses the process."""

    ttft_ms: list[float] = field(default_factory=lambda: [20.0])  # by request index, cycled
    gaps_ms: list[float] = field(default_factory=lambda: [5.0])  # before message k+1, cycled over k
    tokens_per_message: list[int] = field(default_factory=lambda: [1])  # cycled over the message number
    empty_text_every: int = 0  # every Nth message has text "" (a token that is half a UTF-8 char)
    role_chunk_ms: float | None = 1.0  # chat: role-only chunk this long after receipt
    continuous_usage: bool = True  # honour stream_options.continuous_usage_stats
    usage: bool = True  # honour stream_options.include_usage (final usage chunk)
    errors: dict[str, str] = field(default_factory=dict)  # "<index>" (measure) or "<phase>:<index>" -> kind
    error_after_messages: int = 2
    stall_s: float = 30.0
    metrics_ttft_bias_ms: float = 0.0  # added to TTFT on /metrics
    itl_metric: str = "vllm:inter_token_latency_seconds"  # or vllm:time_per_output_token_seconds
    spin: bool = False  # exact emission times; off by default (the log records the real ones)
    empty_text_at: list[int] = field(default_factory=list)  # these message numbers (0 = first) have text ""
    index_by_arrival: bool = False  # a request without a day0 X-Request-Id gets the next number, not 0
    # Parity mode (/v1/completions only): greedy token ids and top logprobs that are a pure function
    # of the prompt, streamed or whole, so the parity stage's comparisons see equal answers, except
    # where ``diverge`` says: "repeat" (the same prompt and cache_salt a second time), "batch" (another
    # request in flight), "stream" (a streamed request). The faulty step picks the runner-up, ~3 nats
    # behind: a divergence, not a near-tie.
    parity: bool = False
    diverge: list[str] = field(default_factory=list)
    diverge_at: int = 3
    # Capacity mode: at most ``slots`` requests served at once, the rest wait (FIFO) for a slot, so a
    # request holds one for its whole schedule and the server sustains slots / service time req/s
    # (see :func:`capacity`); past it the queue, and every TTFT, grows without bound. 0: no limit.
    slots: int = 0
    # Drift: every request's schedule (first token and gaps) stretched by drift[w], w the number of
    # ``drift_period_s`` windows since the server's first generation request began (cycled), so the
    # edge moves as a shared host's does, on a known schedule. Empty: a steady server.
    drift: list[float] = field(default_factory=list)
    drift_period_s: float = 5.0

    def stretch_at(self, elapsed_s: float) -> float:
        """The drift of the window ``elapsed_s`` after the first request began (1 when steady): the
        one reading of the schedule, for the server and for :func:`queue_percentile` alike."""
        return self.drift[int(elapsed_s / self.drift_period_s) % len(self.drift)] if self.drift else 1.0
    # Refuse every generation request with this HTTP status (0: serve it), with a body quoting what the
    # client sent: ``{authorization}`` becomes its Authorization header, as a server echoing a bad key does.
    reject_status: int = 0
    reject_body: str = '{"error": "invalid credentials: {authorization}"}'
    model_id: str = "scripted"  # what /v1/models lists (a hostile id: escape sequences, newlines)


def schedule(script: Script, index: int, max_tokens: int) -> list[tuple[float, int]]:
    """(seconds after receipt, tokens) of each token-carrying message: the scripted truth."""
    out: list[tuple[float, int]] = []
    t = script.ttft_ms[index % len(script.ttft_ms)] / 1000.0
    left, k = max_tokens, 0
    while left > 0:
        n = min(script.tokens_per_message[k % len(script.tokens_per_message)], left)
        out.append((t, n))
        left -= n
        t += script.gaps_ms[k % len(script.gaps_ms)] / 1000.0
        k += 1
    return out


def capacity(script: Script, max_tokens: int) -> float:
    """Requests per second a ``slots`` server sustains as scripted: slots / the service time of one
    request (its last message's offset; the script must give every request the same schedule). On
    a busy host the server's sleeps overshoot and it sustains less: :func:`served_capacity`."""
    return script.slots / schedule(script, 0, max_tokens)[-1][0]


def served_capacity(script: Script, log: list[dict[str, Any]]) -> float:
    """What a ``slots`` server sustained: slots / the median time a request held its slot (``held_s``
    in the log), so a test compares with the capacity the server had, not the one it was given."""
    held = sorted(e["held_s"] for e in log if "held_s" in e)
    return script.slots / held[len(held) // 2]


def queue_percentile(script: Script, rate: float, max_tokens: int, p: float = 99.0, n: int = 200_000,
                     seed: int = 1) -> float:
    """The p-th percentile TTFT (s) a ``slots`` server gives ``n`` Poisson arrivals at ``rate``, as
    scripted (sleeps exact), its ``drift`` windows included: a long run's figure, the truth a tool's
    short points estimate. Event by event: FIFO, a request starts when a slot frees, its first
    token ``ttft_ms`` x the drift of the window it started in after that."""
    rng, t, out = random.Random(seed), 0.0, []
    free = [0.0] * script.slots
    service, first = schedule(script, 0, max_tokens)[-1][0], script.ttft_ms[0] / 1000.0
    for _ in range(n):
        t += rng.expovariate(rate)
        start = max(t, heapq.heappop(free))
        f = script.stretch_at(start)
        heapq.heappush(free, start + service * f)
        out.append(start - t + first * f)
    out.sort()
    return out[min(n - 1, int(p / 100.0 * n))]


def queue_edge(script: Script, limit_s: float, max_tokens: int, p: float = 99.0) -> float:
    """The highest rate (req/s, to 0.1%) whose long-run p-th percentile TTFT is within ``limit_s``
    (:func:`queue_percentile`): the long-run truth a capacity answer on this script estimates
    (short points, starting near an empty queue, land above it: docs/stages/capacity-evidence.md, "The long run
    is the truth, and short points overshoot it")."""
    lo, hi = 0.0, capacity(script, max_tokens) / min(script.drift or [1.0])  # past it every window queues
    while hi - lo > hi * 0.001:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if queue_percentile(script, mid, max_tokens, p) <= limit_s else (lo, mid)
    return lo


def _parse_rid(rid: str) -> tuple[str, int]:
    m = re.match(r"^day0-(\w+)-[0-9a-f]+-(\d+)$", rid or "")
    return (m.group(1), int(m.group(2))) if m else ("measure", 0)


async def _sleep_until(target: float, spin: bool) -> None:
    """Sleep to a deadline; spinning the last 1.5 ms beats epoll's 1 ms rounding but burns a core."""
    remaining = target - time.perf_counter()
    if remaining > (0.0015 if spin else 0.0):
        await asyncio.sleep(remaining - (0.0015 if spin else 0.0))
    while spin and time.perf_counter() < target:
        await asyncio.sleep(0)


def build_app(script: Script):
    from aiohttp import web
    from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

    state: dict[str, Any] = {"script": script, "log": []}
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    h_ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", labels, buckets=TTFT_BUCKETS, registry=reg)
    h_tpot = Histogram("vllm:request_time_per_output_token_seconds", "tpot", labels, buckets=ITL_BUCKETS,
                       registry=reg)
    h_e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", labels, buckets=E2E_BUCKETS, registry=reg)
    itl_hists = {name: Histogram(name, "itl", labels, buckets=ITL_BUCKETS, registry=reg)
                 for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")}
    lv = {"model_name": "scripted", "engine": "0"}
    # vLLM's request gauges: being served, and (capacity mode) waiting for a slot
    g_running = Gauge("vllm:num_requests_running", "running", labels, registry=reg).labels(**lv)
    g_waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=reg).labels(**lv)

    def chunk(obj: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    async def parity_answer(request: web.Request, body: dict[str, Any], t0: float) -> web.StreamResponse:
        """A greedy completion with logprobs in parity mode (see Script.parity)."""
        sc: Script = state["script"]
        text = str(body.get("prompt"))
        seen = state.setdefault("seen", set())
        repeat = (text, body.get("cache_salt")) in seen
        seen.add((text, body.get("cache_salt")))
        stream, n = bool(body.get("stream")), int(body.get("max_tokens") or 16)
        ids = [zlib.crc32(w.encode()) % 300 + 10 for w in text.split()]
        seed = zlib.crc32(text.encode())
        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n,
                 "prompt_tokens_details": {"cached_tokens": len(ids) // 32 * 32 if repeat else 0}}
        base = {"id": "cmpl-parity", "created": 0, "model": body.get("model", "scripted"), "object": "text_completion"}
        state["inflight"] = state.get("inflight", 0) + 1
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
        tokens, tops = [], []
        try:
            for k in range(n):
                await _sleep_until(t0 + (sc.ttft_ms[0] + k * sc.gaps_ms[0]) / 1000.0, False)
                tok = 10 + (seed + 31 * k) % 300
                faulty = k == sc.diverge_at and (("repeat" in sc.diverge and repeat) or (
                    "batch" in sc.diverge and state["inflight"] > 1) or ("stream" in sc.diverge and stream))
                pick, other = (tok + 1, tok) if faulty else (tok, tok + 1)
                top = {f"token_id:{pick}": -0.05, f"token_id:{other}": -3.0}
                tokens.append(pick)
                tops.append(top)
                if resp is not None:
                    choice = {"index": 0, "text": "w", "token_ids": [pick], "logprobs": {"top_logprobs": [top]},
                              "finish_reason": "length" if k == n - 1 else None}
                    if k == 0:
                        choice["prompt_token_ids"] = ids
                    await resp.write(chunk({**base, "choices": [choice]}))
        finally:
            state["inflight"] -= 1
        if resp is None:
            return web.json_response({**base, "usage": usage, "choices": [{
                "index": 0, "text": "w" * n, "token_ids": tokens, "prompt_token_ids": ids,
                "logprobs": {"top_logprobs": tops}, "finish_reason": "length"}]})
        await resp.write(chunk({**base, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def slots(n: int) -> asyncio.Semaphore:
        if state.get("slots") is None or state["slots"][0] != n:
            state["slots"] = (n, asyncio.Semaphore(n))
        return state["slots"][1]

    async def generate(request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        sc: Script = state["script"]
        body = await request.json()
        if not sc.slots:
            with g_running.track_inprogress():
                return await serve(request, body, t0)
        with g_waiting.track_inprogress():
            await slots(sc.slots).acquire()  # the schedule starts when a slot frees: the wait is TTFT
        try:
            with g_running.track_inprogress():
                acquired = time.perf_counter()
                # vLLM's TTFT and E2E histograms run from the request's arrival, its wait in the queue included
                resp = await serve(request, body, acquired, waited=acquired - t0)
                if "entry" in request:  # how long the slot was held: the capacity the server really had
                    request["entry"]["held_s"] = time.perf_counter() - acquired
                return resp
        finally:
            slots(sc.slots).release()

    async def serve(request: web.Request, body: dict[str, Any], t0: float,
                    waited: float = 0.0) -> web.StreamResponse:
        sc: Script = state["script"]
        chat = request.path.endswith("/chat/completions")
        if sc.parity and not chat:
            return await parity_answer(request, body, t0)
        rid = request.headers.get("X-Request-Id", "")
        phase, index = _parse_rid(rid)
        if sc.index_by_arrival and not re.match(r"^day0-\w+-[0-9a-f]+-\d+$", rid):
            index = state["arrivals"] = state.get("arrivals", -1) + 1  # other clients (GuideLLM) send no such id
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        prompt = body.get("prompt") if not chat else body["messages"][-1]["content"]
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        so = body.get("stream_options") or {}
        cont = sc.continuous_usage and bool(so.get("continuous_usage_stats"))
        final_usage = sc.usage and bool(so.get("include_usage"))
        want_ids = bool(body.get("return_token_ids"))
        err = sc.errors.get(str(index) if phase == "measure" else f"{phase}:{index}")
        entry: dict[str, Any] = {"phase": phase, "index": index, "t0": t0, "emitted": [], "tokens": [],
                                 "error": err, "authorization": request.headers.get("Authorization")}
        state["log"].append(entry)
        request["entry"] = entry
        if sc.reject_status:
            body_text = sc.reject_body.replace("{authorization}", request.headers.get("Authorization", ""))
            return web.Response(status=sc.reject_status, text=body_text, content_type="application/json")
        if err == "http500":
            return web.json_response({"error": {"message": "scripted failure", "code": 500}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        base = {"id": f"cmpl-{index}", "created": 0, "model": body.get("model", "scripted"),
                "object": "chat.completion.chunk" if chat else "text_completion"}
        if chat and sc.role_chunk_ms is not None:
            await _sleep_until(t0 + sc.role_chunk_ms / 1000.0, sc.spin)
            obj = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}
            if cont:
                obj["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
            await resp.write(chunk(obj))
        done_tokens = 0
        plan = schedule(sc, index, max_tokens)
        if sc.drift:
            first = state.setdefault("first_t0", t0)
            entry["stretch"] = stretch = sc.stretch_at(t0 - first)
            plan = [(off * stretch, n) for off, n in plan]
        last = t0
        for k, (off, n) in enumerate(plan):
            if err and k == sc.error_after_messages:
                if err == "drop":
                    request.transport.close()  # cut the connection without the terminating chunk
                    return resp
                if err == "malformed":
                    await resp.write(b'data: {"choices": [{"text": "x"\n\n')
                elif err == "stall":
                    await asyncio.sleep(sc.stall_s)
                elif err == "error_event":
                    await resp.write(chunk({"error": {"message": "scripted engine error", "code": 500}}))
                    await resp.write(b"data: [DONE]\n\n")
                    await resp.write_eof()
                    return resp
            await _sleep_until(t0 + off, sc.spin)
            done_tokens += n
            empty = (sc.empty_text_every and (k + 1) % sc.empty_text_every == 0) or k in sc.empty_text_at
            text = "" if empty else "tok " * n
            fin = "length" if done_tokens >= max_tokens else None
            choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}, "finish_reason": fin} if chat
                                      else {"index": 0, "text": text, "logprobs": None, "finish_reason": fin})
            if want_ids:
                choice["token_ids"] = [7] * n
            obj = {**base, "choices": [choice]}
            if cont:
                obj["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": done_tokens,
                                "total_tokens": prompt_tokens + done_tokens}
            data = chunk(obj)
            now = time.perf_counter()  # the instant the bytes go to the socket: the truth
            try:
                await resp.write(data)
            except (ConnectionError, RuntimeError):
                return resp
            entry["emitted"].append(now - t0)
            entry["tokens"].append(n)
            if k == 0:
                h_ttft.labels(**lv).observe(waited + now - t0 + sc.metrics_ttft_bias_ms / 1000.0)
            else:
                itl_hists[sc.itl_metric].labels(**lv).observe(now - last)
            last = now
        em = entry["emitted"]
        if em:
            h_e2e.labels(**lv).observe(waited + em[-1])
            if done_tokens > 1:
                h_tpot.labels(**lv).observe((em[-1] - em[0]) / (done_tokens - 1))
        if final_usage:
            await resp.write(chunk({**base, "choices": [], "usage": {
                "prompt_tokens": prompt_tokens, "completion_tokens": done_tokens,
                "total_tokens": prompt_tokens + done_tokens}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(reg), content_type="text/plain")

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": state["script"].model_id, "object": "model"}]})

    async def set_script(request: web.Request) -> web.Response:
        state["script"] = Script(**(await request.json()))
        state["log"] = []
        state.pop("arrivals", None)
        state.pop("seen", None)
        return web.json_response({"ok": True})

    async def get_log(_request: web.Request) -> web.Response:
        return web.json_response(state["log"])

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/_script", set_script)
    app.router.add_get("/_log", get_log)
    return app


async def _serve(script: Script, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(build_app(script), access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, shutdown_timeout=0.2)  # stalled handlers: do not wait
    await site.start()
    real_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"LISTENING {real_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def watch_stdin() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--script", default="{}", help="Script fields as JSON")
    a = ap.parse_args(argv)
    asyncio.run(_serve(Script(**json.loads(a.script)), a.port))


class SSEServer:
    """Start the server in a child process; ``with SSEServer(script) as srv: srv.url``."""

    def __init__(self, script: Script | None = None, startup_timeout_s: float = 20.0) -> None:
        self.script = script or Script()
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks

    def __enter__(self) -> "SSEServer":
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--script", json.dumps(asdict(self.script))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        line = b""
        deadline = time.monotonic() + self.startup_timeout_s

        def read() -> None:
            nonlocal line
            line = self.proc.stdout.readline()  # type: ignore[union-attr]

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if not line.startswith(b"LISTENING "):
            tail = self.stderr_tail()
            self.__exit__(None, None, None)
            raise RuntimeError(f"sse_server did not start within {self.startup_timeout_s} s: {line!r} {tail}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    @classmethod
    def attach(cls, url: str, script: Script | None = None) -> "SSEServer":
        """A handle on a server another process started (no process to stop)."""
        srv = cls(script)
        srv.url = url
        return srv

    def set_script(self, script: Script) -> None:
        self.script = script
        req = urllib.request.Request(self.url + "/_script", data=json.dumps(asdict(script)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    def log(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/_log", timeout=10) as r:
            return json.loads(r.read())

    def stderr_tail(self, n: int = 2000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-n:]

    def __exit__(self, *exc: object) -> None:
        p = self.proc
        if p is None:
            return
        try:
            if p.stdin:
                p.stdin.close()
            p.terminate()
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
        finally:
            if p.stdout:
                p.stdout.close()
            self._stderr.close()
            self.proc = None


if __name__ == "__main__":
    main()
