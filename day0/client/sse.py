"""Incremental ``text/event-stream`` parsing: the framing every streamed response arrives in.

Kept apart from the request logic because it is pure (bytes in, events out) and shared by every
reader of a stream: the load generator, the risks stage's isolation probe, the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event: its joined ``data`` lines, its type and last event id."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEParser:
    """Incremental ``text/event-stream`` parser (WHATWG rules) fed with arbitrary byte splits.

    Handles LF, CRLF and lone-CR line ends (also a CRLF split across two reads), comments,
    multi-line ``data``, ``event`` and ``id`` fields, and multi-byte UTF-8 split across reads
    (lines are decoded only once complete). An unterminated event at EOF is dropped, as the
    spec says, which is how a stream cut mid-event is noticed.
    """

    __slots__ = ("_buf", "_data", "_event", "_id", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._skip_lf = False
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if not self._started and buf:
            if len(buf) < 3 and b"\xef\xbb\xbf".startswith(buf):
                self._buf = buf
                return []
            self._started = True
            if buf.startswith(b"\xef\xbb\xbf"):
                buf = buf[3:]
        if b"\r" in buf:
            if buf.endswith(b"\r"):
                self._skip_lf = True  # a following "\n" belongs to this CRLF
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[SSEEvent] = []
        for raw in lines:
            if not raw:
                if self._data:
                    out.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
                self._data = []
                self._event = ""
                continue
            line = raw.decode("utf-8", "replace")
            if line[0] == ":":
                continue
            name, sep, value = line.partition(":")
            if sep and value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id":
                if "\0" not in value:
                    self._id = value
        return out

    @property
    def pending(self) -> bool:
        """Whether bytes or fields of an unfinished event are buffered (a cut stream)."""
        return bool(self._buf) or bool(self._data)
