"""Prefix-cache correctness probe: the same long prompt twice under a fresh cache salt, cold then warm."""

from __future__ import annotations

import random
import secrets
import urllib.error
from dataclasses import dataclass
from typing import Any, Iterable

from day0.client.kv_metrics import parse_kv_metrics
from day0.stages.kvcache.errors import KvCacheError
from day0.stages.kvcache.exact import engine_max_model_len
from day0.stages.kvcache.workload import KvRequest, check_fits, rejection_from_message


@dataclass(frozen=True)
class PrefixProbe:
    cold_tokens: list[int]
    warm_tokens: list[int]
    cold_cached: int | None  # prefix-cache hit tokens of each request (None: not observable)
    warm_cached: int | None
    prompt_len: int

    @property
    def identical(self) -> bool:
        return self.cold_tokens == self.warm_tokens

    @property
    def first_difference(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.cold_tokens, self.warm_tokens)):
            if a != b:
                return i
        return None if len(self.cold_tokens) == len(self.warm_tokens) else min(len(self.cold_tokens), len(self.warm_tokens))


PROBE_KEYS = "kvcache.prefix_check_tokens + prefix_check_output_tokens"


def probe_prompt(settings: Any, vocab_size: int, special_ids: Iterable[int] = ()) -> list[int]:
    specials = set(special_ids)
    usable = [i for i in range(vocab_size) if i not in specials]
    return random.Random(f"day0-kvcache:{settings.seed}:probe").choices(usable, k=settings.prefix_check_tokens)


def prefix_probe_inprocess(llm: Any, prompt: list[int], max_tokens: int) -> PrefixProbe:
    """The same long prompt twice under a fresh cache salt: cold (nothing cached), then warm."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    salt = secrets.token_hex(8)
    check_fits([KvRequest(0, "probe", prompt, max_tokens)], engine_max_model_len(llm), keys=PROBE_KEYS)
    outs = []
    for _ in range(2):
        (o,) = llm.generate([{"prompt_token_ids": prompt, "cache_salt": salt}], params, use_tqdm=False)
        outs.append(o)
    return PrefixProbe(list(outs[0].outputs[0].token_ids), list(outs[1].outputs[0].token_ids),
                       int(outs[0].num_cached_tokens or 0), int(outs[1].num_cached_tokens or 0), len(prompt))


def prefix_probe_http(base_url: str, model: str, prompt: list[int], max_tokens: int, *, timeout_s: float = 300.0,
                      headers: dict[str, str] | None = None) -> PrefixProbe:
    """The HTTP version; hit tokens come from the /metrics counter around each request (idle engine)."""
    from day0.client.prom import PromError, scrape_sync
    from day0.engine import http_json

    base = base_url.rstrip("/").removesuffix("/v1")
    salt = secrets.token_hex(8)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, "cache_salt": salt}
    tokens: list[list[int]] = []
    cached: list[int | None] = []
    for _ in range(2):
        try:
            before = parse_kv_metrics(scrape_sync(base)).prefix_hits
        except PromError:
            before = None
        try:
            out = http_json(base + "/v1/completions", body, timeout=timeout_s, headers=headers)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            raise rejection_from_message(text, len(prompt) + max_tokens, keys=PROBE_KEYS) or KvCacheError(
                f"{base}/v1/completions: HTTP {exc.code}: {' '.join(text.split())[:300]}") from None
        choice = out["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise KvCacheError(f"{base}: /v1/completions returned no token_ids (return_token_ids unsupported?)")
        tokens.append(list(ids))
        details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            cached.append(int(details["cached_tokens"]))
            continue
        try:
            after = parse_kv_metrics(scrape_sync(base)).prefix_hits
        except PromError:
            after = None
        cached.append(int(after - before) if before is not None and after is not None else None)
    return PrefixProbe(tokens[0], tokens[1], cached[0], cached[1], len(prompt))
