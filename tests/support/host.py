"""What a test may need from the host beyond Python, and the one rule for when it is missing.

A test says what it needs with ``@pytest.mark.host(NEED, ...)`` (registered in tests/conftest.py,
whose ``pytest_runtest_setup`` calls :func:`require` before any fixture is set up):

* ``"root"``: network namespaces, veths and tc qdiscs (CAP_NET_ADMIN and iproute2), exactly what
  :func:`day0.engine.cluster.netns.blocked_reason` asks of a host before it emulates nodes;
* ``"browser"``: headless Chromium (``$DAY0_CHROMIUM``, or chromium/google-chrome on PATH);
* ``"slurm"``: a real Slurm on emulated nodes: root as above, and munge, slurmctld, slurmd and the
  clients (``scripts/install-system.sh slurm``);
* ``"shellcheck"``: the shell linter the image's entrypoint is held to (``install-system.sh lint``).

Missing, the test is skipped with the reason, except under ``CI=true``, where it fails with that
reason: CI runs as root with every one of them installed (``make test``), so a skip there would be
a test that silently stopped running.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    env = os.environ.get("DAY0_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    return next((p for b in BROWSERS if (p := shutil.which(b))), None)


def _root() -> str | None:
    from day0.engine.cluster.netns import blocked_reason

    return blocked_reason()


def _browser() -> str | None:
    if find_chromium() is None:
        return "headless Chromium not found (apt-get install -y chromium, or set DAY0_CHROMIUM)"
    return None


def _slurm() -> str | None:
    from day0.engine.cluster.scheduler import slurm_missing

    return _root() or slurm_missing()


def _shellcheck() -> str | None:
    if shutil.which("shellcheck") is None:
        return "shellcheck not found (apt-get install -y shellcheck; make test installs it)"
    return None


#: need -> why this host lacks it (None: it has it)
NEEDS: dict[str, Callable[[], str | None]] = {"root": _root, "browser": _browser, "slurm": _slurm,
                                               "shellcheck": _shellcheck}


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(*needs: str) -> None:
    """Return when the host has every one of ``needs``; otherwise skip, or fail under CI=true."""
    if not needs:
        pytest.fail(f"@pytest.mark.host() names no need (one of: {', '.join(NEEDS)})", pytrace=False)
    for need in needs:
        if need not in NEEDS:
            pytest.fail(f"@pytest.mark.host({need!r}): unknown need (one of: {', '.join(NEEDS)})", pytrace=False)
        reason = NEEDS[need]()
        if reason is None:
            continue
        if under_ci():
            pytest.fail(f"needs {need}: {reason}; CI=true, so this test must run, not skip", pytrace=False)
        pytest.skip(f"needs {need}: {reason}")


def chromium() -> str:
    """The browser of a test marked ``host("browser")`` (the marker has made sure there is one)."""
    path = find_chromium()
    assert path is not None, "no Chromium: mark the test @pytest.mark.host(\"browser\")"
    return path
