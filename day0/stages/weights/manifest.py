"""SHA-256 integrity manifest of a checkpoint: write it once, verify it before every run.

Why: a header audit proves a shard is well-formed, not that its bytes are the ones published; a
bit flip in a copy, a half-finished rsync that was later padded, or a shard swapped between two
exports all pass it. Hashing terabytes is slow, so files are hashed in parallel (threads:
hashlib and file reads release the GIL on large buffers) and streamed through one fixed buffer
per worker, so memory stays bounded whatever the shard size.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Union

from day0.core.inputs import InputError, file_kind, open_regular
from day0.core.outputs import write_file
from day0.core.record import utcnow
from day0.model.jsonfile import MAX_MANIFEST_BYTES, read_json

MANIFEST_NAME = "day0-manifest.json"
MANIFEST_FORMAT = "day0-manifest"
MANIFEST_VERSION = 1
CHUNK_BYTES = 4 << 20  # large enough that per-call overhead vanishes, small enough to stay in cache

ProgressFn = Callable[[int, int], None]  # (bytes hashed so far, bytes to hash in all)
Progress = Union[bool, ProgressFn]


class ManifestError(ValueError):
    """A manifest that cannot be used; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class FileDigest:
    name: str
    size: int
    sha256: str | None  # None when the file could not be read
    error: str = ""


def sha256_file(path: Path, *, chunk_bytes: int = CHUNK_BYTES, on_bytes: Callable[[int], None] | None = None) -> str:
    """Stream a file through SHA-256 with one reusable buffer (bounded memory)."""
    digest = hashlib.sha256()
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    with open_regular(path, buffering=0)[0] as fh:  # a FIFO or a device would never end: refused, not read
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return digest.hexdigest()


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def hash_files(
    root: Path,
    names: Iterable[str],
    *,
    workers: int | None = None,
    progress: Progress = False,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, FileDigest]:
    """Hash ``root/name`` for every name, largest first so the slowest file starts earliest."""
    root = Path(root)
    sizes: dict[str, int] = {}
    out: dict[str, FileDigest] = {}
    for name in names:
        try:
            sizes[name] = (root / name).stat().st_size
        except OSError as exc:
            out[name] = FileDigest(name, -1, None, exc.strerror or str(exc))
    total = sum(sizes.values())
    tracker = _Tracker(total, progress)
    order = sorted(sizes, key=lambda n: -sizes[n])

    def one(name: str) -> FileDigest:
        try:
            return FileDigest(name, sizes[name], sha256_file(root / name, chunk_bytes=chunk_bytes, on_bytes=tracker.add))
        except InputError as exc:
            return FileDigest(name, sizes[name], None, str(exc).split(": ", 1)[-1])
        except OSError as exc:
            return FileDigest(name, sizes[name], None, exc.strerror or str(exc))

    n_workers = max(1, min(workers or default_workers(), len(order) or 1))
    try:
        if n_workers == 1:
            results = [one(n) for n in order]
        else:
            with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="day0-sha256") as pool:
                results = list(pool.map(one, order))
    finally:
        tracker.close()
    out.update({d.name: d for d in results})
    return out


class _Tracker:
    """Thread-safe byte counter feeding day0's progress (a tqdm bar on a terminal, else a line
    every few seconds) or a caller's callback."""

    def __init__(self, total: int, progress: Progress) -> None:
        self.total, self.done = total, 0
        self._lock = threading.Lock()
        self._callback: ProgressFn | None = progress if callable(progress) else None
        self._bar: Any = None
        if progress is True:
            from day0.core.progress import Progress as Bar

            self._bar = Bar(total, "sha256", "B", unit_scale=True)

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
            if self._callback is not None:
                self._callback(self.done, self.total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def write(model_dir: Path, names: Iterable[str], *, workers: int | None = None,
          progress: Progress = False, manifest_name: str = MANIFEST_NAME) -> Path:
    """Hash ``names`` (relative to ``model_dir``) and write the manifest atomically."""
    model_dir = Path(model_dir)
    digests = hash_files(model_dir, names, workers=workers, progress=progress)
    unreadable = [d for d in digests.values() if d.sha256 is None]
    if unreadable:
        d = unreadable[0]
        raise ManifestError(f"{model_dir / d.name}: cannot hash ({d.error}); manifest not written")
    doc = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "algorithm": "sha256",
        "created_at": utcnow(),
        "files": {d.name: {"size": d.size, "sha256": d.sha256} for d in sorted(digests.values(), key=lambda d: d.name)},
    }
    try:
        return write_file(model_dir / manifest_name, json.dumps(doc, indent=1) + "\n")
    except InputError as exc:  # a folder, FIFO or link where the manifest goes: one line, nothing written
        raise ManifestError(str(exc)) from None


def load(path: Path) -> dict[str, dict[str, Any]]:
    """The manifest's files table ({name: {size, sha256}}), or a one-line ManifestError."""
    path = Path(path)
    try:
        doc = read_json(path, limit=MAX_MANIFEST_BYTES, label=path.name, what="a manifest")
    except InputError as exc:
        raise ManifestError(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path.name}: not a day0 manifest (\"format\" is not {MANIFEST_FORMAT!r})")
    if doc.get("version") != MANIFEST_VERSION or doc.get("algorithm") != "sha256":
        raise ManifestError(
            f"{path.name}: version {doc.get('version')!r} / algorithm {doc.get('algorithm')!r} not supported "
            f"(expected {MANIFEST_VERSION} / sha256)"
        )
    files = doc.get("files")
    if not isinstance(files, dict):
        raise ManifestError(f"{path.name}: \"files\" is not an object")
    for name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or type(entry.get("size")) is not int
            or not isinstance(entry.get("sha256"), str)
            or len(entry["sha256"]) != 64
        ):
            raise ManifestError(f"{path.name}: files.{name} needs an integer \"size\" and a 64-hex \"sha256\"")
        if not inside_folder(name, path.parent):  # the index's own rule: relative, no `..`, no NUL
            raise ManifestError(f"{path.name}: files.{name} is not a path inside the model folder")
    return files


def inside_folder(name: str, folder: Path) -> bool:
    """A file name the index or the manifest may use: relative, inside the model folder, a usable path, reached
    without leaving the folder through a directory symlink (``sub -> /etc``). The shard file itself may
    be a symlink: a Hugging Face cache links every snapshot file to its blob outside the folder."""
    if not name or "\0" in name or Path(name).is_absolute() or ".." in Path(name).parts:
        return False
    if Path(name).as_posix() != name:  # "x.safetensors/" (a file vLLM cannot open), "./x", "a//x": another name
        return False
    parent = (folder / name).parent
    if parent == folder:
        return True
    try:
        return parent.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop on the way
        return False


@dataclass
class Verification:
    """Outcome of checking files against a manifest: one message per mismatching file."""

    checked: list[str]
    problems: list[tuple[str, str]]  # (file name, one-line message)
    bytes_hashed: int
    seconds: float


def verify(
    model_dir: Path,
    files: dict[str, dict[str, Any]],
    required: Iterable[str] = (),
    *,
    manifest_name: str = MANIFEST_NAME,
    workers: int | None = None,
    progress: Progress = False,
) -> Verification:
    """Compare files on disk with the manifest's table; ``required`` files must be listed in it.

    A size mismatch is reported without hashing that file (the cheap check catches truncation
    and padding at once); everything else present is hashed in parallel.
    """
    model_dir = Path(model_dir)
    problems: list[tuple[str, str]] = []
    for name in sorted(set(required) - set(files)):
        problems.append((name, f"{name}: not listed in {manifest_name} (added or renamed after it was written?)"))
    to_hash: list[str] = []
    for name, entry in sorted(files.items()):
        path = model_dir / name
        try:
            st = path.stat()
        except OSError:
            problems.append((name, f"{name}: listed in {manifest_name} but missing from {model_dir}"))
            continue
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):  # a folder's 4096 "bytes" would read as a truncated file
            problems.append((name, f"{name}: is {file_kind(st.st_mode)}, not a file ({manifest_name} recorded a "
                                   f"file of {entry['size']} bytes)"))
            continue
        if size != entry["size"]:
            problems.append((name, f"{name}: {size} bytes on disk, {manifest_name} recorded {entry['size']}"))
            continue
        to_hash.append(name)
    t0 = time.perf_counter()
    digests = hash_files(model_dir, to_hash, workers=workers, progress=progress)
    seconds = time.perf_counter() - t0
    for name in to_hash:
        d = digests[name]
        want = files[name]["sha256"].lower()
        if d.sha256 is None:
            problems.append((name, f"{name}: cannot read to hash ({d.error})"))
        elif d.sha256 != want:
            problems.append((name, f"{name}: sha256 {d.sha256[:16]}… differs from {manifest_name}'s {want[:16]}…"))
    return Verification(
        checked=to_hash,
        problems=problems,
        bytes_hashed=sum(digests[n].size for n in to_hash if digests[n].sha256),
        seconds=seconds,
    )
