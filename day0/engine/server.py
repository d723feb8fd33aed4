"""``server`` mode: vLLM's OpenAI-compatible server as a subprocess in its own process group on a
free loopback port (or one process per node of a multi-node cluster), ready when ``/health``
answers, its log kept in the run folder."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any, Callable

from day0.config.profile import Profile
from day0.core.outputs import open_output, replacing
from day0.core.redact import Redactor
from day0.core.sockets import free_port
from day0.engine.cluster.launchers import spawn
from day0.engine.cluster.nodes import Cluster
from day0.engine.endpoint import Endpoint, api_key
from day0.engine.handle import Completion, EngineError, EngineInfo, Log, served_name
from day0.engine.loaded import expert_placement
from day0.engine.multinode import cross_node_connections, engine_cli_args, node0_ports, node_commands
from day0.engine.process import die_with_parent, signal_group, stop_process_group
from day0.engine.rootcause import excerpt, root_cause
from day0.model.locate import local_model_dir, resolve_model

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
    """vLLM engine args as its CLI takes them: ``max_num_seqs=8`` -> ``--max-num-seqs 8``. A table is
    compact JSON, without spaces, so the list also survives a shell's word splitting (the Slurm
    recipe reads ``DAY0_VLLM_ARGS`` that way)."""
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
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


class ServerEngine:
    """vLLM's OpenAI server as a subprocess; the whole process group goes at stop().

    With a multi-node ``cluster`` it is one engine across the nodes (:mod:`day0.engine.multinode`):
    one process group per node, started by the cluster's launcher, each with its own log
    (``engine-node0.log``, ...); the engine is alive while every node's process is.
    """

    view = "http"

    def __init__(self, profile: Profile, run_dir: Path, log: Log, name: str = "server",
                 cluster: Cluster | None = None) -> None:
        self.profile = profile
        self.run_dir = Path(run_dir)
        self.log = log
        self.cluster = cluster if cluster is not None and cluster.multi_node else None
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []  # (node, process, log)
        self.info: EngineInfo | None = None
        self.endpoint: Endpoint | None = None  # where stages send requests, built once :meth:`start` knows the port
        prefix = "engine" if name == "server" else f"engine-{name}"
        self.log_path = self.run_dir / (f"{prefix}-node0.log" if self.cluster else f"engine-{name}.log")
        self.redactor = profile.redactor()
        self._t0 = 0.0  # when launch() started the processes

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The serving process (node0's)."""
        return self.procs[0][1] if self.procs else None

    @property
    def base_url(self) -> str:
        assert self.info and self.info.base_url
        return self.info.base_url


    def command(self, model: str, port: int) -> list[str]:
        """The server's command line: ``vllm serve`` through :mod:`day0.engine.vllm_cli`, which binds
        vLLM's IPC sockets in a folder it removes as it exits. ``engine.args.api_key`` is not on it:
        vLLM reads the key from ``VLLM_API_KEY`` (:meth:`environment`), so no process listing or log
        line shows it."""
        return [
            sys.executable, "-m", "day0.engine.vllm_cli", "serve", model,
            "--served-model-name", served_name(self.profile), "--host", "127.0.0.1", "--port", str(port),
            *cli_args(self._args()),
        ]

    def _args(self) -> dict[str, Any]:
        args = {k: v for k, v in self.profile.engine.args.items() if k != "api_key"}
        return engine_cli_args(args) if self.cluster else args

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.deployment_env()}

    def deployment_env(self) -> dict[str, str]:
        """What the server needs beyond its host's own environment: ``engine.env`` and the API key.
        A launcher that cannot pass this process's environment on (ssh) carries this to every node."""
        env = dict(self.profile.engine.env)
        key = api_key(self.profile)
        if key:
            env["VLLM_API_KEY"] = key
        return env

    def start(self) -> EngineInfo:
        self.launch()
        return self.wait()

    def launch(self) -> None:
        """Start the processes and return: :meth:`wait` blocks until they serve. Apart, a run can
        launch the engine while preflight runs (``engine.start_early``)."""
        eng = self.profile.engine
        model = resolve_model(self.profile, self.log)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        try:
            if self.cluster:
                host, port = self._start_nodes(model)
            else:
                host, port = "127.0.0.1", free_port()
                self._start_local(model, port)
        except BaseException:
            self.stop()  # the nodes started before the one that failed
            raise
        self.info = EngineInfo(
            mode="server", view="http", model=model, served_model_name=served_name(self.profile),
            base_url=f"http://{host}:{port}", pid=self.proc.pid if self.proc else None,
            pgid=self.proc.pid if self.proc else None, log_path=str(self.log_path),
            args=dict(eng.args), env=dict(eng.env),
            nodes=[{"node": n, "pid": p.pid, "log_path": str(lp)} for n, p, lp in self.procs] if self.cluster else [],
        )
        self.endpoint = Endpoint.for_profile(self.profile, self.info.base_url or "", self.info.served_model_name)

    def wait(self) -> EngineInfo:
        """Until the launched engine serves; ``startup_s`` counts from :meth:`launch`."""
        assert self.info is not None, "wait() before launch()"
        eng = self.profile.engine
        self._wait_healthy(self._t0, eng.startup_timeout_s)
        self.info.startup_s = time.perf_counter() - self._t0
        if self.cluster:
            self.info.cross_node = cross_node_connections(self.cluster)
        self.info.experts = expert_placement(local_model_dir(self.profile), dict(eng.args),
                                             [lp for _, _, lp in self.procs])
        self.log(f"vLLM server healthy after {self.info.startup_s:.1f} s")
        return self.info

    def _start_local(self, model: str, port: int) -> None:
        cmd = self.command(model, port)
        self.log(f"starting vLLM server on 127.0.0.1:{port} (log: {self.log_path})")
        with open_output(self.log_path) as fh:
            fh.write(("$ " + " ".join(self.redactor.argv(cmd)) + "\n").encode())
            fh.flush()
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.environment(),
                preexec_fn=die_with_parent,
            )
        self.procs.append(("node0", proc, self.log_path))

    def _start_nodes(self, model: str) -> tuple[str, int]:
        """Rank 0 (HTTP) on node0 and headless ranks on the others, each through the launcher."""
        assert self.cluster is not None
        port, master_port = node0_ports(self.profile)
        cmds = node_commands(self.profile, self.cluster, model, port, master_port, cli_args(self._args()),
                             served_name(self.profile))
        node0 = self.cluster.nodes[0]
        self.log(f"starting vLLM across {len(cmds)} nodes ({self.cluster.launcher.kind}): HTTP on "
                 f"{node0.address}:{port}, rendezvous {self.cluster.master_addr}:{master_port} (logs: "
                 f"{self.log_path.name.replace('node0', 'node*')})")
        base, deployment = self.environment(), self.deployment_env()  # once, not once a node
        for nc in cmds:
            log_path = self.log_path.with_name(self.log_path.name.replace("node0", nc.node.name))
            proc = spawn(self.cluster.launcher, nc.node, nc.argv, {**deployment, **nc.env}, log_path, base,
                         header=lambda argv: "$ " + " ".join(self.redactor.argv(argv)))
            self.procs.append((nc.node.name, proc, log_path))
        return node0.address, port

    def _wait_healthy(self, t0: float, timeout_s: float) -> None:
        """Poll ``/health`` until it answers; a node's process exiting or the deadline passing fails the start.
        Meanwhile vLLM's own loading lines are shown as they come (a minute of silence looks like a hang)."""
        deadline = t0 + timeout_s
        last_note = t0
        tail = LogTail(self.log_path, lambda line: self.log("vllm: " + self.redactor.text(line)))
        while True:
            if tail.poll():
                last_note = time.perf_counter()  # a loading line says it is alive; no "waiting" line needed
            for node, proc, _ in self.procs:
                code = proc.poll()
                if code is not None:
                    where = f" on {node}" if self.cluster else ""
                    self._fail(f"vLLM server exited with code {code}{where} during start-up", node)
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
        except (urllib.error.URLError, OSError, http.client.HTTPException):  # the last: not HTTP (yet)
            return False

    def _fail(self, what: str, node: str | None = None) -> None:
        """Stop every node, then raise with the root cause: from the node that died first when one
        did, else from the first log that has one (a headless rank often holds the real error)."""
        pgid = self.proc.pid if self.proc else None
        logs = [lp for n, _, lp in self.procs if node is None or n == node] + [lp for _, _, lp in self.procs]
        self.stop()
        text, cause, where = "", None, self.log_path
        for lp in logs:
            t = lp.read_text(encoding="utf-8", errors="replace") if lp.exists() else ""
            c = root_cause(t)
            if c:
                text, cause, where = t, c, lp
                break
            text = text or t
        raise EngineError(f"{cause} ({what})" if cause else what,
                          log_excerpt=excerpt(text), log_path=where, pgid=pgid)

    def alive(self) -> str | None:
        """None while the server serves, else a one-line reason with the root cause from the logs.

        A process that exited is dead; so is a front end that is up but answers /health with an
        error or refuses the connection: vLLM's API server outlives a crashed engine core and
        answers 500 to every request (a segfault in a kernel, measured with expert parallelism on
        CPU), which must read as the deployment failing, not as day0 unable to measure.
        """
        if not self.procs:
            return "engine not started"
        for node, proc, lp in self.procs:
            code = proc.poll()
            if code is not None:
                where = f" on {node}" if self.cluster else ""
                return f"vLLM server exited with code {code}{where}" + self._cause_suffix(lp)
        problem = self._health_problem()
        if problem is None:
            return None
        return f"vLLM server up but not serving ({problem})" + self._cause_suffix(*(lp for _, _, lp in self.procs))

    def _health_problem(self) -> str | None:
        """Why /health says the engine cannot serve; None when it answers 200 or is only slow."""
        try:
            with urllib.request.urlopen(self.info.base_url + "/health", timeout=5) as resp:  # type: ignore[union-attr]
                return None if resp.status == 200 else f"/health answered {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"/health answered {exc.code}"
        except (urllib.error.URLError, OSError) as exc:  # RemoteDisconnected too, an HTTPException as well
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ConnectionRefusedError):
                return "/health refused the connection"
            return None  # a timeout on a busy box is not a death
        except http.client.HTTPException as exc:  # something listens on the port, and it is not vLLM's server
            return f"/health answered something that is not HTTP ({type(exc).__name__})"

    @staticmethod
    def _cause_suffix(*logs: Path) -> str:
        for lp in logs:
            cause = root_cause(lp.read_text(encoding="utf-8", errors="replace")) if lp.exists() else None
            if cause:
                return f": {cause}"
        return ""

    def stop(self) -> None:
        """Every node's process group: SIGTERM to all first (ranks shut down together), then each is
        waited for, ``engine.shutdown_timeout_s`` in all, not per node. Whatever stops one node (a
        second Ctrl-C, a log that cannot be rewritten) is raised only once every node is stopped:
        a rank left running holds its devices and the rendezvous port."""
        procs, self.procs = self.procs, []
        for _, proc, _ in procs[1:]:
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.profile.engine.shutdown_timeout_s
        first: BaseException | None = None
        for _, proc, lp in procs:
            hurry = isinstance(first, KeyboardInterrupt)  # the user asked twice: no more grace, still the kill
            grace = 0.0 if hurry else max(0.0, deadline - time.monotonic())
            for step in (partial(stop_process_group, proc, grace), partial(remove_file_stores, lp),
                         partial(scrub_log, lp, self.redactor)):
                try:
                    step()
                except BaseException as exc:  # noqa: BLE001 (raised below, once the other nodes are stopped)
                    first = first or exc
        if first is not None:
            raise first

    def greedy(self, prompts: list[str], max_tokens: int) -> list[Completion]:
        assert self.endpoint is not None, "greedy() before start()"
        endpoint = self.endpoint
        return [endpoint.greedy(p, max_tokens)
                for p in prompts]


# vLLM's one-node rendezvous: a torch FileStore in the temp folder, named in the log as
# "distributed_init_method=file:///tmp/vllm_dist_<32 hex>". Only an engine core that exits cleanly
# removes it, and vLLM 0.32's SIGTERM shutdown force-kills the core.
RENDEZVOUS_FILE = re.compile(r"distributed_init_method=file://(/\S*/vllm_dist_[0-9a-f]{32})(?![0-9a-f])")


def remove_file_stores(log: Path) -> list[Path]:
    """Remove the rendezvous files an engine's log names, once the engine is gone; what was removed.

    Only a path the log names in vLLM's own pattern, so nothing else in the temp folder is touched.
    """
    if not log.is_file():
        return []
    removed = []
    with log.open("r", encoding="utf-8", errors="replace") as fh:
        for path in {Path(m.group(1)) for line in fh for m in RENDEZVOUS_FILE.finditer(line)}:
            with contextlib.suppress(OSError):  # gone already, or not ours to remove: a stop never fails on it
                path.unlink()
                removed.append(path)
    return removed


def scrub_log(path: Path, redactor: Redactor) -> None:
    """Rewrite the engine's log with every known secret redacted, once the engine is gone.

    vLLM masks its own ``--api-key`` in its logs, but not a token an engine prints from its
    environment or a URL with credentials; the log is kept in the run folder, so it is scrubbed
    line by line (bounded memory), and replaced atomically.
    """
    if not path.is_file():
        return
    with path.open("r", encoding="utf-8", errors="replace") as src, replacing(path) as dst:
        for line in src:
            dst.write(redactor.text(line).encode("utf-8"))
