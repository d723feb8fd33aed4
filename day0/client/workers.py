"""Local worker processes that each run shards of a phase on their own event loop.

:class:`WorkerPool` starts N processes (``python -m day0.client.workers``) once per run, so
each keeps its keep-alive connections from warm-up to measurement, and drives every phase the
same way: each worker gets its :class:`~day0.client.shards.ShardSpec` and prepares; once all say
``READY`` the pool picks the phase's t=0 a little in the future on the host's monotonic clock,
says ``go``, and merges the raw results (``day0.client.shards.merge_shards``). A phase with a
stop rule (a capacity-search point) has each worker stream its requests as they end, so the rule
judges the whole phase in the pool's process and its stop reaches every worker mid-shard.

The protocol is one JSON object per line on the worker's stdin and stdout, so a node launcher
can run the same worker on another host (see ``day0.client.shards`` for what that needs).
``auto_workers`` is ``latency.workers = 0``: enough processes for the offered message rate,
no more than the cores this process may run on (one fewer where the server shares them).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import json
import math
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlsplit

from day0.client.loadgen import LoadShape, PhaseResult, Until, new_tag
from day0.client.loops import LoopKind, loop_factory
from day0.client.shards import ShardResult, ShardSpec, merge_shards, run_shard, split_phase
from day0.client.stream import ClientOptions, RequestResult, make_streams
from day0.client.wire import StreamPool
from day0.client.workload import Request

# Streamed messages per second one worker times within 1 ms at p99, with room to spare: the
# ladder (benchmarks/bench_ladder.py) measured one process sustaining about 12,800 on a 2-core box.
AUTO_MESSAGES_PER_WORKER = 8000.0
AUTO_STREAMS_PER_WORKER = 256  # closed loop: requests in flight per worker
READY_TIMEOUT_S = 120.0  # a worker's start-up (imports) and preparing its shard
START_LEAD_S = 0.05  # t=0 this far after the last READY: every worker is asleep waiting for it
MAX_LINE = 1 << 31  # a result line holds every sample of a shard


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def server_on_this_host(url: str | None) -> bool:
    """Whether ``url`` names this host: ``localhost`` or a literal address this host can bind (a
    loopback or one of its own interfaces' addresses). A host name is never resolved here, so a
    slow DNS cannot stall the choice; such a server counts as elsewhere."""
    host = urlsplit(url or "").hostname
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(addr), 0))
        return True
    except OSError:
        return False


def client_cores(url: str | None = None) -> int:
    """The cores the load generator may take: the usable ones, less one where the server runs on
    this host too, since it needs a core of its own to write what is timed. On 2 cores with the
    scripted server on loopback, one in-process worker sustained a higher ladder rate than two
    worker processes in 8 of 14 runs, a lower one in 2 (docs/stages/latency.md, 2026-12-05)."""
    cores = usable_cores()
    return max(1, cores - 1) if server_on_this_host(url) else cores


def auto_workers(shape: LoadShape, mean_output_len: float, cores: int | None = None) -> int:
    """Workers for ``latency.workers = 0``: one per AUTO_MESSAGES_PER_WORKER offered streamed
    messages per second (open loop: rate x output length; closed loop: one per
    AUTO_STREAMS_PER_WORKER requests in flight), at least 1, at most ``cores`` (the caller's
    :func:`client_cores`; else the usable cores)."""
    cores = cores or usable_cores()
    if shape.mode == "rate":
        if math.isinf(shape.request_rate):
            return cores
        need = shape.request_rate * max(1.0, mean_output_len) / AUTO_MESSAGES_PER_WORKER
    else:
        need = shape.concurrency / AUTO_STREAMS_PER_WORKER
    return max(1, min(cores, math.ceil(need)))


def _line(obj: dict[str, Any]) -> str:
    """One protocol message, either way (the pool's commands, a worker's results): compact JSON and a
    newline."""
    return json.dumps(obj, separators=(",", ":")) + "\n"


class WorkerError(RuntimeError):
    """A worker process that died or broke the protocol; the message names it and its stderr."""


class _Worker:
    """One worker process and the pipes to it."""

    def __init__(self, number: int, proc: asyncio.subprocess.Process, stderr: Any) -> None:
        self.number, self.proc, self.stderr = number, proc, stderr

    def tail(self, n: int = 800) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode("utf-8", "replace").strip()
        return " ".join(text[-n:].split())

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(_line(obj).encode())
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            await self.proc.wait()
            raise WorkerError(f"load worker {self.number} exited (rc {self.proc.returncode}): "
                              f"{self.tail() or 'no output'}") from None

    def write(self, obj: dict[str, Any]) -> None:
        """A line without waiting for the pipe to drain (a stop, sent from a stop rule's callback);
        a worker that has exited is left for its results' read to report."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.proc.stdin.write(_line(obj).encode())

    async def results(self, finished: Callable[[RequestResult], None]) -> ShardResult:
        """This worker's shard: the requests it streamed as they ended (each to ``finished`` too),
        then its last line, which holds the rest."""
        streamed: list[RequestResult] = []
        while True:
            line = await self.receive()
            try:
                data = json.loads(line)
                if "finished" not in data:
                    part = ShardResult.from_json(data)
                    break
                r = RequestResult(**data["finished"])
            except (ValueError, KeyError, TypeError) as exc:
                raise WorkerError(f"a load worker's results cannot be read (load worker {self.number}: "
                                  f"{type(exc).__name__}: {exc})") from None
            streamed.append(r)
            finished(r)
        part.results = streamed + part.results
        return part

    async def receive(self) -> str:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line.endswith(b"\n"):
            await self.proc.wait()
            raise WorkerError(f"load worker {self.number} exited (rc {self.proc.returncode}) mid-phase: "
                              f"{self.tail() or 'no output'}")
        return line.decode("utf-8")


class WorkerPool:
    """N local worker processes for a run; ``async with WorkerPool(n) as pool: await pool.run_phase(...)``."""

    def __init__(self, workers: int, loop: LoopKind = "auto") -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        loop_factory(loop)  # an unknown or missing loop fails here, not in N processes
        self.size, self.loop = workers, loop
        self._workers: list[_Worker] = []

    async def __aenter__(self) -> "WorkerPool":
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the day0 package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        try:
            for i in range(self.size):
                err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty worker never blocks
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "day0.client.workers", self.loop, stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=err, env=env, limit=MAX_LINE)
                self._workers.append(_Worker(i, proc, err))
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run_phase(self, base_url: str, model: str, requests: Sequence[Request], shape: LoadShape,
                        opts: ClientOptions, *, phase: str = "measure", until: Until | None = None,
                        workers: int | None = None) -> PhaseResult:
        """One phase split across the pool's workers (as many as it can use) and merged back. With
        ``until`` each worker sends each request as it ends, the rule judges them all here in the
        order they arrive, and once it fires every worker is told to stop: what one process does
        with a stop rule, a pipe's delay later (requests that end meanwhile are kept, as the rule
        allows: it fires only on what no continuation can undo). ``workers``: use only that many
        (a phase whose load one worker times well); default, all of them."""
        tag = new_tag()
        specs, offsets = split_phase(base_url, model, requests, shape, opts, min(workers or self.size, self.size),
                                     phase=phase, tag=tag)
        busy = self._workers[:len(specs)]
        for w, spec in zip(busy, specs):
            await w.send({"cmd": "prepare", "spec": spec.to_json()})

        async def ready(w: _Worker) -> None:
            line = await w.receive()
            if line.strip() != "READY":
                raise WorkerError(f"load worker {w.number}: {line.strip()[:300]}")

        try:
            await asyncio.wait_for(asyncio.gather(*(ready(w) for w in busy)), READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise WorkerError(f"load workers not ready within {READY_TIMEOUT_S:g} s") from None
        t0 = time.perf_counter() + START_LEAD_S
        for w in busy:
            await w.send({"cmd": "go", "t0": t0, "stream": until is not None})
        fired = False

        def judge(r: RequestResult) -> None:
            nonlocal fired
            if until is not None and not fired and until(r):
                fired = True
                for w in busy:  # a worker already done reads it as stale and lets it pass
                    w.write({"cmd": "stop", "tag": tag})

        parts = await asyncio.gather(*(w.results(judge) for w in busy))
        return merge_shards(phase, shape, parts, t0, offsets)

    async def close(self) -> None:
        """Ask every worker to exit (its stdin closes), give them a few seconds together, then kill
        what is left: a worker never outlives its pool."""
        for w in self._workers:
            if w.proc.stdin is not None and not w.proc.stdin.is_closing():
                w.proc.stdin.close()
        waits = [asyncio.ensure_future(w.proc.wait()) for w in self._workers]
        if waits:
            await asyncio.wait(waits, timeout=5.0)
        for w in self._workers:
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
                await w.proc.wait()
            w.stderr.close()
        self._workers = []


# --------------------------------------------------------------------------- the worker side


class _Inbox:
    """The worker's stdin, read on a thread of its own: ``prepare`` and ``go`` wait in a queue for
    the main loop, and a ``stop`` for the shard running now sets its event at once, mid-shard. A stop
    read while no shard runs is kept by its tag: the pool may send it between this worker's ``go``
    and its shard's start (another worker's request ended first), and that shard then starts stopped.
    One for a shard already done, or for another tag, matches no later shard (each phase has its own
    tag) and stays stale."""

    def __init__(self, stdin: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.queue = loop, queue.Queue[dict[str, Any] | None]()
        self._lock = threading.Lock()
        self._running: tuple[str, asyncio.Event] | None = None
        self._stopped: Any = None  # the tag of the last stop read while no shard ran
        threading.Thread(target=self._listen, args=(stdin,), daemon=True).start()

    def _listen(self, stdin: Any) -> None:
        try:
            for line in stdin:
                msg = json.loads(line) if line.strip() else None
                if msg is None:
                    break
                if msg.get("cmd") == "stop":
                    with self._lock:
                        if self._running is None:
                            self._stopped = msg.get("tag")
                        elif self._running[0] == msg.get("tag"):
                            self.loop.call_soon_threadsafe(self._running[1].set)
                    continue
                self.queue.put(msg)
        finally:
            self.queue.put(None)

    def next(self) -> dict[str, Any] | None:
        return self.queue.get()

    @contextlib.contextmanager
    def running(self, tag: str, stop: asyncio.Event) -> Iterator[None]:
        with self._lock:
            self._running = (tag, stop)
            if self._stopped == tag:
                stop.set()
        try:
            yield
        finally:
            with self._lock:
                self._running = None


def worker_main(stdin: Any = None, stdout: Any = None, loop_kind: LoopKind = "auto") -> int:
    """One worker: prepare a shard, say READY, wait for go, run it, print its raw results; repeat.
    With ``"stream": true`` in go, each request goes out as a line as it ends (the pool judges them
    for a stop rule) and the last line holds none of them again."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    loop = loop_factory(loop_kind)()
    inbox = _Inbox(stdin, loop)
    streams: StreamPool | None = None
    gc.collect()
    gc.freeze()  # the imports' objects never move again: a full collection stays short mid-phase

    def send(obj: dict[str, Any]) -> None:
        stdout.write(_line(obj))
        stdout.flush()

    try:
        while (msg := inbox.next()) is not None and msg.get("cmd") == "prepare":
            spec = ShardSpec.from_json(msg["spec"])
            if streams is None:
                streams = make_streams(spec.options)
            stdout.write("READY\n")
            stdout.flush()
            go = inbox.next()
            if go is None or go.get("cmd") != "go":
                break
            stream, stop = bool(go.get("stream")), asyncio.Event()
            with inbox.running(spec.tag, stop):
                result = loop.run_until_complete(run_shard(
                    streams, spec, float(go["t0"]), stop=stop,
                    finished=(lambda r: send({"finished": asdict(r)})) if stream else None))
            if stream:
                result.results = []  # the pool has each of them already
            send(result.to_json())
    finally:
        if streams is not None:
            loop.run_until_complete(streams.close())
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(loop_kind=sys.argv[1] if len(sys.argv) > 1 else "auto"))  # type: ignore[arg-type]
