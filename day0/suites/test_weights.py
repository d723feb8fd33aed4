"""Stage 1 - weights: the shards are complete and consistent, the engine loaded them right, and
memory per rank is within the plan."""

from pathlib import Path

import pytest

from day0.core.record import Check
from day0.model.locate import local_model_dir
from day0.stages.weights import (
    Unmeasurable,
    audit,
    golden_tokens_check,
    load_time_check,
    memory_checks,
    smoke_checks,
)
from day0.stages.weights.against_config import overridden_architectures
from day0.stages.weights.beside import beside_checks
from day0.stages.weights.memory import measure_weights

pytestmark = [pytest.mark.day0, pytest.mark.weights]


@pytest.fixture(scope="module")
def model_dir(day0_profile) -> Path:
    path = local_model_dir(day0_profile)
    if path is None:
        pytest.skip(f"model.path {day0_profile.model.path!r} is not a local directory: nothing to audit here")
    return path


def test_checkpoint_audit(model_dir, day0_profile, day0_checks):
    """Index, shards, header offsets, dtypes/shapes vs config.json, parameter count, manifest."""
    w = day0_profile.weights
    day0_checks.extend(audit(model_dir, verify_manifest=w.verify_manifest, workers=w.hash_workers or None,
                             manifest_name=w.manifest, max_checks_per_category=w.max_checks_per_category,
                             architectures=overridden_architectures(day0_profile.engine.args)))


def test_weight_memory_per_rank(day0_profile, day0_session, day0_checks):
    """Weight bytes each worker holds (vLLM's collective_rpc) vs the plan's weights per rank, and
    within device memory x gpu_memory_utilization. A server on a CPU target is measured through the
    scheduler view (the in-process engine with the same args, kept up for the kvcache stage); it runs
    before the smoke test so that engine starts while an early-launched server is still loading."""
    engines = day0_session.engines
    try:
        found = measure_weights(engines)
    except Unmeasurable as exc:  # recorded under the check's own id, so [report] required can name it
        day0_checks.add(Check(id="weights.memory_per_rank", title="Weight memory per rank", status="skip",
                              message=str(exc), source=engines.primary_view))
        return
    day0_checks.extend(memory_checks(found.per_rank, day0_profile, note=found.note, evidence=found.evidence))


def test_rank_memory_beside_the_engine(day0_profile, day0_session, day0_checks):
    """What each rank of the HTTP engine holds beyond its KV pool, read on this host (nvidia-smi per
    process on GPUs, /proc on CPU; /metrics for the pool), against the planned weights plus a
    runtime allowance: the weights check of an external deployment or a GPU server, which expose no
    worker RPC. A bound, not the exact bytes (docs/metrics.md)."""
    if day0_session.engines.primary_view == "scheduler":
        pytest.skip("engine.mode = \"inprocess\": no server process to read; weights.memory_per_rank is exact")
    day0_checks.extend(beside_checks(day0_session.engines, day0_profile))


def test_golden_tokens(day0_session, day0_profile, day0_checks):
    """Greedy tokens and logprobs equal an independent reference: the golden file (weights.golden)
    when set, else transformers on the checkpoint when it fits in host memory; near-ties allowed.
    Before the smoke test: the reference is computed while an early-launched server still loads."""
    day0_checks.add(golden_tokens_check(day0_session.engines.primary, day0_profile.weights.golden,
                                        local_model_dir(day0_profile)))


def test_engine_is_live(day0_engine, day0_checks):
    """Smoke: greedy decoding of fixed prompts returns the requested tokens, twice the same."""
    day0_checks.extend(smoke_checks(day0_engine))


def test_load_time(day0_engine, day0_profile, day0_checks):
    """Engine start-up, weight loading included, against weights.load_time_limit_s (if set)."""
    day0_checks.add(load_time_check(day0_engine, day0_profile.weights.load_time_limit_s))
