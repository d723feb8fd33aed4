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

from day0.engine.endpoint import Endpoint
from day0.engine.engines import Engines
from day0.engine.handle import EngineError, EngineInfo, ViewUnavailable, served_name
from day0.engine.http_api import http_json
from day0.engine.inprocess import InprocessEngine
from day0.engine.process import group_alive
from day0.engine.rootcause import exception_root_cause
from day0.engine.server import ServerEngine
from day0.model.locate import local_model_dir  # for the suites and stages that import it from here

__all__ = [
    "Endpoint",
    "EngineError",
    "EngineInfo",
    "Engines",
    "InprocessEngine",
    "ServerEngine",
    "ViewUnavailable",
    "exception_root_cause",
    "group_alive",
    "http_json",
    "local_model_dir",
    "served_name",
]
