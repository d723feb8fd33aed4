"""Check-id globs (``latency.*``, ``weights.smoke.*``), matched as ``fnmatch.fnmatchcase`` matches,
and refused past a length no check id comes near. They reach day0 from profiles, from the command
line (tolerance keys) and from records, which are data: fnmatch's translation is quadratic in
unclosed brackets, so an 80 KB glob in a record's required list held `day0 report` for 31 s, and a
record may be 512 MiB."""

from __future__ import annotations

import bisect
import fnmatch
import functools
import re
import reprlib
from collections.abc import Iterable

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


class Names:
    """Distinct names (check ids), each glob matched once and only against the names sharing its
    literal prefix (bisect on the sorted names): the verdict and the first screen ask many globs of
    many checks, and matching each glob against every check took 60 s for `day0 report` of 40,000
    skipped checks under one required glob, 17 s to load 20,000 checks with 2,000 required ids."""

    def __init__(self, names: Iterable[str]) -> None:
        self.sorted = sorted(set(names))
        self._found: dict[str, list[str]] = {}

    def matching(self, glob: str) -> list[str]:
        """The names ``glob`` matches (fnmatchcase), sorted; ValueError for a glob past ``MAX_GLOB``."""
        found = self._found.get(glob)
        if found is None:
            checked(glob)  # refused before it is tried
            head = re.split(r"[*?[]", glob, maxsplit=1)[0]  # the literal prefix every match starts with
            names, n = self.sorted, bisect.bisect_left(self.sorted, head)
            found = []
            while n < len(names) and names[n].startswith(head):
                if matches(names[n], glob):
                    found.append(names[n])
                n += 1
            self._found[glob] = found
        return found
