"""Stage 4 - kvcache: PagedAttention fragmentation stays under the limit at long context, the KV
pool holds the target, and a warm prefix cache gives the same tokens as a cold one."""

import pytest

from day0.core.record import Check
from day0.engine import EngineError, ViewUnavailable, auth_headers
from day0.model.config import ConfigUnavailable
from day0.model.sizing import plan_for
from day0.stages import kvcache as kv

pytestmark = [pytest.mark.day0, pytest.mark.kvcache]


@pytest.fixture(scope="module")
def settings(day0_profile):
    return day0_profile.kvcache


@pytest.fixture(scope="module")
def workload(day0_profile, settings):
    size, specials = kv.workload_vocab(day0_profile)
    return kv.build_workload(settings, size, specials)


@pytest.fixture(scope="module")
def runs(day0_repeat) -> dict:
    """Results of the long-context workload, per view, for the agreement test (one per repeat)."""
    return {}


def test_kv_capacity(engine, day0_profile, day0_checks):
    """KV bytes per token (config.json, per rank under TP x PP) x the live pool hold
    target_context x target_concurrency with the margin asked; the stage-0 plan beside it."""
    try:
        cap = kv.live_capacity(engine, day0_profile)
    except ConfigUnavailable as exc:
        pytest.skip(f"no config.json to size KV bytes per token: {exc}")
    day0_checks.extend(kv.capacity_checks(cap, plan_for(day0_profile), engine.view))


def test_fragmentation_at_long_context(day0_session, settings, workload, runs, day0_checks):
    """The same long-context workload on the HTTP view (/metrics estimate), then on the scheduler
    view (exact, every step); a dead engine keeps the samples taken so far."""
    engines = day0_session.engines
    try:
        http = engines.http()  # started here (main thread) when this is its first use
    except (ViewUnavailable, EngineError) as exc:
        http = exc
    exact_samples: list = []
    bb_samples: list = []

    def exact():
        try:
            sched = engines.scheduler()
        except ViewUnavailable as exc:
            return exc
        return kv.run_exact(sched.llm, workload, samples=exact_samples, timeout_s=settings.workload_timeout_s)

    def blackbox():
        if isinstance(http, Exception):
            return http
        return kv.run_blackbox(http.base_url, http.info.served_model_name, workload,
                               interval_s=settings.scrape_interval_s, samples=bb_samples,
                               timeout_s=settings.workload_timeout_s, alive=http.alive,
                               headers=auth_headers(day0_session.profile), passes=settings.blackbox_passes,
                               min_resolved=settings.min_resolved_scrapes)

    exact_run = bb_run = None
    try:
        bb_run, exact_run = kv.run_in_turn(blackbox, exact)
    finally:
        if exact_run is None and exact_samples:  # interrupted: keep what was sampled
            exact_run = kv.ExactRun(samples=exact_samples, error="interrupted")
        if bb_run is None and bb_samples:
            bb_run = kv.BlackBoxRun(samples=bb_samples, error="interrupted")
        for run, key, record, check_id in ((exact_run, "exact", kv.exact_checks, "kvcache.fragmentation"),
                                           (bb_run, "blackbox", kv.blackbox_checks, "kvcache.blackbox_fragmentation")):
            if isinstance(run, (kv.ExactRun, kv.BlackBoxRun)):
                day0_checks.extend(record(run, workload, settings))
                runs[key] = run
            elif run is not None:
                day0_checks.add(_failed_view(run, check_id))
    if not day0_checks.checks:
        pytest.skip("neither the scheduler nor the HTTP view is available")


def _failed_view(exc: BaseException, check_id: str) -> Check:
    if isinstance(exc, ViewUnavailable):
        return Check(id=check_id, title="PagedAttention fragmentation", status="skip", message=str(exc))
    if isinstance(exc, EngineError):
        return Check(id=check_id, title="PagedAttention fragmentation", status="error", message=f"engine failed: {exc}",
                     evidence={"log_excerpt": exc.log_excerpt, "log_path": exc.log_path})
    return Check(id=check_id, title="PagedAttention fragmentation", status="error",
                 message=f"{type(exc).__name__}: {exc}")


def test_views_agree(runs, settings, day0_checks):
    """On the CPU target both views ran the same workload: their steady-state figures agree."""
    exact, blackbox = runs.get("exact"), runs.get("blackbox")
    if exact is None or blackbox is None:
        pytest.skip("needs both the scheduler and the HTTP view (both are started on CPU targets only)")
    if exact.rejected or blackbox.rejected:
        pytest.skip("the workload was rejected (see kvcache.workload_fits)")
    if exact.error or blackbox.error:
        pytest.skip(f"a view stopped early ({exact.error or blackbox.error}); see kvcache.*engine_alive")
    day0_checks.add(kv.agreement_check(exact, blackbox, settings))


def test_prefix_cache_warm_equals_cold(engine, day0_profile, settings, day0_checks):
    """Greedy tokens for a long prompt are identical when its prefix is cached and when it is not."""
    if day0_profile.engine.args.get("enable_prefix_caching") is False:
        pytest.skip("engine.args.enable_prefix_caching is false: nothing to compare")
    size, specials = kv.workload_vocab(day0_profile)
    prompt = kv.probe_prompt(settings, size, specials)
    try:
        if engine.view == "scheduler":
            probe = kv.prefix_probe_inprocess(engine.llm, prompt, settings.prefix_check_output_tokens)
        else:
            probe = kv.prefix_probe_http(engine.base_url, engine.info.served_model_name, prompt,
                                         settings.prefix_check_output_tokens,
                                         timeout_s=day0_profile.engine.request_timeout_s,
                                         headers=auth_headers(day0_profile))
    except kv.WorkloadRejected as exc:
        day0_checks.add(kv.rejected_check("kvcache.prefix_probe_fits", exc, engine.view))
        return
    day0_checks.extend(kv.prefix_check(probe, engine.view))
