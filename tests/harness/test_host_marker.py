"""The ``host`` marker (tests/conftest.py, tests/support/host.py), driven through pytester with the
real hook: a missing need is a skip naming it, and under CI=true a failure naming it."""

import pytest

CONFTEST = "from tests.conftest import pytest_configure, pytest_runtest_setup  # noqa: F401\n"
TESTS = """
import pytest

@pytest.mark.host("browser")
def test_browser():
    pass

@pytest.mark.host("root")
def test_root():
    pass

def test_plain():
    pass
"""


@pytest.fixture
def lacking(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A host with neither need: no browser, and root namespaces blocked."""
    import day0.engine.cluster.netns as netns

    monkeypatch.setenv("DAY0_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(netns, "blocked_reason", lambda: "emulated nodes need root (CAP_NET_ADMIN)")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(TESTS)
    return pytester


def test_a_missing_need_is_a_skip_with_its_reason(lacking: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = lacking.runpytest("-rs", "--strict-markers")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*needs browser: headless Chromium not found*",
                                 "*needs root: emulated nodes need root (CAP_NET_ADMIN)*"])


def test_under_ci_a_missing_need_fails_with_its_reason(lacking: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = lacking.runpytest("-rE", "--strict-markers")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(["*needs browser: headless Chromium not found*CI=true, so this test must run*",
                                 "*needs root: emulated nodes need root*CI=true, so this test must run*"])


def test_a_need_the_host_has_runs_the_test(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import day0.engine.cluster.netns as netns

    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(netns, "blocked_reason", lambda: None)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("import pytest\n@pytest.mark.host('root')\ndef test_root():\n    pass\n")
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_an_unknown_or_missing_need_is_an_error_even_outside_ci(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("import pytest\n@pytest.mark.host('rooot')\ndef test_typo():\n    pass\n"
                        "@pytest.mark.host()\ndef test_empty():\n    pass\n")
    result = pytester.runpytest("-rE")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*host('rooot'): unknown need (one of: root, browser, slurm, shellcheck)*",
                                 "*host() names no need*"])
