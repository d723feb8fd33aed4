"""The emulated cluster's dead man's switch: it tears the cluster down when the harness is gone.

A SIGKILLed harness runs no ``finally``. So the harness starts this process in its own session
with the read end of a pipe as stdin and keeps the write end; the kernel closes the write end
however the harness ends, the read here returns EOF, and the namespaces, veths, bridge and every
process in them go. After a clean teardown the harness writes :data:`DISARM` before it closes the
pipe, and this leaves without touching anything: the cluster id is the owner's pid, so the next
cluster the same harness builds has the same id, and a reaper still starting up (seconds, on a
busy box) once tore that next cluster's bridge down by name half-way through its build.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from day0.engine.cluster.netns import teardown_cid

DISARM = b"disarm\n"  # the harness tore its cluster down itself: nothing of it is this reaper's any more


def start_reaper(cid: str) -> int:
    """Start the reaper for cluster ``cid``; returns the pipe's write end, which the caller keeps open
    for as long as the cluster should live (closing it tears the cluster down; :func:`disarm` first,
    after the caller's own teardown, and it does not)."""
    read_fd, write_fd = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-m", "day0.engine.cluster.reaper", cid], stdin=read_fd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    finally:
        os.close(read_fd)
    return write_fd


def disarm(write_fd: int) -> None:
    """Release the reaper of a cluster already torn down, and close the pipe."""
    try:
        os.write(write_fd, DISARM)  # under PIPE_BUF: one atomic write, read whole
    finally:
        os.close(write_fd)


def main(cid: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the harness's to handle
    told = b""
    while True:
        try:
            chunk = os.read(0, 1 << 12)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break  # EOF: every holder of the write end is gone
        told += chunk
        if DISARM in told:
            return 0
    teardown_cid(cid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
