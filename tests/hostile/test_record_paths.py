"""Paths a record names (issue #31, cause 4): a record is data, never where to write or what to read.

``day0 history add`` copied a received run.json to the ``compare.history_dir`` the record itself
named (absolute, ``../..``, ``~``), ``day0 compare --baseline latest`` and the report's trend charts
read the history from there, and a record's ``[report] template_dir`` chose the templates that
render it, which could include any readable file through a symlink (the Jinja sandbox stops code,
not reads). Now the history folder comes from ``--history`` or the local profile (default:
``history/`` beside the run's folder), templates from ``--template-dir`` or the local profile, and
the template loader refuses a template whose real path leaves its folder. What the record named
is said on stdout, not followed. Every case runs the real command under the corpus's bounds
(tests/support/hostile.py) and judges what the user sees and what lands on disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from day0.results import history
from day0.results.report import render
from tests.support import hostile
from tests.support import run_factory as rf

SECRET = "TOP-SECRET-4711"
MARKER = "CHOSEN-BY-THE-RECORD"
SITE_PAGE = ('{% extends "day0/report.html.j2" %}{% block header %}' + MARKER
             + '{% include "leak.txt" ignore missing %}{{ super() }}{% endblock %}')


def _record(tmp_path: Path, where: str, section: str, **values: object) -> Path:
    """An accepted run.json at ``tmp_path/where`` whose profile's ``[section]`` names ``values``."""
    rec = rf.accepted()
    rec.profile = {**rec.profile, section: {**(rec.profile.get(section) or {}), **values}}
    return rf.write(rec, tmp_path / where)


def _secret(tmp_path: Path) -> Path:
    p = tmp_path / "private" / "secret.txt"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(SECRET + "\n")
    return p


def _site(tmp_path: Path, name: str = "site") -> Path:
    site = tmp_path / name
    site.mkdir(parents=True)
    (site / "report.html.j2").write_text(SITE_PAGE, encoding="utf-8")
    return site


def _pages(root: Path) -> str:
    """Everything day0 wrote under ``root`` that a person or a CI job would read."""
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file()
                   and not p.is_symlink() and p.suffix in (".html", ".xml", ".json"))


# --------------------------------------------------------------------------- history add


def _abs(tmp_path: Path) -> tuple[str, Path]:
    return str(tmp_path / "elsewhere"), tmp_path / "elsewhere"


def _dotdot(tmp_path: Path) -> tuple[str, Path]:
    return "../../escaped", tmp_path / "a" / "escaped"  # from a/b/reports, the run folders' parent


def _home(tmp_path: Path) -> tuple[str, Path]:
    return "~/stolen", tmp_path / "home" / "stolen"


def _linked(tmp_path: Path) -> tuple[str, Path]:
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    return str(tmp_path / "link"), tmp_path / "target"


def _fifo(tmp_path: Path) -> tuple[str, Path]:
    os.mkfifo(tmp_path / "pipe")
    return str(tmp_path / "pipe"), tmp_path / "pipe"


NAMED_HISTORY: dict[str, Callable[[Path], tuple[str, Path]]] = {
    "absolute": _abs, "dotdot": _dotdot, "home": _home, "symlinked": _linked, "fifo": _fifo}


@pytest.mark.parametrize("case", NAMED_HISTORY)
def test_history_add_stores_where_the_command_line_says_not_where_the_record_says(tmp_path: Path, case: str) -> None:
    named, lands = NAMED_HISTORY[case](tmp_path)
    before = set(lands.rglob("*")) if lands.is_dir() else set()
    run = _record(tmp_path, "a/b/reports/run-x", "compare", history_dir=named)
    (tmp_path / "home").mkdir(exist_ok=True)
    out = hostile.day0("history", "add", run, cwd=tmp_path, env={"HOME": str(tmp_path / "home")})
    assert out.code == 0 and not out.lines, out.explain()
    [stored] = list((tmp_path / "a" / "b" / "reports" / "history").glob("*/*/0001_*.json"))
    assert stored.read_bytes() == run.read_bytes()
    assert (set(lands.rglob("*")) if lands.is_dir() else set()) == before, f"{case}: wrote under {lands}"
    assert "note: the record names compare.history_dir" in out.stdout and "not used" in out.stdout


# --------------------------------------------------------------------------- compare and trends


@pytest.mark.parametrize("case", ["absolute", "dotdot"])
def test_compare_reads_no_history_the_record_names(tmp_path: Path, case: str) -> None:
    """A planted history where the record points is not the baseline: without ``--history`` the
    default beside the run is read, and it holds nothing yet."""
    named, planted = NAMED_HISTORY[case](tmp_path)
    base = rf.accepted()
    base.run_id = "run-planted"
    history.store(rf.write(base, tmp_path / "planted-run"), history.folder_for(planted, base))
    run = _record(tmp_path, "a/b/reports/run-x", "compare", history_dir=named)
    default = tmp_path / "a" / "b" / "reports" / "history"
    hostile.refused(hostile.day0("compare", run, "--baseline", "latest", cwd=tmp_path), default,
                    problem="no latest run")


def test_report_trends_come_from_no_history_the_record_names(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    for i in range(2):
        rec = rf.accepted()
        rec.run_id = f"run-{i}"
        history.store(rf.write(rec, tmp_path / "store" / rec.run_id), history.folder_for(planted, rec))
    run = _record(tmp_path, "reports/run-now", "compare", history_dir=str(planted))
    page = render(run, run.parent / "report.html").read_text(encoding="utf-8")
    assert 'class="spark"' not in page and "Last 3 runs" not in page


# --------------------------------------------------------------------------- a record's template_dir


def _rec_abs(tmp_path: Path) -> str:
    return str(_site(tmp_path))


def _rec_dotdot(tmp_path: Path) -> str:
    _site(tmp_path)
    return "../site"  # from the command's folder, tmp_path/cwd


def _rec_linked(tmp_path: Path) -> str:
    (tmp_path / "sitelink").symlink_to(_site(tmp_path))
    return str(tmp_path / "sitelink")


def _rec_missing(tmp_path: Path) -> str:
    return str(tmp_path / "no-such-templates")


def _rec_leak(tmp_path: Path) -> str:
    site = _site(tmp_path)
    (site / "leak.txt").symlink_to(_secret(tmp_path))
    return str(site)


RECORD_TEMPLATES: dict[str, Callable[[Path], str]] = {
    "absolute": _rec_abs, "dotdot": _rec_dotdot, "symlinked": _rec_linked, "missing": _rec_missing,
    "leaks-a-file": _rec_leak}


@pytest.mark.parametrize("case", RECORD_TEMPLATES)
def test_report_renders_with_no_template_the_record_names(tmp_path: Path, case: str) -> None:
    named = RECORD_TEMPLATES[case](tmp_path)
    (tmp_path / "cwd").mkdir()
    run = _record(tmp_path, "reports/run-x", "report", template_dir=named)
    out = hostile.day0("report", run, cwd=tmp_path / "cwd")
    assert out.code == 0 and not out.lines, out.explain()
    page = (run.parent / "report.html").read_text(encoding="utf-8")
    assert MARKER not in page and SECRET not in page
    assert "note: the record names [report] template_dir" in out.stdout and "--template-dir" in out.stdout


# --------------------------------------------------------------------------- the template loader


def _link_abs(site: Path, tmp_path: Path) -> str:
    (site / "leak.txt").symlink_to(_secret(tmp_path))
    return SECRET


def _link_rel(site: Path, tmp_path: Path) -> str:
    _secret(tmp_path)
    (site / "leak.txt").symlink_to(Path("..") / "private" / "secret.txt")
    return SECRET


def _link_passwd(site: Path, tmp_path: Path) -> str:
    (site / "leak.txt").symlink_to("/etc/passwd")
    return "root:"


def _link_folder(site: Path, tmp_path: Path) -> str:
    (site / "inc").symlink_to(_secret(tmp_path).parent)
    (site / "report.html.j2").write_text(SITE_PAGE.replace("leak.txt", "inc/secret.txt"), encoding="utf-8")
    return SECRET


def _link_chain(site: Path, tmp_path: Path) -> str:
    (site / "hop.txt").symlink_to(_secret(tmp_path))
    (site / "leak.txt").symlink_to("hop.txt")  # a link inside the folder, to one that leaves it
    return SECRET


def _link_page(site: Path, tmp_path: Path) -> str:
    elsewhere = tmp_path / "private" / "evil.html.j2"
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    elsewhere.write_text(SITE_PAGE.replace(MARKER, SECRET), encoding="utf-8")
    (site / "report.html.j2").unlink()
    (site / "report.html.j2").symlink_to(elsewhere)
    return SECRET


def _link_dev_zero(site: Path, tmp_path: Path) -> str:
    (site / "leak.txt").symlink_to("/dev/zero")  # read whole, it never ends
    return "\x00"


def _fifo_inside(site: Path, tmp_path: Path) -> str:
    os.mkfifo(site / "leak.txt")  # inside the folder, but no template: read, it never sends EOF
    return MARKER


# case -> (plant it, the file the refusal names, what it says)
LEAVING: dict[str, tuple[Callable[[Path, Path], str], str, str]] = {
    "file-link-absolute": (_link_abs, "leak.txt", "leaves its folder"),
    "file-link-relative": (_link_rel, "leak.txt", "leaves its folder"),
    "etc-passwd": (_link_passwd, "leak.txt", "leaves its folder"),
    "folder-link": (_link_folder, "inc/secret.txt", "leaves its folder"),
    "link-chain": (_link_chain, "leak.txt", "leaves its folder"),
    "page-itself-a-link": (_link_page, "report.html.j2", "leaves its folder"),
    "dev-zero": (_link_dev_zero, "leak.txt", "leaves its folder"),
    "fifo-inside": (_fifo_inside, "leak.txt", "FIFO"),
}


@pytest.mark.parametrize("case", LEAVING)
def test_a_template_that_leaves_its_folder_is_refused_and_nothing_leaks(tmp_path: Path, case: str) -> None:
    plant, name, problem = LEAVING[case]
    site = _site(tmp_path)
    leaked = plant(site, tmp_path)
    run = rf.write(rf.accepted(), tmp_path / "reports" / "run-x")
    out = hostile.day0("report", run, "--template-dir", site, cwd=tmp_path)
    hostile.refused(out, site / name, problem=problem)
    assert leaked not in _pages(tmp_path / "reports") + out.stdout + out.stderr


def test_a_link_that_stays_inside_the_template_folder_is_followed(tmp_path: Path) -> None:
    """The rule is about leaving the folder, not about links (a guard: this held before too)."""
    site = _site(tmp_path)
    (site / "parts").mkdir()
    (site / "parts" / "banner.txt").write_text("ACME-BANNER")
    (site / "leak.txt").symlink_to(Path("parts") / "banner.txt")
    run = rf.write(rf.accepted(), tmp_path / "reports" / "run-x")
    out = hostile.day0("report", run, "--template-dir", site, cwd=tmp_path)
    assert out.code == 0, out.explain()
    page = (run.parent / "report.html").read_text(encoding="utf-8")
    assert "ACME-BANNER" in page and MARKER in page
