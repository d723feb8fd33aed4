"""Hostile inputs, the writing part (issue #31, cause 5): names planted where day0 writes.

A checkpoint folder, a run folder and a ``--json`` path are places other people and jobs can
write to first. Whatever sits at an output's name (a symlink to a file elsewhere, a FIFO nobody
reads, a folder, a socket), or at the temporary name an older writer used beside it, day0 must
neither write through it, nor wait on it, nor leave a traceback: the write either succeeds into
a new regular file, or is refused with exit 2 and one stderr line naming the path. Every case
runs the real command under the corpus's time and memory bounds (tests/support/hostile.py); a
writer that blocks on a FIFO fails here on the bound instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from day0.results import history
from day0.results.report import render
from day0.results.signoff import keygen
from tests.hostile.test_nccl import nccl_tests
from tests.support import DATA, hostile
from tests.support import run_factory as rf

SECRET = "precious: must never change\n"
BOUND_S = 30.0  # a refusal takes a second or two; a write blocked on a FIFO never returns
MANIFEST = "day0-manifest.json"


# --------------------------------------------------------------------------- what gets planted


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    """A file outside every folder day0 writes to, which a planted link points at."""
    p = tmp_path / "elsewhere" / "victim.txt"
    p.parent.mkdir()
    p.write_text(SECRET)
    return p


@pytest.fixture()
def bound() -> Iterator[list[socket.socket]]:
    """Sockets a case bound at an output's name, closed after it."""
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def _fifo(p: Path, victim: Path, socks: list[socket.socket]) -> str:
    os.mkfifo(p)
    return "FIFO"


def _folder(p: Path, victim: Path, socks: list[socket.socket]) -> str:
    p.mkdir()
    (p / "inside").write_text("kept")
    return "directory"


def _link(p: Path, victim: Path, socks: list[socket.socket]) -> str:
    os.symlink(victim, p)
    return "symlink"


def _dangling(p: Path, victim: Path, socks: list[socket.socket]) -> str:
    os.symlink(victim.with_name("created-through-a-link.txt"), p)
    return "symlink"


def _socket(p: Path, victim: Path, socks: list[socket.socket]) -> str:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    socks.append(s)
    return "socket"


PLANTS: dict[str, Callable[[Path, Path, list[socket.socket]], str]] = {
    "fifo": _fifo, "directory": _folder, "symlink": _link, "dangling-symlink": _dangling, "socket": _socket}


def untouched(victim: Path) -> None:
    """Nothing written through a link: the file it names is as it was, and a dangling one's
    destination was not created."""
    assert victim.read_text() == SECRET
    assert not victim.with_name("created-through-a-link.txt").exists()


def refused(out: hostile.Outcome, path: Path, problem: str) -> str:
    line = hostile.refused(out, path, problem=problem)
    assert out.seconds < BOUND_S, out.explain()
    return line


# --------------------------------------------------------------------------- day0 weights manifest


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    """A folder the manifest command hashes (it reads bytes; it does not parse shards)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return d


def manifest(ckpt: Path, **kw) -> hostile.Outcome:
    return hostile.day0("weights", "manifest", ckpt, timeout_s=BOUND_S, **kw)


@pytest.mark.parametrize("plant", list(PLANTS))
def test_manifest_refuses_what_is_planted_at_its_name(ckpt: Path, victim: Path, bound: list[socket.socket],
                                                      plant: str) -> None:
    target = ckpt / MANIFEST
    word = PLANTS[plant](target, victim, bound)
    refused(manifest(ckpt), target, word)
    untouched(victim)
    assert not any(p.name.endswith(".tmp") for p in ckpt.iterdir())


@pytest.mark.parametrize("plant", ["symlink", "dangling-symlink", "fifo"])
def test_manifest_is_not_redirected_by_the_old_temporary_name(ckpt: Path, victim: Path, bound: list[socket.socket],
                                                              plant: str) -> None:
    """The writer used to write ``day0-manifest.json.tmp`` by name: a link there overwrote a file
    outside the checkpoint, a FIFO there hung the command."""
    PLANTS[plant](ckpt / f"{MANIFEST}.tmp", victim, bound)
    out = manifest(ckpt)
    assert out.code == 0 and not out.lines, out.explain()
    untouched(victim)
    assert json.loads((ckpt / MANIFEST).read_text())["files"]["model.safetensors"]["size"] == 4096


def test_manifest_in_a_read_only_checkpoint_is_one_line(ckpt: Path) -> None:
    os.chmod(ckpt, 0o555)
    try:
        out = manifest(ckpt, preexec=hostile.read_only_as_root)
    finally:
        os.chmod(ckpt, 0o755)
    refused(out, ckpt / MANIFEST, "permission denied")


def test_audit_names_a_listed_file_that_became_a_directory(ckpt: Path) -> None:
    assert manifest(ckpt).code == 0
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").mkdir()
    out = hostile.day0("weights", "audit", ckpt, timeout_s=BOUND_S)
    assert out.code == 1 and "Traceback" not in out.stderr, out.explain()
    assert any(ln.startswith("FAIL  weights.manifest: config.json: is a directory, not a file")
               for ln in out.stdout.splitlines()), out.explain()


# --------------------------------------------------------------------------- --json exports


def _compare(tmp_path: Path, dest: Path) -> hostile.Outcome:
    base = rf.accepted()
    base.run_id = "run-baseline"
    b = rf.write(base, tmp_path / "base")
    run = rf.write(rf.accepted(), tmp_path / "run")
    return hostile.day0("compare", run, "--baseline", b, "--json", dest, timeout_s=BOUND_S)


def _latency_import(tmp_path: Path, dest: Path) -> hostile.Outcome:
    return hostile.day0("latency", "import", DATA / "vllm-bench-detailed.json", "--json", dest, timeout_s=BOUND_S)


def _collectives_import(tmp_path: Path, dest: Path) -> hostile.Outcome:
    src = tmp_path / "all_reduce.txt"
    src.write_text(nccl_tests())
    return hostile.day0("collectives", "import", src, "--json", dest, timeout_s=BOUND_S)


EXPORTS: dict[str, Callable[[Path, Path], hostile.Outcome]] = {
    "compare": _compare, "latency-import": _latency_import, "collectives-import": _collectives_import}


@pytest.mark.parametrize("plant", ["fifo", "directory", "symlink"])
@pytest.mark.parametrize("command", list(EXPORTS))
def test_json_export_refuses_what_is_planted_at_its_path(tmp_path: Path, victim: Path, bound: list[socket.socket],
                                                         command: str, plant: str) -> None:
    dest = tmp_path / "checks.json"
    word = PLANTS[plant](dest, victim, bound)
    refused(EXPORTS[command](tmp_path, dest), dest, word)
    untouched(victim)


@pytest.mark.parametrize("command", list(EXPORTS))
def test_json_export_to_a_regular_file_still_works(tmp_path: Path, command: str) -> None:
    dest = tmp_path / "checks.json"
    dest.write_text("stale")
    out = EXPORTS[command](tmp_path, dest)
    assert out.code in (0, 1) and not out.lines, out.explain()
    assert json.loads(dest.read_text())


@pytest.mark.parametrize("name", ["run.json", "events.jsonl"])
@pytest.mark.parametrize("command", list(EXPORTS))
def test_json_export_never_replaces_a_runs_record(tmp_path: Path, command: str, name: str) -> None:
    """`--json RUN/run.json` replaced the record with a list of checks (or a comparison), exit 0;
    `compare --json BASELINE/run.json` destroyed the baseline it had just read. Refused before the
    command's work, naming the file, which keeps its bytes."""
    run = rf.write(rf.accepted(), tmp_path / "victim-run")
    dest = run.parent / name
    if not dest.exists():
        dest.write_text('{"event": "run_started"}\n')
    before = dest.read_bytes()
    refused(EXPORTS[command](tmp_path, dest), dest, "which --json would replace")
    assert dest.read_bytes() == before


def test_an_export_never_replaces_a_record_under_another_name(tmp_path: Path) -> None:
    """The name was the whole rule: `compare --json B --baseline B` still replaced a stored history
    entry or a record kept as base.json, the baseline it had just read (the review). What the file
    holds decides too; and `collectives transport --json` had no guard at all."""
    base = rf.accepted()
    base.run_id = "run-baseline"
    kept = rf.write(base, tmp_path / "b").rename(tmp_path / "base.json")
    run = rf.write(rf.accepted(), tmp_path / "run")
    before = kept.read_bytes()
    refused(hostile.day0("compare", run, "--baseline", kept, "--json", kept, timeout_s=BOUND_S), kept,
            "which --json would replace")
    log = tmp_path / "nccl.log"
    log.write_text("host1:123:456 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    refused(hostile.day0("collectives", "transport", log, "--json", kept, timeout_s=BOUND_S), kept,
            "which --json would replace")
    assert kept.read_bytes() == before


def test_an_import_out_never_replaces_a_runs_record(tmp_path: Path) -> None:
    run = rf.write(rf.accepted(), tmp_path / "victim-run")
    before = run.read_bytes()
    refused(hostile.day0("latency", "import", DATA / "vllm-bench-detailed.json", "--out", run.parent,
                         timeout_s=BOUND_S), run, "which --out would replace")
    src = tmp_path / "all_reduce.txt"
    src.write_text(nccl_tests())
    refused(hostile.day0("collectives", "import", src, "--out", run, timeout_s=BOUND_S), run, "which --out would replace")
    assert run.read_bytes() == before


# --------------------------------------------------------------------------- the run folder's files


def test_report_out_to_a_fifo_is_refused_promptly(tmp_path: Path) -> None:
    run = rf.write(rf.accepted(), tmp_path / "run")
    os.mkfifo(tmp_path / "page.html")
    refused(hostile.day0("report", run, "--out", tmp_path / "page.html", timeout_s=BOUND_S),
            tmp_path / "page.html", "FIFO")


def test_report_junit_through_a_link_is_refused(tmp_path: Path, victim: Path) -> None:
    run = rf.write(rf.accepted(), tmp_path / "run")
    os.symlink(victim, tmp_path / "run" / "junit.xml")
    refused(hostile.day0("report", run, timeout_s=BOUND_S), tmp_path / "run" / "junit.xml", "symlink")
    untouched(victim)


@pytest.mark.parametrize("plant", ["fifo", "dangling-symlink"])
def test_record_rebuild_refuses_what_is_planted_at_run_json(tmp_path: Path, victim: Path,
                                                            bound: list[socket.socket], plant: str) -> None:
    run = rf.write(rf.accepted(), tmp_path / "run")
    from day0.core.events import EventLog  # a real event log to rebuild from

    log = EventLog(run.parent / "events.jsonl")
    log.run_started("run-x", {"host": "h"}, {"name": "p"}, ["weights"])
    log.run_finished(0)
    run.unlink()
    word = PLANTS[plant](run, victim, bound)
    refused(hostile.day0("record", "rebuild", run.parent, timeout_s=BOUND_S), run, word)
    untouched(victim)


def test_latency_import_out_will_not_log_through_a_dangling_link(tmp_path: Path, victim: Path) -> None:
    """``exists()`` is False for a dangling link, so the folder looked empty; the event log then
    followed the link and created a file wherever it pointed."""
    out_dir = tmp_path / "imported"
    out_dir.mkdir()
    _dangling(out_dir / "events.jsonl", victim, [])
    refused(hostile.day0("latency", "import", DATA / "vllm-bench-detailed.json", "--out", out_dir,
                         timeout_s=BOUND_S), out_dir / "events.jsonl", "symlink")
    untouched(victim)


def test_collectives_import_out_to_a_fifo_is_refused_promptly(tmp_path: Path) -> None:
    src = tmp_path / "all_reduce.txt"
    src.write_text(nccl_tests())
    os.mkfifo(tmp_path / "result.json")
    refused(hostile.day0("collectives", "import", src, "--out", tmp_path / "result.json", timeout_s=BOUND_S),
            tmp_path / "result.json", "FIFO")


# --------------------------------------------------------------------------- keys, signatures, history


@pytest.mark.parametrize("which", ["ada.pem", "ada.pub.pem"])
def test_keygen_never_writes_through_a_dangling_link(tmp_path: Path, victim: Path, which: str) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    _dangling(keys / which, victim, [])
    refused(hostile.day0("keygen", keys, "--name", "ada", timeout_s=BOUND_S), keys / which, "already exists")
    untouched(victim)


def test_keygen_makes_a_private_key_readable_by_its_owner_only(tmp_path: Path) -> None:
    out = hostile.day0("keygen", tmp_path / "keys", "--name", "ada", timeout_s=BOUND_S)
    assert out.code == 0, out.explain()
    assert stat.S_IMODE((tmp_path / "keys" / "ada.pem").stat().st_mode) == 0o600


def test_sign_refuses_a_report_that_is_a_link(tmp_path: Path, victim: Path) -> None:
    key, _ = keygen(tmp_path / "keys", "ada")
    real = render(rf.write(rf.accepted(), tmp_path / "run"), tmp_path / "run" / "report.html")
    before = real.read_bytes()
    os.symlink(real, tmp_path / "link.html")
    refused(hostile.day0("sign", tmp_path / "link.html", "--key", key, "--signer", "Ada, lead",
                         timeout_s=BOUND_S), tmp_path / "link.html", "symlink")
    assert real.read_bytes() == before


def test_history_store_skips_a_link_planted_at_the_next_number(tmp_path: Path, victim: Path) -> None:
    run = rf.write(rf.accepted(), tmp_path / "run")
    folder = tmp_path / "history" / "p" / "m"
    folder.mkdir(parents=True)
    record, _ = history.load_with_bytes(run)
    os.symlink(victim, folder / history.entry_name(1, record))
    entry = history.store(run, folder)
    assert entry.number == 2 and entry.path.read_bytes() == run.read_bytes()
    untouched(victim)


def test_tiny_build_refuses_a_link_planted_in_its_folder(tmp_path: Path, victim: Path) -> None:
    out_dir = tmp_path / "tiny"
    out_dir.mkdir()
    os.symlink(victim, out_dir / "tokenizer.json")
    refused(hostile.day0("tiny", "build", out_dir, timeout_s=120, mem_mb=4096), out_dir / "tokenizer.json", "symlink")
    untouched(victim)

