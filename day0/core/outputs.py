"""Writing the files day0 produces, so that nothing planted under a name can redirect, stall or
half-write one.

Every file day0 writes goes through this module: run.json, report.html, junit.xml, history
entries, the weights manifest, golden files, every ``--json`` export, the collectives sweep's
files, the tiny model, and the logs and event log it streams into. Why: these names sit in
folders other people and other jobs write to (a shared checkpoint, a run folder, a path on a
command line). A writer that opens the name it was given follows a symlink planted there and
overwrites a file outside the folder, waits forever on a FIFO, and leaves half a file when it
is killed. Here a replaced file is written to a new temporary file beside it (created
exclusively, never through a link, under a random name nobody can plant in advance), flushed
to disk, and renamed over the target; a streamed file is opened without following a link or
waiting for a reader. The target itself must be a regular file or absent: a directory, FIFO,
device, socket or symlink there is refused in one line naming it, with nothing written.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from day0.core.inputs import InputError, file_kind

OUTPUT_MODE = 0o644  # a new file: readable by all, as reports and records are meant to be (the umask applies)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NAME_TRIES = 16  # a random 64-bit name is taken by chance never; only by someone who keeps planting


def _cannot(exc: OSError) -> str:
    """Why a write failed, in the words a person acts on (the folder, not the temporary name)."""
    return {
        errno.ENOENT: "cannot be written (its folder does not exist)",
        errno.ENOTDIR: "cannot be written (a component of the path is not a directory)",
        errno.EACCES: "cannot be written (permission denied)",
        errno.EPERM: "cannot be written (permission denied)",
        errno.EROFS: "cannot be written (read-only file system)",
        errno.ENOSPC: "cannot be written (no space left on the device)",
        errno.ENAMETOOLONG: "cannot be written (file name too long)",
        errno.ELOOP: "is a symlink; day0 does not write through links, nothing written",
        errno.ENXIO: "is a FIFO or socket with no reader, not a file; nothing written",
    }.get(exc.errno or 0, f"cannot be written ({(exc.strerror or type(exc).__name__).lower()})")


def existing_mode(path: Path, error: type[InputError] = InputError) -> int | None:
    """The permission bits of the regular file at ``path``, or None when nothing is there.
    Anything else there is refused: a rename would silently replace a symlink the person meant
    to write through, and a directory, FIFO or device is not an output file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(path, _cannot(exc)) from None
    if stat.S_ISLNK(st.st_mode):
        raise error(path, "is a symlink; day0 does not write through links, nothing written")
    if not stat.S_ISREG(st.st_mode):
        raise error(path, f"is {file_kind(st.st_mode)}, not a file; nothing written")
    return stat.S_IMODE(st.st_mode)


@contextmanager
def _temporary(beside: Path, label: Path, mode: int, error: type[InputError]) -> Iterator[tuple[BinaryIO, Path]]:
    """A new file in ``beside``'s folder, open for writing; removed on the way out unless the
    caller moved it. O_EXCL|O_NOFOLLOW: whatever already holds a name (a link, a FIFO, a stale
    file) makes the open fail instead of being written through, and the next random name is tried."""
    for _ in range(_NAME_TRIES):
        tmp = beside.with_name(f".{beside.name[:64]}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, _CREATE, mode)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise error(label, _cannot(exc)) from None
    else:
        raise error(label, f"cannot be written (no free temporary name in {beside.parent} after {_NAME_TRIES} tries)")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh, tmp
    except OSError as exc:
        raise error(label, _cannot(exc)) from None
    finally:
        with suppress(FileNotFoundError):
            os.unlink(tmp)


def _settle(fh: BinaryIO, mode: int | None) -> None:
    """On disk before it gets the final name: a crash after the rename leaves the whole file."""
    fh.flush()
    if mode is not None:
        os.fchmod(fh.fileno(), mode)
    os.fsync(fh.fileno())


def cache_root() -> Path:
    """Where day0 keeps what it builds once and reads many times (the tiny models, the installed
    vLLM's rules): ``$DAY0_CACHE_DIR``, else ``$XDG_CACHE_HOME/day0``, else ``~/.cache/day0``."""
    if env := os.environ.get("DAY0_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "day0"


@contextmanager
def replacing(path: Path | str, *, mode: int | None = None,
              error: type[InputError] = InputError) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; when the block ends without an
    exception it replaces ``path`` atomically (readers see the old file or the new one, never
    half of one). For content streamed in pieces (a log scrubbed line by line); whole content
    goes through :func:`write_file`.

    ``mode``: the permission bits; by default an existing file's are kept and a new file gets
    :data:`OUTPUT_MODE` less the umask.
    """
    path = Path(path)
    kept = existing_mode(path, error)
    final = mode if mode is not None else kept
    with _temporary(path, path, OUTPUT_MODE if final is None else 0o600, error) as (fh, tmp):
        yield fh
        _settle(fh, final)
        existing_mode(path, error)  # again: it may have changed while the content was written
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise error(path, _cannot(exc)) from None


def write_file(path: Path | str, data: bytes | str, *, mode: int | None = None,
               error: type[InputError] = InputError) -> Path:
    """Replace ``path`` with ``data`` (str is written as UTF-8), atomically; see :func:`replacing`."""
    with replacing(path, mode=mode, error=error) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def write_new(folder: Path | str, names: Iterable[str], data: bytes | str, *, mode: int | None = None,
              error: type[InputError] = InputError) -> Path | None:
    """Write ``data`` under the first of ``names`` (in ``folder``) that nothing holds yet, never
    replacing a file, and return that path; None when every name was taken.

    The file is complete before it has a name (a hard link from a finished temporary file), so a
    name is claimed whole or not at all; two jobs drawing from the same names (history numbers)
    cannot both claim one. ``names`` may be a generator that looks at the folder again each time.
    """
    folder = Path(folder)
    with _temporary(folder / "incoming", folder, OUTPUT_MODE if mode is None else 0o600, error) as (fh, tmp):
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        _settle(fh, mode)
        for name in names:
            target = folder / name
            try:
                os.link(tmp, target)
            except FileExistsError:
                continue
            except OSError as exc:
                raise error(target, _cannot(exc)) from None
            return target
    return None


def open_output(path: Path | str, *, append: bool = False, error: type[InputError] = InputError) -> BinaryIO:
    """``path`` open for streaming into (a log, the event log): emptied first, or appended to
    with ``append``. Opened without following a link and without blocking, then checked on the
    open descriptor, so a FIFO, device or link planted at the name is refused in one line
    instead of hanging the run or writing somewhere else."""
    path = Path(path)
    flags = (os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_NOCTTY", 0) | (os.O_APPEND if append else 0))
    try:
        fd = os.open(path, flags, OUTPUT_MODE)
    except OSError as exc:
        existing_mode(path, error)  # names what is there (a FIFO, a link), where it can
        raise error(path, _cannot(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(path, f"is {file_kind(st.st_mode)}, not a file; nothing written")
        if not append:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab" if append else "wb")
    except BaseException:
        os.close(fd)
        raise
