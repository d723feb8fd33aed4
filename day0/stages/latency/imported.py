"""What an imported benchmark result becomes, and typed reads from the untrusted file it came from.

A site that already ran ``vllm bench serve`` or GuideLLM should be judged by the same SLA and the
same definitions as a day0 run, so each reader (``from_vllm``, ``from_guidellm``) turns the
tool's per-request records into day0's own :class:`~day0.client.loadgen.RequestResult` list; the
stage's metrics and checks then run on it unchanged. What a tool does not record (GuideLLM keeps no
per-message times) is named in ``missing``; where its definitions differ from day0's, ``notes``
say how, in words the report shows.

A result file is input from outside: every key is read through :class:`Doc`, so a missing key or
a value of the wrong kind is one line naming the file and the key path (exit 2), never a traceback.
A value of the right kind that cannot be true of its request (a negative duration, a first token
before the send, more tokens than the stream could carry: docs/metrics.md, "Domains") is
:class:`OutOfDomain`: the readers leave that request out of every figure and name it (``LeftOut``),
so it can never make a check pass; a file with nothing left is refused like an unusable one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from day0.client.loadgen import PhaseResult, RequestResult
from day0.config.latency import LatencySection
from day0.core.inputs import InputError, key_path, strict_json
from day0.core.record_shape import got

NUMBER = "a number"
_MISSING = object()
T = TypeVar("T")
# A count past 2^53 is not even exactly a float: no request's token count is that large, and sums of
# such claims overflow the throughputs (1.7e308 did).
MAX_COUNT = 2**53
# vLLM streams one engine step per chunk: one token, k + 1 with k speculative tokens, N with
# --stream-interval N. A request claiming more than this many tokens per streamed message on average
# did not stream them: its TPOT would shrink toward 0 and its output throughput swell.
MAX_TOKENS_PER_MESSAGE = 256
# The tools read their clocks at different instants (a send, the window's start): 1 ms is far above
# that jitter and far below anything a window or a latency is judged by.
WINDOW_SLACK_S = 1e-3
# No benchmark request or run lasts anywhere near this (about 116 days; vLLM bench gives up on a
# request after 6 hours): a longer duration is a wrong unit or a made-up file. Bounding it also keeps
# every figure computed from durations finite: a gap of 1e200 s overflowed its square in the
# variance, and past 1.8e305 s it is no float in ms at all.
MAX_DURATION_S = 1e7
MAX_LEFT_OUT_SHOWN = 20
# An imported request costs about 0.8 KB held (its RequestResult, its message times, its share of the
# pooled samples: docs/metrics.md, "Memory and time"), whatever few bytes of the file it took: 300,000
# requests of one gap each, 5 MB of file, held 310 MB. A file at the 256 MiB cap could claim 15
# million (12 GB); the count is refused past a million (about 0.9 GB), by its per-request lists of numbers
# (:func:`result_json`), before any request is read.
MAX_REQUESTS = 1_000_000


class OutOfDomain(InputError):
    """A value of the right kind that cannot be true of its request; the line names file and key path.

    Raised for one request, it leaves that request out (:class:`LeftOut`); raised for the file's own
    figures (the window), it refuses the file like any :class:`InputError`."""


@dataclass
class LeftOut:
    """The requests a reader left out because a figure of theirs is outside its domain: the first
    :data:`MAX_LEFT_OUT_SHOWN` named (file and key path), all counted."""

    shown: list[str] = field(default_factory=list)
    count: int = 0

    def keep(self, read: Callable[[], T]) -> T | None:
        """``read()``, or None (and the request named) when it finds a value outside its domain."""
        try:
            return read()
        except OutOfDomain as exc:
            self.count += 1
            if len(self.shown) < MAX_LEFT_OUT_SHOWN:
                self.shown.append(str(exc))
            return None

    def refuse_if_nothing_left(self, kept: int) -> None:
        """A file whose every request is outside its domain has nothing to judge: refused in one line."""
        if self.count and not kept:
            raise InputError(f"{self.shown[0]} (and every other of the {self.count} requests read is outside "
                             "its domain too: nothing left to judge)" if self.count > 1 else
                             f"{self.shown[0]} (the only request read: nothing left to judge)")


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
    left_out: LeftOut = field(default_factory=LeftOut)  # requests whose figures cannot be true


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

    def outside(self, keys: tuple[Any, ...], problem: str) -> OutOfDomain:
        """A value of the right kind outside its domain (docs/metrics.md, "Domains")."""
        return OutOfDomain(f"{self.path}: {key_path((*self.base, *keys))}: {problem}")

    def get(self, obj: Any, *keys: Any, default: Any = _MISSING) -> Any:
        """The value at ``keys`` (dict keys and list indexes); ``default`` when absent (a key not
        there, an index past the end, a null on the way), if given. A value of the wrong kind on the
        way is refused even then: ``"requests": [1]`` is no object of request groups, not zero
        requests."""
        cur = obj
        for i, k in enumerate(keys):
            kind = dict if isinstance(k, str) else list
            if i and cur is not None and not isinstance(cur, kind):
                raise self.fail(keys[:i], f"expected {'an object' if kind is dict else 'a list'}, got {got(cur)}")
            present = isinstance(cur, kind) and (k in cur if kind is dict else 0 <= k < len(cur))
            if not present:
                if default is not _MISSING:
                    return default
                if i and cur is None:
                    raise self.fail(keys[:i], "expected an object, got null")
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
            raise self.outside(keys, f"expected a number >= {minimum:g}, got {got(v)}")
        return v

    def seconds(self, obj: Any, *keys: Any, default: Any = _MISSING, none_ok: bool = False) -> Any:
        """A duration: a number of seconds in 0..:data:`MAX_DURATION_S` (``None`` too with ``none_ok``)."""
        v = self.number(obj, *keys, default=default, none_ok=none_ok, minimum=0.0)
        if v is not None:
            self.span(keys, v)
        return v

    def span(self, keys: tuple[Any, ...], seconds: float, since: str = "") -> None:
        """Refuse (OutOfDomain naming ``keys``) a duration, read or taken between two instants
        (``since`` says which), longer than :data:`MAX_DURATION_S`: no request or run lasts that long."""
        if seconds > MAX_DURATION_S:
            raise self.outside(keys, f"{seconds:.6g} s{since}: longer than {MAX_DURATION_S:g} s (116 days) "
                                     "cannot be a request's or a run's duration")

    def count(self, obj: Any, *keys: Any, default: Any = _MISSING, none_ok: bool = False) -> int | None:
        """A count: a whole number in 0..:data:`MAX_COUNT` (6.0 is 6; 5.5, -3 and 1e300 are outside)."""
        v = self.number(obj, *keys, default=default, none_ok=none_ok)
        if v is None:
            return None
        if not 0 <= v <= MAX_COUNT or (isinstance(v, float) and not v.is_integer()):
            raise self.outside(keys, f"expected a count (a whole number 0..2^53), got {got(v)}")
        return int(v)

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


def over_the_cap() -> str:
    """Why a run past :data:`MAX_REQUESTS` is refused, in every refusal of one."""
    return f"an import holds at most {MAX_REQUESTS:,} requests (about 0.8 KB of memory each): import a shorter run"


def result_json(text: str | bytes, where: str) -> Any:
    """A result file's JSON (strictly, :func:`~day0.core.inputs.strict_json`), each list of numbers
    at its top level (one entry a request in a vLLM result) refused past :data:`MAX_REQUESTS` entries
    before it is built. A count checked after the parse came after its memory: 1,000,001 requests of
    one gap each (41 MB) peaked at 549 MB to be refused (135 MB now), about 0.5 KB a request, so a
    file at the size cap could take some 6 GB."""
    return strict_json(text, where, max_entries=MAX_REQUESTS, reason=over_the_cap())


def check_request_count(doc: Doc, keys: tuple[Any, ...], n: int) -> None:
    """Refuse (one line naming ``keys``, the count and the cap) a run of more than
    :data:`MAX_REQUESTS` requests: what an import holds grows with the count, not the file's bytes."""
    if n > MAX_REQUESTS:
        raise doc.fail(keys, f"{n:,} requests; {over_the_cap()}")


def check_tokens(doc: Doc, keys: tuple[Any, ...], claimed: int, at_least: int, messages: int) -> None:
    """A request's output token count against what its stream carried: at least ``at_least`` (one per
    inter-token gap the file records), at most :data:`MAX_TOKENS_PER_MESSAGE` per token-carrying message."""
    if claimed < at_least:
        raise doc.outside(keys, f"{claimed} output tokens, but the file records {at_least} inter-token gaps "
                                "of this request (at least one token each)")
    if claimed > MAX_TOKENS_PER_MESSAGE * messages:
        raise doc.outside(keys, f"{claimed} output tokens over {messages} streamed messages: more than "
                                f"{MAX_TOKENS_PER_MESSAGE} per message cannot be true (its TPOT would shrink toward 0)")


def check_window(doc: Doc, r: RequestResult, sent_keys: tuple[Any, ...], last_keys: tuple[Any, ...],
                 start: float, end: float) -> RequestResult:
    """``r``, when it lies within the run's window (sent after it began, its last token before it
    ended): a request outside it would be counted in a throughput over a window too short to hold it."""
    if r.sent < start - WINDOW_SLACK_S:
        raise doc.outside(sent_keys, f"sent {start - r.sent:.6g} s before the run's window began "
                                     f"(the window is {end - start:.6g} s)")
    if r.ok and r.e2e is not None and r.scheduled + r.e2e > end + WINDOW_SLACK_S:
        raise doc.outside(last_keys, f"its last token came {r.scheduled + r.e2e - end:.6g} s after the run's "
                                     f"window ended (the window is {end - start:.6g} s)")
    return r


def holding_window(results: list[RequestResult], start: float, end: float) -> tuple[float, float]:
    """The run's window, widened where needed to hold its requests. :func:`check_window` admits a
    request up to ``WINDOW_SLACK_S`` outside it (a tool's clocks and rounding), which for a window
    of microseconds is all of it: a file claiming 300 requests of 0.5 ms in a window of 1e-9 s read
    as 3e11 req/s. A throughput is over at least the span its requests took."""
    first = min((r.sent for r in results), default=start)
    last = max((r.scheduled + r.e2e for r in results if r.ok and r.e2e is not None), default=end)
    return min(start, first), max(end, last)


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
