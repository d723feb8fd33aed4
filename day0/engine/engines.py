"""The session's engines: the primary engine plus the other view, started only when a stage asks.

Stages ask an :class:`Engines` object for a view: ``http()`` (the API as users call it) or
``scheduler()`` (exact block accounting). The primary engine serves the view it has; on a CPU
target the missing view is started on demand with the same model and arguments, so one run gives
both. Every check records which view its number came from.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

from day0.config.profile import Profile
from day0.engine.cluster.nodes import Cluster, open_cluster
from day0.engine.external import ExternalEngine
from day0.engine.handle import EngineError, EngineInfo, Log, ViewUnavailable, scheduler_unavailable
from day0.engine.inprocess import InprocessEngine
from day0.engine.server import ServerEngine


class Engines:
    """One per pytest session: the primary engine plus views started only when a stage asks.

    Start-up failure is remembered, so every later test fails fast with the same root cause
    instead of trying (and timing out) again.
    """

    def __init__(self, profile: Profile, run_dir: Path, log: Log) -> None:
        self.profile = profile
        self.run_dir = Path(run_dir)
        self.log = log
        self._engines: dict[str, Any] = {}
        self._errors: dict[str, EngineError] = {}
        self._cluster: Cluster | None = None
        self._died: EngineError | None = None  # the first engine found dead mid-run
        self._launched: dict[str, ServerEngine] = {}  # launched early, not yet waited for
        self.on_start: Callable[[EngineInfo], None] | None = None

    def cluster(self) -> Cluster:
        """The run's nodes (:func:`~day0.engine.cluster.nodes.open_cluster`), brought up on first use
        and torn down by :meth:`stop`. Raises ClusterBlocked / ClusterError in one line."""
        if self._cluster is None:
            self._cluster = open_cluster(self.profile.topology, self.log)
        return self._cluster

    @property
    def primary_view(self) -> str:
        return "scheduler" if self.profile.engine.mode == "inprocess" else "http"

    def primary(self) -> Any:
        return self.http() if self.primary_view == "http" else self.scheduler()

    def http(self) -> ServerEngine | ExternalEngine:
        mode = self.profile.engine.mode
        if mode == "external":
            return self._get("http", lambda: ExternalEngine(self.profile, self.log))
        if mode == "inprocess" and self.profile.topology.device != "cpu":
            raise ViewUnavailable("the HTTP view beside an in-process engine is only started on CPU targets "
                                  "(a second engine would not fit on the GPUs); use engine.mode = \"server\"")
        return self._get("http", lambda: ServerEngine(self.profile, self.run_dir, self.log, cluster=self.cluster()))

    def scheduler(self) -> InprocessEngine:
        why = scheduler_unavailable(self.profile, multi_node=self.cluster().multi_node)
        if why:
            raise ViewUnavailable(why)
        return self._get("scheduler", lambda: InprocessEngine(self.profile, self.log))

    def launch_early(self) -> None:
        """Launch the primary server engine now and return (``engine.start_early``): its minute of
        start-up overlaps preflight, and the first stage that asks for it waits for ``/health``.

        Only a time saving: anything that goes wrong here is forgotten, and the stage that asks
        for the engine starts it again the normal way and reports what fails then.
        """
        if self.profile.engine.mode != "server" or self.primary_view != "http" or "http" in self._engines \
                or "http" in self._launched:
            return
        try:
            engine = ServerEngine(self.profile, self.run_dir, self.log, cluster=self.cluster())
        except Exception:
            return
        try:
            engine.launch()
        except Exception:
            with contextlib.suppress(Exception):
                engine.stop()
            return
        self._launched["http"] = engine

    def cancel_early(self) -> bool:
        """Stop an engine launched early that no stage has used yet (preflight failed: every later
        stage is blocked, so nothing will ask for it); True when one was stopped."""
        launched, self._launched = self._launched, {}
        for engine in launched.values():
            with contextlib.suppress(Exception):
                engine.stop()
        return bool(launched)

    def _get(self, view: str, factory: Callable[[], Any]) -> Any:
        if view in self._errors:
            raise self._errors[view]
        if view not in self._engines:
            early = self._launched.pop(view, None)
            engine = early or factory()
            try:
                info = early.wait() if early else engine.start()
            except EngineError as exc:
                self._errors[view] = exc
                raise
            except BaseException:  # an interrupt, or a fault of day0's own: nothing of the engine stays up
                with contextlib.suppress(Exception):
                    engine.stop()
                raise
            self._engines[view] = engine
            if self.on_start:
                self.on_start(info)
        return self._engines[view]

    @contextlib.contextmanager
    def variant(self, name: str, args: dict[str, Any], env: dict[str, str] | None = None) -> Iterator[ServerEngine]:
        """A short-lived second server with some engine args changed (e.g. TP=2 against TP=1),
        stopped as soon as the caller is done so it does not compete with the main engine."""
        eng = self.profile.engine
        profile = self.profile.model_copy(update={"engine": eng.model_copy(
            update={"args": {**eng.args, **args}, "env": {**eng.env, **(env or {})}})})
        server = ServerEngine(profile, self.run_dir, self.log, name=name)
        try:
            info = server.start()
            if self.on_start:
                self.on_start(EngineInfo(**{**info.__dict__, "view": f"variant:{name}"}))
            yield server
        finally:
            server.stop()

    def dead(self) -> EngineError | None:
        """The first started engine that no longer serves, as an :class:`EngineError` naming its root
        cause; None while every engine serves.

        Asked when a check raised something other than an assertion: a request that failed because
        the engine died is the deployment failing (a segfaulting kernel), not day0 unable to measure.
        The dead engine is stopped and its error remembered, so every later stage fails at once with
        the same cause instead of sending requests to a server that answers 500 until a timeout.
        """
        from day0.engine.rootcause import excerpt

        if self._died is not None:  # a handle taken before the death still points at it
            return self._died
        for view, engine in list(self._engines.items()):
            reason = engine.alive()
            if not reason:
                continue
            log_path = getattr(engine, "log_path", None)
            text = log_path.read_text(encoding="utf-8", errors="replace") if log_path and log_path.exists() else ""
            error = EngineError(reason, log_excerpt=excerpt(text) if text else "", log_path=log_path,
                                pgid=getattr(getattr(engine, "proc", None), "pid", None))
            self._errors[view] = self._died = error
            del self._engines[view]
            with contextlib.suppress(Exception):
                engine.stop()
            return error
        return None

    def started(self) -> list[EngineInfo]:
        return [e.info for e in self._engines.values() if e.info is not None]

    def stop(self) -> None:
        for engines in (self._engines, self._launched):
            for view in list(engines):
                engine = engines.pop(view)
                with contextlib.suppress(Exception):
                    engine.stop()
        if self._cluster is not None:  # after the engines: their processes live on the nodes
            self._cluster.close()
            self._cluster = None
