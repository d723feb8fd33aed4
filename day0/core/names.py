"""Names that become file names: the one sanitiser, and the one test of a name read back.

A profile's ``name``, a recorded device, a ``compare.machine`` are data, yet each ends up as a
path component: the run folder ``<out>/<run id>/``, the history's ``<profile>/<machine>/``
folders. Taken as given, ``name = "team/llama70b"`` made the run folder two folders (the record
then refused its own id and the whole run was lost), a 190-character name went past what the
record accepts, and ``x/../../outside`` wrote the event log outside ``--day0-out``. So a name is
turned into a file name once, where the id or folder name is minted (never at each use), by
:func:`file_name`, and a name nobody tried is as safe as the ones that were.

What :func:`file_name` gives is one path component on any file system: ASCII letters, digits and
``. _ -``; never empty, never ``.`` or ``..``, no leading ``-`` (an option to a shell tool) or
``.`` (hidden), no Windows device name (``CON``, ``NUL``, ``COM1``), at most ``limit`` characters.
It stays readable (``team/llama70b`` -> ``team-llama70b``: punctuation becomes ``-``), and when
more than punctuation was lost (letters outside ASCII, a cut for length, a device name) it ends in
a short hash of the whole name, so two such names stay apart. The name as given stays in the
record's profile as data.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

MAX_COMPONENT = 200  # the longest file name a reader accepts (run.json's run_id); well under 255 bytes
NAME_LIMIT = 64  # file_name's default: a run id (stamp + name + suffix) stays under 90 characters
HASH_CHARS = 8
_MIN_LIMIT = len("unnamed-") + HASH_CHARS

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SEPARATOR_RUN = re.compile(r"-[-.]*-")  # "-..-..-" (what "/../../" became) reads as one "-"
# Device names Windows reserves in every folder, with any extension (CON.txt is CON).
_RESERVED = frozenset({"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))})
# What no component read back may hold: separators, C0/C1 controls, DEL, bidi overrides/isolates.
_BAD_IN_COMPONENT = re.compile(r"[/\\\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


def file_name(name: object, limit: int = NAME_LIMIT) -> str:
    """``name`` as one safe path component of at most ``limit`` characters (see the module).

    Punctuation alone is not kept apart (``team/a`` and ``team-a`` are both ``team-a``, as a
    reader would guess); anything else that had to go (non-ASCII text, a cut, a device name, a name
    with no letter or digit left) adds ``-`` and 8 hex digits of the name's SHA-256.
    """
    if limit < _MIN_LIMIT:
        raise ValueError(f"file_name: limit {limit} is under {_MIN_LIMIT} (room for a hash)")
    text = str(name)
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    base = _SEPARATOR_RUN.sub("-", _UNSAFE.sub("-", ascii_text)).strip("-.")
    reserved = base.split(".", 1)[0].upper() in _RESERVED
    if reserved:
        base = f"_{base}"
    if text.isascii() and base and len(base) <= limit and not reserved:
        return base  # only ASCII punctuation changed: every letter and digit is still there
    head = base[: limit - HASH_CHARS - 1].rstrip("-.") or "unnamed"
    return f"{head}-{_digest(text)}"


def is_component(text: object, limit: int = MAX_COMPONENT) -> bool:
    """Whether ``text``, read back (a run id in a record someone else wrote, a folder on disk), can
    name one folder: 1 to ``limit`` characters, not ``.`` or ``..``, no separator, control or bidi
    character. Older day0s minted ids from the raw profile name, so spaces and non-ASCII letters
    pass; every :func:`file_name` passes (tests/hostile/test_names.py holds the two together)."""
    return (isinstance(text, str) and 0 < len(text) <= limit and text not in (".", "..")
            and not _BAD_IN_COMPONENT.search(text))
