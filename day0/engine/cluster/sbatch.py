"""``day0 slurm submit``: submit the recipe, wait for it, and say what the scheduler did to it.

(The command line is :mod:`day0.slurm_cli`.) ``sbatch --wait`` is what a nightly job would call, and it fails the night twice over: a job whose
nodes are down or drained pends forever with nothing said, and a job that Slurm ends (``scancel``,
a node failure, the time limit) leaves a run folder whose harness was killed between SIGTERM and
SIGKILL, with no finished record. Here the wait is bounded and the scheduler's word reaches the run:

- pending on nodes Slurm reports unavailable (``ReqNodeNotAvail``, down, drained) for longer than
  ``--unavailable-timeout``: the job is cancelled and the answer is one line naming each node and
  its state and reason, exit code 3 (blocked: nothing about the deployment was judged). Only nodes
  the job could use count: those Slurm names, else those it asked for, else its partition's, and
  then only when too few of them are left in service for the job's node count (a busy cluster
  with a node down elsewhere waits on);
- still pending after ``--timeout``: cancelled, exit 3 as above; already running: cancelled, and
  its run's record says so as for any job Slurm ended;
- ended other than COMPLETED: the run the job started (found by ``environment.slurm.job_id``) gets
  a ``scheduler`` note with the state and reason, its record is rebuilt from the event log (what was
  measured is kept) and its report rendered again, so the record says why it stopped.

Slurm is asked through its own clients (``scontrol``, ``sinfo``, ``scancel``), each call bounded; while
waiting, a busy controller's failed answers are asked again (``POLL_FAILURES_TOLERATED`` in a row).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from day0.core.commands import run_command
from day0.core.events import EVENTS_FILE, EventLog, read_events, rebuild
from day0.core.record import RUN_FILE, SCHEDULER_NOTE, RecordError
from day0.core.terminal import Terminal

EXIT_BLOCKED = 3
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
UNAVAILABLE_STATES = ("down", "drain", "drng", "drained", "draining", "fail", "failg", "maint", "boot", "power")
CALL_TIMEOUT_S = 20.0
POLL_FAILURES_TOLERATED = 5  # failed scontrol answers in a row while waiting (a busy slurmctld times out)
CANCEL_WAIT_S = 120.0  # how long a job day0 cancelled may take to end (KillWait is 30 s by default)

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
    partition: str = ""  # the partitions it may run in, comma-separated
    req_nodes: str = ""  # the nodes it asked for by name ('' when any)
    num_nodes: int = 1

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL


def job_state(job_id: str) -> JobState:
    """The job as ``scontrol show job -o`` has it (ended jobs stay there for MinJobAge, 300 s by default)."""
    return parse_job(job_id, _slurm("scontrol", "show", "job", "-o", job_id))


def parse_job(job_id: str, text: str) -> JobState:
    """``scontrol show job -o``'s answer as one job.

    A heterogeneous job or an array prints one line per component or task; the job is all of
    them: ended when every line has ended, COMPLETED only when every line completed (else the
    first line that did not, with its exit code), and while any runs, running on their nodes."""
    lines = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines()]
    lines = [f for f in lines if "JobState" in f]
    if not lines:
        raise SubmitError(f"scontrol show job {job_id}: no JobState in {text[:200]!r}")
    jobs = [_one_line(job_id, f) for f in lines]
    live = [j for j in jobs if not j.ended]
    pick = (next((j for j in live if j.state == "RUNNING"), live[0]) if live
            else next((j for j in jobs if j.state != "COMPLETED"), jobs[0]))
    nodes = ",".join(dict.fromkeys(j.nodes for j in (live or jobs) if j.nodes))
    return replace(pick, nodes=nodes, num_nodes=sum(j.num_nodes for j in (live or jobs)))


def _one_line(job_id: str, fields: dict[str, str]) -> JobState:
    def given(key: str) -> str:
        return "" if fields.get(key) in (None, "(null)") else fields[key]

    code = fields.get("ExitCode", "0:0").split(":")[0]
    count = fields.get("NumNodes", "1").split("-")[0]
    return JobState(job_id=job_id, state=fields["JobState"].split("+")[0],
                    reason=fields.get("Reason", "None").replace("_", " "), nodes=given("NodeList"),
                    exit_code=int(code) if code.isdigit() else 1, partition=given("Partition"),
                    req_nodes=given("ReqNodeList"), num_nodes=int(count) if count.isdigit() else 1)


SINFO_NODES = ("sinfo", "-h", "-N", "-o", "%N|%T|%E")  # one line a node: name, state, reason


def parse_node_states(text: str) -> dict[str, tuple[str, str]]:
    """``SINFO_NODES``'s output: every node's (state, reason), the state in lower case."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3:
            out[parts[0]] = (parts[1].lower(), parts[2])
    return out


def node_states(partition: str = "") -> dict[str, tuple[str, str]]:
    """Every node (of ``partition``, when given): (state, reason) as sinfo reports them."""
    return parse_node_states(_slurm(*SINFO_NODES, *(("-p", partition) if partition else ())))


def _out_of_service(state: str) -> bool:
    return state.rstrip("*~#!%$@^-").startswith(UNAVAILABLE_STATES) or state.endswith("*")


def unavailable_nodes(job: JobState) -> dict[str, tuple[str, str]]:
    """The nodes a pending job waits for that Slurm says are out of service, with state and reason.

    Slurm names them in the reason (``ReqNodeNotAvail, UnavailableNodes:node1``) when it can. Its
    other wording ("Nodes required for job are DOWN, DRAINED ...") names none: then the nodes the
    job asked for by name count, else its partition's, and only when fewer than the job's node
    count are left in service (on a big cluster some node is always down, and a job waiting on a
    busy partition is not blocked). A job pending for Resources or Priority waits on."""
    from day0.engine.cluster.slurm import expand_nodelist

    named = re.search(r"UnavailableNodes:(\S+)", job.reason)
    if not (named or "ReqNodeNotAvail" in job.reason or "DOWN, DRAINED" in job.reason):
        return {}
    states = node_states(job.partition)
    if named:
        wanted = expand_nodelist(named.group(1).rstrip(","))
        return {n: states.get(n, ("unknown", "")) for n in wanted}
    usable = {n: states.get(n, ("unknown", "")) for n in expand_nodelist(job.req_nodes)} if job.req_nodes else states
    down = {n: s for n, s in usable.items() if _out_of_service(s[0])}
    if job.req_nodes:
        return down  # every node asked for by name is needed
    return down if len(usable) - len(down) < job.num_nodes else {}


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
    """Poll the job until it ends; cancel it when the nodes it waits for stay out of service, or at
    ``timeout_s`` (a job that had started is then followed to its end, as any job Slurm ended)."""
    t0 = time.monotonic()
    unavailable_since: float | None = None
    last_said = t0
    poll = _Poller(job_id, log)
    while True:
        job = poll.state()
        now = time.monotonic()
        if job is None:
            time.sleep(poll_s)
            continue
        if job.ended:
            return Outcome(job, waited_s=now - t0)
        bad = _unavailable_or_none(job, log) if job.state == "PENDING" else {}
        unavailable_since = (unavailable_since or now) if bad else None
        if bad and now - unavailable_since >= unavailable_timeout_s:
            _slurm("scancel", job_id)
            names = ", ".join(f"{n} ({s}{': ' + r if r and r != 'none' else ''})" for n, (s, r) in bad.items())
            return Outcome(job, waited_s=now - t0, blocked=(
                f"job {job_id} waited {now - unavailable_since:.0f} s for {names}, which Slurm reports out of "
                f"service ({job.reason}); cancelled it: blocked, nothing was measured"))
        if timeout_s is not None and now - t0 > timeout_s:
            _slurm("scancel", job_id)
            if job.state == "PENDING":
                return Outcome(job, waited_s=now - t0,
                               blocked=f"job {job_id} still PENDING after --timeout {timeout_s:g} s; cancelled it")
            log(f"job {job_id} still {job.state} after --timeout {timeout_s:g} s; cancelled it, waiting for it to end")
            return Outcome(_until_ended(poll, poll_s), waited_s=time.monotonic() - t0)
        if now - last_said >= progress_s:
            where = f" on {job.nodes}" if job.nodes else f" ({job.reason})"
            log(f"job {job_id} {job.state}{where}, {now - t0:.0f} s")
            last_said = now
        time.sleep(poll_s)


def _unavailable_or_none(job: JobState, log: Log) -> dict[str, tuple[str, str]]:
    """:func:`unavailable_nodes`, with sinfo's failure (a busy controller) read as nothing known yet:
    the wait goes on, and the next poll asks again."""
    try:
        return unavailable_nodes(job)
    except SubmitError as exc:
        log(f"{exc}; asking again")
        return {}


class _Poller:
    """``job_state`` for a wait that lasts hours: a failed answer (a busy slurmctld's socket
    timeout) is asked again at the next poll, and only ``POLL_FAILURES_TOLERATED`` in a row end the
    wait, saying the job was left as it is."""

    def __init__(self, job_id: str, log: Log) -> None:
        self.job_id, self.log, self.failures = job_id, log, 0

    def state(self) -> JobState | None:
        try:
            job = job_state(self.job_id)
        except SubmitError as exc:
            self.failures += 1
            if self.failures >= POLL_FAILURES_TOLERATED:
                raise SubmitError(f"{exc} ({self.failures} times in a row); job {self.job_id} was not cancelled: "
                                  f"follow it with `scontrol show job {self.job_id}`") from None
            self.log(f"{exc}; asking again")
            return None
        self.failures = 0
        return job


def _until_ended(poll: _Poller, poll_s: float) -> JobState:
    """The cancelled job once it has ended (bounded by ``CANCEL_WAIT_S``)."""
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        job = poll.state()
        if job is not None and job.ended:
            return job
        time.sleep(poll_s)
    raise SubmitError(f"job {poll.job_id} was cancelled but had not ended {CANCEL_WAIT_S:g} s later: "
                      f"follow it with `scontrol show job {poll.job_id}`")


def find_run(out_dir: Path, job_id: str) -> Path | None:
    """The run folder under ``out_dir`` whose record names this Slurm job (its first event, read bounded)."""
    if not out_dir.is_dir():
        return None
    runs = [p for p in out_dir.glob(f"*/{EVENTS_FILE}") if not p.parent.is_symlink()]  # not `latest`
    for events in sorted(runs, key=_mtime, reverse=True):
        try:  # a folder there may be anything (a FIFO, a hand edit): each is read as any event log is
            first = next(read_events(events), {})
        except RecordError:
            continue
        environment = first.get("environment")
        slurm = environment.get("slurm") if isinstance(environment, dict) else None
        if isinstance(slurm, dict) and str(slurm.get("job_id")) == job_id:
            return events.parent
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # a dangling link: last
        return 0.0


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
