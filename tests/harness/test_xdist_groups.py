"""`make test` runs the suite on two xdist workers: tests that hold the same host-wide thing (vLLM
engines; network namespaces and the Slurm) must never run at once, and a module's tests go together."""

from __future__ import annotations

import json

import pytest

from tests.conftest import GROUPS_ENV, pytest_xdist_make_scheduler, read_groups, shared_resource
from tests.support import REPO

SOURCE = """
import pytest

@pytest.mark.engine
def test_starts_vllm(): pass

@pytest.mark.host("root")
def test_makes_namespaces(): pass

@pytest.mark.host("slurm")
@pytest.mark.engine
def test_slurm_runs_vllm(): pass

@pytest.mark.host("browser")
def test_draws_in_chromium(): pass

def test_plain(): pass
"""


def test_each_test_joins_the_group_of_what_it_holds(pytester):
    groups = {item.name: shared_resource(item) for item in pytester.getitems(SOURCE)}
    assert groups == {"test_starts_vllm": "engine", "test_makes_namespaces": "netns",
                      "test_slurm_runs_vllm": "netns", "test_draws_in_chromium": None, "test_plain": None}


@pytest.mark.parametrize("nodeid, scope", [
    ("tests/a/test_x.py::test_one", "engine"),
    ("tests/b/test_y.py::test_two[p]", "engine"),
    ("tests/a/test_x.py::test_three", "tests/a/test_x.py"),
    ("tests/a/test_x.py::test_four[user@host]", "tests/a/test_x.py"),
    ("tests/a/test_x.py::Cases::test_five", "tests/a/test_x.py"),
])
def test_the_scheduler_sends_a_group_together_and_the_rest_by_file(pytester, monkeypatch, tmp_path, nodeid, scope):
    (tmp_path / "gw0.json").write_text(json.dumps({"tests/a/test_x.py::test_one": "engine",
                                                   "tests/b/test_y.py::test_two[p]": "engine"}))
    monkeypatch.setenv(GROUPS_ENV, str(tmp_path))
    scheduler = pytest_xdist_make_scheduler(pytester.parseconfig("--dist", "loadgroup", "--tx", "2*popen"), log=None)
    scheduler.groups = read_groups(tmp_path)  # what its schedule() reads once every worker has collected
    assert scheduler._split_scope(nodeid) == scope


def test_another_dist_mode_keeps_xdist_s_own_scheduler(pytester):
    assert pytest_xdist_make_scheduler(pytester.parseconfig("--dist", "load", "--tx", "2*popen"), log=None) is None


ENGINE_TEST = """
import os, pytest
pytestmark = pytest.mark.engine

def test_where():
    with open(os.path.join(os.environ["RAN_DIR"], __name__), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_engine_tests_in_four_files_run_on_one_worker(pytester, monkeypatch):
    """End to end, two real workers: left to file scheduling, four files would be shared out."""
    monkeypatch.delenv(GROUPS_ENV, raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("RAN_DIR", str(pytester.mkdir("ran")))
    pytester.makeconftest("from tests.conftest import *  # noqa: F401,F403\n")
    for name in ("a", "b", "c", "d"):
        pytester.makepyfile(**{f"test_engine_{name}": ENGINE_TEST, f"test_plain_{name}": "def test_x(): pass\n"})
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "no:randomly")
    result.assert_outcomes(passed=8)
    workers = {p.name: p.read_text() for p in (pytester.path / "ran").iterdir()}
    assert len(workers) == 4 and len(set(workers.values())) == 1, workers
