"""One way to show progress on long work (hashing, collective sweeps, KV-cache workloads).

Minutes of silence look like a hang. On a terminal a tqdm bar on stderr costs nothing to read;
in a CI log a bar is hundreds of carriage-return lines, so there a plain line goes out at most
every ``every_s`` seconds instead (and none for work shorter than that).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from day0.core.inputs import term_safe

EVERY_S = 10.0


def _tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """``update`` from any thread; ``close`` (or the ``with`` block's end) ends the bar."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", *, log: Callable[[str], None] | None = None,
                 every_s: float = EVERY_S, stream: TextIO | None = None, unit_scale: bool = False) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.done = 0
        self.note = ""
        self._unit_scale = unit_scale
        self._lock = threading.Lock()
        self._started = self._last = time.monotonic()
        self._logged = False
        out = sys.stderr if stream is None else stream
        self._bar: Any = None
        if log is None and _tty(out):
            from tqdm import tqdm  # lazy: only a terminal gets a bar

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=out, leave=False, dynamic_ncols=True,
                             unit_scale=unit_scale, unit_divisor=1024 if unit_scale else 1000)
        self._log = log or (lambda msg: print(f"[day0] {msg}", file=out, flush=True))

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1, note: str = "") -> None:
        with self._lock:
            self._advance(self.done + n, note)

    def set(self, done: int, note: str = "") -> None:
        """Progress as an absolute count (a poller that sees where the work is, not each step)."""
        with self._lock:
            self._advance(max(self.done, done), note)

    def _advance(self, done: int, note: str) -> None:
        step, self.done = done - self.done, done
        note = term_safe(note) if note else note  # a shard's or file's name: whatever is on disk
        self.note = note or self.note
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(step)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._logged = True
            self._log(self.line())

    def line(self) -> str:
        """The log line: where the work is, how long it has taken."""
        done = _amount(self.done, self._unit_scale)
        of = f"/{_amount(self.total, self._unit_scale)}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        note = f", {self.note}" if self.note else ""
        return f"{self.desc}: {done}{of} {self.unit}{pct}{note}, {time.monotonic() - self._started:.0f} s"

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self._logged:  # a CI log that saw the work going also sees it end
                self._log(self.line() + " (done)")
                self._logged = False


def _amount(n: int | None, scaled: bool) -> str:
    if n is None:
        return "?"
    if not scaled:
        return str(n)
    x = float(n)
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if x < 1024 or prefix == "Ti":
            return f"{x:.0f}" if not prefix else f"{x:.1f}{prefix}"
        x /= 1024
    return str(n)
