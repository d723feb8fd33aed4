"""The engine's OpenAI-compatible API as the handles call it: JSON over HTTP, greedy completions,
and the bearer header for a deployment that wants one."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from day0.config.profile import Profile
from day0.engine.handle import Completion, EngineError


def api_key(profile: Profile) -> str | None:
    """The key every request to the engine carries, or None for an open deployment.

    ``engine.api_key_env`` names a variable (the key itself never sits in a profile that is shared);
    a server day0 starts with ``engine.args.api_key`` is called with that key. Raises
    :class:`EngineError` when the named variable is not set: 401s on every request would say less.
    """
    name = profile.engine.api_key_env
    if name:
        key = os.environ.get(name)
        if not key:
            raise EngineError(f"engine.api_key_env: environment variable {name} is not set "
                              f"(export it, or remove engine.api_key_env for an open deployment)")
        return key
    key = profile.engine.args.get("api_key")
    if isinstance(key, list):  # vLLM's --api-key takes several; any one of them opens the door
        key = key[0] if key else None
    return str(key) if key and profile.engine.mode != "external" else None


def auth_headers(profile: Profile) -> dict[str, str]:
    """The bearer header for :func:`api_key`; the one place a request to the engine gets its key."""
    key = api_key(profile)
    return {"Authorization": f"Bearer {key}"} if key else {}


def http_json(url: str, payload: dict[str, Any] | None = None, *, timeout: float = 120.0,
              headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def http_greedy(base_url: str, model: str, prompt: str, max_tokens: int, *, timeout: float,
                headers: dict[str, str] | None = None, logprobs: int = 0) -> Completion:
    """One greedy completion; with ``logprobs`` > 0 each step's top logprobs keyed by token id
    (``return_tokens_as_token_ids``: decoded strings would merge distinct byte-level tokens)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                            "ignore_eos": True, "return_token_ids": True}
    if logprobs:
        body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
    out = http_json(base_url + "/v1/completions", body, timeout=timeout, headers=headers)
    choice = out["choices"][0]
    top = None
    if logprobs:
        steps = (choice.get("logprobs") or {}).get("top_logprobs") or []
        top = [{_token_id(k): float(v) for k, v in (step or {}).items()} for step in steps]
    return Completion(text=choice.get("text", ""), token_ids=choice.get("token_ids"),
                      completion_tokens=int(out["usage"]["completion_tokens"]), top_logprobs=top,
                      prompt_token_ids=choice.get("prompt_token_ids"))


def _token_id(key: str) -> int:
    """``"token_id:42"`` (vLLM's spelling with ``return_tokens_as_token_ids``) -> 42."""
    return int(str(key).rpartition(":")[2])
