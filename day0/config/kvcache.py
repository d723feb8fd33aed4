"""The profile's ``[kvcache]`` table: the kvcache stage's limits and its long-context workload
(docs/stages/kvcache.md)."""

from __future__ import annotations

from pydantic import Field, model_validator

from day0.config.section import Section

# Tokens the stage's workload may hold (each request's token ids are built in the harness's memory,
# ~36 bytes a token as Python ints): 64 Mi tokens is ~2.4 GB, 35 times a million-token target's
# default workload. A profile past it is refused at load time, before the engine starts.
MAX_WORKLOAD_TOKENS = 1 << 26


def default_context_lengths(target_context: int, output_tokens: int) -> list[int]:
    """target_context, /2, /4, /8 (those longer than the output), when the profile names none."""
    out = [target_context // d for d in (1, 2, 4, 8)]
    return [n for n in out if n > output_tokens] or [target_context]


class KvCacheSection(Section):
    """Limits and the long-context workload of the kvcache stage (docs/stages/kvcache.md)."""

    fragmentation_limit: float = Field(0.05, gt=0, lt=1)
    target_context: int = Field(16384, gt=0, le=1 << 40)
    target_concurrency: int = Field(1, ge=1, le=1 << 30)
    # Workload: total context (prompt + output) of each long request; empty: target_context, /2, /4, /8.
    context_lengths: list[int] = []
    short_requests: int = Field(4, ge=0)  # short requests mixed in (chat-sized)
    short_lengths: list[int] = [256, 1024]  # [lo, hi] total context (prompt + output) of a short request
    shared_prefix_tokens: int = Field(3000, ge=0)  # 0: no shared-prefix requests
    shared_prefix_requests: int = Field(2, ge=0)  # requests starting with that one prefix
    output_tokens: int = Field(160, ge=3)  # per request (ignore_eos); must outlast the prefill of the rest
    workload_timeout_s: float = Field(600.0, gt=0)
    # Thresholds
    max_preemptions: int = Field(0, ge=0)
    min_capacity_margin: float = Field(0.0, ge=0)  # KV pool / (target_context x concurrency) - 1
    agreement_limit: float = Field(0.01, gt=0, lt=1)  # |exact - /metrics estimate|, absolute (0.01 = 1 pp)
    # Prefix-cache correctness: greedy tokens of a long prompt, cold then warm
    prefix_check_tokens: int = Field(4096, gt=1)
    prefix_check_output_tokens: int = Field(16, gt=0)
    scrape_interval_s: float = Field(0.05, gt=0)  # /metrics period of the black-box view in the steady window
    blackbox_passes: int = Field(3, ge=1)  # the workload again (fresh cache salt) until enough scrapes resolve
    min_resolved_scrapes: int = Field(5, ge=1)  # resolved /metrics scrapes that end the passes early
    seed: int = 0

    @model_validator(mode="after")
    def _workload(self) -> "KvCacheSection":
        if any(n <= self.output_tokens for n in self.context_lengths):
            raise ValueError(f"context_lengths: every length must exceed output_tokens ({self.output_tokens})")
        if len(self.short_lengths) != 2 or not self.output_tokens < self.short_lengths[0] <= self.short_lengths[1]:
            raise ValueError(f"short_lengths: expected [lo, hi] with output_tokens ({self.output_tokens}) < lo <= hi")
        if self.prefix_check_output_tokens >= self.prefix_check_tokens:
            raise ValueError("prefix_check_output_tokens: must be below prefix_check_tokens")
        self._bounded_workload()
        return self

    def _bounded_workload(self) -> None:
        """The workload's tokens, at most (the default lengths before those no longer than the
        output are dropped), against :data:`MAX_WORKLOAD_TOKENS`, naming the keys that make it."""
        long = sum(self.context_lengths or default_context_lengths(self.target_context, 0))  # 0: none dropped
        parts = {"context_lengths" if self.context_lengths else "target_context (its default lengths)": long,
                 "short_requests x short_lengths[1]": self.short_requests * self.short_lengths[1],
                 "shared_prefix_requests x (shared_prefix_tokens + short_lengths[1])":  # each: the prefix, then a short suffix
                     self.shared_prefix_requests * (self.shared_prefix_tokens + self.short_lengths[1]) if self.shared_prefix_tokens else 0,
                 "prefix_check_tokens": self.prefix_check_tokens}
        total = sum(parts.values())
        if total > MAX_WORKLOAD_TOKENS:
            biggest = max(parts, key=lambda k: parts[k])
            raise ValueError(f"the workload would hold {total:,} tokens, over the {MAX_WORKLOAD_TOKENS:,} day0 builds "
                             f"in memory; most from {biggest} ({parts[biggest]:,})")
