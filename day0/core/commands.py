"""Short system commands (ip, tc, scontrol, sbatch, munged): one runner, so every one is bounded in
time, never reads the terminal, and fails with one line naming the command and its last words."""

from __future__ import annotations

import subprocess
from typing import Mapping, Sequence


def run_command(argv: Sequence[str], error: type[Exception], *, missing: str = "", missing_error: type[Exception] | None = None,
                timeout: float = 20.0, check: bool = True,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return it; raise ``error`` (``missing_error`` when the binary is absent, with the
    ``missing`` hint) with one line on a missing binary, a timeout or, with ``check``, a non-zero exit."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=None if env is None else dict(env))
    except FileNotFoundError:
        raise (missing_error or error)(f"{argv[0]} not found" + (f": {missing}" if missing else "")) from None
    except subprocess.TimeoutExpired:
        raise error(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise error(f"`{' '.join(argv)}` failed: {err[-1] if err else f'exit {proc.returncode}'}")
    return proc
