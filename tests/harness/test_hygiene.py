"""Pytest and command-line hygiene: what a user of day0 meets before any engine starts; and the
repository's own: no large file committed, and a README that lists every option and command."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from day0 import cli

# The checkout this file sits in, wherever in tests/ it lives.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
MAX_TRACKED_BYTES = 1 << 20


def test_the_suites_run_from_an_empty_folder_after_installation(tmp_path):
    """`pytest --pyargs day0.suites` needs no source checkout: the suites ship in the package."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "day0.suites", "-m", "day0 and preflight",
                           "--day0-out", "out", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = (tmp_path / "out" / "latest" / "run.json")
    assert run.is_file() and '"name": "preflight"' in run.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing else written where the user stood


def test_xdist_is_refused_in_one_line_for_a_day0_run(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.day0\n@pytest.mark.weights\ndef test_w(day0_checks): pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "-m", "day0", "--day0-out", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: day0: -n 2: the Day0 suites share one engine and one run folder*"])
    assert not (pytester.path / "out").exists()
    # -n 0 is no distribution at all, and a run that is not a Day0 run is left alone
    assert pytester.runpytest_subprocess("-n", "0", "-m", "day0", "--day0-out", "out").ret == 0
    pytester.makepyfile(test_plain="def test_plain(): pass\n")
    assert pytester.runpytest_subprocess("-n", "2", "test_plain.py").ret == 0


def test_last_failed_reruns_only_what_failed(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.day0\n@pytest.mark.weights\n"
                        "def test_bad(day0_checks):\n    day0_checks.measured('weights.x', 'x', 1, 0)\n"
                        "@pytest.mark.day0\n@pytest.mark.weights\ndef test_good(day0_checks): pass\n")
    pytester.runpytest("--day0-out", "out")
    again = pytester.runpytest("--day0-out", "out", "--lf", "-v")
    again.stdout.fnmatch_lines(["*test_bad FAILED*"])
    assert "test_good" not in again.stdout.str()


def test_fixtures_are_named_day0_and_the_old_names_still_work(pytester):
    pytester.makepyfile("""
import pytest

@pytest.mark.day0
@pytest.mark.preflight
def test_names(request, day0_checks, day0_session, day0_profile):
    for name in ("day0_engine", "day0_http_engine", "day0_scheduler_engine", "engine", "http_engine",
                 "scheduler_engine"):
        assert request._fixturemanager.getfixturedefs(name, request.node), name
""")
    pytester.runpytest("--day0-out", "out").assert_outcomes(passed=1)


def _actions(parser: argparse.ArgumentParser, path: str = "day0") -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _actions(sub, f"{path} {name}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            out.append((path, action))
    return out


def test_every_command_line_argument_says_what_it_is():
    missing = [f"{path}: {'/'.join(a.option_strings) or a.dest}" for path, a in _actions(cli.build_parser())
               if not a.help]
    assert not missing, "arguments without help text:\n" + "\n".join(missing)


def test_version_and_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("day0 ")
    text = cli.build_parser().format_help()
    examples = text.split("examples:")[1].strip().splitlines()
    assert len(examples) == 3 and all(line.strip().startswith("day0 ") for line in examples)


def test_the_suites_folder_is_the_package_one():
    assert cli.SUITES_DIR == Path(cli.__file__).resolve().parent / "suites" and cli.SUITES_DIR.is_dir()


# --------------------------------------------------------------------------- the repository


def test_no_tracked_file_is_over_1_mb():
    """Binaries (a wheel, a model, a run folder) come from a registry or are built, never committed:
    every clone would carry them forever."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    sizes = {name: (ROOT / name).lstat().st_size for name in out.decode().split("\0") if name}
    big = [f"{name}: {size / 2**20:.1f} MiB" for name, size in sizes.items() if size > MAX_TRACKED_BYTES]
    assert not big, "tracked files over 1 MiB:\n" + "\n".join(big)


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_options_table_lists_every_day0_option(tmp_path):
    """The table under "Options" and what `pytest --help` shows for the plugin are the same set."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    defined = set(re.findall(r"(--day0-[a-z0-9-]+)", proc.stdout))
    listed = set(re.findall(r"^\| `(--day0-[a-z0-9-]+)", _readme_section("Options"), re.MULTILINE))
    assert defined and defined == listed, (f"missing from README: {sorted(defined - listed)}; "
                                           f"in README only: {sorted(listed - defined)}")


def _command_paths(parser: argparse.ArgumentParser, path: str = "day0") -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [f"{path} {name}", *_command_paths(sub, f"{path} {name}")]
    return out


def test_the_readme_command_list_names_every_day0_command():
    """Every `day0` subcommand, at every depth (`day0 latency import`), starts a line of the list
    under "Command line"; and every line there is a command that exists."""
    lines = [line.strip() for line in _readme_section("Command line").splitlines() if line.strip().startswith("day0 ")]
    paths = _command_paths(cli.build_parser())
    missing = [p for p in paths if not any(re.match(rf"{re.escape(p)}(\s|$)", line) for line in lines)]
    assert not missing, "README's command list omits: " + ", ".join(missing)
    unknown = [line for line in lines if line.split()[1] not in {p.split()[1] for p in paths}]
    assert not unknown, "README lists commands that do not exist: " + "; ".join(unknown)


def test_the_readme_layout_names_every_part_of_the_package():
    """Every package and top-level module of day0/ appears in the README's layout."""
    layout = _readme_section("Layout")
    package = ROOT / "day0"
    parts = sorted(f"day0/{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()) + \
        sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    missing = [part for part in parts if part not in layout]
    assert not missing, "README's layout omits: " + ", ".join(missing)


def test_the_profiles_doc_lists_every_preset_in_its_table():
    """The preset table of docs/profiles.md: one row per preset `day0 profiles` lists (it had left
    out cpu-tiny-spec), and no row named like a preset for one that does not exist."""
    from day0.config.profile import preset_names

    text = (ROOT / "docs" / "profiles.md").read_text()
    rows = set(re.findall(r"^\| `([a-z0-9-]+)`(?: \(default\))? \|", text, re.MULTILINE))
    presets = set(preset_names())
    assert presets <= rows, f"docs/profiles.md's preset table omits {sorted(presets - rows)}"
    assert not {r for r in rows if r.startswith(("cpu-", "h", "gb", "supernode"))} - presets, sorted(rows - presets)


def test_the_docs_cite_test_files_that_exist():
    """A test named in README.md or docs/ as the proof of something is where the text says."""
    cited = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            cited += [(f"{doc.relative_to(ROOT)}:{n}", p.rstrip(".")) for p in re.findall(r"\btests/[\w/.-]*", line)]
    missing = [f"{where}: {path}" for where, path in cited if not (ROOT / path).exists()]
    assert cited and not missing, "cited test paths that do not exist:\n" + "\n".join(missing)
