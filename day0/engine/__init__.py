"""The live engine under test, in three modes, and the two views stages need of it.

* ``server`` (:mod:`.server`): vLLM's OpenAI-compatible server as a subprocess in its own process
  group (:mod:`.process`) on a free loopback port, ready when ``/health`` answers, its log kept in
  the run folder;
* ``inprocess`` (:mod:`.inprocess`): ``vllm.LLM`` in this process with V1 multiprocessing off, so
  the scheduler and its KV-cache manager are plain Python objects a stage can sample;
* ``external`` (:mod:`.external`): a deployment someone else runs; only its HTTP API is visible.

:class:`Engines` (:mod:`.engines`) gives stages a view, ``http()`` or ``scheduler()``; a failed
start is reported by its root cause (:mod:`.rootcause`). What the engine loaded is read in
:mod:`.loaded`; where the model is, in :mod:`day0.model.locate`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ below hands out, for type checkers
    from day0.engine.endpoint import Endpoint as Endpoint
    from day0.engine.engines import Engines as Engines
    from day0.engine.handle import EngineError as EngineError
    from day0.engine.handle import EngineInfo as EngineInfo
    from day0.engine.handle import ViewUnavailable as ViewUnavailable
    from day0.engine.handle import served_name as served_name
    from day0.engine.http_api import http_json as http_json
    from day0.engine.inprocess import InprocessEngine as InprocessEngine
    from day0.engine.process import group_alive as group_alive
    from day0.engine.rootcause import exception_root_cause as exception_root_cause
    from day0.engine.server import ServerEngine as ServerEngine
    from day0.model.locate import (
        local_model_dir as local_model_dir,  # for the suites and stages that import it from here
    )

# name -> the module that holds it, imported on first use (PEP 562): importing one submodule, say
# day0.engine.loaded for ``day0 weights audit``, would otherwise run this file and import them all,
# aiohttp's client among them (~0.3 s of every such process).
_HOME = {
    "Endpoint": "day0.engine.endpoint",
    "Engines": "day0.engine.engines",
    "EngineError": "day0.engine.handle",
    "EngineInfo": "day0.engine.handle",
    "ViewUnavailable": "day0.engine.handle",
    "served_name": "day0.engine.handle",
    "http_json": "day0.engine.http_api",
    "InprocessEngine": "day0.engine.inprocess",
    "group_alive": "day0.engine.process",
    "exception_root_cause": "day0.engine.rootcause",
    "ServerEngine": "day0.engine.server",
    "local_model_dir": "day0.model.locate",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOME[name]), name)
