"""Running the stage on the session's engine views: the long-context workload on the HTTP view, then
on the in-process (scheduler) view, one after the other; the prefix-cache probe on the primary engine.

Results come back as checks; an engine that cannot give a view, or that fails, becomes a check
too, and a view interrupted mid-run keeps the samples it took.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from day0.core.record import Check
from day0.engine import EngineError, ViewUnavailable
from day0.stages.kvcache.blackbox import BlackBoxRun, BlackBoxSample, run_blackbox
from day0.stages.kvcache.checks import blackbox_checks, exact_checks, failed_view_check, prefix_check, rejected_check
from day0.stages.kvcache.errors import WorkloadRejected
from day0.stages.kvcache.exact import ExactRun, run_exact
from day0.stages.kvcache.fragmentation import KvSample
from day0.stages.kvcache.prefix import prefix_probe_http, prefix_probe_inprocess, probe_prompt
from day0.stages.kvcache.workload import KvRequest, workload_vocab


def run_in_turn(*views: Callable[[], Any]) -> list[Any]:
    """Run each view's workload alone, one after the other; each exception is returned in place of
    its result, so one failing view never loses the other's samples.

    Not side by side: on a small host the in-process engine and the server compete for the same
    cores, and the in-process engine holds the GIL the HTTP client needs to timestamp its stream,
    so whether a /metrics scrape landed in the steady window became a matter of luck. In turn,
    each view sees the host as the other did, and the verdict stays the same run after run.
    """
    out: list[Any] = []
    for view in views:
        try:
            out.append(view())
        except Exception as exc:
            out.append(exc)
    return out


@dataclass
class ViewRuns:
    """The long-context workload on both views: each view's run (None when it gave none) and the checks."""

    exact: ExactRun | None = None
    blackbox: BlackBoxRun | None = None
    checks: list[Check] = field(default_factory=list)

    def why_incomparable(self) -> str | None:
        """Why the two runs cannot be compared (a skip reason), or None when they can."""
        exact, blackbox = self.exact, self.blackbox
        if exact is None or blackbox is None:
            return "needs both the scheduler and the HTTP view (both are started on CPU targets only)"
        if exact.rejected or blackbox.rejected:
            return "the workload was rejected (see kvcache.workload_fits)"
        if exact.error or blackbox.error:
            return f"a view stopped early ({exact.error or blackbox.error}); see kvcache.*engine_alive"
        return None


def run_views(engines: Any, workload: Sequence[KvRequest], settings: Any, *,
              out: ViewRuns | None = None) -> ViewRuns:
    """The workload on the HTTP view (/metrics estimate), then on the scheduler view (exact, every
    step), in turn (:func:`run_in_turn`), judged by :func:`exact_checks` and :func:`blackbox_checks`.

    ``engines`` is the session's :class:`day0.engine.Engines`; ``settings`` its profile's
    ``[kvcache]``. ``out`` is filled in place, so a caller's ``finally`` still has the checks when
    the run is interrupted: a view stopped mid-run keeps what it sampled (error "interrupted").
    """
    out = out if out is not None else ViewRuns()
    try:
        http = engines.http()  # started here (main thread) when this is its first use
    except (ViewUnavailable, EngineError) as exc:
        http = exc
    exact_samples: list[KvSample] = []
    bb_samples: list[BlackBoxSample] = []

    def exact() -> Any:
        try:
            sched = engines.scheduler()
        except ViewUnavailable as exc:
            return exc
        return run_exact(sched.llm, workload, samples=exact_samples, timeout_s=settings.workload_timeout_s)

    def blackbox() -> Any:
        if isinstance(http, Exception):
            return http
        endpoint = http.endpoint
        return run_blackbox(endpoint.base_url, endpoint.model, workload,
                            interval_s=settings.scrape_interval_s, samples=bb_samples,
                            timeout_s=settings.workload_timeout_s, alive=http.alive, headers=endpoint.headers,
                            passes=settings.blackbox_passes, min_resolved=settings.min_resolved_scrapes)

    exact_run = bb_run = None
    try:
        bb_run, exact_run = run_in_turn(blackbox, exact)
    finally:
        if exact_run is None and exact_samples:  # interrupted: keep what was sampled
            exact_run = ExactRun(samples=exact_samples, error="interrupted")
        if bb_run is None and bb_samples:
            bb_run = BlackBoxRun(samples=bb_samples, error="interrupted")
        _record(out, exact_run, bb_run, workload, settings)
    return out


def _record(out: ViewRuns, exact_run: Any, bb_run: Any, workload: Sequence[KvRequest], settings: Any) -> None:
    """Each view's run and its checks into ``out``; a view that gave an exception instead, as one check."""
    if isinstance(exact_run, ExactRun):
        out.checks.extend(exact_checks(exact_run, workload, settings))
        out.exact = exact_run
    elif exact_run is not None:
        out.checks.append(failed_view_check(exact_run, "kvcache.fragmentation"))
    if isinstance(bb_run, BlackBoxRun):
        out.checks.extend(blackbox_checks(bb_run, workload, settings))
        out.blackbox = bb_run
    elif bb_run is not None:
        out.checks.append(failed_view_check(bb_run, "kvcache.blackbox_fragmentation"))


def prefix_cache_checks(engine: Any, profile: Any) -> list[Check]:
    """The warm/cold probe on the engine's own view (in-process or HTTP), as checks; a prompt the
    engine cannot take is a failed ``kvcache.prefix_probe_fits``."""
    settings = profile.kvcache
    size, specials = workload_vocab(profile)
    prompt = probe_prompt(settings, size, specials)
    try:
        if engine.view == "scheduler":
            probe = prefix_probe_inprocess(engine.llm, prompt, settings.prefix_check_output_tokens)
        else:
            endpoint = engine.endpoint
            probe = prefix_probe_http(endpoint.base_url, endpoint.model, prompt, settings.prefix_check_output_tokens,
                                      timeout_s=endpoint.timeout_s, headers=endpoint.headers)
    except WorkloadRejected as exc:
        return [rejected_check("kvcache.prefix_probe_fits", exc, engine.view)]
    return prefix_check(probe, engine.view)
