"""Run history: append-only numbered files per profile and machine, baselines and trends read back."""

from __future__ import annotations

import argparse
import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from day0.core.record import RecordError, RunRecord, load
from day0.results import history
from tests.support import run_factory as rf


def _record(run_id: str, verdict_ok: bool = True, started: str = "2026-11-30T09:00:00.000+00:00") -> RunRecord:
    rec = rf.accepted() if verdict_ok else rf.rejected()
    rec.run_id = run_id
    rec.started_at = started
    return rec


def _write(rec: RunRecord, tmp_path: Path) -> Path:
    return rf.write(rec, tmp_path / "runs" / rec.run_id)


def test_store_appends_numbered_byte_identical_copies(tmp_path):
    folder = tmp_path / "h" / "p" / "m"
    stored = []
    for i, ok in enumerate([True, False, True]):
        rec = _record(f"run-{i}", ok, started=f"2026-11-30T0{i}:15:00.000+00:00")
        src = _write(rec, tmp_path)
        stored.append((src, history.store(src, folder)))
    assert [e.number for _, e in stored] == [1, 2, 3]
    names = [e.path.name for _, e in stored]
    assert names[0] == "0001_20261130T001500Z_0123456789ab_accepted.json"
    assert names[1].startswith("0002_20261130T011500Z_0123456789ab_rejected")
    for src, e in stored:
        assert e.path.read_bytes() == src.read_bytes()  # the signed report's digest still matches
    assert [e.verdict for e in history.entries(folder)] == ["accepted", "rejected", "accepted"]
    assert not list(folder.glob(".*.tmp"))  # no temporary file left behind


def test_store_never_replaces_a_number_taken_meanwhile(tmp_path):
    folder = tmp_path / "h"
    src = _write(_record("run-a"), tmp_path)
    first = history.store(src, folder)
    squatter = folder / history.entry_name(2, _record("other"))
    squatter.write_text("{}")  # another job claimed #2 between our listing and our link
    real_entries = history.entries
    calls = {"n": 0}

    def stale_listing(f):  # the first listing does not see #2 yet, as in a race
        calls["n"] += 1
        es = real_entries(f)
        return [e for e in es if e.number != 2] if calls["n"] == 1 else es

    history.entries = stale_listing
    try:
        second = history.store(src, folder)
    finally:
        history.entries = real_entries
    assert first.number == 1 and second.number == 3
    assert squatter.read_text() == "{}"


def test_concurrent_stores_get_distinct_numbers(tmp_path):
    folder = tmp_path / "h"
    srcs = [_write(_record(f"run-{i}"), tmp_path) for i in range(8)]
    got: list[int] = []
    errors: list[BaseException] = []

    def work(p: Path) -> None:
        try:
            got.append(history.store(p, folder).number)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in srcs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert sorted(got) == list(range(1, 9))
    assert sorted(load(e.path).run_id for e in history.entries(folder)) == sorted(f"run-{i}" for i in range(8))


def test_a_record_that_does_not_load_is_not_stored(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"schema_version": 99, "run_id": "x"}))
    with pytest.raises(RecordError, match="schema_version 99 is newer"):
        history.store(bad, tmp_path / "h")
    assert not (tmp_path / "h").exists() or not history.entries(tmp_path / "h")


@given(
    number=st.integers(1, 99_999),
    seconds=st.integers(0, 10**9),
    commit=st.one_of(st.none(), st.text("0123456789abcdef", min_size=7, max_size=40)),
    dirty=st.booleans(),
    verdict=st.sampled_from(["accepted", "rejected", "incomplete"]),
)
def test_entry_names_round_trip(number, seconds, commit, dirty, verdict):
    rec = _record("r")
    rec.verdict = verdict
    rec.started_at = (datetime(2000, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=seconds)).isoformat()
    rec.environment = {**rec.environment, "git_commit": (commit + ("-dirty" if dirty else "")) if commit else None}
    name = history.entry_name(number, rec)
    m = history.NAME.match(name)
    assert m is not None, name
    assert int(m["number"]) == number and m["verdict"] == verdict
    assert m["commit"] == ((commit[:12] + ("-dirty" if dirty else "")) if commit else "nogit")
    assert datetime.strptime(m["stamp"], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc) == \
        datetime.fromisoformat(rec.started_at).replace(microsecond=0)


@given(st.lists(st.fixed_dictionaries({"kind": st.sampled_from(["cpu", "cuda"]), "name": st.text(max_size=40),
                                        "cores": st.one_of(st.none(), st.integers(1, 512))}), max_size=10),
       st.text(max_size=30))
@example([{"kind": "cpu", "name": "\U0001d670", "cores": None}], "")  # '𝙰' lowered is itself; NFKD makes it 'A'
def test_machine_id_is_a_safe_folder_name_without_the_host(devices, host):
    rec = _record("r")
    rec.environment = {"host": host, "devices": devices}
    mid = history.machine_id(rec)
    assert mid and len(mid) <= 80
    assert set(mid) <= set("abcdefghijklmnopqrstuvwxyz0123456789.-")
    assert not mid.startswith((".", "-"))
    rec.environment = {"host": host + "-other-runner", "devices": devices}
    assert history.machine_id(rec) == mid  # a fresh CI runner name keeps the same history


def test_machine_id_groups_devices_and_nodes():
    rec = _record("r")
    rec.environment = {"devices": [{"kind": "cuda", "name": "NVIDIA H200"}] * 8}
    rec.profile = {"name": "x", "topology": {"nodes": 4}}
    assert history.machine_id(rec) == "4n-cuda-8x-nvidia-h200"
    assert history.machine_id(rec, override="Site A / rack 3") == "site-a-rack-3"


def test_recent_returns_the_last_n_oldest_first_and_skips_unreadable(tmp_path):
    folder = tmp_path / "h"
    for i in range(5):
        history.store(_write(_record(f"run-{i}"), tmp_path), folder)
    (folder / history.entry_name(6, _record("x"))).write_text("{not json")
    got = history.recent(folder, 3, exclude_run_id="run-4")
    assert [r.run_id for _, r in got] == ["run-1", "run-2", "run-3"]
    assert history.recent(tmp_path / "empty", 5) == []


def test_latest_accepted_runs_skip_rejected_ones_and_the_run_itself(tmp_path):
    folder = tmp_path / "h"
    for i, ok in enumerate([True, True, False, True, False]):
        history.store(_write(_record(f"run-{i}", ok), tmp_path), folder)
    got = history.recent(folder, 5, exclude_run_id="run-3", verdict="accepted")
    assert [(e.number, r.run_id) for e, r in got] == [(1, "run-0"), (2, "run-1")]
    assert [r.run_id for _, r in history.recent(folder, 2, verdict="accepted")] == ["run-1", "run-3"]
    assert [r.verdict for _, r in history.recent(folder, 2)] == ["accepted", "rejected"]


def test_an_older_run_is_judged_and_charted_against_the_runs_before_it_never_after(tmp_path):
    """Re-rendering an older run's report drew later runs before it in its trends, and `day0 compare
    OLD --baseline latest` judged it against them ("vs 3 earlier runs")."""
    folder = tmp_path / "h"
    for i in range(5):
        history.store(_write(_record(f"run-{i}", started=f"2026-11-30T09:0{i}:00.000+00:00"), tmp_path), folder)
    got = history.recent(folder, 5, exclude_run_id="run-2", before="2026-11-30T09:02:00.000+00:00")
    assert [r.run_id for _, r in got] == ["run-0", "run-1"]
    assert len(history.recent(folder, 5, exclude_run_id="run-2")) == 4  # no start given: as before


def test_a_start_without_a_zone_stays_a_baseline_and_only_the_first_unreadable_entries_are_named(tmp_path):
    """9146b0f passed over entries by their file name's stamp, which writes a start without a zone
    as UTC: an imported run started at 10:30 (no zone, so maybe 08:30Z) left `day0 compare`'s
    baseline, which the loaded record's start had always kept. And `day0 compare` named every one
    of ten truncated entries."""
    folder = tmp_path / "h"
    history.store(_write(_record("run-a", started="2026-11-30T08:00:00.000+00:00"), tmp_path), folder)
    history.store(_write(_record("run-b", started="2026-11-30T10:30:00"), tmp_path), folder)
    got = history.recent(folder, 5, exclude_run_id="run-now", before="2026-11-30T09:00:00.000+00:00")
    assert [r.run_id for _, r in got] == ["run-a", "run-b"]
    for number in range(3, 13):
        (folder / f"{number:04d}_20261129T080000Z_0123456789ab_accepted.json").write_text('{"trunc')
    (folder / "0013_20261205T080000Z_0123456789ab_accepted.json").write_text('{"trunc')  # after the run began
    skipped: list[str] = []
    history.recent(folder, 5, exclude_run_id="run-now", skipped=skipped, before="2026-11-30T09:00:00.000+00:00")
    assert len(skipped) == history.NAMED_SKIPS + 1 and skipped[-1] == "and 7 more history entries that did not load"
    assert not [n for n in skipped if "20261205T" in n], skipped
    # a start without a zone is written in the name as if it were UTC: an entry named 10:30 may be
    # 08:30Z, before a run at 09:00Z, so it is named when it does not load (14 hours, the widest offset)
    skipped = []
    late = tmp_path / "late"
    late.mkdir()
    (late / "0001_20261130T223000Z_0123456789ab_accepted.json").write_text('{"trunc')
    (late / "0002_20261130T231000Z_0123456789ab_accepted.json").write_text('{"trunc')
    history.recent(late, 5, skipped=skipped, before="2026-11-30T09:00:00.000+00:00")
    assert len(skipped) == 1 and "0001_20261130T223000Z" in skipped[0], skipped
    (late / "0003_00010101T050000Z_0123456789ab_accepted.json").write_text('{"trunc')  # 14 h before year 1
    skipped = []
    history.recent(late, 5, skipped=skipped, before="2026-11-30T09:00:00.000+00:00")
    assert any("00010101T050000Z" in n for n in skipped), skipped
    # and a start whose UTC time is out of datetime's range is named as written, never an OverflowError
    # (history.keep "never raises": it did, for a run stored with this start)
    assert history.entry_name(1, _record("y1", started="0001-01-01T00:00:00+05:00")).startswith("0001_00010101T000000Z_")
    assert "_99991231T230000Z_" in history.entry_name(2, _record("y9999", started="9999-12-31T23:00:00-05:00"))


def test_keep_stores_the_finished_run_unless_the_profile_says_not_to(tmp_path):
    out = tmp_path / "reports"
    rec = _record("run-kept")
    run_dir = out / rec.run_id
    rf.write(rec, run_dir)
    logged: list[str] = []
    entry = history.keep(rec, run_dir, out, logged.append)
    assert entry is not None and entry.path.parent == history.folder_for(out / "history", rec)
    assert entry.path.read_bytes() == (run_dir / "run.json").read_bytes() and "stored as" in logged[-1]
    local = {"compare": {"history": False}}  # the run's own profile decides, never the record's copy
    assert history.keep(rec, run_dir, out, logged.append, local) is None and len(history.entries(entry.path.parent)) == 1
    rec.profile = {**rec.profile, "compare": {"history": False}}
    assert history.keep(rec, run_dir, out, logged.append) is not None  # what the record says is data
    assert history.keep(rec, tmp_path / "no-such-run", out, logged.append) is None  # a log line, not a crash
    assert "run not stored" in logged[-1]


def test_history_root_and_folder_follow_the_profile(tmp_path):
    rec = _record("r")
    rec.profile = {"name": "My Site", "compare": {"history_dir": "hist", "machine": "rack-7"}}
    root = history.history_root(rec.profile, tmp_path / "reports")
    assert root == tmp_path / "reports" / "hist"
    assert history.folder_for(root, rec) == root / "my-site" / "rack-7"
    rec.profile["compare"]["history_dir"] = str(tmp_path / "abs")
    assert history.history_root(rec.profile, tmp_path / "reports") == tmp_path / "abs"
    assert history.history_root({}, tmp_path) == tmp_path / "history"  # records from before [compare]


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="day0")
    history.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_add_and_list(tmp_path, capsys):
    src = _write(_record("run-cli"), tmp_path)
    assert _cli(["history", "add", str(src), "--history", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "stored" in out and "0001_" in out
    assert _cli(["history", "list", "--history", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "cpu-tiny-fixture/" in out and "#1" in out and "accepted" in out
    assert _cli(["history", "add", str(tmp_path / "nope"), "--history", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope: run record not found" in err


def _long_figure(rec: RunRecord) -> RunRecord:
    from day0.core.stages import Figure, StageInfo

    rec.stages[0].info = StageInfo(rec.stages[0].name, "T", "?", (Figure("k", "L", ("latency." + "x" * 300,)),),
                                   origin="mysite")
    return rec


def test_a_figure_glob_no_check_id_could_be_is_refused_by_history_add_naming_its_key(tmp_path, capsys):
    """record_shape checked a figure's check_ids only as non-empty strings, so `history add` stored a
    record whose 308-character glob then stopped every later `day0 report` (reviewer's r6_longfig.py)."""
    src = _write(_long_figure(_record("run-longfig")), tmp_path)
    assert _cli(["history", "add", str(src), "--history", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{src}: stages[0].figures[0].check_ids[0]: check pattern " in err
    assert "308 characters, past 256" in err and not (tmp_path / "h").exists()
    with pytest.raises(RecordError, match=r"stages\[0\]\.figures\[0\]\.check_ids\[0\]: check pattern"):
        load(src)


def test_a_bad_history_entry_never_blocks_a_later_runs_report(tmp_path, capsys):
    """One entry an older day0 stored with a figure glob past 256 characters made `day0 report` of
    every later valid run exit 2 blaming that run's file (r6_longfig.py then r7): now it is passed over."""
    from tests.results.test_report import _cli as report_cli

    out = tmp_path / "reports"
    old = _long_figure(_record("run-old", started="2026-11-29T09:00:00.000+00:00"))
    folder = history.folder_for(history.history_root(old.profile, out), old)
    folder.mkdir(parents=True)
    (folder / history.entry_name(1, old)).write_text(json.dumps(old.to_dict()), encoding="utf-8")
    new = _record("run-new")
    src = rf.write(new, out / new.run_id)
    assert report_cli(["report", str(src.parent)]) == 0
    out_text = capsys.readouterr().out
    assert (src.parent / "report.html").is_file() and "day0 verdict" in out_text
    # passed over, not silently: the terminal and the first screen name the entry and why (a trend
    # drawn without it would otherwise read as the whole history)
    entry = history.entry_name(1, old)
    note = next(ln for ln in out_text.splitlines() if ln.startswith("note: history entry skipped: "))
    assert entry in note and "check pattern" in note
    html = (src.parent / "report.html").read_text()
    assert 'class="muted trend-note">Trends: history entry skipped: ' in html and entry in html
