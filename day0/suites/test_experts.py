"""Stage 3b - experts: on an MoE, the latency workload's tokens spread evenly enough over the
experts and the expert-parallel ranks, and no expert takes far more than its share."""

import pytest

from day0.plugin import NotApplicable
from day0.stages import experts

pytestmark = [pytest.mark.day0, pytest.mark.experts]


def test_expert_load_is_balanced(day0_context, day0_checks):
    """Tokens per expert and per EP rank over the latency workload's shape: the worst layer's
    mean/max load against experts.min_balancedness, the hottest expert against its share."""
    why = experts.not_applicable(day0_context.profile)
    if why:  # a dense model: nothing is started, and the run does not wait for it
        raise NotApplicable(why)
    day0_checks.extend(experts.run_stage(day0_context.engine, day0_context.profile, progress=day0_context.progress))
