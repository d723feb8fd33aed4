"""Where a stage sends its requests: the engine's URL, the served model's name, the bearer
header and the request timeout, built once per engine.

This is the only module that reads the engine's key (``engine.api_key_env`` names the variable
that holds it; a server day0 starts with ``engine.args.api_key`` is called with that key), so a
stage never touches the profile's key settings or the environment for them; the architecture
test (tests/harness/test_architecture.py) holds every other module to that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from day0.client.stream import ClientOptions, make_session
from day0.config.profile import Profile, shown_variable
from day0.engine.handle import Completion, EngineError
from day0.engine.http_api import http_greedy, http_json


def api_key(profile: Profile) -> str | None:
    """The key every request to the engine carries, or None for an open deployment.

    Raises :class:`EngineError` when ``engine.api_key_env`` names a variable that is not set: 401s
    on every request would say less.
    """
    name = profile.engine.api_key_env
    if name:
        key = os.environ.get(name)
        if not key:
            raise EngineError(f"engine.api_key_env: environment variable {shown_variable(name)} is not set "
                              f"(export it, or remove engine.api_key_env for an open deployment)")
        return key
    key = profile.engine.args.get("api_key")
    if isinstance(key, list):  # vLLM's --api-key takes several; any one of them opens the door
        key = key[0] if key else None
    return str(key) if key and profile.engine.mode != "external" else None


@dataclass(frozen=True)
class Endpoint:
    """The engine's OpenAI-compatible API as a stage calls it. ``headers`` and ``key`` are kept
    out of ``repr`` so an endpoint in a traceback or a log line shows no secret."""

    base_url: str
    model: str
    timeout_s: float = 120.0
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    key: str | None = field(default=None, repr=False)  # for tools that take the key itself (lm-eval)

    @classmethod
    def for_profile(cls, profile: Profile, base_url: str, model: str) -> Endpoint:
        key = api_key(profile)
        return cls(base_url.rstrip("/"), model, float(profile.engine.request_timeout_s),
                   {"Authorization": f"Bearer {key}"} if key else {}, key)

    def url(self, path: str) -> str:
        return self.base_url + path

    def session(self) -> aiohttp.ClientSession:
        """An aiohttp session shaped like the load generator's, timed out by this endpoint's request
        timeout: what a stage's own requests use (parity, agents)."""
        return make_session(ClientOptions(request_timeout_s=self.timeout_s, stall_timeout_s=self.timeout_s))

    def json(self, path: str, payload: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        return http_json(self.url(path), payload, timeout=self.timeout_s if timeout is None else timeout,
                         headers=self.headers)

    def greedy(self, prompt: str, max_tokens: int, *, logprobs: int = 0) -> Completion:
        return http_greedy(self.base_url, self.model, prompt, max_tokens, timeout=self.timeout_s,
                           headers=self.headers, logprobs=logprobs)
