"""``day0 slurm submit``: submit the recipe, wait for it, and say what the scheduler did to it.

(The command line is :mod:`day0.slurm_cli`.) ``sbatch --wait`` is what a nightly job would call, and it fails the night twice over: a job whose
nodes are down or drained pends forever with nothing said, and a job that Slurm ends (``scancel``,
a node failure, the time limit) leaves a run folder whose harness was killed between SIGTERM and
SIGKILL, with no finished record. Here the wait is bounded and the scheduler's word reaches the run:

- pending on nodes Slurm reports unavailable (``ReqNodeNotAvail``, down, drained) for longer than
  ``--unavailable-timeout``: the job is cancelled and the answer is one line naming each node and
  its state and reason, exit code 3 (blocked: nothing about the deployment was judged);
- ended other than COMPLETED: the run the job started (found by ``environment.slurm.job_id``) gets
  a ``scheduler`` note with the state and reason, its record is rebuilt from the event log (what was
  measured is kept) and its report rendered again, so the record says why it stopped.

Slurm is asked through its own clients (``scontrol``, ``sinfo``, ``scancel``), each call bounded.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from day0.core.commands import run_command
from day0.core.record import EVENTS_FILE, RUN_FILE, SCHEDULER_NOTE, EventLog, rebuild
from day0.core.terminal import Terminal

EXIT_BLOCKED = 3
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
UNAVAILABLE_STATES = ("down", "drain", "drng", "drained", "draining", "fail", "failg", "maint", "boot", "power")
CALL_TIMEOUT_S = 20.0

Log = Callable[[str], None]
Render = Callable[[Path], object]


class SubmitError(RuntimeError):
    """A Slurm client failed or did not answer; one line naming the command."""


def _slurm(*argv: str, timeout: float = CALL_TIMEOUT_S) -> str:
    return run_command(argv, SubmitError, missing="is this a Slurm login node (or SLURM_CONF set)?",
                       timeout=timeout).stdout


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, NODE_FAIL, ...
    reason: str  # Slurm's, with its underscores turned back into spaces
    nodes: str  # the allocation's node list ('' while pending)
    exit_code: int  # the batch script's, once ended

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL


def job_state(job_id: str) -> JobState:
    """The job as ``scontrol show job -o`` has it (ended jobs stay there for MinJobAge, 300 s by default)."""
    text = _slurm("scontrol", "show", "job", "-o", job_id)
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobState" not in fields:
        raise SubmitError(f"scontrol show job {job_id}: no JobState in {text[:200]!r}")
    code = fields.get("ExitCode", "0:0").split(":")[0]
    return JobState(job_id=job_id, state=fields["JobState"].split("+")[0],
                    reason=fields.get("Reason", "None").replace("_", " "),
                    nodes="" if fields.get("NodeList") in (None, "(null)") else fields["NodeList"],
                    exit_code=int(code) if code.isdigit() else 1)


SINFO_NODES = ("sinfo", "-h", "-N", "-o", "%N|%T|%E")  # one line a node: name, state, reason


def parse_node_states(text: str) -> dict[str, tuple[str, str]]:
    """``SINFO_NODES``'s output: every node's (state, reason), the state in lower case."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3:
            out[parts[0]] = (parts[1].lower(), parts[2])
    return out


def node_states() -> dict[str, tuple[str, str]]:
    """Every node: (state, reason) as sinfo reports them."""
    return parse_node_states(_slurm(*SINFO_NODES))


def unavailable_nodes(job: JobState) -> dict[str, tuple[str, str]]:
    """The nodes a pending job waits for that Slurm says are out of service, with state and reason.

    Slurm names them in the reason (``ReqNodeNotAvail, UnavailableNodes:node1``) when it can; its
    other wording ("Nodes required for job are DOWN, DRAINED ...") names none, so then every node
    out of service counts. A job pending for Resources or Priority (a busy cluster) waits on."""
    named = re.search(r"UnavailableNodes:(\S+)", job.reason)
    if not (named or "ReqNodeNotAvail" in job.reason or "DOWN, DRAINED" in job.reason):
        return {}
    states = node_states()
    down = {n: s for n, s in states.items() if s[0].rstrip("*~#!%$@^-").startswith(UNAVAILABLE_STATES)
            or s[0].endswith("*")}
    if named:
        from day0.engine.cluster.slurm import expand_nodelist

        wanted = expand_nodelist(named.group(1).rstrip(","))
        return {n: states.get(n, ("unknown", "")) for n in wanted} | {n: down[n] for n in wanted if n in down}
    return down


@dataclass(frozen=True)
class Outcome:
    job: JobState
    blocked: str = ""  # why the job was cancelled before it ran
    waited_s: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.blocked:
            return EXIT_BLOCKED
        return self.job.exit_code if self.job.state == "COMPLETED" else (self.job.exit_code or 1)


def wait_for(job_id: str, unavailable_timeout_s: float, timeout_s: float | None, log: Log,
             poll_s: float = 1.0, progress_s: float = 30.0) -> Outcome:
    """Poll the job until it ends; cancel it when the nodes it waits for stay out of service."""
    t0 = time.monotonic()
    unavailable_since: float | None = None
    last_said = t0
    while True:
        job = job_state(job_id)
        now = time.monotonic()
        if job.ended:
            return Outcome(job, waited_s=now - t0)
        bad = unavailable_nodes(job) if job.state == "PENDING" else {}
        unavailable_since = (unavailable_since or now) if bad else None
        if bad and now - unavailable_since >= unavailable_timeout_s:
            _slurm("scancel", job_id)
            names = ", ".join(f"{n} ({s}{': ' + r if r and r != 'none' else ''})" for n, (s, r) in bad.items())
            return Outcome(job, waited_s=now - t0, blocked=(
                f"job {job_id} waited {now - unavailable_since:.0f} s for {names}, which Slurm reports out of "
                f"service ({job.reason}); cancelled it: blocked, nothing was measured"))
        if timeout_s is not None and now - t0 > timeout_s:
            _slurm("scancel", job_id)
            return Outcome(job_state(job_id), waited_s=now - t0,
                           blocked=f"job {job_id} still {job.state} after --timeout {timeout_s:g} s; cancelled it")
        if now - last_said >= progress_s:
            where = f" on {job.nodes}" if job.nodes else f" ({job.reason})"
            log(f"job {job_id} {job.state}{where}, {now - t0:.0f} s")
            last_said = now
        time.sleep(poll_s)


def find_run(out_dir: Path, job_id: str) -> Path | None:
    """The run folder under ``out_dir`` whose record names this Slurm job (its first event, read bounded)."""
    if not out_dir.is_dir():
        return None
    runs = [p for p in out_dir.glob(f"*/{EVENTS_FILE}") if not p.parent.is_symlink()]  # not `latest`
    for events in sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            with events.open("rb") as fh:
                first = json.loads(fh.readline(8 << 20) or b"{}")
        except (OSError, ValueError):
            continue
        slurm = (first.get("environment") or {}).get("slurm") if isinstance(first, dict) else None
        if isinstance(slurm, dict) and str(slurm.get("job_id")) == job_id:
            return events.parent
    return None


def record_the_end(run_dir: Path, job: JobState, render: Render, log: Log) -> str:
    """Note the scheduler's word in the run's event log, rebuild the record, render its report again
    (``render``: the caller's report writer); returns the verdict line."""
    EventLog(run_dir / EVENTS_FILE).note(SCHEDULER_NOTE, {
        "kind": "slurm", "job_id": job.job_id, "state": job.state, "reason": job.reason, "nodes": job.nodes,
        "exit_code": job.exit_code})
    record = rebuild(run_dir)
    try:
        render(run_dir / RUN_FILE)
    except Exception as exc:  # the rebuilt record is on disk: say why its report is not
        log(f"report not rendered again: {type(exc).__name__}: {exc}")
    return f"{record.verdict.upper()}: {record.reason}"


def submit(sbatch_args: Sequence[str], out_dir: Path, unavailable_timeout_s: float, timeout_s: float | None,
           render: Render, log: Log) -> int:
    """sbatch, wait (bounded on nodes out of service), and leave the run's record saying how the job ended;
    returns the exit code for the caller (the job's; 3 when blocked)."""
    text = _slurm("sbatch", "--parsable", *sbatch_args)
    job_id = text.strip().splitlines()[-1].split(";")[0] if text.strip() else ""
    if not job_id.isdigit():
        raise SubmitError(f"sbatch answered {text.strip()[:200]!r}, not a job id")
    log(f"submitted job {job_id}; waiting (nodes out of service: cancelled after {unavailable_timeout_s:g} s)")
    outcome = wait_for(job_id, unavailable_timeout_s, timeout_s, log)
    if outcome.blocked:
        print(Terminal().line(f"day0: blocked: {outcome.blocked}"), file=sys.stderr)  # Slurm's reasons, node names
        return EXIT_BLOCKED
    job = outcome.job
    run_dir = find_run(out_dir, job_id)
    summary = f"job {job_id} {job.state} (exit {job.exit_code}) after {outcome.waited_s:.0f} s"
    if job.state != "COMPLETED" and run_dir is not None:
        summary += f"; run {run_dir.name} rebuilt: {record_the_end(run_dir, job, render, log)}"
    elif run_dir is not None:
        summary += f"; run record {run_dir / 'run.json'}"
    else:
        summary += f"; no run of this job under {out_dir}"
    print(Terminal().line(f"day0: {summary}" + (f" ({job.reason})" if job.state != "COMPLETED" and job.reason != "None" else "")))
    return outcome.exit_code
