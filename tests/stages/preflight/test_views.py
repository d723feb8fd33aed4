"""Required checks the deployment cannot measure are said at stage 0, before any engine work
(day0/stages/preflight/views.py), from the same answer the run gets (scheduler_unavailable)."""

from __future__ import annotations

import pytest

from day0.config.profile import deep_merge, load_profile, parse_override
from day0.engine.handle import scheduler_unavailable
from day0.stages.preflight.views import unmeasurable_findings
from day0.stages.registry import builtin

EXTERNAL = {"engine": {"mode": "external", "url": "http://10.0.0.5:8000"}}


def profile(preset: str, *overrides: str, base: dict | None = None):
    merged: dict = dict(base or {})
    for o in overrides:
        merged = deep_merge(merged, parse_override(o))
    return load_profile(preset, overrides=merged or None)


@pytest.mark.parametrize("preset", ["h200x8", "cpu-tiny"])
def test_the_readme_external_example_learns_at_stage_0_what_it_cannot_verify(preset: str) -> None:
    """The README's example (extends h200x8, engine.mode = external) requires the exact KV view and the
    worker memory: one warning each, naming the check and what to require instead."""
    findings = unmeasurable_findings(profile(preset, base=EXTERNAL), builtin())
    by_check = {f.value: f for f in findings}
    assert set(by_check) == {"weights.memory_per_rank", "kvcache.fragmentation"}
    assert "kvcache.blackbox_fragmentation" in by_check["kvcache.fragmentation"].fix
    assert all(f.severity == "warning" and f.rule == "unmeasurable" and "INCOMPLETE" in f.why for f in findings)
    assert all("external engine's scheduler is not reachable" in f.why for f in findings)


def test_a_profile_that_requires_the_alternatives_hears_nothing() -> None:
    p = profile("cpu-tiny", 'report.required=["weights.smoke.*", "kvcache.blackbox_fragmentation"]', base=EXTERNAL)
    assert unmeasurable_findings(p, builtin()) == []


@pytest.mark.parametrize("overrides, unavailable", [
    ((), False),                                                   # cpu-tiny, server: the view starts on demand
    (('engine.mode="inprocess"',), False),
    (("topology.nodes=2",), True),                                  # an engine across nodes
])
def test_the_warning_follows_the_runs_own_answer(overrides: tuple[str, ...], unavailable: bool) -> None:
    p = profile("cpu-tiny", *overrides)
    assert (scheduler_unavailable(p) is not None) == unavailable
    assert bool(unmeasurable_findings(p, builtin())) == unavailable


def test_a_gpu_server_has_no_scheduler_view() -> None:
    assert "only started on CPU targets" in scheduler_unavailable(load_profile("h200x8"))
    assert {f.value for f in unmeasurable_findings(load_profile("h200x8"), builtin())} == {
        "weights.memory_per_rank", "kvcache.fragmentation"}
