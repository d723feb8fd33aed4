"""The engine's OpenAI-compatible API at its lowest: JSON over HTTP and greedy completions. The
headers come from the caller (:class:`day0.engine.endpoint.Endpoint` holds them)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from day0.engine.handle import Completion


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
