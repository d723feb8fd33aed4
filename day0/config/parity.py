"""The profile's ``[parity]`` table: how the feature-parity stage asks its questions and the limits
of speculative decoding's acceptance (docs/stages/parity.md; the figures in docs/metrics.md,
"Speculative decoding").

Every comparison is greedy with per-step logprobs, so its cost is a handful of short requests;
the sizes below keep the whole stage to seconds on a 2-core box.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from day0.config.section import Section


class ParitySection(Section):
    """Sizes of the parity comparisons and the speculative-decoding limits."""

    max_tokens: int = Field(16, ge=2, le=4096, description="greedy tokens per compared request")
    top_k: int = Field(5, ge=2, le=20, description="logprobs kept per step (a near-tie needs the runner-up)")
    prompt_words: int = Field(48, ge=8, le=100_000, description="words of each prompt: several KV blocks, "
                                                                 "so a cache hit covers whole blocks")
    batch_size: int = Field(8, ge=2, le=1024, description="requests in flight in the batch comparison, "
                                                          "the compared one included")
    # nats; None: 0.001 for a float32 engine, 0.05 otherwise (the golden-token margins,
    # docs/stages/weights.md): how far two correct numerics move a logprob
    margin: Optional[float] = Field(None, ge=0, le=10)
    spec_prompts: int = Field(3, ge=1, le=64, description="prompts of the speculative comparison")
    spec_max_tokens: int = Field(32, ge=2, le=4096, description="greedy tokens per speculative prompt")
    # vLLM's own definitions (v1/spec_decode/metrics.py): accepted / drafted tokens, and
    # 1 + accepted tokens / drafts. A collapse (every draft rejected) gives 0 and 1.0.
    min_acceptance_rate: float = Field(0.1, ge=0, le=1)
    min_mean_acceptance_length: float = Field(1.1, ge=1)
    timeout_s: float = Field(120.0, gt=0, description="for all of one comparison's requests")
    # None: 3/4 of engine.args.max_model_len; 0: not compared (said in parity.features)
    long_context_tokens: Optional[int] = Field(None, ge=0, le=1 << 24,
                                               description="prompt tokens of the long-context comparison")
