"""``server`` mode: vLLM's OpenAI-compatible server as a subprocess in its own process group on a
free loopback port, ready when ``/health`` answers, its log kept in the run folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from day0.config.profile import Profile
from day0.engine.handle import Completion, EngineError, EngineInfo, Log, served_name
from day0.engine.http_api import http_greedy
from day0.engine.process import die_with_parent, stop_process_group
from day0.engine.rootcause import excerpt, root_cause
from day0.model.locate import resolve_model


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

    @property
    def base_url(self) -> str:
        assert self.info and self.info.base_url
        return self.info.base_url

    def command(self, model: str, port: int) -> list[str]:
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", served_name(self.profile),
            "--host", "127.0.0.1", "--port", str(port),
            *cli_args(self.profile.engine.args),
        ]

    def start(self) -> EngineInfo:
        eng = self.profile.engine
        model = resolve_model(self.profile, self.log)
        port = free_port()
        cmd = self.command(model, port)
        env = {**os.environ, **eng.env}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log(f"starting vLLM server on 127.0.0.1:{port} (log: {self.log_path})")
        t0 = time.perf_counter()
        with self.log_path.open("wb") as fh:
            fh.write(("$ " + " ".join(cmd) + "\n").encode())
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
        """Poll ``/health`` until it answers; the server exiting or the deadline passing fails the start."""
        assert self.proc is not None
        deadline = t0 + timeout_s
        last_note = t0
        while True:
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

    def greedy(self, prompts: list[str], max_tokens: int) -> list[Completion]:
        return [http_greedy(self.base_url, served_name(self.profile), p, max_tokens,
                            timeout=self.profile.engine.request_timeout_s) for p in prompts]
