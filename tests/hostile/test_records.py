"""Hostile run records, event logs, reports and signatures: nothing hangs, nothing passes falsely.

Every case runs ``day0`` as a user would (tests/support/hostile.py: a subprocess under an address-space
and a wall-time bound) and judges what the user sees: exit 2 and one stderr line naming the file
and the problem for unusable input (``day0 compare`` and ``day0 verify`` keep 1 for a regression
or a failed verification), never a traceback, never a hang, and record text reaching the terminal
escaped so it cannot forge or hide a line.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from day0.core.events import EventLog
from day0.core.inputs import MAX_DEPTH, lines, term_safe
from day0.core.record import SKIPPED_NOTE, Check, RecordError, load
from day0.results.report import render
from day0.results.signoff import Signatory, keygen, parse_report, sign_report
from tests.support import hostile
from tests.support import run_factory as rf

ADA = Signatory("Ada Lovelace", "Infra lead")
SPARSE = (1 << 30) + 1  # claims a little over 1 GiB; holds nothing (a sparse file)
ESC = "\x1b"


# --------------------------------------------------------------------------- helpers


def _data(record: Any = None) -> dict[str, Any]:
    """A valid run.json as a dict, to be made hostile one field at a time."""
    return (record or rf.accepted()).to_dict()


def _write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def _mutated(tmp_path: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    data = _data()
    change(data)
    return _write_json(tmp_path / "run" / "run.json", data)


def _baseline(tmp_path: Path) -> Path:
    rec = rf.accepted()
    rec.run_id = "run-baseline"
    return rf.write(rec, tmp_path / "base")


def _sparse(path: Path, size: int = SPARSE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _loop(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(path.name, path)  # points at itself
    return path


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _events(run_dir: Path, checks: tuple[tuple[str, str], ...] = (("weights", "pass"),), finished: bool = True) -> Path:
    log = EventLog(run_dir / "events.jsonl")
    log.run_started("run-log", {"host": "h"}, {"name": "p"}, ["weights"])
    for n, (stage, status) in enumerate(checks):
        log.check(stage, Check(id=f"{stage}.c{n}", title="t", status=status, value=n))
    if finished:
        log.run_finished(0)
    return run_dir / "events.jsonl"


def _report(tmp_path: Path, record: Any = None) -> Path:
    return render(rf.write(record or rf.accepted(), tmp_path / "rep"), tmp_path / "rep" / "report.html")


@pytest.fixture()
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return keygen(tmp_path / "keys", "ada")


# --------------------------------------------------------------------------- run.json: the file itself


def _empty(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return p


def _binary(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"\xff\xfe" + bytes(range(256)) * 64)
    return p


def _folder(p: Path) -> Path:
    p.mkdir(parents=True)
    return p


def _dangling(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("nowhere.json", p)
    return p


def _dev_zero(p: Path) -> Path:
    """A symlink to a file that never ends."""
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("/dev/zero", p)
    return p


def _too_deep_to_parse(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("[" * 200_000, encoding="utf-8")
    return p


FILE_CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "empty": (_empty, "not JSON"),
    "binary-garbage": (_binary, "not UTF-8"),
    "fifo": (_fifo, "FIFO"),
    "directory": (_folder, "folder"),
    "symlink-loop": (_loop, "symlink loop"),
    "dangling-symlink": (_dangling, "dangling symlink"),
    "dev-zero": (_dev_zero, "character device"),
    "sparse-1GiB": (_sparse, "over the"),
    "nested-200000-deep": (_too_deep_to_parse, "nested too deeply"),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_a_run_json_that_is_not_a_file_of_json_is_refused(tmp_path: Path, case: str) -> None:
    make, problem = FILE_CASES[case]
    path = make(tmp_path / "run" / "run.json")
    hostile.refused(hostile.day0("report", path), path, problem=problem)


# --------------------------------------------------------------------------- run.json: its shape


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


SHAPE_CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], tuple[str, ...]]] = {
    "stages-a-string": (_set(("stages",), "oops"), ("stages: expected a list",)),
    "run_id-a-number": (_set(("run_id",), 5), ("run_id: expected a run id", "the number 5")),
    "run_id-a-path": (_set(("run_id",), "../../etc"), ("run_id:", "slash")),
    "check-title-a-number": (_set(("stages", 0, "checks", 0, "title"), 5), ("stages[0].checks[0].title",)),
    "unknown-status": (_set(("stages", 1, "checks", 1, "status"), "ok"), ("stages[1].checks[1].status", "one of")),
    "unknown-direction": (_set(("stages", 0, "checks", 0, "direction"), "up"), ("checks[0].direction",)),
    "stage-without-name": (lambda d: d["stages"][2].pop("name"), ("stages[2].name: missing",)),
    "check-a-list": (_set(("stages", 0, "checks", 0), [1, 2]), ("stages[0].checks[0]: expected an object",)),
    "evidence-a-string": (_set(("stages", 0, "checks", 0, "evidence"), "x"), ("checks[0].evidence",)),
    "repeat-zero": (_set(("stages", 0, "checks", 0, "repeat"), 0), ("checks[0].repeat",)),
    "performance-a-string": (_set(("stages", 0, "checks", 0, "performance"), "yes"), ("checks[0].performance",)),
    "started_at-not-a-time": (_set(("started_at",), "yesterday"), ("started_at", "ISO 8601")),
    "unknown-verdict": (_set(("verdict",), "passed"), ("verdict: expected one of",)),
    "schema-newer": (_set(("schema_version",), 99), ("schema_version 99 is newer", "(1)")),
    "schema-a-string": (_set(("schema_version",), "1"), ("schema_version: expected a whole number",)),
    "schema-true": (_set(("schema_version",), True), ("schema_version",)),
    "duplicate-stage": (lambda d: d["stages"].append(dict(d["stages"][0])), ("stages[4].name", "again")),
    "accepted-but-a-check-failed": (lambda d: (_set(("stages", 2, "checks", 0, "status"), "fail")(d),
                                               _set(("stages", 2, "checks", 0, "value"), 2500.0)(d),  # a real miss
                                               _set(("stages", 2, "verdict"), "fail")(d)),
                                    ("verdict: 'accepted', but its checks give 'rejected'", "contradicts")),
    "stage-pass-but-errored": (_set(("stages", 0, "checks", 1, "status"), "error"), ("stages[0].verdict: 'pass'",)),
    "nested-evidence": (_set(("stages", 0, "checks", 0, "evidence", "deep"), _nested(MAX_DEPTH + 10)),
                        ("stages[0].checks[0].evidence.deep", "nested deeper")),
}


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_a_run_json_of_the_wrong_shape_is_refused_by_key_path(tmp_path: Path, case: str) -> None:
    change, words = SHAPE_CASES[case]
    path = _mutated(tmp_path, change)
    hostile.refused(hostile.day0("report", path), path, problem=words)


TEXT_CASES: dict[str, tuple[Callable[[str], str], tuple[str, ...]]] = {
    "top-level-list": (lambda t: "[1, 2]", ("expected a JSON object",)),
    "only-a-schema-version": (lambda t: '{"schema_version": 1}', ("run_id: missing",)),
    "nan": (lambda t: t.replace('"value": 812.5', '"value": NaN', 1), ("checks[2].value", "NaN", "finite")),
    "infinity-by-overflow": (lambda t: t.replace('"value": 812.5', '"value": 1e999', 1), ("1e999", "finite")),
    "duplicate-key": (lambda t: t.replace('"verdict": "accepted",', '"verdict": "rejected", "verdict": "accepted",', 1),
                      ("duplicate key 'verdict'",)),
    "lone-surrogate": (lambda t: t.replace('"reason": "', '"reason": "\\ud800', 1), ("reason", "surrogate")),
    "integer-of-5000-digits": (lambda t: t.replace('"value": 812.5', '"value": ' + "9" * 5000, 1),
                               ("checks[2].value", "5000 characters", "finite")),
    "integer-beyond-a-float": (lambda t: t.replace('"value": 812.5', '"value": ' + "9" * 320, 1), ("finite",)),
    "truncated": (lambda t: t[: len(t) // 2], ("not JSON",)),
}


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_a_run_json_whose_text_json_forbids_or_day0_never_writes_is_refused(tmp_path: Path, case: str) -> None:
    edit, words = TEXT_CASES[case]
    path = rf.write(rf.accepted(), tmp_path / "run")
    text = path.read_text(encoding="utf-8")
    edited = edit(text)
    assert edited != text
    path.write_text(edited, encoding="utf-8")
    hostile.refused(hostile.day0("report", path), path, problem=words)


COMMANDS: dict[str, Callable[[Path, Path], list[Any]]] = {
    "report": lambda bad, ok: ["report", bad],
    "compare-run": lambda bad, ok: ["compare", bad, "--baseline", ok],
    "compare-baseline": lambda bad, ok: ["compare", ok, "--baseline", bad],
    "history-add": lambda bad, ok: ["history", "add", bad, "--history", ok.parent.parent / "history"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_that_reads_a_record_refuses_the_same_way(tmp_path: Path, command: str) -> None:
    bad = _mutated(tmp_path, _set(("stages",), "oops"))
    out = hostile.day0(*COMMANDS[command](bad, _baseline(tmp_path)))
    hostile.refused(out, bad, problem="stages: expected a list")


def test_report_outputs_that_are_fifos_are_refused_not_written_into(tmp_path: Path) -> None:
    """Neither written into (a FIFO nobody reads blocks for ever) nor silently replaced: one line
    naming it (day0/core/outputs.py: a write replaces only a regular file)."""
    run = rf.write(rf.accepted(), tmp_path / "run")
    html, junit = _fifo(tmp_path / "out" / "r.html"), _fifo(tmp_path / "out" / "j.xml")
    hostile.refused(hostile.day0("report", run, "--out", html, "--junit", junit), html, problem="FIFO")
    assert not list(html.parent.glob(".*.tmp"))
    hostile.refused(hostile.day0("report", run, "--junit", junit), junit, problem="FIFO")


def test_a_baseline_that_is_a_report_not_a_run_record_is_refused(tmp_path: Path) -> None:
    report = _report(tmp_path)
    run = _baseline(tmp_path)
    hostile.refused(hostile.day0("compare", run, "--baseline", report), report, problem="not JSON")


def test_a_baseline_that_is_the_run_itself_is_unusable_not_a_regression(tmp_path: Path) -> None:
    run = _baseline(tmp_path)
    hostile.refused(hostile.day0("compare", run, "--baseline", run), "run-baseline", problem="this run itself")


def test_a_site_template_cannot_run_code(tmp_path: Path) -> None:
    """Templates are sandboxed, so a hostile template in a ``--template-dir`` cannot reach Python
    (a record's own ``[report] template_dir`` is not used at all: tests/hostile/test_record_paths.py)."""
    site = tmp_path / "site"
    site.mkdir()
    pwned = tmp_path / "pwned"
    (site / "report.html.j2").write_text(
        "{{ cycler.__init__.__globals__.os.system('touch " + str(pwned) + "') }}", encoding="utf-8")
    run = rf.write(rf.accepted(), tmp_path / "run")
    hostile.refused(hostile.day0("report", run, "--template-dir", site), "report.html.j2", problem="template error")
    assert not pwned.exists()


@pytest.mark.parametrize("body, problem", [
    ("{{ 1/0 }}", "template error: ZeroDivisionError"),
    ('{{ "a" + 1 }}', "template error: TypeError"),
    ('{% include "report.html.j2" %}', "template error: RecursionError"),
    # what Jinja2's own sandbox lets one expression build: 400 MB, a gigabyte-wide format
    ('{{ "x" * 400000000 }}', "template error: a repetition of 400000000 items"),
    ('{{ "%999999999d" % 1 }}', "template error: a format width of 999999999"),
    # the calls that pad, format or replace, which the operators' bounds did not see (the hunt: 200 MB each)
    ('{{ "x"|center(200000000) }}', "template error: the filter center of 200000000 items"),
    ('{{ "%200000000d"|format(1) }}', "template error: the filter format of 200000000 items"),
    ('{{ "{:>200000000}".format(1) }}', "template error: str.format of 200000000 items"),
    ('{{ "{0:{1}}".format(1, 200000000) }}', "template error: str.format of 200000000 items"),
    ('{{ ("x" * 1000000)|replace("x", "y" * 40) }}', "template error: the filter replace of 40000000 items"),
    ('{{ "x".rjust(200000000) }}', "template error: str.rjust of 200000000 items"),
    # a review's routes past those: a keyed or starred %-width, a width given as text or in a list,
    # join, wordwrap, tojson and indent amplifying what they are given
    ("{{ '%(a)20000000s'|format(a=1) }}", "template error: the filter format of 20000000 items"),
    ("{{ '%*d' % (20000000, 1) }}", "template error: a format width of 20000000"),
    ("{{ '{0:{1[0]}}'.format(1, ['20000000']) }}", "template error: str.format of 20000000 items"),
    ("{{ (['a'] * 20000)|join('x' * 1000) }}", "template error: the filter join of 20019000 items"),
    ("{{ ('a ' * 200000)|wordwrap(2, wrapstring='y' * 100) }}", "template error: the filter wordwrap of"),
    ("{{ (['a'] * 20)|tojson(indent=1000000) }}", "template error: the filter tojson of"),
    ("{{ ('a' ~ '\n' ~ 'b')|indent('y' * 10000000) }}", "template error: the filter indent of 20000000 items"),
])
def test_a_site_template_that_fails_or_builds_without_bound_is_one_line(tmp_path: Path, body: str, problem: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.html.j2").write_text(body, encoding="utf-8")
    run = rf.write(rf.accepted(), tmp_path / "run")
    hostile.refused(hostile.day0("report", run, "--template-dir", site), problem=problem)


GLOB_BOMB = "[!a-" * 20_000  # fnmatch's translation is quadratic in unclosed brackets: 31 s here, minutes longer


def test_a_required_pattern_no_check_id_could_be_is_one_line_at_once(tmp_path: Path) -> None:
    data = _data()
    data["profile"].setdefault("report", {})["required"] = [GLOB_BOMB]
    data["verdict"] = "accepted"
    run = _write_json(tmp_path / "run" / "run.json", data)
    hostile.refused(hostile.day0("report", run), run, problem="80000 characters, past 256")


def test_a_tolerance_key_no_check_id_could_be_is_one_line_at_once(tmp_path: Path) -> None:
    run, base = rf.write(rf.accepted(), tmp_path / "run"), _baseline(tmp_path)
    out = hostile.day0("compare", run, "--baseline", base, "--tolerance", f"{GLOB_BOMB}=5%")
    hostile.refused(out, problem="80000 characters, past 256")


def test_duplicate_check_ids_are_a_record_day0_writes_and_load(tmp_path: Path) -> None:
    """One check per shard or rank shares its id; that is the contract, not hostile input."""
    data = _data()
    data["stages"][0]["checks"].append(dict(data["stages"][0]["checks"][0]))
    path = _write_json(tmp_path / "run" / "run.json", data)
    out = hostile.day0("report", path)
    assert out.code == 0, out.explain()
    assert (tmp_path / "run" / "report.html").is_file()


# --------------------------------------------------------------------------- text that reaches a terminal

FORGED = "fine\nverified\n\x1b[8mverification FAILED\u202e"


def test_verify_cannot_be_forged_by_the_reason_it_prints(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    record = rf.accepted()
    record.reason = FORGED  # an accepted run may carry any reason text; render escapes HTML, not terminals
    report = _report(tmp_path, record)
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    line = hostile.refused(out, report, code=1, problem="not signed")
    everything = out.stdout + out.stderr
    assert ESC not in everything and "\u202e" not in everything and ESC not in line
    assert [ln for ln in out.stdout.splitlines() if ln.strip() == "verified"] == []
    assert out.stdout.splitlines()[-1].startswith("verification FAILED")
    assert "fine\\x0averified\\x0a\\x1b[8m" in out.stdout  # shown, escaped, on the line it belongs to


def test_report_and_compare_escape_record_text(tmp_path: Path) -> None:
    record = rf.rejected()
    record.stages[2].checks[0].message = "slow\x1b[2J\x1b[8mhidden"
    record.reason = record.reason + "\x1b]0;title\x07"
    run = rf.write(record, tmp_path / "run")
    out = hostile.day0("report", run)
    assert out.code == 0 and ESC not in out.stdout and "\\x1b[2J" in out.stdout, out.explain()
    out = hostile.day0("compare", run, "--baseline", _baseline(tmp_path))
    assert out.code == 0 and ESC not in out.stdout + out.stderr, out.explain()


@pytest.mark.parametrize("char", ["\x00", "\t", "\n", "\r", ESC, "\x7f", "\x85", "\x9b", "\u202a", "\u202e",
                                  "\u2066", "\u2069", "\u2028", "\ud800"])
def test_term_safe_shows_every_character_a_terminal_would_act_on(char: str) -> None:
    shown = term_safe(f"a{char}b")
    assert char not in shown and shown.startswith("a\\") and shown.endswith("b") and shown.isprintable()


def test_a_file_name_with_control_characters_is_escaped_in_the_refusal(tmp_path: Path) -> None:
    path = _empty(tmp_path / "run\x1b[8m\n.json")
    out = hostile.day0("report", path)
    hostile.refused(out, term_safe(path), problem="not JSON")
    assert ESC not in out.stderr


# --------------------------------------------------------------------------- events.jsonl and record rebuild


def test_rebuild_keeps_the_readable_lines_and_names_the_rest(tmp_path: Path) -> None:
    log = _events(tmp_path / "r", checks=(("weights", "pass"), ("weights", "pass")))
    text = log.read_text().splitlines()
    text.insert(2, "garbage \x1b[8m")
    text.insert(3, json.dumps({"type": "check", "stage": "weights", "check": "fail"}))
    log.write_text("\n".join(text) + "\n")
    out = hostile.day0("record", "rebuild", tmp_path / "r")
    assert out.code == 0, out.explain()
    warning = hostile.refused(out, f"{log}:3", code=0, problem=["not JSON", "and 1 more"])
    assert ESC not in warning and "verdict incomplete" in out.stdout
    record = load(tmp_path / "r")
    assert [c.id for c in record.checks()] == ["weights.c0", "weights.c1"]
    assert f"{log}:4: check: expected an object, got the string 'fail'" in record.notes[SKIPPED_NOTE][1]


def test_rebuild_skips_an_event_line_over_the_cap_without_holding_it(tmp_path: Path) -> None:
    log = _events(tmp_path / "r")
    text = log.read_bytes().splitlines(keepends=True)
    with log.open("wb") as fh:
        fh.writelines(text[:2])
        fh.write(b'{"type": "note", "key": "x", "value": "' + b"x" * ((64 << 20) + 10) + b'"}\n')
        fh.writelines(text[2:])
    out = hostile.day0("record", "rebuild", tmp_path / "r")
    hostile.refused(out, f"{log}:3", code=0, problem="line over 64 MiB")
    assert [c.id for c in load(tmp_path / "r").checks()] == ["weights.c0"]


def _events_folder(run: Path) -> None:
    (run / "events.jsonl").mkdir(parents=True)


def _events_fifo(run: Path) -> None:
    _fifo(run / "events.jsonl")


def _events_loop(run: Path) -> None:
    _loop(run / "events.jsonl")


def _events_sparse(run: Path) -> None:
    _sparse(run / "events.jsonl")


def _events_empty(run: Path) -> None:
    _empty(run / "events.jsonl")


def _events_binary(run: Path) -> None:
    _binary(run / "events.jsonl")


def _events_newer(run: Path) -> None:
    log = _events(run)
    log.write_text(log.read_text().replace('"schema_version": 1', '"schema_version": 99', 1))


def _events_no_start(run: Path) -> None:
    log = _events(run)
    log.write_text("\n".join(log.read_text().splitlines()[1:]) + "\n")


def _events_missing(run: Path) -> None:
    run.mkdir(parents=True)


def _events_run_json_a_folder(run: Path) -> None:
    _events(run)
    (run / "run.json").mkdir()


def _events_run_dir_a_file(run: Path) -> None:
    run.parent.mkdir(parents=True, exist_ok=True)
    run.write_text("not a folder")


REBUILD_CASES: dict[str, tuple[Callable[[Path], None], str, tuple[str, ...]]] = {
    "events-a-folder": (_events_folder, "events.jsonl", ("directory",)),
    "events-a-fifo": (_events_fifo, "events.jsonl", ("FIFO",)),
    "events-a-symlink-loop": (_events_loop, "events.jsonl", ("symlink loop",)),
    "events-sparse-1GiB": (_events_sparse, "events.jsonl", ("over the",)),
    "events-empty": (_events_empty, "events.jsonl", ("no run_started",)),
    "events-binary": (_events_binary, "events.jsonl", ("no run_started", "not UTF-8")),
    "events-newer-schema": (_events_newer, "events.jsonl:1", ("schema_version 99 is newer", "(1)")),
    "events-without-start": (_events_no_start, "events.jsonl", ("no run_started",)),
    "events-missing": (_events_missing, "events.jsonl", ("not found",)),
    "run-json-a-folder": (_events_run_json_a_folder, "run.json", ("is a directory", "nothing written")),
    "run-dir-a-file": (_events_run_dir_a_file, "events.jsonl", ("not a directory",)),
}


@pytest.mark.parametrize("case", list(REBUILD_CASES))
def test_record_rebuild_refuses_what_it_cannot_read(tmp_path: Path, case: str) -> None:
    make, name, words = REBUILD_CASES[case]
    run = tmp_path / "run"
    make(run)
    hostile.refused(hostile.day0("record", "rebuild", run), f"{run}/{name}", problem=words)


def test_an_overlong_event_line_is_skipped_with_bounded_memory() -> None:
    fh = io.BytesIO(b'{"a": 1}\n' + b"x" * 5000 + b"\n" + b'{"b": 2}\n' + b"y" * 3000)
    got = [(n, line, ended) for n, line, ended in lines(fh, cap=1000)]
    assert got == [(1, b'{"a": 1}\n', True), (2, None, True), (3, b'{"b": 2}\n', True), (4, None, False)]


# --------------------------------------------------------------------------- reports: verify and sign


def _signed(tmp_path: Path, keys: tuple[Path, Path], record: Any = None) -> Path:
    report = _report(tmp_path, record)
    sign_report(report, keys[0], ADA, allow_rejected=True)
    return report


def test_verify_names_an_edited_embedded_record(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    html = report.read_text(encoding="utf-8")
    report.write_text(html.replace('"value": 812.5,', '"value": 912.5,', 1), encoding="utf-8")
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    hostile.refused(out, report, code=1, problem="embedded run record does not match its digest")


def test_verify_names_an_edited_visible_page(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    html = report.read_text(encoding="utf-8")
    report.write_text(html.replace(">812.5<", ">912.5<", 1), encoding="utf-8")
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    hostile.refused(out, report, code=1, problem="outside the embedded run record")


def test_verify_names_an_edited_sign_off_block(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    rep = parse_report(report)
    old = f'"reason": {json.dumps(rep.signoff["reason"])},\n "rendered_at"'  # the sign-off block's (sorted keys)
    html = report.read_text(encoding="utf-8")
    assert html.count(old) == 1
    report.write_text(html.replace(old, '"reason": "all good",\n "rendered_at"'), encoding="utf-8")
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    hostile.refused(out, report, code=1, problem="the sign-off block was edited")


def test_signatures_copied_from_another_report_do_not_verify(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    signed = _signed(tmp_path / "a", keys)
    other = rf.accepted()
    other.run_id = "run-other"
    target = _report(tmp_path / "b", other)
    rep = parse_report(target)
    target.write_text(rep.with_entries(parse_report(signed).entries), encoding="utf-8")
    out = hostile.day0("verify", target, "--pubkey", keys[1])
    hostile.refused(out, target, code=1, problem="changed after it was signed")


def test_a_truncated_signature_does_not_verify(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    rep = parse_report(report)
    entries = rep.entries
    entries[0]["signature"] = entries[0]["signature"][:40]
    report.write_text(rep.with_entries(entries), encoding="utf-8")
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    hostile.refused(out, report, code=1, problem="signature does not verify")


def test_a_report_cut_inside_its_signature_list_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    html = report.read_text(encoding="utf-8")
    cut = html.index('id="day0-signatures-data">') + 60
    report.write_text(html[:cut], encoding="utf-8")
    hostile.refused(hostile.day0("verify", report, "--pubkey", keys[1]), report, problem="not an intact day0 report")


def _openings(p: Path) -> Path:
    """A page of 100,000 unclosed embedded-record openings: the parser must stay linear."""
    p.write_text('<!--day0-signatures:begin--><!--day0-signatures:end-->'
                 + '<script type="application/json" id="day0-run" data-encoding="json">{' * 100_000 + "</script>",
                 encoding="utf-8")
    return p


REPORT_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "report-empty": (_empty, "signatures region"),
    "report-binary": (_binary, "not UTF-8"),
    "report-fifo": (_fifo, "FIFO"),
    "report-folder": (_folder, "directory"),
    "report-symlink-loop": (_loop, "symlink loop"),
    "report-dev-zero": (_dev_zero, "character device"),
    "report-sparse-1GiB": (_sparse, "over the"),
    "report-100000-openings": (_openings, "found 100000"),
}


@pytest.mark.parametrize("case", list(REPORT_FILES))
def test_verify_refuses_a_report_that_is_not_one(tmp_path: Path, keys: tuple[Path, Path], case: str) -> None:
    make, problem = REPORT_FILES[case]
    report = make(tmp_path / "report.html")
    hostile.refused(hostile.day0("verify", report, "--pubkey", keys[1]), report, problem=problem)


def _rsa_public(p: Path) -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    p.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return p


def _truncated_public(p: Path) -> Path:
    pem = keygen(p.parent / "t", "t")[1].read_bytes()
    p.write_bytes(pem[: len(pem) // 2])
    return p


KEY_CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "pubkey-rsa": (_rsa_public, "not an Ed25519 public key"),
    "pubkey-truncated": (_truncated_public, "not a PEM public key"),
    "pubkey-fifo": (_fifo, "FIFO"),
    "pubkey-symlink-loop": (_loop, "symlink loop"),
    "pubkey-sparse": (_sparse, "over the"),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_verify_refuses_a_public_key_it_cannot_use(tmp_path: Path, keys: tuple[Path, Path], case: str) -> None:
    report = _signed(tmp_path, keys)
    make, problem = KEY_CASES[case]
    key = make(tmp_path / "other" / "key.pub.pem") if case != "pubkey-rsa" else make(tmp_path / "rsa.pub.pem")
    hostile.refused(hostile.day0("verify", report, "--pubkey", key), key, problem=problem)


def test_a_private_key_given_as_the_public_key_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    hostile.refused(hostile.day0("verify", report, "--pubkey", keys[0]), keys[0], problem="not a PEM public key")


def test_sign_refuses_a_private_key_that_is_a_fifo(tmp_path: Path) -> None:
    report = _report(tmp_path)
    key = _fifo(tmp_path / "k" / "key.pem")
    os.chmod(key, 0o600)
    out = hostile.day0("sign", report, "--key", key, "--signer", "Ada Lovelace, Infra lead")
    hostile.refused(out, key, problem="FIFO")


@pytest.mark.parametrize("make", [rf.rejected, rf.incomplete], ids=["rejected", "incomplete"])
def test_signing_a_run_that_was_not_accepted_needs_allow_rejected_and_says_so(
        tmp_path: Path, keys: tuple[Path, Path], make: Callable[[], Any]) -> None:
    record = make()
    label = record.verdict.upper()
    report = _report(tmp_path, record)
    argv = ["sign", report, "--key", keys[0], "--signer", "Ada Lovelace, Infra lead"]
    hostile.refused(hostile.day0(*argv), report, problem=["--allow-rejected", f"verdict: {label}"])
    assert parse_report(report).entries == []
    out = hostile.day0(*argv, "--allow-rejected")
    assert out.code == 0 and f"despite verdict {label}" in out.stdout, out.explain()
    rep = parse_report(report)
    assert rep.entries[0]["despite_verdict"] == record.verdict
    assert f"Ada Lovelace, Infra lead signed despite verdict {label}</strong>" in rep.html[rep.region[0]:rep.region[1]]
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    assert out.code == 0 and f"signed despite verdict {label}" in out.stdout, out.explain()


def test_stripping_despite_verdict_from_a_signature_breaks_it(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys, rf.rejected())
    rep = parse_report(report)
    entries = rep.entries
    del entries[0]["despite_verdict"]
    report.write_text(rep.with_entries(entries), encoding="utf-8")
    hostile.refused(hostile.day0("verify", report, "--pubkey", keys[1]), report, code=1,
                    problem="signature does not verify")


def test_a_signer_name_with_escape_codes_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _report(tmp_path)
    out = hostile.day0("sign", report, "--key", keys[0], "--signer", "Ada\x1b[8m, Infra lead")
    hostile.refused(out, problem="control")
    assert ESC not in out.stderr


# --------------------------------------------------------------------------- history folders


def test_history_with_junk_in_it_lists_and_compares_what_is_real(tmp_path: Path) -> None:
    root = tmp_path / "history"
    run = _baseline(tmp_path)
    out = hostile.day0("history", "add", run, "--history", root)
    assert out.code == 0, out.explain()
    folder = next(root.glob("*/*"))
    _fifo(folder / "0002_20261130T090000Z_0123456789ab_accepted.json")  # named like an entry
    (folder / "0003_20261130T090000Z_0123456789ab_accepted.json").mkdir()
    _loop(folder / "0004_20261130T090000Z_0123456789ab_accepted.json")
    (folder / "0005_20261130T090000Z_0123456789ab_accepted.json").write_bytes(b"\x00garbage")
    (folder / "notes.txt").write_text("hello")
    _binary(folder / "0006.json")
    (root / "stray-file").write_text("x")
    out = hostile.day0("history", "list", "--history", root)
    assert out.code == 0 and "1 runs" not in out.stdout and "2 runs" in out.stdout, out.explain()
    this = rf.accepted()
    this.run_id = "run-now"
    now = rf.write(this, tmp_path / "now")
    out = hostile.day0("compare", now, "--baseline", "latest", "--history", root)
    assert out.code == 0, out.explain()
    assert "note: history entry skipped: " in out.stdout and "0005_" in out.stdout and "not JSON" in out.stdout


def test_a_history_of_nothing_but_junk_is_refused_naming_the_entries(tmp_path: Path) -> None:
    """Not "store a run first": the runs were stored, and the refusal says why none could be read."""
    root = tmp_path / "history"
    out = hostile.day0("history", "add", _baseline(tmp_path), "--history", root)
    assert out.code == 0, out.explain()
    (entry,) = next(root.glob("*/*")).glob("0001_*.json")
    entry.write_bytes(b"\x00garbage")
    this = rf.accepted()
    this.run_id = "run-now"
    out = hostile.day0("compare", rf.write(this, tmp_path / "now"), "--baseline", "latest", "--history", root)
    line = hostile.refused(out, "history entry skipped", entry.name, problem="not JSON")
    assert "could be read" in line and "repair or remove" in line and "store a run first" not in line, line


def test_history_list_of_a_file_is_refused(tmp_path: Path) -> None:
    root = _empty(tmp_path / "history")
    hostile.refused(hostile.day0("history", "list", "--history", root), root, problem="no history folder")


def test_a_record_with_an_escape_in_a_history_folder_name_is_listed_escaped(tmp_path: Path) -> None:
    root = tmp_path / "history"
    (root / "evil\x1b[8m" / "machine").mkdir(parents=True)
    out = hostile.day0("history", "list", "--history", root)
    assert out.code == 0 and ESC not in out.stdout and "evil\\x1b[8m" in out.stdout, out.explain()


def test_a_signature_value_of_the_wrong_type_is_a_failed_verification(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    report = _signed(tmp_path, keys)
    rep = parse_report(report)
    entries = rep.entries
    entries[0]["signature"] = [base64.b64encode(b"x").decode()]
    entries[0]["signer"] = {"name": "Ada"}
    report.write_text(rep.with_entries(entries), encoding="utf-8")
    hostile.refused(hostile.day0("verify", report, "--pubkey", keys[1]), report, code=1, problem="missing fields")


def test_rebuild_refuses_a_record_that_indenting_would_put_past_the_cap(tmp_path: Path, monkeypatch) -> None:
    """The hunt's 9.6 MB log of deeply nested lists became a 562 MB run.json (indent pads each item by
    its depth) that `report` then refused: a record that could not be read back is not written, the
    log stays, and the refusal names run.json (the cap is lowered so the test stays small)."""
    import day0.core.record as record_mod
    from day0.core.events import rebuild

    run = tmp_path / "r"
    log = _events(run)
    deep = "[" * 50 + ",".join(["0"] * 20_000) + "]" * 50
    text = log.read_text().splitlines()
    text.insert(1, '{"type": "note", "key": "deep", "value": ' + deep + "}")
    log.write_text("\n".join(text) + "\n")
    before = log.read_bytes()
    assert len(before) < 100_000 and rebuild(run).notes["deep"]  # under the real cap it is kept
    (run / "run.json").unlink()
    monkeypatch.setattr(record_mod, "MAX_RECORD_BYTES", 1 << 20)
    with pytest.raises(RecordError) as err:
        rebuild(run)
    assert str(err.value).startswith(f"{run / 'run.json'}: the record would be over the 1 MiB")
    assert not (run / "run.json").exists() and log.read_bytes() == before
    # the cap is what a reader takes, closing newline included: a record of exactly it is written
    text = record_mod.record_text({"a": "x"}, "w")
    monkeypatch.setattr(record_mod, "MAX_RECORD_BYTES", len(text))
    assert record_mod.record_text({"a": "x"}, "w") == text
    monkeypatch.setattr(record_mod, "MAX_RECORD_BYTES", len(text) - 1)
    with pytest.raises(RecordError, match="^w: the record would be over the"):
        record_mod.record_text({"a": "x"}, "w")
