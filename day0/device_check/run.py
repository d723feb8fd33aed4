"""``day0 device-check`` / ``python -m day0.device_check``: the options, the step list, the exit code.

Exit codes: 0 when no check failed or errored (skips are fine: a CPU machine skips every GPU part),
1 when one did, 2 when the arguments are unusable (nothing is measured then).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence, TextIO

from day0.core.events import EVENTS_FILE
from day0.core.terminal import Terminal
from day0.device_check.runner import DeviceRun, HardStop, Options
from day0.device_check.steps import model_steps, token_steps
from day0.device_check.sweep import sweep_steps

DEFAULT_BUDGET_S = 420.0
DEFAULT_GRACE_S = 60.0
#: Budget and grace each at most a day: far past any lent machine's limit, and finite, so the hard
#: limit's timer (setitimer) can be set; inf used to raise OverflowError after the record was opened.
MAX_SECONDS = 86400.0


class UsageError(ValueError):
    """Arguments the check cannot run with; one line, exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--out", default=None, help="folder for the record, logs and summary.json (default: $OUT when "
                   "set, else reports/device-check-<UTC time>); must not hold an earlier run")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"steps that would start after this many seconds are skipped (default {DEFAULT_BUDGET_S:g})")
    p.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S,
                   help="the step still running at budget + grace is stopped and recorded as an error "
                        f"(default {DEFAULT_GRACE_S:g})")
    p.add_argument("--model-dir", default=None, help="use this checkpoint (config.json, tokenizer, safetensors) "
                   "instead of building the embedded tiny model")
    p.add_argument("--work-dir", default=None, help="scratch folder for the model and the sweep's rank files "
                   "(default: a temporary folder, removed at the end)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="greedy tokens per prompt (default 16)")
    p.add_argument("--top-k", type=int, default=5, help="logprobs kept per step for near-ties (default 5)")
    p.add_argument("--margin-float32", type=float, default=0.01,
                   help="near-tie margin in nats for GPU float32 vs CPU float32 (default 0.01)")
    p.add_argument("--margin-bfloat16", type=float, default=0.05,
                   help="near-tie margin in nats for GPU bfloat16 vs CPU float32 (default 0.05)")
    p.add_argument("--intra-node", default="nvlink", help="what the node's GPUs promise to talk over, for the "
                   "transport check: nvlink, pcie, shm or any (default nvlink)")
    return p


def build_parser() -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(
        prog="python -m day0.device_check",
        description="Run day0's GPU code paths once on a CUDA machine without vLLM (docs/device-check.md)."))


def options(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Options:
    """The checked options, with the output folder made; :class:`UsageError` names the first unusable one."""
    env = os.environ if environ is None else environ
    if not 0 < args.budget_s <= MAX_SECONDS:  # NaN fails too
        raise UsageError(f"--budget-s {args.budget_s:g}: must be > 0 and at most {MAX_SECONDS:g} seconds")
    if not 0 <= args.grace_s <= MAX_SECONDS:
        raise UsageError(f"--grace-s {args.grace_s:g}: must be >= 0 and at most {MAX_SECONDS:g} seconds")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: must be >= 1")
    if args.top_k < 2:
        raise UsageError(f"--top-k {args.top_k}: must be >= 2 (a near-tie needs the runner-up)")
    for name in ("margin_float32", "margin_bfloat16"):
        if not getattr(args, name) >= 0:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(args, name):g}: must be >= 0 nats")
    if args.intra_node not in ("nvlink", "pcie", "shm", "any"):
        raise UsageError(f"--intra-node {args.intra_node!r}: must be nvlink, pcie, shm or any")
    model_dir = Path(args.model_dir).resolve() if args.model_dir else None
    if model_dir is not None and not (model_dir / "config.json").is_file():
        raise UsageError(f"--model-dir {args.model_dir}: no config.json there")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out or env.get("OUT") or f"reports/device-check-{stamp}").resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    if (out / EVENTS_FILE).exists():
        raise UsageError(f"--out {out}: holds an earlier run's {EVENTS_FILE}; pick an empty folder")
    work_dir = Path(args.work_dir).resolve() if args.work_dir else None
    if work_dir is not None and work_dir.exists() and not work_dir.is_dir():  # before the event log is begun
        raise UsageError(f"--work-dir {work_dir}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot be created ({exc.strerror or exc})") from None
    return Options(out=out, budget_s=float(args.budget_s), grace_s=float(args.grace_s), model_dir=model_dir,
                   work_dir=work_dir,
                   max_new_tokens=args.max_new_tokens, top_k=args.top_k,
                   margins={"float32": args.margin_float32, "bfloat16": args.margin_bfloat16},
                   intra_node=args.intra_node)


def execute(opts: Options, stream: TextIO | None = None) -> int:
    """Every step in order within the budget; returns the exit code (0, or 1 on a failed check)."""
    opts.out.mkdir(parents=True, exist_ok=True)  # options() made it; a caller passing Options may not have
    run = DeviceRun(opts, f"device-check-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}", _environment(), stream)
    temporary = opts.work_dir is None
    run.state.work = Path(tempfile.mkdtemp(prefix="day0-device-check-")) if temporary else opts.work_dir
    run.state.work.mkdir(parents=True, exist_ok=True)
    run.progress(f"out {opts.out}; budget {opts.budget_s:g} s (+{opts.grace_s:g} s grace); work {run.state.work}")
    try:
        with run.hard_limit():
            for step in [*model_steps(), *sweep_steps(), *token_steps()]:
                run.do(step)
    except HardStop as exc:  # fired between steps, while the record was being written
        run.progress(f"{exc}; the record holds every step that finished")
    finally:
        if temporary:
            shutil.rmtree(run.state.work, ignore_errors=True)
    return run.finish()


def _environment() -> dict[str, Any]:
    """What the run ran on; nothing is recorded yet, so whatever breaks here is named, never raised."""
    try:
        from day0.core.environment import collect

        return collect()
    except Exception as exc:  # noqa: BLE001 - the one GPU run must not end without a record
        return {"error": f"the environment could not be collected: {type(exc).__name__}: {exc}"}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # argparse exits 2 on a malformed command line
    return run_args(args)


def run_args(args: argparse.Namespace) -> int:
    try:
        opts = options(args)
    except UsageError as exc:
        print(Terminal().line(f"day0 device-check: {exc}"), file=sys.stderr)  # paths as given: escaped
        return 2
    return execute(opts)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """``day0 device-check``: the same options as ``python -m day0.device_check``."""
    p = subparsers.add_parser("device-check", help="run day0's GPU code paths once on a CUDA machine (no vLLM "
                              "needed); on CPU the GPU parts are skipped with the reason")
    add_arguments(p)
    p.set_defaults(func=run_args)
