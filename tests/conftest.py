"""Shared test settings: hypothesis must not flake on a busy 2-core CI machine, the one rule for
tests that need the host's powers (``@pytest.mark.host``, tests/support/host.py), and which tests
must not run beside each other when `make test` runs the suite on two xdist workers."""

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
    config.addinivalue_line(
        "markers",
        "engine: the test starts vLLM engines (a whole Day0 run counts): under `-n 2 --dist loadgroup` every "
        "such test runs on one worker, one at a time, so no more engines share the box than on a serial run",
    )


def shared_resource(item: pytest.Item) -> str | None:
    """The host-wide thing a test holds, which its like must not hold at the same time: network
    namespaces and the one Slurm (a cluster test counts every day0 namespace on the host, and
    there is one slurmctld), or a vLLM engine (memory, and both cores for minutes)."""
    needs = {need for mark in item.iter_markers("host") for need in mark.args}
    if needs & {"root", "slurm"}:
        return "netns"
    if item.get_closest_marker("engine"):
        return "engine"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before xdist reads them (its own hook, ``--dist loadgroup``): each group runs on one worker."""
    for item in items:
        group = shared_resource(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The one place that decides: before any fixture, skip (CI=true: fail) a test whose need is missing."""
    for mark in item.iter_markers("host"):
        host.require(*mark.args)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup`` with a test outside every group sent with its file (xdist's loadfile)
    rather than alone: a module's fixtures (the Day0 run a hostile module's cases read) are built
    once, on one worker, and its tests run in their order, as in a serial run."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupOrFile(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return nodeid.split("::", 1)[0] if scope == nodeid else scope

    return GroupOrFile(config, log)
