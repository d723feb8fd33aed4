"""What an imported benchmark result becomes, and typed reads from the untrusted file it came from.

A site that already ran ``vllm bench serve`` or GuideLLM should be judged by the same SLA and the
same definitions as a day0 run, so each reader (``from_vllm``, ``from_guidellm``) turns the
tool's per-request records into day0's own :class:`~day0.client.loadgen.RequestResult` list; the
stage's metrics and checks then run on it unchanged. What a tool does not record (GuideLLM keeps no
per-message times) is named in ``missing``; where its definitions differ from day0's, ``notes``
say how, in words the report shows.

A result file is input from outside: every key is read through :class:`Doc`, so a missing key or
a value of the wrong kind is one line naming the file and the key path (exit 2), never a traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from day0.client.loadgen import PhaseResult
from day0.config.latency import LatencySection
from day0.core.inputs import InputError, key_path
from day0.core.record_shape import got

NUMBER = "a number"
_MISSING = object()


@dataclass
class ImportedRun:
    """One benchmark run read from a tool's result file, as day0's own phase of requests."""

    tool: str  # "vllm bench serve" | "guidellm"
    version: str | None
    path: Path
    label: str  # which run in the file: its date, strategy or index
    phase: PhaseResult
    settings: LatencySection  # the load as the tool offered it (load, rate, concurrency, arrivals)
    missing: dict[str, str] = field(default_factory=dict)  # metric -> why the tool has no samples of it
    notes: list[str] = field(default_factory=list)  # where the tool's figures differ from a day0 run's
    facts: list[tuple[str, Any]] = field(default_factory=list)  # the tool's own headline figures, as written
    sha256: str | None = None  # of the file read, so a record names exactly what it judged


class Doc:
    """Typed reads from one parsed result file; a problem is an InputError naming file and key path."""

    def __init__(self, path: Path, hint: str = "", base: tuple[Any, ...] = ()) -> None:
        self.path = path
        self.hint = hint  # appended to "missing": how to make the tool write the key
        self.base = base  # where the objects this Doc reads sit in the file

    def at(self, *keys: Any) -> "Doc":
        """The same file, reading an object found at ``keys`` (errors still name the whole path)."""
        return Doc(self.path, self.hint, (*self.base, *keys))

    def fail(self, keys: tuple[Any, ...], problem: str) -> InputError:
        return InputError(f"{self.path}: {key_path((*self.base, *keys))}: {problem}")

    def get(self, obj: Any, *keys: Any, default: Any = _MISSING) -> Any:
        """The value at ``keys`` (dict keys and list indexes); ``default`` when absent, if given."""
        cur = obj
        for i, k in enumerate(keys):
            present = (isinstance(cur, list) and isinstance(k, int) and 0 <= k < len(cur)) or (
                isinstance(cur, dict) and isinstance(k, str) and k in cur)
            if not present:
                if default is not _MISSING:
                    return default
                if i and not isinstance(cur, (dict, list)):
                    raise self.fail(keys[:i], f"expected an object, got {got(cur)}")
                raise self.fail(keys[:i + 1], "missing" + (f" ({self.hint})" if self.hint else ""))
            cur = cur[k]
        return cur

    def number(self, obj: Any, *keys: Any, default: Any = _MISSING, none_ok: bool = False,
               minimum: float | None = None) -> Any:
        """A finite number (``None`` too with ``none_ok``), at least ``minimum`` when given."""
        v = self.get(obj, *keys, default=default)
        if v is None and (none_ok or default is None):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(keys, f"expected {NUMBER}, got {got(v)}")
        if minimum is not None and v < minimum:
            raise self.fail(keys, f"expected a number >= {minimum:g}, got {got(v)}")
        return v

    def text(self, obj: Any, *keys: Any, default: Any = _MISSING) -> Any:
        v = self.get(obj, *keys, default=default)
        if v is not None and not isinstance(v, str):
            raise self.fail(keys, f"expected text, got {got(v)}")
        return v

    def listed(self, obj: Any, *keys: Any, length: int | None = None, default: Any = _MISSING) -> Any:
        """A list (of ``length`` entries when given: one per request)."""
        v = self.get(obj, *keys, default=default)
        if v is None and default is None:
            return None
        if not isinstance(v, list):
            raise self.fail(keys, f"expected a list, got {got(v)}")
        if length is not None and len(v) != length:
            raise self.fail(keys, f"{len(v)} entries, expected {length} (one per request)")
        return v

    def obj(self, obj: Any, *keys: Any) -> dict[str, Any]:
        v = self.get(obj, *keys)
        if not isinstance(v, dict):
            raise self.fail(keys, f"expected an object, got {got(v)}")
        return v


def error_kind(message: str) -> tuple[str, str]:
    """(day0 error kind, one-line reason) of a tool's free-text error: its traceback or reason phrase."""
    text = message.strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else "unknown error"
    rules = (
        ("no_tokens", ("Never received a valid chunk",)),
        ("timeout", ("TimeoutError", "ReadTimeout", "timed out", "Timeout")),
        ("connection", ("ClientConnectorError", "ConnectionRefused", "Cannot connect", "ConnectError",
                        "Connect call failed")),
        ("dropped_stream", ("ClientPayloadError", "ServerDisconnected", "TransferEncodingError", "RemoteProtocolError",
                            "incomplete chunked", "Response payload is not completed")),
        ("malformed_event", ("JSONDecodeError", "Expecting value", "Unterminated string")),
        ("http_error", ("HTTPStatusError", "Server error '", "Client error '")),
    )
    for kind, needles in rules:
        hit = next((n for n in needles if n in text), None)
        if hit is not None:  # the line that says it (a traceback's last line, or GuideLLM's first)
            said = next((line for line in reversed(lines) if hit in line), last)
            return kind, said[:160]
    if len(lines) == 1 and not last.startswith("Traceback"):
        return "http_error", f"http: {last[:150]}"  # vLLM keeps only the status reason ("Internal Server Error")
    return "client_error", last[:160]
