"""Process groups: a server started in its own group that dies with its parent, and a stop that
returns only once the whole group is gone."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path


def die_with_parent() -> None:  # runs in the child between fork and exec
    """``preexec_fn``: a new session (so the group can be signalled whole) and PR_SET_PDEATHSIG."""
    os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: a SIGKILLed harness still stops its server


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group that may be gone already (or, reused, not ours to signal)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the group, wait, then SIGKILL whatever is left of it: ``grace_s`` in all, for the
    leader and the rest of its group together.

    A second Ctrl-C or SIGTERM during the grace period (an impatient user, a CI runner's second
    signal) cuts the grace short but never the kill: a vLLM server still starting up ignores
    SIGTERM, and one that outlives the harness holds the port and the memory.
    """
    pgid = proc.pid
    interrupted: BaseException | None = None
    deadline = time.monotonic() + grace_s
    signal_group(pgid, signal.SIGTERM)
    try:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt as exc:
        interrupted = exc
    _kill_group(proc, pgid)
    if interrupted is not None:
        raise interrupted


def _kill_group(proc: subprocess.Popen[bytes], pgid: int) -> None:
    signal_group(pgid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    # SIGKILL is delivered asynchronously: on a busy host a grandchild can still be running when
    # its parent has been reaped. Return only once the whole group is gone (bounded).
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Running, and not a zombie: a process its parent has not reaped yet is dead for every purpose
    here (a rank torchrun has not collected, a daemon whose launcher is gone, a test's child)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether any (non-zombie) process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
