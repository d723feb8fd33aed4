"""/v1/chat/completions and /tokenize as an agent's client sees them: one reply per request, the
streamed one assembled from its deltas the way OpenAI's SDK assembles them (tool-call fragments
joined per ``index``), so a streamed and a whole reply compare field by field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from day0.client.stream import data_events
from day0.engine import Endpoint


class ChatError(RuntimeError):
    """A request the server refused or failed; the message is one line naming the URL."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str


@dataclass
class Reply:
    content: str | None = None
    reasoning: str | None = None
    calls: list[Call] = field(default_factory=list)
    finish_reason: str | None = None
    streamed: bool = False


# What a request can raise on the way: the connection, a timeout, a body that is not the JSON expected
_REQUEST_ERRORS = (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError)


@contextlib.contextmanager
def _one_line(url: str) -> Iterator[None]:
    """Any failure of a request to ``url`` as a ChatError of one line naming it."""
    try:
        yield
    except _REQUEST_ERRORS as exc:
        raise ChatError(f"{url}: {type(exc).__name__}: {exc}") from None


async def _post(session: aiohttp.ClientSession, endpoint: Endpoint, path: str, body: dict[str, Any]) -> Any:
    url = endpoint.url(path)
    async with session.post(url, json=body, headers=endpoint.headers) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise ChatError(f"{url}: HTTP {resp.status}: {' '.join(text[:240].split())}")
    return json.loads(text)


def _message_reply(data: dict[str, Any]) -> Reply:
    choice = data["choices"][0]
    msg = choice.get("message") or {}
    calls = [Call(str((c.get("function") or {}).get("name") or ""), str((c.get("function") or {}).get("arguments") or ""))
             for c in msg.get("tool_calls") or []]
    return Reply(msg.get("content"), msg.get("reasoning") or msg.get("reasoning_content"), calls,
                 choice.get("finish_reason"))


class _Assembly:
    """Deltas folded into one reply: text appended, tool calls joined per index."""

    def __init__(self) -> None:
        self.reply = Reply(streamed=True)
        self.calls: dict[int, dict[str, str]] = {}

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self.reply.content = (self.reply.content or "") + delta["content"]
        thought = delta.get("reasoning") or delta.get("reasoning_content")
        if thought:
            self.reply.reasoning = (self.reply.reasoning or "") + thought
        for part in delta.get("tool_calls") or []:
            slot = self.calls.setdefault(int(part.get("index", 0)), {"name": "", "arguments": ""})
            fn = part.get("function") or {}
            slot["name"] += fn.get("name") or ""  # joined, as the SDK's accumulate_delta joins every string field
            slot["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            self.reply.finish_reason = choice["finish_reason"]

    def done(self) -> Reply:
        self.reply.calls = [Call(c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]
        return self.reply


async def _streamed(session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]) -> Reply:
    url = endpoint.url("/v1/chat/completions")
    assembly = _Assembly()
    async with session.post(url, json={**body, "stream": True}, headers=endpoint.headers) as resp:
        if resp.status != 200:
            raise ChatError(f"{url}: HTTP {resp.status}: {' '.join((await resp.text())[:240].split())}")
        async for data in data_events(resp):
            obj = json.loads(data)
            if "error" in obj:
                raise ChatError(f"{url}: error event in the stream: {str(obj['error'])[:240]}")
            for choice in obj.get("choices") or []:
                assembly.add(choice)
    return assembly.done()


async def chat(session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any], *,
               stream: bool = False) -> Reply:
    """One chat completion (``model`` filled in); ChatError in one line when it fails."""
    body = {"model": endpoint.model, **body}
    with _one_line(endpoint.url("/v1/chat/completions")):
        if stream:
            return await _streamed(session, endpoint, body)
        return _message_reply(await _post(session, endpoint, "/v1/chat/completions", body))


async def chat_many(session: aiohttp.ClientSession, endpoint: Endpoint, bodies: Sequence[dict[str, Any]],
                    concurrency: int) -> list[Reply | ChatError]:
    """Every body, ``concurrency`` in flight; a failed request is its ChatError in its place."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> Reply | ChatError:
        async with gate:
            try:
                return await chat(session, endpoint, body)
            except ChatError as exc:
                return exc

    return list(await asyncio.gather(*(one(b) for b in bodies)))


async def tokenize_chat(session: aiohttp.ClientSession, endpoint: Endpoint, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None) -> list[int]:
    """The token ids the server renders for a conversation (its chat template, generation prompt on)."""
    body: dict[str, Any] = {"model": endpoint.model, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    with _one_line(endpoint.url("/tokenize")):
        data = await _post(session, endpoint, "/tokenize", body)
        return [int(t) for t in data["tokens"]]


async def complete_ids(session: aiohttp.ClientSession, endpoint: Endpoint, prompt_ids: list[int],
                       sampling: dict[str, Any]) -> tuple[str, str | None]:
    """(text, finish reason) of /v1/completions on token ids: a chat request's output unparsed."""
    body = {"model": endpoint.model, "prompt": prompt_ids, **sampling}
    with _one_line(endpoint.url("/v1/completions")):
        choice = (await _post(session, endpoint, "/v1/completions", body))["choices"][0]
        return str(choice.get("text") or ""), choice.get("finish_reason")


async def token_id(session: aiohttp.ClientSession, endpoint: Endpoint, text: str) -> int | None:
    """The id of ``text`` when the server's tokenizer holds it as one token, else None."""
    with _one_line(endpoint.url("/tokenize")):
        data = await _post(session, endpoint, "/tokenize", {"model": endpoint.model, "prompt": text,
                                                             "add_special_tokens": False})
        ids = [int(t) for t in data["tokens"]]
    return ids[0] if len(ids) == 1 else None
