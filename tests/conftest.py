"""Shared test settings: hypothesis must not flake on a busy 2-core CI machine, and the one rule for
tests that need the host's powers (``@pytest.mark.host``, tests/support/host.py)."""

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.support import host

# vLLM's collect_env takes seconds per run, and the harness's tests start dozens of short runs;
# tests/core/test_environment.py runs it on purpose.
os.environ.setdefault("DAY0_COLLECT_ENV", "0")

settings.register_profile(
    "day0", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.load_profile("day0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "host(*needs): the test needs the host's powers: 'root' (network namespaces: CAP_NET_ADMIN and "
        "iproute2), 'browser' (headless Chromium) and/or 'slurm' (a real Slurm on emulated nodes); missing, it is skipped with the reason, and under "
        "CI=true it fails with it",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The one place that decides: before any fixture, skip (CI=true: fail) a test whose need is missing."""
    for mark in item.iter_markers("host"):
        host.require(*mark.args)
