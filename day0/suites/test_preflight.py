"""Stage 0 - preflight: the profile is valid for vLLM and the model fits, before the engine starts."""

import pytest

from day0.stages.preflight import ConfigUnavailable, preflight

pytestmark = [pytest.mark.day0, pytest.mark.preflight]


@pytest.fixture(scope="module")
def result(day0_profile, day0_session):
    try:
        return preflight(day0_profile, stages=day0_session.registry.stages)
    except ConfigUnavailable as exc:
        pytest.skip(f"no config.json to plan from: {exc}")


def test_config_lint(result, day0_checks):
    """vLLM's own rules: dtype, quantization, TP/PP vs heads and layers, block size, max_model_len."""
    day0_checks.extend(result.lint_checks())


def test_memory_plan(result, day0_checks):
    """Weights and KV cache per rank under TP x PP fit the devices, for the target context."""
    day0_checks.extend(result.plan_checks())
