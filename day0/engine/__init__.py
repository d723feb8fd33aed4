"""The live engine under test, in three modes, and the two views stages need of it.

* ``server``: vLLM's OpenAI-compatible server as a subprocess in its own process group on a free
  loopback port, ready when ``/health`` answers, its log kept in the run folder.
* ``inprocess``: ``vllm.LLM`` in this process with V1 multiprocessing off, so the scheduler and
  its KV-cache manager are plain Python objects a stage can sample.
* ``external``: a deployment someone else runs; only its HTTP API is visible.

Stages ask an :class:`Engines` object for a view: ``http()`` (the API as users call it) or
``scheduler()`` (exact block accounting). The primary engine serves the view it has; on a CPU
target the missing view is started on demand with the same model and arguments, so one run gives
both. Every check records which view its number came from.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from day0.config.profile import Profile

Log = Callable[[str], None]


class EngineError(RuntimeError):
    """The engine could not be started or died; ``str()`` is the engine's own root-cause line."""

    def __init__(self, message: str, *, log_excerpt: str = "", log_path: Path | None = None,
                 pgid: int | None = None) -> None:
        super().__init__(message)
        self.log_excerpt = log_excerpt
        self.log_path = log_path
        self.pgid = pgid  # the process group that was stopped, so a test can prove it is gone


class ViewUnavailable(RuntimeError):
    """A view this mode/target cannot give (e.g. the scheduler of an external deployment)."""


# --------------------------------------------------------------------------- model and args


def resolve_model(profile: Profile, log: Log | None = None) -> str:
    """The ``--model`` value: the embedded tiny model's cached directory or the profile's path."""
    if profile.model.source == "tiny":
        from day0.model.tiny import cached_model

        return str(cached_model(profile.model.tiny, log=log))
    assert profile.model.path is not None
    return profile.model.path


def local_model_dir(profile: Profile) -> Path | None:
    """The model's directory on this machine (the tiny build, or model.path when it is a local
    directory), else None: a hub id or a remote deployment's path has nothing to read here."""
    if profile.model.source == "tiny":
        from day0.model.tiny import cached_model

        return cached_model(profile.model.tiny)
    path = Path(str(profile.model.path))
    return path if path.is_dir() else None


def served_name(profile: Profile) -> str:
    return profile.model.served_model_name or (
        "day0-tiny" if profile.model.source == "tiny" else str(profile.model.path)
    )


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


# --------------------------------------------------------------------------- root cause

_EXC_LINE = re.compile(r"^(?:\S+ )*?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")
_ARGPARSE = re.compile(r"^\S+: error: (.+)$")
_WRAPPERS = (
    "See root cause above",
    "Engine core initialization failed",
    "Engine process failed to start",
    "EngineCore encountered an issue",
    "Worker failed with error",
    "EngineDeadError",
)
_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:ERROR|WARNING|INFO|DEBUG)\s+[\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")


def root_cause(log_text: str) -> str | None:
    found = _root_cause_at(log_text)
    return found[1] if found else None


def excerpt(log_text: str, before: int = 12, after: int = 3, last: int = 15) -> str:
    """The log lines around the root cause, then the log's end: what a person reads first."""
    lines = log_text.splitlines()
    found = _root_cause_at(log_text)
    end = lines[-last:]
    if not found:
        return "\n".join(end)
    n = found[0]
    around = lines[max(0, n - before): n + after + 1]
    if n + after + 1 >= len(lines) - last:
        return "\n".join(lines[max(0, n - before):])
    return "\n".join([*around, "[...]", *end])


def _root_cause_at(log_text: str) -> tuple[int, str] | None:
    """The line that says why the engine failed, from its log (first non-wrapper exception).

    vLLM reports an engine-core failure twice: the real exception in the core process, then a
    generic ``RuntimeError: Engine core initialization failed. See root cause above`` in the
    front end. The first is what a person can act on.
    """
    lines = [_PREFIX.sub("", ln).rstrip() for ln in log_text.splitlines()]
    for n, line in enumerate(lines):
        m = _ARGPARSE.match(line)
        if m:
            return n, f"vLLM rejected its arguments: {m.group(1)}"
        m = _EXC_LINE.match(line)
        if not m or any(w in line for w in _WRAPPERS):
            continue
        name, text = m.group(1).rsplit(".", 1)[-1], m.group(2)
        if name == "ValidationError":  # pydantic: the reason is on the following lines
            detail = [ln.strip() for ln in lines[n + 1 : n + 4] if ln.strip() and "errors.pydantic.dev" not in ln]
            text = text + ": " + " ".join(detail)
        return n, f"{name}: {text}"
    return None


# --------------------------------------------------------------------------- engines


@dataclass
class EngineInfo:
    """What the record keeps about an engine (run.json ``notes.engines``)."""

    mode: str
    view: str  # "http" or "scheduler"
    model: str
    served_model_name: str
    base_url: str | None = None
    pid: int | None = None
    pgid: int | None = None
    log_path: str | None = None
    startup_s: float | None = None
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: a SIGKILLed harness still stops its server


def auth_headers(profile: Profile) -> dict[str, str]:
    """The bearer header for ``engine.api_key_env`` (the variable's name is in the profile, never the key)."""
    name = profile.engine.api_key_env
    return {"Authorization": f"Bearer {os.environ[name]}"} if name and name in os.environ else {}


def http_json(url: str, payload: dict[str, Any] | None = None, *, timeout: float = 120.0,
              headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


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
                preexec_fn=_die_with_parent,
            )
        self.info = EngineInfo(
            mode="server", view="http", model=model, served_model_name=served_name(self.profile),
            base_url=f"http://127.0.0.1:{port}", pid=self.proc.pid, pgid=self.proc.pid,
            log_path=str(self.log_path), args=dict(eng.args), env=dict(eng.env),
        )
        deadline = t0 + eng.startup_timeout_s
        last_note = t0
        while True:
            code = self.proc.poll()
            if code is not None:
                self._fail(f"vLLM server exited with code {code} during start-up")
            if self._healthy():
                break
            now = time.perf_counter()
            if now > deadline:
                self._fail(f"vLLM server not healthy within engine.startup_timeout_s = {eng.startup_timeout_s:g} s")
            if now - last_note > 15:
                self.log(f"waiting for vLLM /health ({now - t0:.0f} s)")
                last_note = now
            time.sleep(0.5)
        self.info.startup_s = time.perf_counter() - t0
        self.log(f"vLLM server healthy after {self.info.startup_s:.1f} s")
        return self.info

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

    def greedy(self, prompts: list[str], max_tokens: int) -> list["Completion"]:
        return [http_greedy(self.base_url, served_name(self.profile), p, max_tokens,
                            timeout=self.profile.engine.request_timeout_s) for p in prompts]


class ExternalEngine:
    view = "http"

    def __init__(self, profile: Profile, log: Log) -> None:
        self.profile = profile
        self.log = log
        self.info: EngineInfo | None = None

    @property
    def base_url(self) -> str:
        return str(self.profile.engine.url).rstrip("/")

    def start(self) -> EngineInfo:
        t0 = time.perf_counter()
        deadline = t0 + self.profile.engine.startup_timeout_s
        last_err = ""
        while time.perf_counter() < deadline:
            try:
                models = http_json(self.base_url + "/v1/models", timeout=5, headers=auth_headers(self.profile))
                break
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_err = str(getattr(exc, "reason", exc))
                time.sleep(1)
        else:
            raise EngineError(f"external engine {self.base_url} not reachable within "
                              f"engine.startup_timeout_s = {self.profile.engine.startup_timeout_s:g} s: {last_err}")
        names = [m.get("id") for m in models.get("data", [])]
        want = self.profile.model.served_model_name
        if want and want not in names:
            raise EngineError(f"external engine {self.base_url} serves {names}, not model.served_model_name = {want!r}")
        self.info = EngineInfo(mode="external", view="http", model=want or (names[0] if names else "?"),
                               served_model_name=want or (names[0] if names else "?"), base_url=self.base_url,
                               startup_s=time.perf_counter() - t0)
        return self.info

    def alive(self) -> str | None:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5):
                return None
        except (urllib.error.URLError, OSError) as exc:
            return f"external engine {self.base_url} not healthy: {getattr(exc, 'reason', exc)}"

    def stop(self) -> None:  # not ours to stop
        return None

    def greedy(self, prompts: list[str], max_tokens: int) -> list["Completion"]:
        assert self.info is not None
        return [http_greedy(self.base_url, self.info.served_model_name, p, max_tokens,
                            timeout=self.profile.engine.request_timeout_s, headers=auth_headers(self.profile))
                for p in prompts]


class InprocessEngine:
    """``vllm.LLM`` in this process; the scheduler is reachable for exact KV accounting."""

    view = "scheduler"

    def __init__(self, profile: Profile, log: Log) -> None:
        self.profile = profile
        self.log = log
        self.llm: Any = None
        self.info: EngineInfo | None = None
        self._saved_env: dict[str, str | None] = {}

    def start(self) -> EngineInfo:
        eng = self.profile.engine
        model = resolve_model(self.profile, self.log)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **eng.env}
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self.log("starting in-process vLLM engine (V1 multiprocessing off)")
        t0 = time.perf_counter()
        try:
            with _deadline(eng.startup_timeout_s):
                from vllm import LLM

                self.llm = LLM(model=model, served_model_name=served_name(self.profile),
                               disable_log_stats=False, **eng.args)
        except _Timeout:
            self.stop()
            raise EngineError(f"in-process engine not ready within engine.startup_timeout_s = "
                              f"{eng.startup_timeout_s:g} s") from None
        except Exception as exc:  # vLLM raises many kinds; the chain holds the root cause
            self.stop()
            raise EngineError(exception_root_cause(exc)) from exc
        self.info = EngineInfo(mode="inprocess", view="scheduler", model=model,
                               served_model_name=served_name(self.profile),
                               startup_s=time.perf_counter() - t0, args=dict(eng.args), env=dict(eng.env))
        self.log(f"in-process engine ready after {self.info.startup_s:.1f} s")
        return self.info

    @property
    def scheduler(self) -> Any:
        """The V1 scheduler (``kv_cache_manager``, running requests) of the in-process core."""
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    def alive(self) -> str | None:
        return None if self.llm is not None else "in-process engine not running"

    def stop(self) -> None:
        if self.llm is not None:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            import gc

            gc.collect()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def greedy(self, prompts: list[str], max_tokens: int) -> list["Completion"]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [Completion(text=o.outputs[0].text, token_ids=list(o.outputs[0].token_ids),
                           completion_tokens=len(o.outputs[0].token_ids)) for o in outs]


# --------------------------------------------------------------------------- helpers


@dataclass
class Completion:
    text: str
    token_ids: list[int] | None
    completion_tokens: int


def http_greedy(base_url: str, model: str, prompt: str, max_tokens: int, *, timeout: float,
                headers: dict[str, str] | None = None) -> Completion:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    out = http_json(base_url + "/v1/completions", body, timeout=timeout, headers=headers)
    choice = out["choices"][0]
    return Completion(text=choice.get("text", ""), token_ids=choice.get("token_ids"),
                      completion_tokens=int(out["usage"]["completion_tokens"]))


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Bound a blocking call on the main thread (elsewhere it runs unbounded, and says so)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def exception_root_cause(exc: BaseException) -> str:
    """The innermost exception of a chain, as ``Name: message`` on one line."""
    seen = set()
    cur: BaseException = exc
    while True:
        nxt = cur.__cause__ or cur.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(cur))
        cur = nxt
    text = str(cur).strip().splitlines()
    msg = " ".join(t.strip() for t in text[:4] if t.strip())
    if any(w in msg for w in _WRAPPERS) and cur is not exc:
        msg = str(exc)
    return f"{type(cur).__name__}: {msg}"


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the group, wait, then SIGKILL whatever is left of it."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    # SIGKILL is delivered asynchronously: on a busy host a grandchild can still be running when
    # its parent has been reaped. Return only once the whole group is gone (bounded).
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any (non-zombie) process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


# --------------------------------------------------------------------------- the session's engines


class Engines:
    """One per pytest session: the primary engine plus views started only when a stage asks.

    Start-up failure is remembered, so every later test fails fast with the same root cause
    instead of trying (and timing out) again.
    """

    def __init__(self, profile: Profile, run_dir: Path, log: Log) -> None:
        self.profile = profile
        self.run_dir = Path(run_dir)
        self.log = log
        self._engines: dict[str, Any] = {}
        self._errors: dict[str, EngineError] = {}
        self.on_start: Callable[[EngineInfo], None] | None = None

    @property
    def primary_view(self) -> str:
        return "scheduler" if self.profile.engine.mode == "inprocess" else "http"

    def primary(self) -> Any:
        return self.http() if self.primary_view == "http" else self.scheduler()

    def http(self) -> ServerEngine | ExternalEngine:
        mode = self.profile.engine.mode
        if mode == "external":
            return self._get("http", lambda: ExternalEngine(self.profile, self.log))
        if mode == "inprocess" and self.profile.topology.device != "cpu":
            raise ViewUnavailable("the HTTP view beside an in-process engine is only started on CPU targets "
                                  "(a second engine would not fit on the GPUs); use engine.mode = \"server\"")
        return self._get("http", lambda: ServerEngine(self.profile, self.run_dir, self.log))

    def scheduler(self) -> InprocessEngine:
        mode = self.profile.engine.mode
        if mode == "external":
            raise ViewUnavailable("an external engine's scheduler is not reachable; numbers come from /metrics")
        if mode == "server" and self.profile.topology.device != "cpu":
            raise ViewUnavailable("the scheduler view beside a server engine is only started on CPU targets "
                                  "(a second engine would not fit on the GPUs); use engine.mode = \"inprocess\"")
        return self._get("scheduler", lambda: InprocessEngine(self.profile, self.log))

    def _get(self, view: str, factory: Callable[[], Any]) -> Any:
        if view in self._errors:
            raise self._errors[view]
        if view not in self._engines:
            engine = factory()
            try:
                info = engine.start()
            except EngineError as exc:
                self._errors[view] = exc
                raise
            except KeyboardInterrupt:
                engine.stop()
                raise
            self._engines[view] = engine
            if self.on_start:
                self.on_start(info)
        return self._engines[view]

    @contextlib.contextmanager
    def variant(self, name: str, args: dict[str, Any], env: dict[str, str] | None = None) -> Iterator[ServerEngine]:
        """A short-lived second server with some engine args changed (e.g. TP=2 against TP=1),
        stopped as soon as the caller is done so it does not compete with the main engine."""
        eng = self.profile.engine
        profile = self.profile.model_copy(update={"engine": eng.model_copy(
            update={"args": {**eng.args, **args}, "env": {**eng.env, **(env or {})}})})
        server = ServerEngine(profile, self.run_dir, self.log, name=name)
        try:
            info = server.start()
            if self.on_start:
                self.on_start(EngineInfo(**{**info.__dict__, "view": f"variant:{name}"}))
            yield server
        finally:
            server.stop()

    def started(self) -> list[EngineInfo]:
        return [e.info for e in self._engines.values() if e.info is not None]

    def stop(self) -> None:
        for view in list(self._engines):
            engine = self._engines.pop(view)
            with contextlib.suppress(Exception):
                engine.stop()
