"""Downstream task accuracy: the same lm-evaluation-harness tasks scored against the deployed
endpoint and against the transformers reference, and the change in accuracy judged.

Perplexity and KL say the distribution moved; a task score says whether answers got worse, which
is what a quantization or a kernel change is finally judged on. lm-eval (the ``day0[eval]``
extra) talks to the live server through its completions-API model (``local-completions``) and
to the reference through its transformers model (``hf``, CPU, float32), with tasks read from
local files only (no hub downloads). day0 ships one small task (``task_data/``) so the path runs
on the default target; a profile may add its own task folders.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any, Callable

from day0.config.risks import AccuracySettings
from day0.core.outputs import write_file
from day0.core.record import Check, measured
from day0.core.redact import is_secret_env_name
from day0.engine import Endpoint
from day0.engine.process import die_with_parent, signal_group
from day0.model.locate import local_model_dir
from day0.model.reference import host_reference_unavailable

CHECK_ID = "risks.accuracy.task_delta"
TITLE = "Downstream task accuracy vs the reference (lm-eval)"
TASK_DIR = Path(__file__).with_name("task_data")
METRIC = "exact_match,none"


class TaskError(RuntimeError):
    """lm-eval could not score a side; the message names the side and its last log line."""


def _skip(message: str) -> Check:
    return Check(id=CHECK_ID, title=TITLE, status="skip", message=message, source="profile")


MAX_TASK_FILES = 50_000  # files mirrored from one task folder: lm-eval 0.4.13's own task tree is 16,175


def include_dir(settings: AccuracySettings, work: Path) -> Path:
    """One folder for lm-eval's one ``--include_path`` (its CLI keeps only the last of several, and
    its index does not follow a linked folder): the shipped task YAMLs with their data file made
    absolute (lm-eval resolves it from the cwd), and each of ``task_paths`` mirrored under
    ``site-N/``, folders made and files linked, so a task's ``!function utils.x`` and ``include:``
    still find their neighbours. TaskError names a task path that is no folder."""
    work.mkdir(parents=True, exist_ok=True)
    for yaml in TASK_DIR.glob("*.yaml"):
        data = TASK_DIR / (yaml.stem + ".jsonl")
        write_file(work / yaml.name, yaml.read_text(encoding="utf-8").replace("DATA_FILE", str(data)))
    for i, folder in enumerate(settings.task_paths):
        _mirror(Path(folder).expanduser(), work / f"site-{i}", f"risks.accuracy.task_paths[{i}]")
    return work


def _mirror(src: Path, dest: Path, key: str) -> None:
    if not src.is_dir():
        raise TaskError(f"{key}: {src} is not a folder of lm-eval task YAMLs")
    count = 0
    for parent, dirs, files in os.walk(src):  # not into linked folders: a loop cannot hold it
        here = dest / Path(parent).relative_to(src)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            count += 1
            if count > MAX_TASK_FILES:
                raise TaskError(f"{key}: {src} holds more than {MAX_TASK_FILES:,} files; name the task folder itself")
            (here / name).symlink_to(Path(parent, name).absolute())


@dataclass
class LmEval:
    """One side's ``python -m lm_eval`` run. Offline: the hub is never asked.

    A keyed deployment's key reaches lm-eval's completions model the only way it reads one, its
    ``OPENAI_API_KEY`` variable (never ``model_args``, which lm-eval writes into its results);
    the log kept in the run folder passes ``scrub`` (the run's redactor). Its output goes to an
    unnamed temporary file until then: a pipe would stall one side while the other is read, and
    the run folder gets only the scrubbed log."""

    model: str
    model_args: str
    out: Path
    api_key: str | None = None
    scrub: Callable[[str], str] = field(default=lambda text: text)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    output: IO[bytes] | None = field(default=None, init=False)
    started: float = field(default=0.0, init=False)

    def command(self, tasks: list[str], include: list[Path]) -> list[str]:
        cmd = [sys.executable, "-m", "lm_eval", "--model", self.model, "--model_args", self.model_args,
               "--tasks", ",".join(tasks), "--output_path", str(self.out), "--batch_size", "1", "--device", "cpu"]
        for path in include:
            cmd += ["--include_path", str(path)]
        return cmd

    def start(self, tasks: list[str], include: list[Path]) -> None:
        """In a process group of its own that dies with day0 (PR_SET_PDEATHSIG): a SIGKILLed
        harness leaves no lm-eval behind. ``OPENAI_API_KEY`` is this side's key or none: one set in
        day0's own environment would reach the reference, or an unkeyed endpoint under test. No
        other variable named like a secret goes either (``VLLM_API_KEY``, ``HF_TOKEN``): lm-eval
        reads none of them offline, and a third-party process holds no key it does not use."""
        env = {k: v for k, v in os.environ.items() if not is_secret_env_name(k)}
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false"})
        if self.api_key:
            env["OPENAI_API_KEY"] = self.api_key
        cmd = self.command(tasks, include)
        self.output = tempfile.TemporaryFile()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, preexec_fn=die_with_parent)

    def result(self, tasks: list[str]) -> tuple[dict[str, float], float]:
        """(task -> exact_match, seconds) of a run that has ended; its log written, scrubbed."""
        assert self.proc is not None and self.proc.returncode is not None
        seconds = time.perf_counter() - self.started
        text = self.keep_log()
        results = sorted(self.out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
        if self.proc.returncode != 0 or not results:
            tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["no output"]
            raise TaskError(f"lm-eval ({self.model}) exited {self.proc.returncode}: {tail[0][:300]}")
        doc = json.loads(results[-1].read_text(encoding="utf-8"))
        return {t: task_score(doc, t, self.model) for t in tasks}, seconds

    def keep_log(self, ending: str = "") -> str:
        """The run's output so far, scrubbed, into the run folder (once; ``ending`` says why it
        stopped where it did); the text written."""
        if self.output is None or self.output.closed:
            return ""
        self.output.seek(0)
        text = self.scrub(self.output.read().decode("utf-8", errors="replace")) + ending
        self.output.close()
        with contextlib.suppress(OSError, ValueError):  # a log that cannot be kept never hides the run's outcome
            self.out.mkdir(parents=True, exist_ok=True)
            write_file(self.out / f"lm-eval-{self.model}.log", text)
        return text


def _stop(sides: list[LmEval]) -> None:
    """Kill every side still running, whole groups first and then reap them (a second SIGTERM
    during one side's reaping must not leave the next running), and keep what each had written."""
    running = {id(side) for side in sides if side.proc is not None and side.proc.poll() is None}
    for side in sides:
        if side.proc is not None and id(side) in running:
            signal_group(side.proc.pid)
    for side in sides:
        if side.proc is not None:
            side.proc.wait()
        stopped = f"\n[day0: stopped after {time.perf_counter() - side.started:.0f} s]\n"
        side.keep_log(stopped if id(side) in running else "")


def run_sides(sides: list[LmEval], tasks: list[str], include: list[Path],
              timeout: float) -> list[tuple[dict[str, float], float]]:
    """Every side at once, each (task -> exact_match, seconds). The deployed side mostly waits on the
    server while the reference computes on the host, and each first spends ~10 s importing lm-eval
    and torch (one after the other, the check took 33 s on 2 cores). The first side to fail stops
    the others, and so does anything that stops the check (a runner's SIGTERM arrives as
    KeyboardInterrupt): no lm-eval outlives it."""
    deadline = time.monotonic() + timeout
    done: dict[int, tuple[dict[str, float], float]] = {}
    try:
        for side in sides:
            side.start(tasks, include)
        while len(done) < len(sides):
            for i, side in enumerate(sides):
                if i not in done and side.proc is not None and side.proc.poll() is not None:
                    done[i] = side.result(tasks)
            if len(done) < len(sides):
                if time.monotonic() > deadline:
                    late = next(side for i, side in enumerate(sides) if i not in done)
                    raise TaskError(f"lm-eval ({late.model}) ran past {timeout:g} s")
                time.sleep(0.2)
    finally:
        _stop(sides)
    return [done[i] for i in range(len(sides))]


def task_score(doc: dict[str, Any], task: str, model: str) -> float:
    """The task's exact-match score in lm-eval's results: ``exact_match,none`` (day0's own task), else
    the first ``exact_match,<filter>`` the task reports in name order (gsm8k's ``flexible-extract``), else its ``acc``.
    A task that reports none of them is a TaskError naming what it did report (a KeyError was a
    traceback for any task added through tasks or task_paths)."""
    scores = (doc.get("results") or {}).get(task)
    if not isinstance(scores, dict):
        raise TaskError(f"lm-eval ({model}) reported no results for task {task!r}")
    keys = [METRIC, *sorted(k for k in scores if k.startswith("exact_match,")), "acc,none"]
    key = next((k for k in keys if isinstance(scores.get(k), (int, float))), None)
    if key is None:
        raise TaskError(f"lm-eval ({model}) reported no exact_match or acc for task {task!r} "
                        f"(it reported {', '.join(sorted(scores))[:200]})")
    return float(scores[key])


def check_tasks(endpoint: Endpoint, profile: Any, run_dir: Path) -> Check:
    """Task accuracy of the deployment and of transformers on the same (or ``reference_model``'s)
    checkpoint; fails when any task's accuracy drops by more than ``max_task_delta``."""
    settings: AccuracySettings = profile.risks.accuracy
    if not settings.tasks:
        return _skip("[risks.accuracy].tasks is empty")
    if find_spec("lm_eval") is None:
        return _skip("not verified: lm-evaluation-harness is not installed (pip install 'day0[eval]')")
    model_dir = Path(settings.reference_model) if settings.reference_model else local_model_dir(profile)
    reason = host_reference_unavailable(model_dir)
    if reason is not None:
        return _skip(f"not verified: no transformers reference for the tasks here: {reason}")
    work = Path(run_dir) / "lm-eval"
    try:
        include = [include_dir(settings, work / "tasks")]
    except TaskError as exc:
        return Check(id=CHECK_ID, title=TITLE, status="error", message=str(exc), source="profile")
    tok = local_model_dir(profile) or model_dir
    served = (f"model={endpoint.model},base_url={endpoint.base_url}/v1/completions,tokenizer={tok},"
              f"tokenized_requests=False,max_retries=1,num_concurrent=1")
    ref = f"pretrained={model_dir},dtype=float32"
    scrub = profile.redactor().text
    sides = [LmEval("local-completions", served, work / "deployed", endpoint.key, scrub),
             LmEval("hf", ref, work / "reference", scrub=scrub)]
    try:
        (deployed, deployed_s), (reference, reference_s) = run_sides(sides, settings.tasks, include,
                                                                     float(settings.task_timeout_s))
    except TaskError as exc:
        return Check(id=CHECK_ID, title=TITLE, status="error", message=str(exc), source="http",
                     evidence={"log_dir": str(work)})
    return judge_tasks(deployed, reference, settings.max_task_delta,
                       {"deployed_seconds": round(deployed_s, 2), "reference_seconds": round(reference_s, 2),
                        "reference": f"transformers on {model_dir} (cpu/float32)", "log_dir": str(work)})


def judge_tasks(deployed: dict[str, float], reference: dict[str, float], limit: float,
                evidence: dict[str, Any]) -> Check:
    """The largest drop (reference minus deployed, per task) against ``limit``; a gain never fails."""
    drops = {t: reference[t] - deployed[t] for t in deployed}
    worst = max(drops, key=lambda t: drops[t])
    table = {"columns": ["task", "deployed", "reference", "drop"],
             "rows": [[t, round(deployed[t], 4), round(reference[t], 4), round(drops[t], 4)] for t in deployed]}
    return measured(CHECK_ID, TITLE, round(max(drops[worst], 0.0), 6), limit, unit="ratio",
                    direction="lower_is_better", source="http",
                    message=(f"largest accuracy drop {drops[worst]:+.1%} on {worst} "
                             f"({deployed[worst]:.1%} deployed vs {reference[worst]:.1%} reference; "
                             f"limit {limit:.0%}) over {len(deployed)} task(s)"),
                    evidence={**evidence, "table": table, "deployed": deployed, "reference_scores": reference})
