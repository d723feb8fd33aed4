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

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable

from day0.config.risks import AccuracySettings
from day0.core.outputs import write_file
from day0.core.record import Check, measured
from day0.engine import Endpoint
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


def include_dir(settings: AccuracySettings, work: Path) -> Path:
    """The shipped task YAMLs with their data file made absolute (lm-eval resolves it from the cwd)."""
    work.mkdir(parents=True, exist_ok=True)
    for yaml in TASK_DIR.glob("*.yaml"):
        data = TASK_DIR / (yaml.stem + ".jsonl")
        write_file(work / yaml.name, yaml.read_text(encoding="utf-8").replace("DATA_FILE", str(data)))
    return work


def run_lm_eval(model: str, model_args: str, tasks: list[str], include: list[Path], out: Path,
                timeout: float, *, api_key: str | None = None,
                scrub: Callable[[str], str] = lambda text: text) -> tuple[dict[str, float], float]:
    """One ``python -m lm_eval`` run; (task -> exact_match, seconds). Offline: the hub is never asked.

    A keyed deployment's key reaches lm-eval's completions model the only way it reads one, its
    ``OPENAI_API_KEY`` variable (never ``model_args``, which lm-eval writes into its results);
    the log kept in the run folder passes ``scrub`` (the run's redactor)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    cmd = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", ",".join(tasks),
           "--output_path", str(out), "--batch_size", "1", "--device", "cpu"]
    for path in include:
        cmd += ["--include_path", str(path)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise TaskError(f"lm-eval ({model}) ran past {timeout:g} s") from None
    seconds = time.perf_counter() - t0
    (out / f"lm-eval-{model}.log").parent.mkdir(parents=True, exist_ok=True)
    write_file(out / f"lm-eval-{model}.log", scrub(proc.stdout + proc.stderr))
    results = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if proc.returncode != 0 or not results:
        tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:] or ["no output"]
        raise TaskError(f"lm-eval ({model}) exited {proc.returncode}: {scrub(tail[0])[:300]}")
    doc = json.loads(results[-1].read_text(encoding="utf-8"))
    return {t: task_score(doc, t, model) for t in tasks}, seconds


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
    include = [include_dir(settings, work / "tasks"), *(Path(p) for p in settings.task_paths)]
    tok = local_model_dir(profile) or model_dir
    served = (f"model={endpoint.model},base_url={endpoint.base_url}/v1/completions,tokenizer={tok},"
              f"tokenized_requests=False,max_retries=1,num_concurrent=1")
    ref = f"pretrained={model_dir},dtype=float32"
    timeout = float(settings.task_timeout_s)
    # Both sides at once: the deployed side mostly waits on the server and the reference runs on the
    # host's CPU, and each first spends ~10 s importing lm-eval and torch (one after the other, the
    # check took 33 s on 2 cores). Each is its own process with its own timeout.
    with ThreadPoolExecutor(max_workers=2) as pool:
        deployed_side = pool.submit(run_lm_eval, "local-completions", served, settings.tasks, include,
                                    work / "deployed", timeout, api_key=endpoint.key, scrub=profile.redactor().text)
        reference_side = pool.submit(run_lm_eval, "hf", ref, settings.tasks, include, work / "reference", timeout)
    try:
        deployed, deployed_s = deployed_side.result()
        reference, reference_s = reference_side.result()
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
