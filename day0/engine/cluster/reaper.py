"""The emulated cluster's dead man's switch: it tears the cluster down when the harness is gone.

A SIGKILLed harness runs no ``finally``. So the harness starts this process in its own session
with the read end of a pipe as stdin and keeps the write end; the kernel closes the write end
however the harness ends, the read here returns EOF, and the namespaces, veths, bridge and every
process in them go. After a clean teardown the harness closes the pipe itself and this finds
nothing left to remove.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from day0.engine.cluster.netns import teardown_cid


def start_reaper(cid: str) -> int:
    """Start the reaper for cluster ``cid``; returns the pipe's write end, which the caller keeps open
    for as long as the cluster should live (closing it tears the cluster down)."""
    read_fd, write_fd = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-m", "day0.engine.cluster.reaper", cid], stdin=read_fd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    finally:
        os.close(read_fd)
    return write_fd


def main(cid: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the harness's to handle
    while True:
        try:
            if not os.read(0, 1 << 12):
                break  # EOF: every holder of the write end is gone
        except InterruptedError:
            continue
        except OSError:
            break
    teardown_cid(cid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
