"""Stage 0 - preflight: the profile is valid for vLLM and the model fits, before the engine starts."""

import pytest

from day0.core.record import Check
from day0.model.plan import plan_checks
from day0.stages.preflight import ConfigUnavailable, preflight
from day0.stages.preflight.lint import lint_checks

pytestmark = [pytest.mark.day0, pytest.mark.preflight]


@pytest.fixture(scope="module")
def result(day0_profile):
    try:
        return preflight(day0_profile)
    except ConfigUnavailable as exc:
        pytest.skip(f"no config.json to plan from: {exc}")


def test_config_lint(result, day0_checks):
    """vLLM's own rules: dtype, quantization, TP/PP vs heads and layers, block size, max_model_len."""
    for check in lint_checks(result.findings):
        check.source = "static"
        check.evidence.setdefault("config", result.config_source)
        day0_checks.add(check)


def test_memory_plan(result, day0_checks):
    """Weights and KV cache per rank under TP x PP fit the devices, for the target context."""
    if result.plan is None:
        day0_checks.add(Check(id="preflight.plan", title="Memory plan", status="fail", source="static",
                              message=f"no plan could be priced: {result.plan_error}"))
        return
    for check in plan_checks(result.plan):
        check.source = "static"
        day0_checks.add(check)
