"""Reading files a person hands day0 (run records, event logs, reports, keys, profiles, config.json,
checkpoint indexes, nccl-tests output, NCCL logs) without trusting them.

Any path on a command line may be a FIFO that never sends EOF, a symlink loop, a folder, a sparse
file claiming a terabyte, JSON nested a million deep or holding NaN (which JSON has not), or
text whose escape sequences rewrite the terminal. Each becomes one :class:`InputError` line that
names the file (and line or key path) in bounded time and memory, and :func:`term_safe` is the
one place text read from such a file is made safe to print.

Why one module for every layer: the same question ("why can this path not be read?", "where is
the bad byte?") must get the same answer whichever command asks it, and a fix (a FIFO that hangs,
a symlink loop called "missing") must land once.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from day0.core.redact import Redactor

NUL_PATH = "the path holds a NUL byte, which no file's can"
MAX_DEPTH = 64  # a real record nests ~7 deep (evidence.charts[0].series[0].y); the report recurses per level
# Characters a terminal acts on instead of showing: C0 and C1 controls, DEL, bidi overrides and
# isolates (they reorder what follows), invisible direction marks, line/paragraph separators
# (str.splitlines breaks on them), and lone surrogates (an encoder refuses them).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def term_safe(text: Any) -> str:
    """``text`` with every character a terminal would act on written as a visible escape
    (``\\x1b``, ``\\n``, ``\\u202e``): record text reaching a terminal cannot hide, reorder or forge lines."""
    return _UNSAFE.sub(_escape, str(text))


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


class InputError(ValueError):
    """A file that cannot be used as given; the message is one printable line naming it.

    ``InputError(line)`` takes the whole line; ``InputError(path, problem, line, col)`` composes
    ``path[:line[:col]]: problem`` and keeps the parts, for a caller that reports the file and the
    problem apart (a stand-in for an unreadable NCCL log names both).
    """

    def __init__(self, where: object, problem: str | None = None, line: int | None = None,
                 col: int | None = None) -> None:
        if problem is None:  # the whole line
            self.path, self.problem, text = None, str(where), str(where)
        else:
            self.path, self.problem = str(where), problem
            text = f"{where}{f':{line}' if line else ''}{f':{col}' if line and col else ''}: {problem}"
        self.line, self.col = line, col
        super().__init__(term_safe(text))


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _file(what: str | None) -> str:
    """``a run record file``, ``an index file``; ``a file`` when the kind is not named."""
    if not what:
        return "a file"
    return _a(what) if what.endswith(" file") else f"{_a(what)} file"


def _why(exc: OSError, path: Path, what: str | None) -> str:
    """The phrase a person checks first. Why not the OSError text: a symlink loop and a dangling
    symlink both look like "does not exist" to ``Path.exists()``, which sends people looking for a
    file that is there."""
    if exc.errno == errno.ENOENT:
        try:
            return f"dangling symlink (to {os.readlink(path)}, which does not exist)"
        except OSError:  # not a symlink: nothing is there
            return f"{what} not found" if what else "does not exist"
    return {
        errno.ELOOP: "symlink loop (too many levels of symbolic links)",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENOTDIR: "a component of the path is not a directory",
        errno.ENAMETOOLONG: "file name too long",
        errno.ENXIO: f"is a socket or device, not {_file(what)}",
        errno.EISDIR: f"is a directory, not {_file(what)}",
    }.get(exc.errno or 0, f"cannot be read ({exc.strerror or type(exc).__name__})")


def file_kind(mode: int) -> str:
    """What is at a path that is not a regular file, for a refusal ("a directory", "a FIFO (named pipe)")."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def size_text(n: int) -> str:
    """A size in a refusal ("over the 256 MiB ..."): MiB from one, else bytes."""
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _over(cap: int, what: str | None) -> str:
    return f"over the {size_text(cap)} {_a(what or 'file')} may hold"


def path_problem(path: Path | str) -> str:
    """Why ``path`` cannot be opened as a file, in :func:`open_regular`'s words; "" when it can.

    For a caller that acts on the answer before opening anything: a missing index means "read the
    shards on disk" and a directory is what a checkpoint path should be, so these two answers are
    compared as they are ("does not exist", "is a directory, not a file").
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        return _why(exc, Path(path), None)
    except ValueError:
        return NUL_PATH
    return "" if stat.S_ISREG(st.st_mode) else f"is {file_kind(st.st_mode)}, not a file"


def open_regular(path: Path | str, what: str | None = None, error: type[InputError] = InputError, *,
                 label: str | None = None, cap: int | None = None,
                 buffering: int = -1) -> tuple[IO[bytes], os.stat_result]:
    """Open ``path`` for reading only if it is a regular file (of at most ``cap`` bytes). Opened
    non-blocking and checked on the open descriptor, so a FIFO is refused instead of waiting for a
    writer, and a file swapped for one after a check cannot slip in; the size is the one claimed,
    so a sparse terabyte is refused without reading it.

    ``what`` ("run record") names the kind of file in a refusal, ``label`` the file (its path by default).
    """
    label = str(path) if label is None else label
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(label, _why(exc, Path(path), what)) from None
    except ValueError:  # "embedded null byte": the OS's own words name no file
        raise error(label, NUL_PATH) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(label, f"is {file_kind(st.st_mode)}, not {_file(what)}")
        if cap is not None and st.st_size > cap:
            raise error(label, f"{size_text(st.st_size)}, {_over(cap, what)}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering), st
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path | str, what: str | None, cap: int, error: type[InputError] = InputError, *,
                 label: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes (checked before and while reading:
    a sparse file's claimed size is refused without reading it, a growing one at the cap).

    Read as the size the file claims, then on to the cap only if there is more: ``read(cap + 1)``
    allocates the whole cap up front (256 MiB for a 5 kB result), which counts against a strict
    overcommit limit and which tracemalloc counts as the reader's peak."""
    label = str(path) if label is None else label
    fh, st = open_regular(path, what, error, label=label, cap=cap)
    with fh:
        try:
            data = fh.read(min(st.st_size, cap) + 1)
            if st.st_size < len(data) <= cap:  # it grew since, or claims no size (/proc): the rest, to the cap
                data += fh.read(cap + 1 - len(data))
        except OSError as exc:
            raise error(label, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > cap:
        raise error(label, f"{_over(cap, what)} (it grew while being read)")
    return data


def decode_utf8(data: bytes, where: object, error: type[InputError] = InputError, *, line: int | None = None,
                text: bool = False) -> str:
    """``data`` as UTF-8, else a refusal naming the first bad byte and where it is: by offset, or
    by ``line`` and column when ``data`` is that line. ``text`` refuses a NUL byte too, for files
    that are text and nothing else (a log, a settings file): NUL is valid UTF-8, and what holds
    one is binary data whatever its other bytes are."""
    bad = data.find(b"\x00") if text else -1
    nul = bad >= 0
    if not nul:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = exc.start
    at = "" if line is not None else f" at offset {bad}"
    problem = f"binary data (a NUL byte{at}), not text" if nul else f"not UTF-8 text (byte 0x{data[bad]:02x}{at})"
    raise error(where, problem, line, None if line is None else bad + 1)


def read_text(path: Path | str, what: str | None = None, *, cap: int, error: type[InputError] = InputError,
              label: str | None = None) -> str:
    """A whole text file of at most ``cap`` bytes that must hold something: empty (or blank),
    binary and not UTF-8 are refused."""
    label = str(path) if label is None else label
    raw = read_regular(path, what, cap, error, label=label)
    if not raw.strip():
        raise error(label, "empty file")
    return decode_utf8(raw, label, error, text=True)


def lines(fh: IO[bytes], cap: int) -> Iterator[tuple[int, bytes | None, bool]]:
    """(line number, line or None when over ``cap`` bytes, ended by a newline) for each line,
    holding at most ``cap`` bytes of one line in memory."""
    n = 0
    while True:
        line = fh.readline(cap + 1)
        if not line:
            return
        n += 1
        if len(line) > cap and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # drop the rest of the over-long line
                line = fh.readline(1 << 20)
            yield n, None, line.endswith(b"\n")
            continue
        yield n, line, line.endswith(b"\n")


def text_lines(path: Path | str, what: str | None = None, *, cap: int, max_line: int, lenient: bool = False,
               error: type[InputError] = InputError, label: str | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text without its newline)`` of a text file of at most ``cap`` bytes,
    streamed: an empty file, a line over ``max_line`` bytes, binary data and bytes that are not
    UTF-8 are refused naming the line (and column).

    ``lenient`` is for files day0's own processes wrote, where a killed one may leave NUL padding
    and one that only asked a library its version an empty file: what is not text is replaced and
    an empty file is no lines. The caps hold either way.
    """
    label = str(path) if label is None else label
    fh, _ = open_regular(path, what, error, label=label, cap=cap)
    total = n = 0
    with fh:
        for n, raw, _ended in lines(fh, max_line):
            if raw is None:
                raise error(label, f"line longer than {max_line} bytes: not line-oriented text", n)
            total += len(raw)
            if total > cap:
                raise error(label, f"{_over(cap, what)} (it grew while being read)", n)
            text = (raw.decode("utf-8", "replace").replace("\x00", "\ufffd") if lenient
                    else decode_utf8(raw, label, error, line=n, text=True))
            yield n, text.rstrip("\r\n")
    if n == 0 and not lenient:
        raise error(label, "empty file")


class _NonFinite(str):
    """A number no float holds (NaN, Infinity, 1e999, a 400-digit integer), kept as text until
    its key path is known. Every reader of a record takes numbers as floats; none can take these."""

    def __str__(self) -> str:
        text = str.__str__(self)
        return text if len(text) <= 24 else f"{text[:20]}… ({len(text)} characters)"

    def problem(self) -> str:
        digits = self.lstrip("-")
        if digits.isdigit():  # say why 10**400 is refused: it is finite, but no float holds it
            return f"{self} is not a finite number (an integer of {len(digits)} digits is beyond any float)"
        return f"{self} is not a finite number (NaN, Infinity and values beyond a float are refused)"


def _finite_float(text: str) -> float | _NonFinite:
    x = float(text)
    return x if math.isfinite(x) else _NonFinite(text)


def _float_sized_int(text: str) -> int | _NonFinite:
    return int(text) if len(text) <= 300 else _NonFinite(text)  # before int(): 10**5000 costs time too


class _Duplicate(ValueError):
    @classmethod
    def of(cls, key: str) -> "_Duplicate":
        shown = key if len(key) <= 80 else key[:77] + "..."
        return cls(f"duplicate key {shown!r} (it appears twice in one object: readers disagree on which value counts)")


class _TooLong(ValueError):
    """A list at the document's top level longer than its reader holds (the message names its key path)."""


class _Malformed(Exception):
    """Not JSON where :class:`_Capped` reads the document's top level: :func:`json.loads` says why,
    in its own words (they differ between Python versions)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _Duplicate.of(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


_HOOKS: dict[str, Any] = {"parse_constant": _NonFinite, "parse_float": _finite_float,
                          "parse_int": _float_sized_int, "object_pairs_hook": _no_duplicates}
_WS = json.decoder.WHITESPACE.match
_NOT_SCALAR = re.compile(r'[\[{"]')  # where a list holds a list, an object or a string (which may hold a ']')


@dataclass(frozen=True)
class _Capped:
    """A strict parse of ``text`` that counts each list of scalars at its top level (the document, or
    an object's member) by its commas, and refuses one past ``cap`` entries before it is built: what
    a parse builds per entry can be 20 times its bytes, so a count checked after the parse comes after
    the memory it was meant to spare. A vLLM result holds a list of numbers a request (``input_lens``,
    ``ttfts``...) ahead of its lists of lists and texts, so an over-long run is refused there.

    Every value is the stdlib's C scanner's, with the same hooks as :func:`json.loads`: the same
    document, the same numbers. Lists deeper in the document, and top-level lists of lists, objects
    or strings, are not counted (a file of them is bounded by the file's size cap alone).
    """

    text: str
    scan: Callable[[str, int], tuple[Any, int]]
    cap: int
    reason: str  # why the cap, after "more than N entries"

    def document(self) -> Any:
        i = _WS(self.text, 0).end()
        if self.text.startswith("{", i):
            doc, i = self.members(i)
        elif self.text.startswith("[", i):
            doc, i = self.entries(i, ())
        else:
            doc, i = self.value(i)
        end = _WS(self.text, i).end()
        if end != len(self.text):
            raise json.JSONDecodeError("Extra data", self.text, end)  # JSONDecoder.decode's words
        return doc

    def value(self, i: int) -> tuple[Any, int]:
        try:
            return self.scan(self.text, i)
        except StopIteration:
            raise _Malformed from None

    def members(self, i: int) -> tuple[dict[str, Any], int]:
        """The object at ``i``; a key seen twice is refused as it is read, before its value is built."""
        text = self.text
        out: dict[str, Any] = {}
        i = _WS(text, i + 1).end()
        if text.startswith("}", i):
            return out, i + 1
        while text.startswith('"', i):
            key, i = json.decoder.scanstring(text, i + 1, True)
            if key in out:
                raise _Duplicate.of(key)
            i = _WS(text, i).end()
            if not text.startswith(":", i):
                break
            i = _WS(text, i + 1).end()
            out[key], i = self.entries(i, (key,)) if text.startswith("[", i) else self.value(i)
            i = _WS(text, i).end()
            if text.startswith("}", i):
                return out, i + 1
            if not text.startswith(",", i):
                break
            i = _WS(text, i + 1).end()
        raise _Malformed

    def entries(self, i: int, keys: tuple[Any, ...]) -> tuple[list[Any], int]:
        """The list at ``i``. One of scalars only (no ``[``, ``{`` or ``"`` before its first ``]``, which
        then ends it) is counted by its commas and refused (naming ``keys``) past ``cap`` before a value
        of it is built; any other list is the C scanner's whole, uncounted: an entry-by-entry loop in
        Python made importing a vLLM result's per-request lists of ITLs and texts 1.5 to 2x slower."""
        text = self.text
        end = text.find("]", i)
        if end >= 0 and not _NOT_SCALAR.search(text, i + 1, end) and text.count(",", i, end) >= self.cap:
            shown = key_path(keys)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise _TooLong(f"{shown}: more than {self.cap:,} entries{self.reason and '; '}{self.reason}")
        return self.value(i)


def _loads(text: str, max_entries: int | None, reason: str) -> Any:
    """``text`` parsed strictly; with ``max_entries``, by :class:`_Capped`."""
    if max_entries is not None:
        try:
            return _Capped(text, json.JSONDecoder(**_HOOKS).scan_once, max_entries, reason).document()
        except _Malformed:
            pass  # out of the handler first, so what was built is let go: json.loads stops where it stopped
    return json.loads(text, **_HOOKS)


def key_path(path: tuple[Any, ...]) -> str:
    """``stages[2].checks[0].status``: where in a document a problem is."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "(top level)"


@contextmanager
def _json_errors(where: str, error: type[InputError], deep: str) -> Iterator[None]:
    """What a JSON parser raises, as one line naming ``where``: the same words whichever parser."""
    try:
        yield
    except json.JSONDecodeError as exc:
        col = f", column {exc.colno}" if exc.lineno > 1 or exc.colno > 1 else ""
        raise error(where, f"not JSON ({exc.msg} at line {exc.lineno}{col})") from None
    except RecursionError:
        raise error(where, f"JSON nested too deeply ({deep})") from None
    except MemoryError:
        raise error(where, "too large to parse in the memory available") from None
    except (_Duplicate, _TooLong) as exc:
        raise error(where, str(exc)) from None
    except ValueError as exc:  # an integer of more digits than int() converts
        raise error(where, f"not usable JSON ({str(exc).split(';')[0]})") from None


def strict_json(data: bytes | str, where: str, error: type[InputError] = InputError, *,
                max_depth: int = MAX_DEPTH, max_entries: int | None = None, reason: str = "") -> Any:
    """Parse JSON as the record format defines it: UTF-8, no NaN/Infinity, no duplicate keys, at
    most ``max_depth`` deep, no lone surrogates. ``where`` names the file (and line) in the error.

    ``max_entries`` refuses a list of scalars at the top level (the document, or an object's member)
    of more entries, naming its key (and ``reason``: why the cap), before building it: for a reader
    whose memory follows a count (one entry a request) rather than the file's bytes."""
    text = decode_utf8(data, where, error) if isinstance(data, bytes) else data
    with _json_errors(where, error, f"more than {max_depth} levels"):
        obj = _loads(text, max_entries, reason)
    _walk(obj, where, error, max_depth)
    return obj


def loose_json(data: bytes | str, where: str, error: type[InputError] = InputError, *,
               loads: Callable[[bytes | str], Any] = json.loads) -> Any:
    """Parse JSON as any reader takes it (NaN, a key twice, any depth the parser reaches), failing
    in :func:`strict_json`'s words. For files whose odd values are findings of their own, judged
    key by key afterwards (a checkpoint index whose total_size is NaN was written for other shards:
    that is the finding, not "unreadable"); ``loads`` may be a faster parser of the same JSON."""
    if isinstance(data, bytes):
        decode_utf8(data, where, error)  # the parsers' own complaint would not name the byte
    with _json_errors(where, error, "deeper than the parser reads"):
        obj = loads(data)
    return obj


def _walk(obj: Any, where: str, error: type[InputError], max_depth: int) -> None:
    """Depth, non-finite numbers and lone surrogates, found iteratively with their key path."""
    if isinstance(obj, _NonFinite):
        raise error(where, obj.problem())
    if isinstance(obj, str) and _SURROGATE.search(obj):
        raise error(where, "lone surrogate in text (not valid Unicode)")
    stack: list[tuple[Any, tuple[Any, ...]]] = [(obj, ())] if isinstance(obj, (dict, list)) else []
    while stack:
        node, path = stack.pop()
        if len(path) >= max_depth:
            raise error(where, f"{key_path(path)}: nested deeper than {max_depth} levels")
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(v, (dict, list)):
                stack.append((v, (*path, k)))
            elif isinstance(v, _NonFinite):
                raise error(where, f"{key_path((*path, k))}: {v.problem()}")
            elif (isinstance(v, str) and _SURROGATE.search(v)) or (isinstance(k, str) and _SURROGATE.search(k)):
                raise error(where, f"{key_path((*path, k))}: lone surrogate in text (not valid Unicode)")


def refusal(exc: BaseException, redactor: Redactor | None = None) -> str:
    """The one stderr line for input day0 cannot use: ``day0: <file>[:line]: <key path>: <problem>``
    (an OSError's own text names the file only as an afterthought, so it is reordered). The line
    quotes the input, so it is redacted (``redactor``, else this environment's secrets and every
    secret shape: a refused ``engine.url`` may hold a password) before it is escaped."""
    if isinstance(exc, OSError) and exc.strerror:
        problem = exc.strerror.lower()
        text = f"{exc.filename}: {problem}" if exc.filename else problem
    else:
        text = str(exc) or type(exc).__name__
    return "day0: " + term_safe((redactor or Redactor.from_sources()).text(text))

