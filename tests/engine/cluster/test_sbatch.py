"""``day0 slurm submit``'s wait, against scripted answers of Slurm's clients.

The real-Slurm tests (test_real_slurm.py) cover a node drained or down and a job cancelled mid-run
on one emulated cluster; these cover what one cluster cannot show in seconds: a busy controller, a
node down outside the job's partition, heterogeneous jobs, ``--timeout`` on a running job. The
fake is ``sbatch._slurm`` (every client call goes through it), scripted per command.
"""

from __future__ import annotations

from typing import Callable

import pytest

from day0.engine.cluster import sbatch
from day0.engine.cluster.sbatch import SubmitError, parse_job, unavailable_nodes, wait_for

Answer = str | Exception | Callable[[], str]


class ScriptedSlurm:
    """A labelled fake of Slurm's clients: each command's answers in turn (the last one repeats)."""

    def __init__(self, **answers: list[Answer]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *argv: str, timeout: float = 0) -> str:
        self.calls.append(argv)
        queue = self.answers[argv[0]]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer() if callable(answer) else answer

    def ran(self, command: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == command]


def job_line(state: str, *, reason: str = "None", nodes: str = "(null)", exit_code: str = "0:0",
             partition: str = "gpu", req: str = "(null)", num: int = 2, job_id: str = "42") -> str:
    return (f"JobId={job_id} JobName=day0 JobState={state} Reason={reason} Partition={partition} "
            f"ReqNodeList={req} NodeList={nodes} NumNodes={num} ExitCode={exit_code}")


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sbatch.time, "sleep", lambda s: None)


def scripted(monkeypatch: pytest.MonkeyPatch, **answers: list[Answer]) -> ScriptedSlurm:
    fake = ScriptedSlurm(**answers)
    monkeypatch.setattr(sbatch, "_slurm", fake)
    return fake


DOWN_DRAINED = "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"


def test_a_node_down_outside_the_jobs_partition_does_not_block_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's unnamed wording: only the partition's nodes count, and only when too few are left."""
    fake = scripted(monkeypatch, sinfo=["gpu01|allocated|none\ngpu02|allocated|none\ngpu03|down*|Not responding\n"])
    job = parse_job("42", job_line("PENDING", reason=DOWN_DRAINED, num=2))
    assert unavailable_nodes(job) == {}  # two of three in service: the job waits for them to free up
    assert fake.ran("sinfo")[0][-2:] == ("-p", "gpu")
    job = parse_job("42", job_line("PENDING", reason=DOWN_DRAINED, num=3))
    assert unavailable_nodes(job) == {"gpu03": ("down*", "Not responding")}  # now it cannot run


def test_nodes_asked_for_by_name_count_when_slurm_names_none(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, sinfo=["gpu01|idle|none\ngpu02|drained|maintenance\ngpu03|idle|none\n"])
    job = parse_job("42", job_line("PENDING", reason=DOWN_DRAINED, req="gpu[01-02]", num=2))
    assert unavailable_nodes(job) == {"gpu02": ("drained", "maintenance")}
    job = parse_job("42", job_line("PENDING", reason=DOWN_DRAINED, req="gpu[01,03]", num=2))
    assert unavailable_nodes(job) == {}


@pytest.mark.parametrize("lines, state, exit_code, nodes", [
    (["RUNNING:0:0:gpu[01-04]", "COMPLETED:0:0:cpu01"], "RUNNING", 0, "gpu[01-04]"),
    (["FAILED:1:0:gpu[01-04]", "COMPLETED:0:0:cpu01"], "FAILED", 1, "gpu[01-04],cpu01"),
    (["COMPLETED:0:0:gpu[01-04]", "CANCELLED:0:15:cpu01"], "CANCELLED", 0, "gpu[01-04],cpu01"),
    (["COMPLETED:0:0:gpu01", "COMPLETED:0:0:gpu02"], "COMPLETED", 0, "gpu01,gpu02"),
])
def test_a_heterogeneous_jobs_lines_are_one_job(lines: list[str], state: str, exit_code: int, nodes: str) -> None:
    """One line per component: ended only when all have, COMPLETED only when all did."""
    text = "\n".join(job_line(s, exit_code=f"{c}:{sig}", nodes=n, job_id=str(42 + i))
                     for i, (s, c, sig, n) in enumerate(line.split(":") for line in lines))
    job = parse_job("42", text)
    assert (job.state, job.exit_code, job.nodes) == (state, exit_code, nodes)


def test_a_busy_controllers_failed_answers_are_asked_again(monkeypatch: pytest.MonkeyPatch, no_sleep: None) -> None:
    timeout = SubmitError("`scontrol show job -o 42` failed: Socket timed out on send/recv operation")
    fake = scripted(monkeypatch, scontrol=[job_line("RUNNING"), timeout, timeout,
                                           job_line("COMPLETED", nodes="gpu[01-02]")])
    said: list[str] = []
    outcome = wait_for("42", 300, None, said.append)
    assert (outcome.job.state, outcome.exit_code, fake.ran("scancel")) == ("COMPLETED", 0, [])
    assert sum("asking again" in m for m in said) == 2


def test_a_controller_that_stays_silent_ends_the_wait_naming_the_job_left_as_it_is(
        monkeypatch: pytest.MonkeyPatch, no_sleep: None) -> None:
    timeout = SubmitError("`scontrol show job -o 42` did not finish within 20 s")
    fake = scripted(monkeypatch, scontrol=[job_line("RUNNING"), timeout])
    with pytest.raises(SubmitError, match=r"5 times in a row\); job 42 was not cancelled: follow it with "
                                          r"`scontrol show job 42`"):
        wait_for("42", 300, None, lambda m: None)
    assert fake.ran("scancel") == []


def test_timeout_on_a_running_job_cancels_it_and_follows_it_to_its_end(
        monkeypatch: pytest.MonkeyPatch, no_sleep: None) -> None:
    """The job ran: its end is the scheduler's word for its run (exit not 3, which says nothing ran)."""
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(sbatch.time, "monotonic", lambda: float(next(clock)))
    fake = scripted(monkeypatch, scontrol=[job_line("RUNNING", nodes="gpu[01-02]"), job_line("RUNNING"),
                                           job_line("COMPLETING"), job_line("CANCELLED", reason="None")],
                    scancel=[""])
    outcome = wait_for("42", 300, 15, lambda m: None)
    assert fake.ran("scancel") == [("scancel", "42")]
    assert (outcome.blocked, outcome.job.state, outcome.exit_code) == ("", "CANCELLED", 1)


def test_timeout_on_a_pending_job_is_blocked(monkeypatch: pytest.MonkeyPatch, no_sleep: None) -> None:
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(sbatch.time, "monotonic", lambda: float(next(clock)))
    fake = scripted(monkeypatch, scontrol=[job_line("PENDING", reason="Resources")], scancel=[""])
    outcome = wait_for("42", 300, 15, lambda m: None)
    assert fake.ran("scancel") == [("scancel", "42")]
    assert outcome.exit_code == sbatch.EXIT_BLOCKED and "still PENDING after --timeout 15 s" in outcome.blocked


def test_a_failed_sinfo_while_a_job_waits_on_nodes_is_asked_again(monkeypatch: pytest.MonkeyPatch, no_sleep: None) -> None:
    """sinfo shares the controller's hiccups: one failed answer is nothing known yet, not the end."""
    fake = scripted(monkeypatch, scontrol=[job_line("PENDING", reason=DOWN_DRAINED, num=3), job_line("RUNNING"),
                                           job_line("COMPLETED")],
                    sinfo=[SubmitError("`sinfo -h -N` did not finish within 20 s"), "gpu01|idle|none\n"])
    said: list[str] = []
    outcome = wait_for("42", 300, None, said.append)
    assert (outcome.job.state, fake.ran("scancel")) == ("COMPLETED", [])
    assert said == ["`sinfo -h -N` did not finish within 20 s; asking again"]


def test_find_run_passes_over_anything_that_is_not_a_runs_event_log(tmp_path) -> None:
    """A stray folder under --out once ended every later submit (the hunt): a FIFO hung it, an
    ``environment`` that is a string raised AttributeError, a deep first line RecursionError; and
    the job's record was never rebuilt. Each is passed over; the job's own run is still found."""
    import json
    import os

    from day0.core.events import EventLog

    out = tmp_path / "out"
    for name, line in (("string-env", '{"type": "run_started", "environment": "hand-edited"}'),
                       ("list-env", '{"type": "run_started", "environment": [1]}'),
                       ("deep", "[" * 100_000 + "]" * 100_000), ("not-json", "garbage")):
        (out / name).mkdir(parents=True)
        (out / name / "events.jsonl").write_text(line + "\n")
    (out / "fifo").mkdir()
    os.mkfifo(out / "fifo" / "events.jsonl")
    (out / "dangling").mkdir()
    (out / "dangling" / "events.jsonl").symlink_to(tmp_path / "nowhere")
    assert sbatch.find_run(out, "123") is None
    mine = out / "mine"
    mine.mkdir()
    EventLog(mine / "events.jsonl").run_started("r1", {"slurm": {"job_id": "123"}}, {}, ["weights"])
    os.utime(mine / "events.jsonl", (1, 1))  # the oldest: every stray folder is read before it
    assert sbatch.find_run(out, "123") == mine
    assert json.loads((mine / "events.jsonl").read_text().splitlines()[0])["environment"]["slurm"]["job_id"] == "123"
