"""Greedy answers with per-step logprobs over the engine's HTTP API, streamed or not, one at a time
or many at once: the raw material of every parity comparison.

Streamed answers are read with the project's one SSE framing and token accounting
(``day0.client.loadgen``'s ``SSEParser`` and ``TokenAccountant``: an error event or a malformed
chunk fails the request the same way it fails a latency request); the token ids come from vLLM's
``return_token_ids`` and the logprobs are keyed by id (``return_tokens_as_token_ids``), since
decoded strings would merge distinct byte-level tokens.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import aiohttp

from day0.client.loadgen import TokenAccountant, endpoint_url
from day0.client.prom import PromError, scrape
from day0.client.stream import StreamCut, data_events
from day0.engine import Endpoint
from day0.model.reference import RefSequence, from_completion


class AnswerError(RuntimeError):
    """A request that did not give a usable answer; the message names the URL and the reason."""


@dataclass(frozen=True)
class Ask:
    """One greedy request: its prompt, length and the knobs a comparison varies."""

    prompt: str
    max_tokens: int
    top_k: int
    salt: str | None = None  # vLLM cache_salt: requests with different salts share no KV blocks
    ignore_eos: bool = True


@dataclass
class Answer:
    """What the engine answered to one :class:`Ask`."""

    prompt: str
    tokens: list[int] = field(default_factory=list)
    top: list[dict[int, float]] = field(default_factory=list)  # per step: token id -> logprob
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None
    usage: dict[str, Any] | None = None
    streamed: bool = False
    text: str | None = None  # as the server detokenized it (None: not a server's answer, e.g. transformers')

    def sequence(self, side: str, dtype: str) -> RefSequence:
        """As a :class:`RefSequence`, so :func:`day0.model.reference.compare_tokens` can judge it."""
        top = self.top if len(self.top) == len(self.tokens) else [{} for _ in self.tokens]
        return from_completion(self.prompt, self.prompt_ids or [], self.tokens, top, device=side, dtype=dtype)


def body(endpoint: Endpoint, ask: Ask, *, stream: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": endpoint.model, "prompt": ask.prompt, "max_tokens": ask.max_tokens,
                               "temperature": 0.0, "ignore_eos": ask.ignore_eos, "return_token_ids": True,
                               "logprobs": ask.top_k, "return_tokens_as_token_ids": True, "stream": stream}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if ask.salt is not None:
        payload["cache_salt"] = ask.salt
    return payload


def _token_id(key: str) -> int:
    return int(str(key).rpartition(":")[2])


def _take_choice(answer: Answer, choice: dict[str, Any]) -> None:
    """Add one (whole or streamed) choice's tokens, logprobs, finish reason and prompt ids."""
    answer.tokens.extend(int(t) for t in choice.get("token_ids") or [])
    if "text" in choice:
        answer.text = (answer.text or "") + (choice.get("text") or "")
    steps = (choice.get("logprobs") or {}).get("top_logprobs") or []
    answer.top.extend({_token_id(k): float(v) for k, v in (step or {}).items()} for step in steps)
    if choice.get("finish_reason") is not None:
        answer.finish_reason = choice["finish_reason"]
    if choice.get("prompt_token_ids") and answer.prompt_ids is None:
        answer.prompt_ids = [int(t) for t in choice["prompt_token_ids"]]


async def _whole(session: aiohttp.ClientSession, url: str, endpoint: Endpoint, ask: Ask) -> Answer:
    async with session.post(url, json=body(endpoint, ask, stream=False), headers=endpoint.headers) as resp:
        if resp.status != 200:
            raise AnswerError(f"{url}: HTTP {resp.status}: {' '.join((await resp.text())[:200].split())}")
        data = await resp.json(content_type=None)
    answer = Answer(ask.prompt, usage=data.get("usage"))
    _take_choice(answer, data["choices"][0])
    return answer


async def _streamed(session: aiohttp.ClientSession, url: str, endpoint: Endpoint, ask: Ask) -> Answer:
    answer = Answer(ask.prompt, streamed=True)
    acct = TokenAccountant()
    async with session.post(url, json=body(endpoint, ask, stream=True), headers=endpoint.headers) as resp:
        if resp.status != 200:
            raise AnswerError(f"{url}: HTTP {resp.status}: {' '.join((await resp.text())[:200].split())}")
        try:
            async for data in data_events(resp):
                try:
                    acct.tokens_in(data)
                except Exception as exc:  # loadgen's failure kinds: an error event, a malformed chunk
                    raise AnswerError(f"{url}: {getattr(exc, 'reason', exc)}") from None
                obj = json.loads(data)
                if obj.get("usage"):
                    answer.usage = obj["usage"]
                for choice in obj.get("choices") or []:
                    _take_choice(answer, choice)
        except StreamCut as exc:
            raise AnswerError(f"{url}: {exc}") from None
    return answer


async def ask_one(session: aiohttp.ClientSession, endpoint: Endpoint, ask: Ask, *, stream: bool = False) -> Answer:
    """One greedy completion; AnswerError (one line) when it fails."""
    url = endpoint_url(endpoint.base_url, "completions")
    try:
        answer = await (_streamed if stream else _whole)(session, url, endpoint, ask)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise AnswerError(f"{url}: {type(exc).__name__}: {exc}") from None
    if not answer.tokens:
        raise AnswerError(f"{url}: {ask.prompt[:40]!r}: no token ids in the answer (vLLM's return_token_ids)")
    return answer


async def ask_many(session: aiohttp.ClientSession, endpoint: Endpoint, asks: Sequence[Ask]) -> list[Answer]:
    """All of ``asks`` in flight at once (the engine batches them), answers in the same order."""
    return list(await asyncio.gather(*(ask_one(session, endpoint, a) for a in asks)))


async def metrics_text(session: aiohttp.ClientSession, endpoint: Endpoint) -> str | None:
    """/metrics as text, or None when the deployment does not serve it."""
    try:
        return await scrape(session, endpoint.base_url)
    except PromError:
        return None
