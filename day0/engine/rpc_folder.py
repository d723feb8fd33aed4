"""A folder of a server process's own for vLLM's IPC sockets, gone when the process is.

vLLM binds its ZMQ IPC sockets under ``VLLM_RPC_BASE_PATH`` (default: the temp folder), and its
SIGTERM shutdown force-kills the engine core, so the socket files outlived every server (3 per
server with vLLM 0.32; 294 in /tmp after a day of this project's tests). :mod:`day0.engine.vllm_cli`
runs ``serve`` inside :func:`own_rpc_folder`; the server's log names the folder (:data:`FOLDER_LINE`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path

# A Unix socket's path holds 107 bytes (sun_path, its NUL aside); vLLM names each socket by a uuid4.
_SOCKET_PATH_MAX, _SOCKET_NAME = 107, 36
# The server log's line naming the folder, so a person (and a test) can see where they went.
FOLDER_NOTE = "day0: vLLM's IPC sockets go in {folder}, removed as this process exits"
FOLDER_LINE = re.compile(re.escape(FOLDER_NOTE).replace(re.escape("{folder}"), r"(\S+)"))


@contextlib.contextmanager
def own_rpc_folder(environ: MutableMapping[str, str]) -> Iterator[Path | None]:
    """``VLLM_RPC_BASE_PATH`` in ``environ`` (the process's own, which its engine core and workers
    inherit) set to a new folder for the duration, then the folder removed with what is in it.

    vLLM binds its IPC sockets there (default: the temp folder), and its SIGTERM shutdown
    force-kills the engine core, so the socket files outlived every server (3 per server with
    vLLM 0.32; 294 in /tmp after a day of this project's tests). vLLM turns SIGTERM into a return
    (the API server) or ``SystemExit`` (a headless rank), so the folder goes with any stop short of
    SIGKILL, on whichever node the rank runs. Left as it is where the user set the path, or where the
    temp folder's path is so long that a socket's path in a new folder would not fit.
    """
    if environ.get("VLLM_RPC_BASE_PATH"):
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="day0-rpc-"))
    if len(os.fsencode(folder)) + 1 + _SOCKET_NAME > _SOCKET_PATH_MAX:
        folder.rmdir()
        yield None
        return
    environ["VLLM_RPC_BASE_PATH"] = str(folder)
    print(FOLDER_NOTE.format(folder=folder), file=sys.stderr, flush=True)
    try:
        yield folder
    finally:
        environ.pop("VLLM_RPC_BASE_PATH", None)
        shutil.rmtree(folder, ignore_errors=True)
