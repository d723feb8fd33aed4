"""Speculative decoding's acceptance from vLLM's /metrics counters: the one definition of each
figure (docs/metrics.md, "Speculative decoding"), read by every stage that measures it.

The parity stage takes the counters' change around its own speculative requests, the latency stage
around its measured workload; both are vLLM's own arithmetic (v1/spec_decode/metrics.py) over the
window between two scrapes:

* acceptance rate = accepted tokens / drafted tokens;
* mean acceptance length = 1 + accepted tokens / drafts (the bonus token counts: 1.0 = no draft
  ever accepted);
* acceptance at position k = accepted at k / drafts.

It lives below the stages (it only parses /metrics text, through ``day0.client.prom``) so that no
stage imports another to share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from day0.client.prom import PromError, parse_counters, samples

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
LABEL = "speculative decoding"  # every acceptance check's message starts with it: a failure names the feature


@dataclass
class Acceptance:
    """The counters' change over a window, and vLLM's figures from it."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: dict[int, float] = field(default_factory=dict)  # position -> accepted there

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    def per_position_rate(self) -> dict[int, float]:
        return {k: v / self.drafts for k, v in sorted(self.per_position.items())} if self.drafts > 0 else {}

    def summary(self) -> str:
        """The counts behind the figures and the per-position rates, for a check's message: a
        collapse after position 0 (vLLM #33497, #51009) reads off it without opening the evidence."""
        pos = ", ".join(f"{k}: {v:.2f}" for k, v in self.per_position_rate().items())
        return (f"{self.accepted:g} of {self.draft_tokens:g} drafted tokens accepted over {self.drafts:g} drafts; "
                f"per position {pos or 'n/a'}")

    def describe(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "acceptance_rate": self.rate, "mean_acceptance_length": self.mean_length,
                "accepted_per_position": {str(k): v for k, v in sorted(self.per_position.items())},
                "acceptance_per_position": {str(k): v for k, v in self.per_position_rate().items()}}


def _per_position(text: str) -> dict[int, float]:
    """Accepted tokens by draft position; PromError naming the metric for a position that is no
    whole number (vLLM's are 0, 1, ...)."""
    out: dict[int, float] = {}
    for s in samples(text):
        if s.name in (PER_POS + "_total", PER_POS) and "position" in s.labels:
            try:
                k = int(s.labels["position"])
            except ValueError:
                raise PromError(f"{PER_POS}: position {s.labels['position'][:40]!r} is not a whole number") from None
            out[k] = out.get(k, 0.0) + s.value
    return out


def acceptance(before: str | None, after: str) -> Acceptance | None:
    """The acceptance between two /metrics texts (``before`` None: since the server started);
    None when the engine exports no speculative counters. PromError when a counter went down."""
    names = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
    a = parse_counters(after, names)
    if set(a) != set(names):
        return None
    b = parse_counters(before, names) if before is not None else {}
    pa, pb = _per_position(after), _per_position(before) if before is not None else {}
    d = Acceptance(*(a[n] - b.get(n, 0.0) for n in names),
                   per_position={k: v - pb.get(k, 0.0) for k, v in pa.items()})
    if min(d.drafts, d.draft_tokens, d.accepted, *d.per_position.values(), 0.0) < 0:
        raise PromError("vllm:spec_decode_*: counts went down between scrapes (server restarted?)")
    return d
