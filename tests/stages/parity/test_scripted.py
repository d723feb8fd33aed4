"""Each parity comparison proves it can fail: a scripted server that diverges only on the second
identical request, only inside a batch, only when streaming; the stage fails that feature alone
and names it, with the prompt, the position, both tokens and both logprobs."""

import pytest

from day0.config.parity import ParitySection
from day0.config.profile import load_profile
from day0.engine import Endpoint
from day0.stages.parity import run_parity
from tests.support.sse_server import Script, SSEServer

FEATURES = ("prefix_caching", "batch_invariance", "streaming")


@pytest.fixture(scope="module")
def server():
    with SSEServer(Script(parity=True, ttft_ms=[10.0], gaps_ms=[2.0])) as srv:
        yield srv


def _run(server, diverge):
    server.set_script(Script(parity=True, ttft_ms=[10.0], gaps_ms=[2.0], diverge=diverge))
    profile = load_profile("cpu-tiny")
    checks = run_parity(Endpoint(server.url, "scripted"), profile, ParitySection(), lambda _msg: None)
    return {c.id: c for c in checks}


def test_an_engine_without_faults_passes_every_comparison_and_skips_speculation(server):
    checks = _run(server, [])
    for name in FEATURES:
        assert checks[f"parity.{name}"].status == "pass", checks[f"parity.{name}"].message
    assert "0 diverged" in checks["parity.prefix_caching"].message
    assert "repeat served 32 of 49 prompt tokens from the cache" in checks["parity.prefix_caching"].message
    spec = checks["parity.speculative"]
    assert spec.status == "skip" and "not in force" in spec.message and "speculative_config = None" in spec.message
    matrix = checks["parity.features"]
    assert matrix.status == "pass" and matrix.value == 3
    assert "not compared" in matrix.message and "chunked prefill" in matrix.message and "long context" in matrix.message


@pytest.mark.parametrize("fault, feature, label, sides", [
    ("repeat", "prefix_caching", "prefix caching", "cold miss/float32 vs full hit/float32"),
    ("batch", "batch_invariance", "batch invariance", "alone/float32 vs in a batch of 8/float32"),
    ("stream", "streaming", "streaming", "not streamed/float32 vs streamed/float32"),
])
def test_each_fault_fails_its_own_feature_by_name(server, fault, feature, label, sides):
    checks = _run(server, [fault])
    bad = checks[f"parity.{feature}"]
    assert bad.status == "fail", bad.message
    assert bad.message.startswith(f"{label} changes the output: ")
    assert "diverged at generated position 3" in bad.message and sides in bad.message
    assert "logprob -0.05" in bad.message  # both picks, both logprobs
    row = bad.evidence["table"]["rows"][0]
    assert row[3] == 3 and row[4] != row[5] and row[6] == row[7] == -0.05
    for other in FEATURES:
        if other != feature:
            assert checks[f"parity.{other}"].status == "pass", (other, checks[f"parity.{other}"].message)


def test_a_dead_endpoint_is_an_error_not_a_verdict():
    checks = {c.id: c for c in run_parity(Endpoint("http://127.0.0.1:9", "x"), load_profile("cpu-tiny"),
                                          ParitySection(timeout_s=5), lambda _msg: None)}
    for name in FEATURES:
        assert checks[f"parity.{name}"].status == "error", checks[f"parity.{name}"].message
        assert "not compared" in checks[f"parity.{name}"].message
