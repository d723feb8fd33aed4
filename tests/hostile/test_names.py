"""Hostile names (issue #31, cause 1): a name that becomes a path never costs the run.

A profile's ``name`` (also ``--day0-set name=...``) became the run folder's name unchecked:
``team/llama70b`` made two folders and the record refused its own id (traceback, no run.json,
report or junit, a dangling ``latest``), ~190 characters went past what the record accepts, and
``x/../../../outside/..`` wrote the event log outside ``--day0-out``. Every name now passes one
sanitiser (``day0.core.names.file_name``) where the run id or history folder is minted. The cases
are families, not a list: separators, dots, control characters, length, Unicode, a leading dash,
Windows device names, empty. Each is judged on the sanitiser itself, on a whole run in-process
(start to report, no engine), and twice as a user runs it (``pytest day0/suites -m "day0 and
preflight"``, which starts no engine) under the corpus's bounds.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.config.profile import ProfileError, load_profile
from day0.core.names import MAX_COMPONENT, NAME_LIMIT, file_name, is_component
from day0.core.record import Check, load
from day0.core.record_shape import RUN_ID
from day0.results import history
from day0.session import Day0Session, new_run_id
from tests.support import hostile
from tests.support import run_factory as rf

NAMES: dict[str, str] = {
    # separators
    "slash": "team/llama70b",
    "backslash": "team\\llama70b",
    "absolute": "/etc/passwd",
    "windows-drive": "C:\\Windows\\System32",
    "colon": "site:rack7",
    "slashes-only": "///",
    # dots
    "dot": ".",
    "dotdot": "..",
    "traversal": "x/../../../outside/..",
    "dots-only": "....",
    "leading-dot": ".hidden",
    "trailing-dot": "name.",
    # control characters
    "nul": "a\x00b",
    "newline": "line1\nline2",
    "escape": "\x1b[2J\x1b[31mred",
    "tab-cr": "a\tb\rc",
    # length
    "long-190": "l" * 190,
    "long-300": "n" * 300,
    "long-slashes": "a/" * 150,
    # Unicode
    "cyrillic": "модель-70b",
    "emoji": "🦙-llama",
    "rtl-override": "evil\u202etxt.exe",
    "fullwidth-slash": "team／llama",
    "accent": "café",
    "zero-width": "a\u200bb",
    "ligature": "ﬁle",
    # a leading dash (an option to whatever tool is handed the path)
    "leading-dash": "-rf",
    "double-dash": "--help",
    # Windows device names (refused as file names in every folder, with any extension)
    "con": "CON",
    "nul-ext": "nul.txt",
    "com1": "com1",
    "lpt9": "LPT9",
    "aux": "aux",
    # empty
    "empty": "",
    "spaces": "   ",
}
# What day0 mints: UTC start, the name as a file name, 6 hex digits.
SAFE = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
MINTED = re.compile(rf"\d{{8}}T\d{{6}}Z-{SAFE}-[0-9a-f]{{6}}")
RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}
RUN_BOUND_S = 300.0  # a preflight-only run takes ~10-45 s on 2 busy cores (vLLM's imports); the bound is "did not hang"
RUN_MEM_MB = 8192  # torch and vLLM map far more address space than they use


def _safe(component: str, limit: int = NAME_LIMIT) -> None:
    """One path component on any file system, as the sanitiser promises."""
    assert re.fullmatch(SAFE, component), component
    assert len(component) <= limit and component not in (".", "..")
    assert component.split(".", 1)[0].upper() not in RESERVED, component
    assert is_component(component) and RUN_ID[0](component)


# --------------------------------------------------------------------------- the sanitiser


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_file_name_gives_one_safe_component(tmp_path: Path, name: str) -> None:
    got = file_name(name)
    _safe(got)
    made = tmp_path / got
    made.mkdir()
    assert made.parent == tmp_path and [p.name for p in tmp_path.iterdir()] == [got]


@pytest.mark.parametrize("name, expected", [
    ("team/llama70b", "team-llama70b"),
    ("x/../../../outside/..", "x-outside"),
    ("Llama-3.1-70B-Instruct", "Llama-3.1-70B-Instruct"),
    ("cpu-tiny", "cpu-tiny"),
    ("My Site", "My-Site"),
])
def test_file_name_stays_readable(name: str, expected: str) -> None:
    assert file_name(name) == expected


@given(st.text(max_size=600), st.integers(min_value=16, max_value=MAX_COMPONENT))
def test_any_text_becomes_one_safe_component_of_bounded_length(name: str, limit: int) -> None:
    got = file_name(name, limit)
    _safe(got, limit)
    assert file_name(got, limit) == got  # a minted name passes through unchanged


@given(st.text(max_size=300), st.text(max_size=300))
def test_names_that_differ_in_more_than_punctuation_stay_apart(a: str, b: str) -> None:
    """Only ASCII punctuation is merged (``team/a`` is ``team-a``); a name that lost anything else
    (non-ASCII text, a cut, a device name) keeps a hash of itself."""
    letters = re.compile(r"[^A-Za-z0-9]+")
    if file_name(a) == file_name(b):
        assert a == b or (a.isascii() and b.isascii() and letters.sub("", a) == letters.sub("", b))


def test_names_cut_for_length_keep_a_hash_of_the_whole_name() -> None:
    a, b = "m" * 299 + "a", "m" * 299 + "b"
    assert file_name(a) != file_name(b) and len(file_name(a)) == NAME_LIMIT


# --------------------------------------------------------------------------- the run id and the record


@given(st.text(max_size=400))
def test_every_id_day0_mints_is_one_the_record_accepts(name: str) -> None:
    rid = new_run_id(name, datetime(2026, 12, 2, tzinfo=timezone.utc))
    assert MINTED.fullmatch(rid) and RUN_ID[0](rid) and len(rid.encode()) <= 100


def test_ids_older_day0s_minted_from_raw_names_still_load(tmp_path: Path) -> None:
    """The reader's rule (names.is_component) is wider than the minter's: a stored run whose id
    holds a space or non-ASCII letters keeps loading."""
    rec = rf.accepted()
    rec.run_id = "20261130T090000Z-My Site модель-0a1b2c"
    assert load(rf.write(rec, tmp_path / "old")).run_id == rec.run_id


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_a_run_of_any_name_keeps_its_whole_record_inside_out(tmp_path: Path, name: str) -> None:
    """Start to report in-process (no engine): run.json, report.html and junit.xml in ``out/<run id>``,
    ``latest`` pointing at it, the history beside it, nothing written outside ``out``; the name as
    given stays in the record's profile."""
    out = tmp_path / "out"
    s = Day0Session(load_profile("cpu-tiny", overrides={"name": name}), out, log=lambda m: None)
    s.start(engine_wanted=False)
    s.add_check("preflight", Check(id="preflight.named", title="a check", status="pass"))
    record = s.finish(0)
    assert s.report_error == "" and s.run_dir.parent == out and MINTED.fullmatch(s.run_id), s.run_id
    assert {"run.json", "report.html", "junit.xml", "events.jsonl"} <= {p.name for p in s.run_dir.iterdir()}
    assert (out / "latest").resolve() == s.run_dir.resolve()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert record.profile["name"] == name and load(s.run_json).profile["name"] == name
    [stored] = list((out / "history").glob("*/*/*.json"))
    _safe(stored.parent.parent.name, 80)
    assert stored.parent.parent.parent == out / "history"


def test_a_name_that_is_not_unicode_text_is_refused_before_the_run() -> None:
    """Bytes that are not UTF-8 on a command line arrive as lone surrogates; a record holding one
    cannot be read back, so the name is refused up front in one line (no run is started to lose)."""
    with pytest.raises(ProfileError, match="name: .* is not Unicode text"):
        load_profile("cpu-tiny", overrides={"name": "a\udcffb"})


# --------------------------------------------------------------------------- history folders


@pytest.mark.parametrize("a, b", [
    ("модель-70b", "другая-70b"),  # the old slug made both "70b"
    ("日本", "中国"),  # both "unknown"
    ("n" * 299 + "a", "n" * 299 + "b"),  # both cut to the same 80 characters
], ids=["cyrillic", "cjk", "long"])
def test_history_folders_of_names_that_differ_stay_apart(a: str, b: str) -> None:
    assert history.slug(a) != history.slug(b)
    _safe(history.slug(a), 80)


@pytest.mark.parametrize("name", ["CON", "nul.txt", "com1", "Lpt9"])
def test_a_history_folder_is_never_a_windows_device_name(name: str) -> None:
    _safe(history.slug(name), 80)


def test_history_folders_keep_the_names_they_always_had() -> None:
    """Existing histories stay found: ASCII names and recorded devices keep their folders (a
    guard for the change above; it held before it too)."""
    assert history.slug("My Site") == "my-site" and history.slug("cpu_tiny") == "cpu-tiny"
    assert history.slug("cpu-2c-Intel(R) Xeon(R) CPU @ 2.20GHz") == "cpu-2c-intel-r-xeon-r-cpu-2.20ghz"
    assert history.machine_id(rf.accepted(), override="Site A / rack 3") == "site-a-rack-3"


# --------------------------------------------------------------------------- as a user runs it


@pytest.mark.parametrize("name", ["team/llama70b", "x/../../../outside/" + "l" * 190],
                         ids=["slash", "traversal-and-long"])
def test_a_preflight_run_of_a_hostile_name_is_never_lost(tmp_path: Path, name: str) -> None:
    """The issue's own cases, through ``--day0-set``: exit 0, the three files inside
    ``--day0-out``, ``latest`` resolving to the run, nothing written anywhere else."""
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    res = hostile.pytest_day0("--pyargs", "day0.suites", "-m", "day0 and preflight", "-q", "-p", "no:randomly",
                              "--day0-profile", "cpu-tiny", "--day0-set", f"name={json.dumps(name)}",
                              "--day0-out", out, cwd=cwd, timeout_s=RUN_BOUND_S, mem_mb=RUN_MEM_MB)
    assert res.code == 0 and "Traceback" not in res.stdout + res.stderr, res.explain()
    [run_dir] = [p for p in out.iterdir() if p.name not in ("latest", "history")]
    assert MINTED.fullmatch(run_dir.name) and (out / "latest").resolve() == run_dir.resolve()
    assert {"run.json", "report.html", "junit.xml"} <= {p.name for p in run_dir.iterdir()}
    assert load(run_dir / "run.json").profile["name"] == name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "out"] and not any(cwd.iterdir())


def test_a_name_of_bytes_that_are_not_utf8_is_one_line_not_a_lost_run(tmp_path: Path) -> None:
    res = hostile.pytest_day0("--pyargs", "day0.suites", "-m", "day0 and preflight", "-q",
                              "--day0-profile", "cpu-tiny", "--day0-set", 'name="a\udcffb"',
                              "--day0-out", tmp_path / "out", cwd=tmp_path, timeout_s=RUN_BOUND_S, mem_mb=RUN_MEM_MB)
    hostile.refused(res, code=4, problem="not Unicode text")
    assert not (tmp_path / "out").exists()
