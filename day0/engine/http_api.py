"""The engine's OpenAI-compatible API as the handles call it: JSON over HTTP, greedy completions,
and the bearer header for a deployment that wants one."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from day0.config.profile import Profile
from day0.engine.handle import Completion


def auth_headers(profile: Profile) -> dict[str, str]:
    """The bearer header for ``engine.api_key_env`` (the variable's name is in the profile, never the key)."""
    name = profile.engine.api_key_env
    return {"Authorization": f"Bearer {os.environ[name]}"} if name and name in os.environ else {}


def http_json(url: str, payload: dict[str, Any] | None = None, *, timeout: float = 120.0,
              headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def http_greedy(base_url: str, model: str, prompt: str, max_tokens: int, *, timeout: float,
                headers: dict[str, str] | None = None) -> Completion:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    out = http_json(base_url + "/v1/completions", body, timeout=timeout, headers=headers)
    choice = out["choices"][0]
    return Completion(text=choice.get("text", ""), token_ids=choice.get("token_ids"),
                      completion_tokens=int(out["usage"]["completion_tokens"]))
