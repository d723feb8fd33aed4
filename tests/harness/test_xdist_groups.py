"""`make test` runs the suite on two xdist workers: tests that hold the same host-wide thing (vLLM
engines; network namespaces and the Slurm) must never run at once, and a module's tests go together."""

from __future__ import annotations

import pytest

from tests.conftest import pytest_xdist_make_scheduler, shared_resource

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
    ("tests/a/test_x.py::test_one@engine", "engine"),
    ("tests/b/test_y.py::test_two[p]@engine", "engine"),
    ("tests/a/test_x.py::test_three", "tests/a/test_x.py"),
    ("tests/a/test_x.py::test_four[user@host]", "tests/a/test_x.py"),  # an @ in a parameter is no group
    ("tests/a/test_x.py::Cases::test_five", "tests/a/test_x.py"),
])
def test_the_scheduler_sends_a_group_together_and_the_rest_by_file(pytester, nodeid, scope):
    config = pytester.parseconfig("--dist", "loadgroup", "--tx", "2*popen")
    scheduler = pytest_xdist_make_scheduler(config, log=None)
    assert scheduler._split_scope(nodeid) == scope


def test_another_dist_mode_keeps_xdist_s_own_scheduler(pytester):
    assert pytest_xdist_make_scheduler(pytester.parseconfig("--dist", "load", "--tx", "2*popen"), log=None) is None
