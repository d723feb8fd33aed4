"""Required checks the deployment cannot measure are said at stage 0, before any engine work
(day0/stages/preflight/views.py), from the same answer the run gets (scheduler_unavailable)."""

from __future__ import annotations

import pytest

from day0.config.profile import deep_merge, load_profile, parse_override
from day0.core.record import Check, StageRecord
from day0.core.verdict import stood_in_checks, unverified_required
from day0.engine.handle import scheduler_unavailable
from day0.stages.preflight.views import unmeasurable_findings
from day0.stages.registry import builtin
from day0.stages.required import resolve

EXTERNAL = {"engine": {"mode": "external", "url": "http://192.0.2.5:8000"}}  # TEST-NET: never this host
BESIDE = {"engine": {"mode": "external", "url": "http://127.0.0.1:8000"}}


def profile(preset: str, *overrides: str, base: dict | None = None):
    merged: dict = dict(base or {})
    for o in overrides:
        merged = deep_merge(merged, parse_override(o))
    return load_profile(preset, overrides=merged or None)


@pytest.mark.parametrize("preset", ["h200x8", "cpu-tiny"])
def test_the_readme_external_example_beside_the_engine_requires_stand_ins(preset: str) -> None:
    """The README's example (extends h200x8, engine.mode = external) on the engine's host: the exact
    KV view and the worker memory cannot be had, their stand-ins can, so the run requires those and
    stage 0 notes each substitution; nothing is left unmeasurable."""
    p = profile(preset, base=BESIDE)
    required = resolve(p, builtin())
    assert {(s.check, s.stand_in) for s in required.substituted} == {
        ("weights.memory_per_rank", "weights.rank_memory"),
        ("kvcache.fragmentation", "kvcache.blackbox_fragmentation")}
    assert "weights.memory_per_rank" not in required.globs and "weights.rank_memory" in required.globs
    assert "kvcache.fragmentation" not in required.globs and "kvcache.blackbox_fragmentation" in required.globs
    findings = unmeasurable_findings(p, builtin())
    assert {f.severity for f in findings} == {"info"} and len(findings) == 2


@pytest.mark.parametrize("preset", ["h200x8", "cpu-tiny"])
def test_a_remote_external_engine_learns_at_stage_0_what_it_cannot_verify(preset: str) -> None:
    """Away from the engine's host its ranks cannot be read: weights.memory_per_rank is a warning
    naming the check and what to do instead; the KV estimate from /metrics still stands in."""
    findings = unmeasurable_findings(profile(preset, base=EXTERNAL), builtin())
    by_check = {f.value: f for f in findings}
    assert set(by_check) == {"weights.memory_per_rank", "kvcache.fragmentation"}
    warn, note = by_check["weights.memory_per_rank"], by_check["kvcache.fragmentation"]
    assert warn.severity == "warning" and warn.rule == "unmeasurable" and "INCOMPLETE" in warn.why
    assert "external engine's scheduler is not reachable" in warn.why and "engine's host" in warn.fix
    assert note.severity == "info" and "kvcache.blackbox_fragmentation is required in its place" in note.why


def test_a_glob_that_covered_a_stood_in_check_no_longer_requires_it() -> None:
    """weights.* required: the run requires the stand-in too, and the record's substitution excuses
    the skipped original from the glob (core/verdict.stood_in_checks)."""
    p = profile("cpu-tiny", 'report.required=["weights.*"]', base=BESIDE)
    required = resolve(p, builtin())
    assert required.globs == ["weights.*", "weights.rank_memory"]
    record_profile = {"report": {"required": required.globs,
                                 "substituted": [s.as_record() for s in required.substituted]}}
    assert stood_in_checks(record_profile) == {"weights.memory_per_rank"}
    stage = StageRecord("weights", "pass", [
        Check(id="weights.memory_per_rank", title="t", status="skip", message="no worker RPC"),
        Check(id="weights.rank_memory", title="t", status="pass", value=1, limit=2, direction="lower_is_better")])
    assert unverified_required([stage], required.globs, stood_in_checks(record_profile)) == []
    assert unverified_required([stage], required.globs) != []  # without the record's substitution it counts


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


def test_a_gpu_server_has_no_scheduler_view_but_day0_is_beside_it() -> None:
    """The GPU presets' default (day0 starts vLLM on the node): no second engine fits, so both
    exact checks are stood in for, by the ranks read beside the server and the /metrics estimate."""
    assert "only started on CPU targets" in scheduler_unavailable(load_profile("h200x8"))
    findings = unmeasurable_findings(load_profile("h200x8"), builtin())
    assert {(f.value, f.severity) for f in findings} == {
        ("weights.memory_per_rank", "info"), ("kvcache.fragmentation", "info")}


def test_across_nodes_the_ranks_are_not_beside() -> None:
    findings = {f.value: f for f in unmeasurable_findings(profile("cpu-tiny", "topology.nodes=2"), builtin())}
    assert findings["weights.memory_per_rank"].severity == "warning"
    assert findings["kvcache.fragmentation"].severity == "info"
