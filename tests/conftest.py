"""Shared test settings: hypothesis must not flake on a busy 2-core CI machine, the one rule for
tests that need the host's powers (``@pytest.mark.host``, tests/support/host.py), and which tests
must not run beside each other when `make test` runs the suite on two xdist workers."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support import host

GROUPS_ENV = "DAY0_TEST_GROUPS"  # the folder where each xdist worker writes which tests share what
CHILD_PYTEST_OPTS = ("-p", "no:hypothesispytest")  # for the pytest processes the tests start

# vLLM's collect_env takes seconds per run, and the harness's tests start dozens of short runs;
# tests/core/test_environment.py runs it on purpose.
os.environ.setdefault("DAY0_COLLECT_ENV", "0")
# Two workers hold vLLM engines at once (the engine and netns groups), and where torch runs several
# OpenMP threads (day0's own process, an engine worker on both cores) a thread out of work spins
# before it sleeps: two whole default runs side by side took 212-247 s each, 98-110 s with passive
# waiting (wall, 3 rounds of 2 runs; docs/engine.md, benchmarks/side_by_side_runs.py). The suite's
# engines inherit it; a run of day0 itself keeps the deployment's own setting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

settings.register_profile(
    "day0", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.load_profile("day0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "host(*needs): the test needs the host's powers: 'root' (network namespaces: CAP_NET_ADMIN and "
        "iproute2), 'browser' (headless Chromium), 'slurm' (a real Slurm on emulated nodes) and/or 'shellcheck'; missing, it is skipped with the reason, and under "
        "CI=true it fails with it",
    )
    config.addinivalue_line(
        "markers",
        "engine: the test starts vLLM engines (a whole Day0 run counts): under `-n 2 --dist loadgroup` every "
        "such test runs on one worker, one at a time, and the tests of emulated nodes on the other (those that "
        "start engines across the nodes too: see shared_resource)",
    )
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if config.getoption("dist", "no") == "loadgroup" and not worker:
        os.environ[GROUPS_ENV] = tempfile.mkdtemp(prefix="day0-test-groups-")  # the workers inherit it
    if worker or not getattr(config.option, "numprocesses", None):  # not a controller about to start workers
        quiet_child_pytest()


def quiet_child_pytest() -> None:
    """The pytest processes tests start (whole Day0 runs, the hostile cases' ``pytest -m day0``) run
    no hypothesis test, but its entry-point plugin imports all of hypothesis at the end of every
    session (its terminal summary reads hypothesis' observability module): ~1.7 s of CPU each.
    Set here, after this process read its own options, so only its children see it (an xdist
    controller leaves it to its workers, which run hypothesis tests under the plugin)."""
    opts = os.environ.get("PYTEST_ADDOPTS", "")
    if CHILD_PYTEST_OPTS[-1] not in opts.split():  # appended as text: the user's own quoting stays
        os.environ["PYTEST_ADDOPTS"] = f"{opts} {' '.join(CHILD_PYTEST_OPTS)}".strip()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the groups folder; a worker leaves it to the controller."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(GROUPS_ENV):
        shutil.rmtree(os.environ.pop(GROUPS_ENV), ignore_errors=True)


def shared_resource(item: pytest.Item) -> str | None:
    """What a test holds that its like should not hold at the same time: emulated nodes (network
    namespaces, and the Slurm daemons on them; clusters are told apart by owner pid, but each
    starts engines across its nodes), or vLLM engines (GiBs of memory, both cores for minutes).

    A test of emulated nodes that also starts engines (marked both) stays in the nodes' group, so
    it can run beside the engine group's test of the moment: one group for both would put the four such tests' 431 s
    (CI, 2026-12-07) behind the engine tests, and both groups pass side by side."""
    needs = {need for mark in item.iter_markers("host") for need in mark.args}
    if needs & {"root", "slurm"}:
        return "netns"
    if item.get_closest_marker("engine"):
        return "engine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: tell the controller's scheduler which tests share what. xdist's own
    ``xdist_group`` marker cannot (with pytest 9.2 its renaming of ``item._nodeid`` no longer
    changes the node id), so each worker writes its groups into the folder the controller made."""
    folder, worker = os.environ.get(GROUPS_ENV), os.environ.get("PYTEST_XDIST_WORKER")
    if folder and worker:
        groups = {item.nodeid: group for item in items if (group := shared_resource(item))}
        (Path(folder) / f"{worker}.json").write_text(json.dumps(groups), encoding="utf-8")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The one place that decides: before any fixture, skip (CI=true: fail) a test whose need is missing."""
    for mark in item.iter_markers("host"):
        host.require(*mark.args)


def read_groups(folder: Path) -> dict[str, str]:
    """node id -> group, as the workers wrote them (each collects every test, so any one would do)."""
    groups: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        groups.update(json.loads(path.read_text(encoding="utf-8")))
    return groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup``, day0's way: the tests of one group (:func:`shared_resource`) go to one
    worker, one after another; every other test goes with its file (xdist's loadfile), so a
    module's fixtures (the Day0 run a hostile module's cases read) are built once, on one worker,
    and its tests run in their order, as in a serial run."""
    if config.getoption("dist", "no") != "loadgroup" or not os.environ.get(GROUPS_ENV):
        return None
    from xdist.scheduler import LoadScopeScheduling

    folder = Path(os.environ[GROUPS_ENV])

    class GroupOrFile(LoadScopeScheduling):
        groups: dict[str, str] = {}

        def schedule(self) -> None:  # every worker has collected (and written its groups) by now
            self.groups = read_groups(folder)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

    return GroupOrFile(config, log)
