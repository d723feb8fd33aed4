"""``day0 slurm submit``: the command line of :mod:`day0.engine.cluster.sbatch` (the wiring layer, since a
job Slurm ended gets its report rendered again)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from day0.core.terminal import Terminal
from day0.engine.cluster.sbatch import SubmitError, submit
from day0.results.report import publish


def _seconds(text: str) -> float:
    """A wait in seconds: finite and above 0 (nan never fires, 0 or less cancels at once), refused by
    argparse before anything is submitted."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a wait must be a finite number of seconds above 0")
    return value


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("slurm", help="submit the Slurm recipe and wait for it, with bounded waits")
    sub = p.add_subparsers(dest="slurm_command", required=True, metavar="ACTION")
    q = sub.add_parser("submit", help="sbatch a script, wait for it; a job pending on nodes that are down or "
                                      "drained is cancelled (exit 3), a job Slurm ends has its run's record rebuilt",
                       usage="day0 slurm submit [--unavailable-timeout S] [--timeout S] [--out DIR] "
                             "[SBATCH OPTIONS] SCRIPT [ARGS]")
    q.add_argument("--unavailable-timeout", type=_seconds, default=300.0, metavar="S",
                   help="how long a job may pend on nodes Slurm reports down, drained or failed (default 300)")
    q.add_argument("--timeout", type=_seconds, default=None, metavar="S", help="cancel the job after S seconds in all")
    q.add_argument("--out", type=Path, default=None,
                   help="where the recipe writes its runs (default: $DAY0_OUT, else ./reports, as the recipe)")
    q.add_argument("sbatch_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    q.set_defaults(func=cmd_submit, passthrough="sbatch_args")


def cmd_submit(args: argparse.Namespace) -> int:
    term = Terminal()  # sbatch's and squeue's answers, quoted in progress and errors
    if not args.sbatch_args:
        term.print("day0: slurm submit: name the batch script (e.g. scripts/slurm/day0.sbatch)", err=True)
        return 2
    out = args.out or Path(os.environ.get("DAY0_OUT") or "reports")
    try:
        return submit(args.sbatch_args, out.resolve(), args.unavailable_timeout, args.timeout, publish,
                      lambda m: term.print(f"[day0] {m}", err=True))
    except SubmitError as exc:
        term.print(f"day0: {exc}", err=True)
        return 2
