"""The pytest processes the suite starts (whole Day0 runs, hostile ``pytest -m day0`` cases) load
no hypothesis: its plugin imports all of it at the end of every session (its terminal summary
reads hypothesis' observability module), ~1.7 s of CPU each (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import CHILD_PYTEST_OPTS

PROBE = """
import os, sys

def pytest_unconfigure(config):
    with open(os.environ["PROBE_OUT"], "w") as f:
        f.write(str("hypothesis" in sys.modules))
"""


def child_loads_hypothesis(folder: Path, env: dict[str, str]) -> bool:
    """A child pytest session's answer, read after its terminal summary."""
    out = folder / "loaded"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_x.py"], cwd=folder,
                         capture_output=True, text=True, timeout=120, env={**env, "PROBE_OUT": str(out)})
    assert run.returncode in (0, 5), run.stdout + run.stderr  # 5: the user's PYTEST_ADDOPTS deselected it
    return out.read_text() == "True"


def test_a_child_pytest_of_this_session_loads_no_hypothesis(tmp_path):
    (tmp_path / "conftest.py").write_text(PROBE)
    (tmp_path / "test_x.py").write_text("def test_x(): pass\n")
    assert not child_loads_hypothesis(tmp_path, dict(os.environ))
    # and the setting is what made it so: without it the same child loads it
    bare = os.environ["PYTEST_ADDOPTS"].replace(" ".join(CHILD_PYTEST_OPTS), "")
    assert child_loads_hypothesis(tmp_path, {**os.environ, "PYTEST_ADDOPTS": bare})
