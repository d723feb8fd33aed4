"""Stage 4 - kvcache: PagedAttention fragmentation stays under the limit at long context, the KV
pool holds the target, and a warm prefix cache gives the same tokens as a cold one."""

import pytest

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
def runs(day0_repeat) -> kv.ViewRuns:
    """Results of the long-context workload, per view, for the agreement test (one per repeat)."""
    return kv.ViewRuns()


def test_kv_capacity(day0_engine, day0_profile, day0_checks):
    """KV bytes per token (config.json, per rank under TP x PP) x the live pool hold
    target_context x target_concurrency with the margin asked; the stage-0 plan beside it."""
    try:
        cap = kv.live_capacity(day0_engine, day0_profile)
    except ConfigUnavailable as exc:
        pytest.skip(f"no config.json to size KV bytes per token: {exc}")
    day0_checks.extend(kv.capacity_checks(cap, plan_for(day0_profile), day0_engine.view))


def test_fragmentation_at_long_context(day0_session, settings, workload, runs, day0_checks):
    """The same long-context workload on the HTTP view (/metrics estimate), then on the scheduler
    view (exact, every step); a dead engine keeps the samples taken so far."""
    try:
        kv.run_views(day0_session.engines, workload, settings, out=runs)
    finally:  # an interrupted run still records what it sampled
        day0_checks.extend(runs.checks)
    if not runs.checks:
        pytest.skip("neither the scheduler nor the HTTP view is available")


def test_views_agree(runs, settings, day0_checks):
    """On the CPU target both views ran the same workload: their steady-state figures agree."""
    why_not = runs.why_incomparable()
    if why_not:
        pytest.skip(why_not)
    day0_checks.add(kv.agreement_check(runs.exact, runs.blackbox, settings))


def test_prefix_cache_warm_equals_cold(day0_engine, day0_profile, day0_checks):
    """Greedy tokens for a long prompt are identical when its prefix is cached and when it is not."""
    if day0_profile.engine.args.get("enable_prefix_caching") is False:
        pytest.skip("engine.args.enable_prefix_caching is false: nothing to compare")
    day0_checks.extend(kv.prefix_cache_checks(day0_engine, day0_profile))
