"""Stages whose test is their ``run(ctx)``: a site's own stages (entry-point group ``day0.stages``)
and any built-in without a suite module. One test each, marked ``day0`` and the stage's marker,
so ``-m <stage>`` selects it, it runs in the registry's order, and it gates and is gated like
every other stage."""

import pytest

from day0.plugin import registry_of


def pytest_generate_tests(metafunc):
    if "day0_run_stage" not in metafunc.fixturenames:
        return
    stages = registry_of(metafunc.config).with_run()
    metafunc.parametrize("day0_run_stage", [
        pytest.param(s, id=s.name, marks=[pytest.mark.day0, getattr(pytest.mark, s.marker)]) for s in stages
    ], indirect=True)


def test_stage(day0_run_stage, day0_context, day0_checks):
    """What the stage declares it answers (``day0 stages`` lists each question)."""
    day0_checks.extend(list(day0_run_stage.run(day0_context)))
