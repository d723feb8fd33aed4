"""One streaming request against an OpenAI-compatible completion endpoint, timed per message.

Every request carries two clocks: the time it was *scheduled* (the arrival process said "now")
and the time it was actually sent. Latencies are measured from the scheduled time, so a client
that falls behind (a full concurrency cap, a slow event loop) shows up as latency instead of
silently lowering the offered load (coordinated omission). The lag between the two is kept per
request so a person can tell client queueing from server queueing.

A streamed message counts as carrying tokens by the best evidence the server gives, in order:
``token_ids`` on the choice (vLLM ``return_token_ids``), the growth of the cumulative
``usage.completion_tokens`` (vLLM ``continuous_usage_stats``), else one token per message whose
choice carries a text/content field, even an empty one (as vLLM's bench counts them: a token that
decodes to half a UTF-8 character arrives with empty text); a message carrying several tokens then
counts as one, so the result says which source was used. The evidence may change from message to
message; each token is counted once (``TokenAccountant``).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Literal

import aiohttp

from day0.client.prom import read_answer
from day0.client.sse import SSEError, SSEParser
from day0.client.wire import KEEPALIVE_S, StreamPool, WireError, request_head
from day0.client.workload import Request
from day0.core.numbers import token_count

Endpoint = Literal["completions", "chat"]
# Per-message token-count evidence, strongest first; a request reports its weakest source.
TOKEN_SOURCES: tuple[str, ...] = ("token_ids", "continuous_usage", "content")
ERROR_KINDS: tuple[str, ...] = (
    "http_error",       # non-200 status (reason carries the code: http_500)
    "connection",       # could not connect / connection reset before a response
    "dropped_stream",   # the stream ended (or broke) before data: [DONE]
    "malformed_event",  # a data: line that is not JSON, or not the shape and counts a stream's event has
    "server_error",     # a JSON error object inside the stream
    "timeout",          # total timeout, or no bytes for stall_timeout_s
    "no_tokens",        # a complete stream that carried no generated token
    "client_error",     # the client could not make or read the request (bad URL, framing, anything else)
)


# --------------------------------------------------------------------------- one request


@dataclass
class ClientOptions:
    """How requests are shaped and how long the client waits."""

    endpoint: Endpoint = "completions"
    ignore_eos: bool = True
    continuous_usage: bool = True  # vLLM: usage on every chunk -> exact tokens per message
    return_token_ids: bool = False  # vLLM: token ids on every chunk (stronger than usage)
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float = 300.0  # from send to the end of the stream
    stall_timeout_s: float = 60.0  # longest silence between two reads
    connect_timeout_s: float = 10.0


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times are seconds; ``msg_t`` is relative to scheduled.

    Slotted: an import holds one per request of the file (a million at the cap), and a per-instance
    ``__dict__`` was the largest part of each; nothing sets an attribute that is not a field. Load
    workers send it as JSON (``asdict``, ``RequestResult(**d)``), and it still pickles."""

    index: int
    phase: str
    scheduled: float  # perf_counter at which the arrival process wanted it sent
    sent: float  # perf_counter when it was handed to the HTTP client
    input_len: int
    expected_output_len: int
    ok: bool = False
    error: str | None = None  # one of ERROR_KINDS
    reason: str = ""  # the specific reason: http_500, stalled 2.0 s, ...
    finished: float = 0.0  # perf_counter when the stream ended (or failed)
    msg_t: list[float] = field(default_factory=list)  # token-carrying messages, s after scheduled
    msg_n: list[int] = field(default_factory=list)  # tokens in each of those messages
    output_tokens: int = 0  # server usage.completion_tokens when given, else sum(msg_n)
    output_tokens_source: str = "usage"  # usage | messages
    prompt_tokens: int | None = None
    token_source: str = "content"  # weakest evidence used for a message's token count
    count_mismatch: bool = False  # per-message counts disagree with the final usage (see _mismatch)
    shard: int = 0  # the shard (load worker) that drove it: whose loop's stalls it sat through
    # seconds its driving loop did not run between its scheduled send and the read of its first token,
    # and of its last (day0.client.loadgen.LoopWatch.stamp): what its TTFT and E2E hold of the client's
    stalled_to_first: float = 0.0
    stalled_to_last: float = 0.0

    @property
    def send_lag(self) -> float:
        return self.sent - self.scheduled

    @property
    def ttft(self) -> float | None:
        return self.msg_t[0] if self.msg_t else None

    @property
    def e2e(self) -> float | None:
        return self.msg_t[-1] if self.msg_t else None


def build_payload(req: Request, model: str, opts: ClientOptions) -> dict[str, Any]:
    stream_options: dict[str, Any] = {"include_usage": True}
    if opts.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    payload: dict[str, Any] = {"model": model, "stream": True, "stream_options": stream_options}
    if opts.endpoint == "chat":
        content = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        payload["messages"] = [{"role": "user", "content": content}]
        payload["max_completion_tokens"] = req.output_len
    else:
        payload["prompt"] = req.prompt
        payload["max_tokens"] = req.output_len
    if opts.ignore_eos:
        payload["ignore_eos"] = True
    if opts.return_token_ids:
        payload["return_token_ids"] = True
    payload.update(opts.extra_body)
    return payload


def requested_choices(payload: dict[str, Any]) -> int:
    """The choices a request asks for (``n``, which ``extra_body`` may set; 1 otherwise)."""
    n = payload.get("n")
    return min(n, MAX_CHOICES) if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def max_output_tokens(payload: dict[str, Any]) -> int | None:
    """The most completion tokens a server may count for a request with this body: its
    ``max_tokens`` or ``max_completion_tokens`` (the larger where ``extra_body`` set both), times
    ``n`` choices; None when neither is a whole number (no bound is known)."""
    caps = [v for v in (payload.get("max_tokens"), payload.get("max_completion_tokens"))
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    if not caps:
        return None
    return max(caps) * requested_choices(payload)


def endpoint_url(base_url: str, endpoint: Endpoint) -> str:
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return f"{base}/v1/chat/completions" if endpoint == "chat" else f"{base}/v1/completions"


class _Failed(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _delta_text(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if text:
        return text
    delta = choice.get("delta")
    if delta:
        for key in ("content", "reasoning_content", "reasoning"):
            v = delta.get(key)
            if v:
                return v
        if delta.get("tool_calls"):
            return "<tool_call>"
    return ""


class TokenAccountant:
    """Per stream: how many generated tokens each ``data:`` payload carries, by the best evidence.

    ``token_ids`` on the choice beats the growth of cumulative ``usage.completion_tokens``
    (continuous usage), which beats "a message with a text field is one token" (empty text too, as
    vLLM's bench counts it); ``weakest`` remembers the weakest evidence used. A role-only chat
    chunk is no token under any of them. A usage-only chunk (``choices: []``) carries the final
    totals. Error objects and bad shapes raise ``_Failed`` so the request is counted as failed,
    never averaged in.

    A stream may mix the three, message by message (usage on some chunks only, or only on the closing
    ``delta: {}`` as older llama.cpp servers send it), so a usage's growth is measured from
    ``own``, the tokens already given to that choice's messages by any evidence, never from the
    previous usage alone: that counted every token a text or token-id message had carried a second
    time when the next usage arrived. Per choice, because with ``n`` > 1 vLLM's usage on a choice's
    chunk is that choice's own count: measured from all choices' tokens, every chunk of the second
    choice was no token. A usage below what its choice was already given is a disagreement the
    result flags (``behind``, into ``count_mismatch``); without a usage-only chunk, in a stream of one
    choice, the last usage a choice carried is the stream's total (older llama.cpp servers put it on
    their closing ``delta: {}``).

    ``max_tokens`` (the request's own) bounds every count the server gives: a cumulative or final
    ``completion_tokens``, token ids adding up, or messages counted one token each, past it cannot be
    true, and is the request's malformed_event rather than a throughput 100 times too high (a final
    usage of 400 after 4 streamed tokens, or 400 text messages where 2 tokens were asked for) or a
    per-token list of 10**9 values (a usage jumping to 10**9).
    """

    __slots__ = ("own", "ids", "grown", "texts", "closed", "weakest", "final_tokens", "last_usage", "behind",
                 "several", "prompt_tokens", "max_tokens", "choices")

    def __init__(self, max_tokens: int | None = None) -> None:
        self.own: dict[int, int] = {}  # per choice index, tokens given to its messages: what its usage grows from
        self.ids = 0  # token ids seen so far
        self.grown = 0  # tokens the growth of usage gave, every choice's
        self.texts = 0  # messages counted one token each (no token ids, no usage on them)
        self.closed: set[int] = set()  # choices whose closing empty message was let past the bound
        self.weakest = 0  # index into TOKEN_SOURCES
        self.final_tokens: int | None = None  # a usage-only chunk's completion_tokens
        self.last_usage: int | None = None  # the last completion_tokens any chunk carried
        self.behind = 0  # the most a usage fell short of the tokens already counted
        self.several = False  # a chunk of a choice other than the first: its last usage is no total
        self.prompt_tokens: int | None = None
        self.max_tokens = max_tokens
        self.choices = MAX_CHOICES  # the request's n, where the caller knows it: an index past it is no choice

    def tokens_in(self, data: str) -> int:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: arrays or objects nested past Python's stack
            raise _Failed("malformed_event", f"malformed event: {data[:80]!r}") from None
        if not isinstance(obj, dict):
            raise _Failed("malformed_event", f"event is not an object: {data[:80]!r}")
        try:
            return self._count(obj)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
            raise _Failed("malformed_event", f"unexpected event shape ({type(exc).__name__}): {data[:80]!r}") from None

    def _count(self, obj: dict[str, Any]) -> int:
        choices = obj.get("choices")
        usage = obj.get("usage")
        if "error" in obj and not choices:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise _Failed("server_error", f"error event: {str(msg)[:160]}")
        has_ct = bool(usage) and usage.get("completion_tokens") is not None
        ct = self._bounded(_count_of(usage, "completion_tokens"), "usage.completion_tokens") if has_ct else 0
        n, index = 0, 0
        if choices:
            choice = choices[0]
            index = _choice_index(choice, self.choices)
            self.several = self.several or index != 0
            before = self.own.get(index, 0)
            tids = choice.get("token_ids")
            if tids is not None:
                n = len(tids)
                self.ids = self._bounded(self.ids + n, "token ids")
            elif has_ct:
                n = max(ct - before, 0)
                self.grown = self._bounded(self.grown + n, "usage.completion_tokens of all choices")
                if n:  # a role chunk's usage of 0 tokens is no evidence the count used
                    self.weakest = max(self.weakest, 1)
            else:
                role_only = _role_only(choice)
                n = 1 if _carries_output(choice) and not role_only else 0
                if n:
                    self.texts += n
                    if _closing_empty(choice) and index not in self.closed:  # one a choice may hold no token:
                        self.closed.add(index)  # it costs no budget, so later tokens of other choices still fit
                    else:
                        self._bounded(self.texts - len(self.closed), "messages counted as tokens")
                if not role_only:
                    self.weakest = 2
            self.own[index] = before + n
        if usage:
            if has_ct:
                self.last_usage = ct
                if choices:
                    self.behind = max(self.behind, self.own[index] - ct)
                else:
                    self.final_tokens = ct
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = _count_of(usage, "prompt_tokens")
        return n

    def total(self) -> int | None:
        """The output tokens usage gives: a usage-only chunk's, else, with one choice, the last usage."""
        return self.final_tokens if self.final_tokens is not None or self.several else self.last_usage

    @property
    def counted(self) -> int:
        """Tokens given to messages so far, every choice's."""
        return sum(self.own.values())

    def usage_behind(self) -> bool:
        """Whether a usage fell short of the tokens its choice's earlier messages carried."""
        return self.behind > 0

    def _bounded(self, count: int, what: str) -> int:
        if self.max_tokens is not None and count > self.max_tokens:
            raise _Failed("malformed_event", f"{what} {count} is past the request's max_tokens {self.max_tokens}")
        return count


# Choices a stream may hold (``n``; vLLM's VLLM_MAX_N_SEQUENCES default): an index past it is no choice
# of any request. It bounds the per-choice counts a server sending a new index every chunk would grow.
MAX_CHOICES = 16384


def _choice_index(choice: dict[str, Any], choices: int) -> int:
    """The choice's ``index`` (0 when absent or null), a whole number below the request's ``choices``;
    else the request's malformed_event: ``0`` and ``"0"`` would count as two choices, ``true`` as the
    second, and a new index on every chunk as that many choices."""
    index = choice.get("index")
    if index is None:
        return 0
    if type(index) is not int or not 0 <= index < choices:
        raise _Failed("malformed_event", f"choice index {str(index)[:40]!r} is not a choice of the request")
    return index


def _count_of(usage: dict[str, Any], key: str) -> int:
    """``usage[key]`` as a token count (``day0.core.numbers.token_count``: a whole number from 0 to
    2**53), else the request's malformed_event naming the key, so the phase's other requests stand."""
    count = token_count(usage[key])
    if count is None:
        raise _Failed("malformed_event", f"usage.{key} is {str(usage[key])[:40]!r}, not a token count")
    return count


_OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def _carries_output(choice: dict[str, Any]) -> bool:
    """Whether a choice holds a generated token, by its text field being there at all: vLLM sends a
    token that decodes to half a UTF-8 character with empty text, so emptiness proves nothing (a
    chunk with only ``finish_reason``, or ``delta: {}``, carries none)."""
    if choice.get("text") is not None:
        return True
    delta = choice.get("delta")
    return bool(delta) and any(delta.get(k) is not None for k in _OUTPUT_FIELDS)


def _closing_empty(choice: dict[str, Any]) -> bool:
    """A message with a finish_reason and no text: counted one token by the rule (vLLM sends a token
    that decodes to half a character as empty text), but a server may also close a stream of
    max_tokens tokens with one, holding none; held to max_tokens, every such request failed."""
    return choice.get("finish_reason") is not None and not _delta_text(choice)


def _role_only(choice: dict[str, Any]) -> bool:
    """A chat chunk that only announces the assistant role: by construction it holds no token."""
    delta = choice.get("delta")
    return bool(delta) and "role" in delta and not _delta_text(choice) and choice.get("text") is None


class _Timer:
    """A 200 answer's reader: SSE framing, then each token-carrying message stamped with the instant
    its chunk came off the socket (``day0.client.wire`` calls it from ``data_received``)."""

    __slots__ = ("res", "acct", "sse", "scheduled", "done")

    def __init__(self, res: RequestResult, scheduled: float) -> None:
        self.res, self.scheduled = res, scheduled
        self.acct, self.sse, self.done = TokenAccountant(), SSEParser(), False

    def __call__(self, chunk: bytes, now: float) -> None:
        try:
            events = self.sse.feed(chunk)
        except SSEError as exc:  # a line or event without end
            raise _Failed("malformed_event", str(exc)) from None
        for ev in events:
            data = ev.data
            if data == "[DONE]":
                self.done = True
                continue
            n = self.acct.tokens_in(data)
            if n > 0:
                self.res.msg_t.append(now - self.scheduled)
                self.res.msg_n.append(n)


async def stream_one(
    streams: StreamPool,
    url: str,
    req: Request,
    model: str,
    opts: ClientOptions,
    *,
    scheduled: float,
    phase: str,
    request_id: str,
) -> RequestResult:
    """Send one streaming request and time every token-carrying message; never raises (but is
    cancellable: its connection closes, so the server aborts the request)."""
    res = RequestResult(req.index, phase, scheduled, 0.0, req.input_len, req.output_len)
    timer = _Timer(res, scheduled)
    perf = time.perf_counter
    res.sent = perf()
    try:
        target = streams.target(url)
        payload = build_payload(req, model, opts)
        timer.acct.max_tokens = max_output_tokens(payload)
        timer.acct.choices = requested_choices(payload)
        body = json.dumps(payload).encode()
        head = request_head(target, {"X-Request-Id": request_id, **opts.headers}, len(body))
        async with asyncio.timeout(opts.request_timeout_s):
            answer = await streams.post(target, head, body, timer, opts.stall_timeout_s)
        if answer.status != 200:
            text = answer.body.decode("utf-8", "replace")[:200]
            raise _Failed("http_error", f"http_{answer.status}: {' '.join(text.split())}")
        if not timer.done:
            cut = " mid-event" if timer.sse.pending else ""
            raise _Failed("dropped_stream", f"stream ended{cut} before [DONE]")
    except (_Failed, WireError) as f:
        res.error, res.reason = f.kind, f.reason
    except TimeoutError:
        res.error, res.reason = "timeout", f"exceeded request_timeout_s={opts.request_timeout_s:g}"
    except Exception as exc:  # a bad URL or header, or anything a server's bytes set off: one failed request
        res.error, res.reason = "client_error", f"{type(exc).__name__}: {str(exc)[:160]}"
    res.finished = perf()
    acct = timer.acct
    res.token_source = TOKEN_SOURCES[acct.weakest]
    res.prompt_tokens = acct.prompt_tokens
    msg_total = sum(res.msg_n)
    final = acct.total()
    if final is not None:
        res.output_tokens = final
        res.output_tokens_source = "usage"
        res.count_mismatch = acct.usage_behind() or _mismatch(acct.weakest, msg_total, res.output_tokens)
    else:
        res.output_tokens = msg_total
        res.output_tokens_source = "messages"
    if res.error is None:
        if not res.msg_t:
            res.error, res.reason = "no_tokens", "stream finished without a generated token"
        else:
            res.ok = True
    return res


def _mismatch(weakest: int, counted: int, usage: int) -> bool:
    """Whether the per-message counts disagree with the final usage. Exact evidence (token ids,
    continuous usage) must add up to it; one token a text message may fall short of it (a server
    sending several tokens a message is legal, and the reason the source is reported), but not pass
    it: each such message is a token by the rule, so more of them than usage counts means the
    per-message figures (TTFT, ITL) are not the tokens usage speaks of. Not a failure: usage still
    gives the totals, and a server may send a closing text message with no token in it."""
    return counted != usage if weakest < 2 else counted > usage


class StreamCut(ValueError):
    """A streamed response that ended before ``data: [DONE]``."""


async def data_events(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """Each event's ``data`` of a streamed response, up to ``[DONE]`` (not yielded); StreamCut when
    the stream ends without it, SSEError (a ValueError) at a line or event past
    ``day0.client.sse.EVENT_MAX_BYTES``. For readers of the payloads (parity, agents); :func:`stream_one`
    keeps its own loop, since it times every chunk as it arrives. Its session's total timeout
    (:func:`make_session`) bounds how long a stream that never ends is read."""
    parser, done = SSEParser(), False
    async for chunk in resp.content.iter_any():
        for ev in parser.feed(chunk):
            if ev.data == "[DONE]":
                done = True
                continue
            yield ev.data
    if not done:
        raise StreamCut(f"the stream ended{' mid-event' if parser.pending else ''} before [DONE]")


REPLACEMENT = "\ufffd"


def same_text(whole: str | None, streamed: str | None) -> bool:
    """Equal once U+FFFD is dropped from both: how a whole and a streamed reply's text compare. A token
    that ends inside a multi-byte UTF-8 character decodes to U+FFFD in a whole reply, while the
    streaming detokenizer holds the bytes back and, when a parser boundary (a think or call tag) comes
    next, never sends them (measured: vLLM 0.32, a random-weight model). Where bytes that never formed
    a character show is not the API's contract."""
    return (whole or "").replace(REPLACEMENT, "") == (streamed or "").replace(REPLACEMENT, "")


def make_streams(opts: ClientOptions) -> StreamPool:
    """The connections of a run's timed requests (:func:`stream_one`); one per run, so warm-up
    leaves warm keep-alive connections for the measurement."""
    return StreamPool(opts.connect_timeout_s)


def make_session(opts: ClientOptions) -> aiohttp.ClientSession:
    """An aiohttp session for the requests day0 makes but does not time: model lists, /metrics,
    the payloads the parity, agents and risks stages read. Idle connections are dropped after
    ``day0.client.wire.KEEPALIVE_S``, under the server's own keep-alive, for the reason given there.
    Each request, its answer read to the end, is bounded by ``request_timeout_s`` as a timed one is:
    a stream dripping an event at a time, inside every read timeout, once held a stage for ever."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S,
                                     enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s, sock_connect=opts.connect_timeout_s,
                                    sock_read=opts.stall_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


async def fetch_models(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """Served model names from /v1/models (the first is vLLM's served model name)."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/models"
    try:
        status, body = await read_answer(session, url)
        if status != 200:
            raise RuntimeError(f"{url}: HTTP {status}")
        return [m["id"] for m in json.loads(body).get("data", [])]
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise RuntimeError(f"{url}: cannot list models ({type(exc).__name__}: {exc}); pass the model name") from None


def token_source(results: Iterable[RequestResult]) -> str:
    """The weakest per-message token evidence any successful request relied on ("none": no success)."""
    worst = -1
    for r in results:
        if r.ok:
            worst = max(worst, TOKEN_SOURCES.index(r.token_source))
    return TOKEN_SOURCES[worst] if worst >= 0 else "none"
