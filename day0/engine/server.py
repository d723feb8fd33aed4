"""``server`` mode: vLLM's OpenAI-compatible server as a subprocess in its own process group on a
free loopback port, ready when ``/health`` answers, its log kept in the run folder."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from day0.config.profile import Profile
from day0.core.redact import Redactor
from day0.engine.handle import Completion, EngineError, EngineInfo, Log, served_name
from day0.engine.http_api import api_key, auth_headers, http_greedy
from day0.engine.process import die_with_parent, stop_process_group
from day0.engine.rootcause import excerpt, root_cause
from day0.model.locate import resolve_model

# vLLM start-up lines worth showing live: weights loading, profiling, KV cache size, CUDA graphs, errors.
STARTUP_LINE = re.compile(r"Loading|took|Starting|ERROR|Error:|Traceback|KV cache|Maximum concurrency|"
                          r"Capturing CUDA graph|Application startup complete")
# vLLM's prefix ("(EngineCore_DP0 pid=12) INFO 11-30 23:59:01 [gpu_model_runner.py:1234] "), dropped for width.
_LOG_PREFIX = re.compile(r"^(\([^)]*pid=\d+\)\s*)?(INFO|WARNING|DEBUG)\s+\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\s+"
                         r"(\[[^\]]*\]\s*)?")


class LogTail:
    """New interesting lines of a growing log: the newest ``per_poll`` of them per poll (the
    rest counted, so a CI log is never flooded), each cut to ``width`` characters."""

    def __init__(self, path: Path, emit: Callable[[str], None], *, per_poll: int = 3, width: int = 240,
                 max_read: int = 1 << 16) -> None:
        self.path, self.emit, self.per_poll, self.width, self.max_read = path, emit, per_poll, width, max_read
        self.pos = 0
        self._partial = b""

    def poll(self) -> int:
        """Show what is new since the last poll; returns how many lines were shown."""
        try:
            with self.path.open("rb") as fh:
                size = fh.seek(0, 2)
                if size - self.pos > self.max_read:  # far behind: the newest part is what matters
                    self.pos, self._partial = size - self.max_read, b""
                fh.seek(self.pos)
                data = fh.read(self.max_read)
        except OSError:
            return 0
        self.pos += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        hits = [_LOG_PREFIX.sub("", t) for t in (ln.decode("utf-8", "replace").strip() for ln in lines)
                if t and STARTUP_LINE.search(t)]
        if len(hits) > self.per_poll:  # the newest lines say where start-up is; the rest are counted
            self.emit(f"({len(hits) - self.per_poll} earlier such lines in {self.path.name})")
        for line in hits[-self.per_poll:] if self.per_poll else []:
            self.emit(line if len(line) <= self.width else line[: self.width - 1] + "…")
        return min(len(hits), self.per_poll + 1)


def cli_args(args: dict[str, Any]) -> list[str]:
    """vLLM engine args as its CLI takes them: ``max_num_seqs=8`` -> ``--max-num-seqs 8``."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerEngine:
    """vLLM's OpenAI server as a subprocess; the whole process group goes at stop()."""

    view = "http"

    def __init__(self, profile: Profile, run_dir: Path, log: Log, name: str = "server") -> None:
        self.profile = profile
        self.run_dir = Path(run_dir)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: EngineInfo | None = None
        self.log_path = self.run_dir / f"engine-{name}.log"
        self.redactor = profile.redactor()

    @property
    def base_url(self) -> str:
        assert self.info and self.info.base_url
        return self.info.base_url

    def command(self, model: str, port: int) -> list[str]:
        """The server's command line. ``engine.args.api_key`` is not on it: vLLM reads the key from
        ``VLLM_API_KEY`` (:meth:`environment`), so no process listing or log line shows it."""
        args = {k: v for k, v in self.profile.engine.args.items() if k != "api_key"}
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", served_name(self.profile),
            "--host", "127.0.0.1", "--port", str(port),
            *cli_args(args),
        ]

    def environment(self) -> dict[str, str]:
        eng = self.profile.engine
        env = {**os.environ, **eng.env}
        key = api_key(self.profile)
        if key:
            env["VLLM_API_KEY"] = key
        return env

    def start(self) -> EngineInfo:
        eng = self.profile.engine
        model = resolve_model(self.profile, self.log)
        port = free_port()
        cmd = self.command(model, port)
        env = self.environment()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log(f"starting vLLM server on 127.0.0.1:{port} (log: {self.log_path})")
        t0 = time.perf_counter()
        with self.log_path.open("wb") as fh:
            fh.write(("$ " + " ".join(self.redactor.argv(cmd)) + "\n").encode())
            fh.flush()
            self.proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=die_with_parent,
            )
        self.info = EngineInfo(
            mode="server", view="http", model=model, served_model_name=served_name(self.profile),
            base_url=f"http://127.0.0.1:{port}", pid=self.proc.pid, pgid=self.proc.pid,
            log_path=str(self.log_path), args=dict(eng.args), env=dict(eng.env),
        )
        self._wait_healthy(t0, eng.startup_timeout_s)
        self.info.startup_s = time.perf_counter() - t0
        self.log(f"vLLM server healthy after {self.info.startup_s:.1f} s")
        return self.info

    def _wait_healthy(self, t0: float, timeout_s: float) -> None:
        """Poll ``/health`` until it answers; the server exiting or the deadline passing fails the start.
        Meanwhile vLLM's own loading lines are shown as they come (a minute of silence looks like a hang)."""
        assert self.proc is not None
        deadline = t0 + timeout_s
        last_note = t0
        tail = LogTail(self.log_path, lambda line: self.log("vllm: " + self.redactor.text(line)))
        while True:
            if tail.poll():
                last_note = time.perf_counter()  # a loading line says it is alive; no "waiting" line needed
            code = self.proc.poll()
            if code is not None:
                self._fail(f"vLLM server exited with code {code} during start-up")
            if self._healthy():
                break
            now = time.perf_counter()
            if now > deadline:
                self._fail(f"vLLM server not healthy within engine.startup_timeout_s = {timeout_s:g} s")
            if now - last_note > 15:
                self.log(f"waiting for vLLM /health ({now - t0:.0f} s)")
                last_note = now
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.info.base_url + "/health", timeout=2) as resp:  # type: ignore[union-attr]
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _fail(self, what: str) -> None:
        pgid = self.proc.pid if self.proc else None
        self.stop()
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        cause = root_cause(text)
        raise EngineError(f"{cause} ({what})" if cause else what,
                          log_excerpt=excerpt(text), log_path=self.log_path, pgid=pgid)

    def alive(self) -> str | None:
        """None while the server runs, else a one-line reason (for stages that see it die)."""
        if self.proc is None:
            return "engine not started"
        code = self.proc.poll()
        if code is None:
            return None
        cause = root_cause(self.log_path.read_text(encoding="utf-8", errors="replace"))
        return f"vLLM server exited with code {code}" + (f": {cause}" if cause else "")

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process_group(self.proc, self.profile.engine.shutdown_timeout_s)
        self.proc = None
        scrub_log(self.log_path, self.redactor)

    def greedy(self, prompts: list[str], max_tokens: int) -> list[Completion]:
        return [http_greedy(self.base_url, served_name(self.profile), p, max_tokens,
                            timeout=self.profile.engine.request_timeout_s, headers=auth_headers(self.profile))
                for p in prompts]


def scrub_log(path: Path, redactor: Redactor) -> None:
    """Rewrite the engine's log with every known secret redacted, once the engine is gone.

    vLLM masks its own ``--api-key`` in its logs, but not a token an engine prints from its
    environment or a URL with credentials; the log is kept in the run folder, so it is scrubbed
    line by line (bounded memory), and replaced atomically.
    """
    if not path.is_file():
        return
    tmp = path.with_name(path.name + ".scrub")
    with path.open("r", encoding="utf-8", errors="replace") as src, tmp.open("w", encoding="utf-8") as dst:
        for line in src:
            dst.write(redactor.text(line))
    tmp.replace(path)
