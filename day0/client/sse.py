"""Incremental ``text/event-stream`` parsing: the framing every streamed response arrives in.

Kept apart from the request logic because it is pure (bytes in, events out) and shared by every
reader of a stream: the load generator, the risks stage's isolation probe, the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.core.inputs import size_text


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event: its joined ``data`` lines, its type and last event id."""

    data: str
    event: str = "message"
    id: str | None = None


# The longest line, and the most ``data`` one event may hold: vLLM's events are kilobytes. A stream
# whose line never ends (or whose event never does) is refused here rather than kept in memory until
# the request's timeout, like what day0 reads whole (day0.client.prom.ANSWER_MAX_BYTES).
EVENT_MAX_BYTES = 16 << 20
_BOM = b"\xef\xbb\xbf"


class SSEError(ValueError):
    """A stream past what one line or event may hold; the message names the cap."""


class SSEParser:
    """Incremental ``text/event-stream`` parser (WHATWG rules) fed with arbitrary byte splits.

    Handles LF, CRLF and lone-CR line ends (also a CRLF split across two reads), comments,
    multi-line ``data``, ``event`` and ``id`` fields, and multi-byte UTF-8 split across reads
    (lines are decoded only once complete). An unterminated event at EOF is dropped, as the
    spec says, which is how a stream cut mid-event is noticed.

    Each read is scanned once: an unfinished line is kept apart and only the new bytes are searched
    for a line end, so a long line costs time in proportion to its length, not its square. A line or
    an event's data past ``max_bytes`` (default ``EVENT_MAX_BYTES``) is an SSEError naming the cap.
    """

    __slots__ = ("_line", "_data", "_data_bytes", "_event", "_id", "_skip_lf", "_started", "_max")

    def __init__(self, max_bytes: int | None = None) -> None:
        self._line = bytearray()  # the unfinished line (before the start: up to 2 bytes of a BOM)
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""
        self._id: str | None = None
        self._skip_lf = False
        self._started = False
        self._max = EVENT_MAX_BYTES if max_bytes is None else max_bytes

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not self._started and chunk:
            head = bytes(self._line) + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._line = bytearray(head)
                return []
            self._started = True
            self._line.clear()
            chunk = head[3:] if head.startswith(_BOM) else head
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                self._skip_lf = True  # a following "\n" belongs to this CRLF
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if lines and self._line:
            lines[0] = bytes(self._line) + lines[0]
            self._line.clear()
        self._line += tail
        if len(self._line) > self._max:
            raise SSEError(f"a line of the event stream goes on past {size_text(self._max)} without an end")
        out: list[SSEEvent] = []
        for raw in lines:
            if not raw:
                if self._data:
                    out.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
                self._data, self._data_bytes = [], 0
                self._event = ""
                continue
            line = raw.decode("utf-8", "replace")
            if line[0] == ":":
                continue
            name, sep, value = line.partition(":")
            if sep and value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data_bytes += len(raw)
                if self._data_bytes > self._max:
                    raise SSEError(f"an event of the stream holds data past {size_text(self._max)}")
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
        return bool(self._line) or bool(self._data)

