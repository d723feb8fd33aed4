"""The one writer (day0/core/outputs.py): what is planted under a name is never written through,
never waited on, and never left half-written.

A case that could hang (a FIFO) runs in a thread joined with a timeout, so a regression fails
with a message instead of holding the suite; a hung writer is then released by opening the
FIFO's other end.
"""

from __future__ import annotations

import ast
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from day0.core import outputs
from day0.core.events import EventLog
from day0.core.inputs import InputError
from day0.core.outputs import open_output, replacing, write_file, write_new
from tests.support import REPO, hostile

PROMPT_S = 10.0  # "returned promptly": a refusal takes microseconds; a blocked open never returns
SECRET = b"precious: must never change\n"


def promptly(fn: Callable[[], Any], fifo: Path | None = None) -> Any:
    """``fn()``'s result (or the exception it raised, returned) if it returns within PROMPT_S."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["value"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(PROMPT_S)
    if t.is_alive():
        if fifo is not None:  # release the blocked open so the thread can end
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            t.join(2.0)
            os.close(fd)
        pytest.fail(f"still blocked after {PROMPT_S:.0f} s (a write that waits on a FIFO)")
    return box["value"]


def refused(value: Any, path: Path, *words: str) -> str:
    assert isinstance(value, InputError), f"expected a refusal, got {value!r}"
    line = str(value)
    assert "\n" not in line and str(path) in line, line
    for w in words:
        assert w.lower() in line.lower(), line
    return line


def no_temporaries(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert not left, f"temporary files left behind: {left}"


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    """A file outside the output folder that a planted link points at."""
    p = tmp_path / "elsewhere" / "victim.txt"
    p.parent.mkdir()
    p.write_bytes(SECRET)
    return p


@pytest.fixture()
def out(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


# --------------------------------------------------------------------------- the plain path


def test_a_new_file_gets_its_content_and_a_readable_mode(out: Path) -> None:
    path = write_file(out / "run.json", '{"a": "é"}\n')
    assert path.read_bytes() == '{"a": "é"}\n'.encode()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == outputs.OUTPUT_MODE & ~umask
    no_temporaries(out)


def test_a_replaced_file_keeps_its_mode_and_gets_a_new_inode(out: Path) -> None:
    target = out / "report.html"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    before = target.stat().st_ino
    write_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != before  # renamed over, never rewritten in place
    no_temporaries(out)


def test_an_explicit_mode_holds_from_the_first_byte(out: Path) -> None:
    path = write_file(out / "key.pem", b"k", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_hard_link_at_the_target_is_not_written_through(out: Path, victim: Path) -> None:
    """In-place writing would change every name of the file; a rename replaces only this one."""
    os.link(victim, out / "junit.xml")
    write_file(out / "junit.xml", b"<xml/>")
    assert victim.read_bytes() == SECRET
    assert (out / "junit.xml").read_bytes() == b"<xml/>"


def test_a_failure_midway_keeps_the_old_file_whole(out: Path) -> None:
    target = out / "run.json"
    target.write_bytes(b"old and whole")
    with pytest.raises(RuntimeError):
        with replacing(target) as fh:
            fh.write(b"half of the new")
            raise RuntimeError("killed while writing")
    assert target.read_bytes() == b"old and whole"
    no_temporaries(out)


# --------------------------------------------------------------------------- what is at the target


def test_a_symlink_at_the_target_is_refused_and_not_followed(out: Path, victim: Path) -> None:
    os.symlink(victim, out / "report.html")
    line = refused(promptly(lambda: write_file(out / "report.html", b"x")), out / "report.html", "symlink")
    assert "nothing written" in line
    assert victim.read_bytes() == SECRET and (out / "report.html").is_symlink()
    no_temporaries(out)


def test_a_dangling_symlink_at_the_target_creates_nothing_where_it_points(out: Path, tmp_path: Path) -> None:
    dest = tmp_path / "elsewhere-new.txt"
    os.symlink(dest, out / "checks.json")
    refused(promptly(lambda: write_file(out / "checks.json", b"x")), out / "checks.json", "symlink")
    assert not dest.exists()


def test_a_fifo_at_the_target_is_refused_promptly(out: Path) -> None:
    fifo = out / "checks.json"
    os.mkfifo(fifo)
    refused(promptly(lambda: write_file(fifo, b"[]"), fifo), fifo, "FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_at_the_target_is_refused(out: Path) -> None:
    (out / "day0-manifest.json").mkdir()
    (out / "day0-manifest.json" / "inside").write_bytes(b"kept")
    refused(promptly(lambda: write_file(out / "day0-manifest.json", b"{}")), out / "day0-manifest.json",
            "directory")
    assert (out / "day0-manifest.json" / "inside").read_bytes() == b"kept"
    no_temporaries(out)


def test_a_device_at_the_target_is_refused() -> None:
    refused(promptly(lambda: write_file(Path("/dev/null"), b"x")), Path("/dev/null"), "character device")


def test_a_socket_at_the_target_is_refused(out: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(out / "run.json"))
        refused(promptly(lambda: write_file(out / "run.json", b"{}")), out / "run.json", "socket")
    finally:
        sock.close()


def test_a_missing_folder_says_so(tmp_path: Path) -> None:
    refused(write_file_or_error(tmp_path / "nowhere" / "run.json"), tmp_path / "nowhere" / "run.json",
            "folder does not exist")


def write_file_or_error(path: Path) -> Any:
    try:
        return write_file(path, b"x")
    except InputError as exc:
        return exc


# --------------------------------------------------------------------------- what is at the temporary name


def _names(*tokens: str) -> Iterator[str]:
    yield from tokens


class _Planted:
    """Stands in for ``secrets``: the first temporary names are ones a test planted something at."""

    def __init__(self, *tokens: str) -> None:
        self._tokens = iter(tokens)

    def token_hex(self, n: int) -> str:
        return next(self._tokens, None) or os.urandom(n).hex()


def test_a_symlink_at_the_temporary_name_is_not_followed(out: Path, victim: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    os.symlink(victim, out / ".day0-manifest.json.planted.tmp")
    monkeypatch.setattr(outputs, "secrets", _Planted("planted"))
    write_file(out / "day0-manifest.json", b"{}")
    assert victim.read_bytes() == SECRET
    assert (out / "day0-manifest.json").read_bytes() == b"{}"
    assert (out / ".day0-manifest.json.planted.tmp").is_symlink()  # someone else's: left as it was


def test_a_fifo_at_the_temporary_name_is_not_opened(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = out / ".run.json.planted.tmp"
    os.mkfifo(fifo)
    monkeypatch.setattr(outputs, "secrets", _Planted("planted"))
    result = promptly(lambda: write_file(out / "run.json", b"{}"), fifo)
    assert result == out / "run.json" and result.read_bytes() == b"{}"


def test_a_folder_full_of_planted_names_is_one_line(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = [f"t{i}" for i in range(outputs._NAME_TRIES)]
    for t in tokens:
        os.symlink("/nowhere", out / f".run.json.{t}.tmp")
    monkeypatch.setattr(outputs, "secrets", _Planted(*tokens))
    refused(write_file_or_error(out / "run.json"), out / "run.json", "no free temporary name")
    assert not (out / "run.json").exists()


# --------------------------------------------------------------------------- a folder that cannot be written


def test_a_read_only_folder_is_one_line_and_the_old_file_stays(out: Path) -> None:
    target = out / "run.json"
    target.write_bytes(b"old")
    os.chmod(out, 0o555)
    code = ("import sys\nfrom pathlib import Path\nfrom day0.core.inputs import InputError\n"
            "from day0.core.outputs import write_file\ntry:\n    write_file(Path(sys.argv[1]), b'new')\n"
            "except InputError as exc:\n    print(exc)\n    sys.exit(2)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(target)], cwd=REPO, capture_output=True, text=True,
                              timeout=60, preexec_fn=hostile.read_only_as_root)
    finally:
        os.chmod(out, 0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip() == f"{target}: cannot be written (permission denied)"
    assert target.read_bytes() == b"old"
    no_temporaries(out)


# --------------------------------------------------------------------------- concurrent writers


def test_concurrent_writers_leave_one_whole_file_and_readers_never_see_half(out: Path) -> None:
    target = out / "run.json"
    size, writers, rounds = 256 << 10, 6, 15
    write_file(target, bytes([0]) * size)
    torn: list[int] = []
    stop = threading.Event()

    def write(k: int) -> None:
        for _ in range(rounds):
            write_file(target, bytes([k]) * size)

    def read() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            if len(data) != size or data.count(data[:1]) != size:
                torn.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(k,)) for k in range(1, writers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    reader.join(10)
    assert not torn, f"a reader saw {len(torn)} partial files"
    final = target.read_bytes()
    assert len(final) == size and final[0] in range(1, writers + 1) and final.count(final[:1]) == size
    no_temporaries(out)


def test_concurrent_claims_of_new_names_never_share_one(out: Path) -> None:
    """Like two jobs storing into one history folder: each lists, takes the next number, links."""

    def next_names() -> Iterator[str]:
        for _ in range(200):
            n = 1 + max((int(p.stem) for p in out.glob("*.json")), default=0)
            yield f"{n:04d}.json"

    got: list[Path | None] = []
    lock = threading.Lock()

    def claim(k: int) -> None:
        path = write_new(out, next_names(), f"job {k}\n")
        with lock:
            got.append(path)

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert None not in got and len(set(got)) == 12
    assert sorted(p.read_text() for p in got if p) == sorted(f"job {k}\n" for k in range(12))
    no_temporaries(out)


# --------------------------------------------------------------------------- write_new


def test_write_new_never_replaces_and_skips_a_planted_link(out: Path, victim: Path) -> None:
    (out / "0001.json").write_bytes(b"first")
    os.symlink(victim, out / "0002.json")
    path = write_new(out, _names("0001.json", "0002.json", "0003.json"), b"third")
    assert path == out / "0003.json" and path.read_bytes() == b"third"
    assert (out / "0001.json").read_bytes() == b"first" and victim.read_bytes() == SECRET


def test_write_new_returns_none_when_every_name_is_taken(out: Path) -> None:
    (out / "key.pem").write_bytes(b"old key")
    assert write_new(out, ["key.pem"], b"new key", mode=0o600) is None
    assert (out / "key.pem").read_bytes() == b"old key"
    no_temporaries(out)


def test_write_new_gives_a_private_mode_from_the_start(out: Path) -> None:
    path = write_new(out, ["key.pem"], b"secret", mode=0o600)
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600


# --------------------------------------------------------------------------- streams and the event log


def test_open_output_truncates_and_appends_a_regular_file(out: Path) -> None:
    log = out / "engine.log"
    log.write_bytes(b"previous run\n")
    with open_output(log) as fh:
        fh.write(b"a\n")
    with open_output(log, append=True) as fh:
        fh.write(b"b\n")
    assert log.read_bytes() == b"a\nb\n"


@pytest.mark.parametrize("append", [False, True], ids=["truncate", "append"])
def test_open_output_refuses_a_fifo_without_a_reader_promptly(out: Path, append: bool) -> None:
    fifo = out / "events.jsonl"
    os.mkfifo(fifo)
    refused(promptly(lambda: open_output(fifo, append=append), fifo), fifo, "FIFO")


def test_open_output_refuses_a_fifo_someone_reads(out: Path) -> None:
    fifo = out / "launcher.log"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        refused(promptly(lambda: open_output(fifo), fifo), fifo, "FIFO")
    finally:
        os.close(reader)


@pytest.mark.parametrize("append", [False, True], ids=["truncate", "append"])
def test_open_output_refuses_a_symlink_and_leaves_its_target(out: Path, victim: Path, append: bool) -> None:
    os.symlink(victim, out / "events.jsonl")
    refused(promptly(lambda: open_output(out / "events.jsonl", append=append)), out / "events.jsonl", "symlink")
    assert victim.read_bytes() == SECRET


def test_open_output_refuses_a_directory(out: Path) -> None:
    (out / "device-check.log").mkdir()
    refused(promptly(lambda: open_output(out / "device-check.log", append=True)), out / "device-check.log",
            "directory")


def test_the_event_log_will_not_append_into_a_planted_fifo_or_link(out: Path, victim: Path) -> None:
    fifo = out / "a" / "events.jsonl"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    refused(promptly(lambda: EventLog(fifo).note("k", 1), fifo), fifo, "FIFO")
    link = out / "b" / "events.jsonl"
    link.parent.mkdir()
    os.symlink(victim, link)
    refused(promptly(lambda: EventLog(link).note("k", 1)), link, "symlink")
    assert victim.read_bytes() == SECRET
    log = EventLog(out / "c" / "events.jsonl")
    log.note("k", 1)
    log.note("k", 2)
    assert len((out / "c" / "events.jsonl").read_text().splitlines()) == 2  # a regular file: appended


# --------------------------------------------------------------------------- nobody writes around it

# Writes day0 still makes without the writer, each with why. day0/engine/cluster/ keeps its own state
# and Slurm files (a folder it creates fresh per cluster; routing them is that package's change).
NOT_ROUTED = ("day0/core/outputs.py", "day0/engine/cluster/")
_WRITE_MODES = set("wax+")


def _direct_writes(path: Path) -> Iterator[str]:
    """``file:line call`` for each write that does not go through day0/core/outputs.py: ``write_text``,
    ``write_bytes``, ``touch``, safetensors' ``save_file``, ``mkstemp``, ``os.replace``/``os.rename``,
    ``os.O_CREAT``, and ``open`` with a writing mode. (``Path.replace`` reads like ``str.replace``
    to a parser: not looked for.)"""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = ""
        if isinstance(node, ast.Attribute) and node.attr == "O_CREAT":
            name = "os.O_CREAT"
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            modes = [a.value for a in [*node.args, *(k.value for k in node.keywords if k.arg == "mode")]
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if fn in ("write_text", "write_bytes", "touch", "save_file", "mkstemp"):
                name = fn
            elif fn in ("replace", "rename") and isinstance(owner, ast.Name) and owner.id == "os":
                name = f"os.{fn}"
            elif fn == "open" and any(set(m) & _WRITE_MODES and len(m) <= 3 for m in modes):
                name = f"open({modes[0]!r})"
        if name:
            yield f"{path.relative_to(REPO)}:{node.lineno} {name}"


def test_every_file_day0_writes_goes_through_the_writer() -> None:
    found = [w for p in sorted((REPO / "day0").rglob("*.py"))
             if not str(p.relative_to(REPO)).startswith(NOT_ROUTED) for w in _direct_writes(p)]
    assert not found, "write through day0.core.outputs instead:\n" + "\n".join(found)
