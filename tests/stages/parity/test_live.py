"""The parity stage against live vLLM servers on the tiny model: every comparison in force passes,
on the default deployment (prefix caching, batching, streaming) and with n-gram speculation (its
greedy tokens equal transformers', its acceptance within the preset's limits). One server per
test, started and stopped here (~1 min each on 2 cores); the stage itself takes seconds."""

import time

import pytest

from day0.config.profile import load_profile
from day0.engine import ServerEngine, local_model_dir
from day0.stages.parity import run_parity


@pytest.fixture
def served(tmp_path):
    engines = []

    def start(name):
        profile = load_profile(name)
        engine = ServerEngine(profile, tmp_path, print, name=name)
        engines.append(engine)
        engine.start()
        return profile, engine

    yield start
    for engine in engines:
        engine.stop()


def _run(profile, engine):
    t0 = time.perf_counter()
    checks = run_parity(engine.endpoint, profile, profile.parity, print, model_dir=local_model_dir(profile))
    return {c.id: c for c in checks}, time.perf_counter() - t0


def test_cpu_tiny_keeps_its_output_under_prefix_caching_batching_and_streaming(served):
    checks, seconds = _run(*served("cpu-tiny"))
    for name in ("prefix_caching", "batch_invariance", "streaming"):
        assert checks[f"parity.{name}"].status == "pass", checks[f"parity.{name}"].message
    assert "from the cache" in checks["parity.prefix_caching"].message  # the repeat really hit
    assert checks["parity.speculative"].status == "skip"
    assert checks["parity.features"].value == 3
    assert seconds < 30, f"the stage took {seconds:.1f} s"


def test_cpu_tiny_spec_is_lossless_and_accepts_drafts(served):
    checks, seconds = _run(*served("cpu-tiny-spec"))
    for cid in ("parity.prefix_caching", "parity.batch_invariance", "parity.streaming", "parity.speculative",
                "parity.speculative.acceptance_rate", "parity.speculative.mean_acceptance_length"):
        assert checks[cid].status == "pass", checks[cid].message
    assert checks["parity.speculative"].evidence["reference"] == "transformers"
    assert checks["parity.speculative.acceptance_rate"].evidence["drafts"] > 0
    assert checks["parity.features"].value == 4
    assert seconds < 60, f"the stage took {seconds:.1f} s"
