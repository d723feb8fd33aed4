"""Check-id globs (``latency.*``, ``weights.smoke.*``), matched as ``fnmatch.fnmatchcase`` matches,
and refused past a length no check id comes near. They reach day0 from profiles, from the command
line (tolerance keys) and from records, which are data: fnmatch's translation is quadratic in
unclosed brackets, so an 80 KB glob in a record's required list held `day0 report` for 31 s, and a
record may be 512 MiB."""

from __future__ import annotations

import fnmatch
import functools
import re
import reprlib

MAX_GLOB = 256  # characters; the longest check id day0 writes is under 80


@functools.lru_cache(maxsize=4096)
def _compiled(glob: str) -> re.Pattern[str]:
    if len(glob) > MAX_GLOB:
        raise ValueError(f"check pattern {reprlib.repr(glob)}: {len(glob)} characters, past {MAX_GLOB}: "
                         "not a check id or glob")
    return re.compile(fnmatch.translate(glob))


def matches(name: str, glob: str) -> bool:
    """``fnmatch.fnmatchcase(name, glob)``; ValueError for a glob longer than ``MAX_GLOB``."""
    return _compiled(glob).match(name) is not None


def checked(glob: str) -> str:
    """``glob`` itself, or the ValueError :func:`matches` would raise: for a setting read before anything is matched."""
    _compiled(glob)
    return glob
