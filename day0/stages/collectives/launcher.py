"""The local launcher: start the ranks on this host, watch them, and kill every process they left.

One launcher process (``python -m day0.stages.collectives _launch N SETTINGS OUT_DIR``) imports
torch once and forks the ranks, each a session leader with torchrun's environment. The harness
watches their exit files, step files and heartbeats; at the first failure the others get
``grace_s`` to report, then every rank's process group and the launcher are SIGKILLed and
:func:`~day0.stages.collectives.faults.diagnose` names the culprit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

from day0.core.outputs import open_output, write_file
from day0.core.sockets import free_port
from day0.engine.process import signal_group
from day0.stages.collectives.faults import clean_error, diagnose
from day0.stages.collectives.rank import run_rank
from day0.stages.collectives.rank_env import RankEnv
from day0.stages.collectives.result import (
    RANKS_DIR,
    RESULT_FILE,
    SETTINGS_FILE,
    CollectivesResult,
    Fault,
    OpOutcome,
    RankState,
    load_result,
)
from day0.stages.collectives.settings import CollectivesSection, SettingsError, coerce_settings


class _Rank:
    """One local rank as the harness sees it: a pid the zygote reported and an exit file it writes."""

    def __init__(self, rank: int, ranks_dir: Path) -> None:
        self.rank = rank
        self.dir = ranks_dir
        self.pid: int | None = None
        self.rc: int | None = None
        self.killed_by_harness = False

    def _read_pid(self) -> int | None:
        if self.pid is None:
            try:
                self.pid = int((self.dir / f"rank{self.rank}.pid").read_text())
            except (OSError, ValueError):
                return None
        return self.pid

    def recorded_exit(self) -> int | None:
        """The exit status known already: kept, or read from the rank's exit file (cached)."""
        if self.rc is None:
            try:
                self.rc = int((self.dir / f"rank{self.rank}.exit").read_text())
            except (OSError, ValueError):
                pass
        return self.rc

    def poll(self, launcher_rc: int | None = None) -> int | None:
        """The rank's exit status (-signal or code), or None while it runs."""
        if self.recorded_exit() is not None:
            return self.rc
        pid = self._read_pid()
        if pid is None:
            # Never forked: the launcher died first (its exit code says why), else still starting.
            if launcher_rc is not None:
                self.rc = launcher_rc if launcher_rc != 0 else 1
            return self.rc
        try:
            os.kill(pid, 0)
            return None  # running (or a zombie the launcher is about to reap and record)
        except ProcessLookupError:
            if launcher_rc is None:
                return None  # exited: the launcher is writing its exit file
            self.rc = 1  # the launcher is gone and the exit status with it
            return self.rc
        except PermissionError:  # pragma: no cover - pid reused by another user's process
            return None

    def kill_group(self) -> None:
        """SIGKILL the rank's process group (each rank is a session leader)."""
        pid = self._read_pid()
        if pid is None:
            return
        if self.poll() is None:
            self.killed_by_harness = True
        signal_group(pid)


def zygote_main(n: int, settings_path: Path, out_dir: Path) -> int:
    """Import torch once, fork the n ranks (each in its own session), reap them, record exit codes.

    Importing torch costs seconds of CPU per process; forking after the import (as torch's own
    DataLoader workers do) pays it once. CUDA is never touched here, so NCCL ranks may init it.
    """
    import torch  # noqa: F401 - the point: imported before fork
    import torch.distributed  # noqa: F401

    settings = CollectivesSection.from_mapping(json.loads(Path(settings_path).read_text(encoding="utf-8")))
    ranks_dir = Path(out_dir) / RANKS_DIR
    children: dict[int, int] = {}
    for r in range(n):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            try:
                os.setsid()
                with open_output(ranks_dir / f"rank{r}.log") as log:
                    os.dup2(log.fileno(), 1)
                    os.dup2(log.fileno(), 2)
                os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0")
                code = run_rank(settings, RankEnv(r, n, r, n), Path(out_dir))
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                os._exit(code)
        children[pid] = r
        write_file(ranks_dir / f"rank{r}.pid", str(pid))
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        r = children.pop(pid, None)
        if r is None:
            continue
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        write_file(ranks_dir / f"rank{r}.exit", str(rc))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip torch's interpreter teardown (seconds on a busy box); nothing is left to flush


def run_local(
    settings: CollectivesSection | Mapping[str, Any] | None,
    world_size: int | None = None,
    out_dir: Path | str = "reports/collectives",
    *,
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.05,
) -> CollectivesResult:
    """Start ``world_size`` ranks on this host (gloo on CPU, one rank per GPU with NCCL), wait, judge.

    A launcher process imports torch once and forks the ranks, each in its own session/process
    group with torchrun's environment variables; whatever happens, every rank's group and the
    launcher are SIGKILLed before this returns, so no process outlives the call.
    """
    s = coerce_settings(settings)
    n = int(world_size or s.world_size or 2)
    if n < 1:
        raise SettingsError(f"collectives.world_size: must be >= 1, got {n}")
    out, ranks_dir = prepare_out_dir(out_dir, s)
    port = s.master_port or free_port(s.master_addr)
    e = rank_base_env(env)
    e.update(MASTER_ADDR=s.master_addr, MASTER_PORT=str(port))
    ranks = [_Rank(r, ranks_dir) for r in range(n)]
    t_start = time.monotonic()
    with open_output(ranks_dir / "launcher.log") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "day0.stages.collectives", "_launch", str(n), str(out / SETTINGS_FILE), str(out)],
            env=e, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO_ROOT,
        )
        write_file(ranks_dir / "launcher.pid", str(launcher.pid))
        fault = watch_ranks(ranks, _LocalAgent(launcher, ranks_dir / "launcher.log"), s, out, t_start, poll_s,
                            f"collectives sweep ({n} ranks)")
    return finish_result(out, s, n, fault, time.monotonic() - t_start)


REPO_ROOT = str(Path(__file__).resolve().parents[3])  # day0/stages/collectives/ -> the folder holding day0


def prepare_out_dir(out_dir: Path | str, s: CollectivesSection) -> tuple[Path, Path]:
    """The run's folder (absolute) and its ranks/ folder, cleared of a previous run, with the settings the ranks read."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ranks_dir = out / RANKS_DIR
    ranks_dir.mkdir(exist_ok=True)
    for stale in [out / RESULT_FILE, *ranks_dir.glob("rank*"), *ranks_dir.glob("launcher*"), *ranks_dir.glob("node*"),
                  *out.glob("nccl-debug.*.log")]:
        stale.unlink(missing_ok=True)
    write_file(out / SETTINGS_FILE, json.dumps(s.to_dict(), indent=1))
    return out, ranks_dir


def rank_base_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: this one (or ``env``) with day0 importable and no rank variables of an outer job."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = REPO_ROOT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("OMP_NUM_THREADS", "1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
              "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        e.pop(k, None)
    return e


def watch_ranks(ranks: list[_Rank], agent: Any, s: CollectivesSection, out: Path, t_start: float, poll_s: float,
                title: str) -> Fault | None:
    """Watch the ranks under a progress bar; whatever happens, every process is killed before this returns."""
    from day0.core.progress import Progress

    points = _points(s)
    try:
        with Progress(len(points) or None, title, "points") as bar:
            return _watch(ranks, agent, s, out, t_start, poll_s, lambda st: _show(bar, points, st))
    finally:
        agent.kill(ranks)


def finish_result(out: Path, s: CollectivesSection, n: int, fault: Fault | None, elapsed: float) -> CollectivesResult:
    """Rank 0's result (or an empty one), with the diagnosed fault, written back."""
    try:
        result = load_result(out)
    except (FileNotFoundError, ValueError):
        result = CollectivesResult(source="day0", world_size=n, dtype=s.dtype, settings=s.to_dict(),
                                   ops={op: OpOutcome(op) for op in s.ops})
    if fault is not None:
        fault.elapsed_s = elapsed
        result.fault = fault
        result.complete = False
        for o in result.ops.values():
            if o.status == "not_run":
                o.reason = o.reason or "not reached: " + fault.message
    result.nccl_logs = sorted(str(p) for p in out.glob("nccl-debug.*.log"))
    result.write(out / RESULT_FILE)
    return result


def _rank_states(ranks: list[_Rank], out: Path, launcher_rc: int | None) -> list[RankState]:
    now = time.time()
    states = []
    rd = out / RANKS_DIR
    for c in ranks:
        step = None
        try:
            step = json.loads((rd / f"rank{c.rank}.step.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            pass
        err = None
        try:
            err = clean_error((rd / f"rank{c.rank}.error.txt").read_text(encoding="utf-8").splitlines()[0])
        except (OSError, IndexError):
            err = _log_hint(rd / f"rank{c.rank}.log")
        try:
            hb = now - (rd / f"rank{c.rank}.heartbeat").stat().st_mtime
        except OSError:
            hb = None
        states.append(RankState(
            rank=c.rank, pid=c.pid, host=(step or {}).get("host") or getattr(c, "node", None),
            returncode=c.poll(launcher_rc),
            killed_by_harness=c.killed_by_harness, heartbeat_age_s=hb, step=step, error=err,
        ))
    return states


_TIMEOUT_LINE = re.compile(r"Watchdog caught collective operation timeout|timed out|Timeout|NCCL communicator was aborted", re.I)


def _log_hint(path: Path) -> str | None:
    """A rank that died without writing its error (NCCL's watchdog aborts the process on a
    collective timeout) still logged why: the timeout line marks it as a victim, not a culprit."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if _TIMEOUT_LINE.search(line):
            return clean_error(line.strip())[:300]
    return None


def _points(s: CollectivesSection) -> list[tuple[str, str, int]]:
    """The sweep's (op, mode, size) points in the order a rank measures them."""
    try:
        return [(op, mode, size) for op in s.ops for mode in s.modes(op) for size in s.sizes()]
    except Exception:  # progress only: settings the ranks will refuse say so themselves
        return []


def _show(bar: Any, points: list[tuple[str, str, int]], states: list[RankState]) -> None:
    """Rank 0's step file says which point it is measuring; that is the sweep's progress."""
    step = states[0].step if states else None
    if not step or step.get("phase") != "sweep":
        return
    key = (step.get("op"), step.get("mode"), step.get("size"))
    if key in points:
        bar.set(points.index(key), f"{key[0]} {key[1]} {key[2]} B")


def _started(st: RankState) -> bool:
    return bool(st.step) and st.step.get("phase") not in ("import", "rendezvous")


def _watch(ranks: list[_Rank], agent: Any, s: CollectivesSection, out: Path, t_start: float,
           poll_s: float, show: Callable[[list[RankState]], None] = lambda states: None) -> Fault | None:
    """Wait for the ranks; on the first failure give the rest ``grace_s``, then kill and diagnose."""
    first_fail: float | None = None
    hb_limit = float(s.timeout_s) + float(s.grace_s)
    started = False
    while True:
        lrc = agent.poll()
        codes = [c.poll(lrc) for c in ranks]
        now = time.monotonic()
        if all(code == 0 for code in codes):
            return None
        if first_fail is None and any(code not in (None, 0) for code in codes):
            first_fail = now
        if first_fail is not None and (now - first_fail >= s.grace_s or all(code is not None for code in codes)):
            break
        if first_fail is None:
            states = _rank_states(ranks, out, lrc)
            show(states)
            started = started or all(_started(st) for st in states)
            if not started and now - t_start > s.startup_timeout_s:
                where = ", ".join(f"{st.rank}:{(st.step or {}).get('phase', 'not started')}" for st in states)
                agent.kill(ranks)
                states = _rank_states(ranks, out, agent.poll())
                return Fault("startup", [st.rank for st in states if not _started(st)],
                             f"ranks did not all start within startup_timeout_s={s.startup_timeout_s:g} s ({where})",
                             states)
            if any(st.returncode is None and st.heartbeat_age_s is not None and st.heartbeat_age_s > hb_limit
                   for st in states):
                break  # a frozen rank (SIGSTOP, a stuck driver call): its heartbeat thread stopped too
        time.sleep(poll_s)
    before = _rank_states(ranks, out, agent.poll())
    agent.kill(ranks)
    states = _rank_states(ranks, out, agent.poll())
    for st, b in zip(states, before):  # the heartbeat age seen before the kill is the evidence
        st.heartbeat_age_s = b.heartbeat_age_s
    if all(st.pid is None for st in states):
        return Fault("startup", [st.rank for st in states], agent.no_ranks_message(), states)
    return diagnose(states, float(s.timeout_s))


def _tail(path: Path, n: int = 300) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no launcher log)"
    return (lines[-1] if lines else "(empty launcher log)")[:n]


class _LocalAgent:
    """The local launcher process as the watcher sees it: its status, the kill, and why no rank started."""

    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.proc, self.log = proc, log

    def poll(self) -> int | None:
        return self.proc.poll()

    def no_ranks_message(self) -> str:
        return f"the local launcher failed before starting ranks: {_tail(self.log)}"

    def kill(self, ranks: list[_Rank]) -> None:
        _kill_all(ranks, self.proc)


def _kill_all(ranks: list[_Rank], launcher: subprocess.Popen) -> None:
    """SIGKILL every rank group, let the launcher reap and record them, then kill the launcher."""
    for c in ranks:
        c.kill_group()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and launcher.poll() is None:
        if all(c.poll() is not None for c in ranks):
            break
        time.sleep(0.02)
    kill_and_reap(launcher)
    for c in ranks:  # a rank whose exit was never recorded: its group may still hold helpers
        c.poll(launcher.returncode)
        if c.pid is not None:
            signal_group(c.pid)


def kill_and_reap(proc: subprocess.Popen) -> None:
    """SIGKILL a session leader's group and reap the leader."""
    signal_group(proc.pid)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        pass
