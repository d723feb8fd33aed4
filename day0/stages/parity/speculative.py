"""Speculative decoding's acceptance from vLLM's /metrics counters, and the token comparison that
holds its greedy output to an independent reference.

Speculation is lossless by construction: the target model verifies every drafted token, so greedy
output with it must equal greedy output without it. The engine cannot turn speculation off per
request, so "without it" is transformers on the same checkpoint (cpu/float32), which shares none
of vLLM's kernels. Acceptance is vLLM's own arithmetic (v1/spec_decode/metrics.py) over the
counters' change around the stage's own requests:

* acceptance rate = accepted tokens / drafted tokens;
* mean acceptance length = 1 + accepted tokens / drafts (the bonus token counts: 1.0 = no draft
  ever accepted);
* acceptance at position k = accepted at k / drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from day0.client.prom import PromError, parse_counters, samples
from day0.config.parity import ParitySection
from day0.core.record import Check, measured

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
LABEL = "speculative decoding"


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

    def describe(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "acceptance_rate": self.rate, "mean_acceptance_length": self.mean_length,
                "accepted_per_position": {str(k): v for k, v in sorted(self.per_position.items())},
                "acceptance_per_position": {str(k): v for k, v in self.per_position_rate().items()}}


def _per_position(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for s in samples(text):
        if s.name in (PER_POS + "_total", PER_POS) and "position" in s.labels:
            k = int(s.labels["position"])
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


def acceptance_checks(before: str | None, after: str | None, section: ParitySection) -> list[Check]:
    """``parity.speculative.acceptance_rate`` and ``.mean_acceptance_length`` against the profile's limits."""
    ids = ("parity.speculative.acceptance_rate", "parity.speculative.mean_acceptance_length")
    titles = ("Speculative decoding: acceptance rate", "Speculative decoding: mean acceptance length")
    why = None
    acc = None
    try:
        acc = acceptance(before, after) if after is not None else None
    except PromError as exc:
        why = str(exc)
    if acc is None or acc.drafts <= 0:
        why = why or ("/metrics is not served" if after is None else
                      "no vllm:spec_decode_* counters on /metrics" if acc is None else
                      "no draft was proposed during the stage's requests: nothing was speculated")
        return [Check(id=i, title=t, status="error", source="/metrics", message=f"{LABEL}: not measured: {why}")
                for i, t in zip(ids, titles)]
    pos = ", ".join(f"{k}: {v:.2f}" for k, v in acc.per_position_rate().items())
    counts = (f"{acc.accepted:g} of {acc.draft_tokens:g} drafted tokens accepted over {acc.drafts:g} drafts; "
              f"per position {pos or 'n/a'}")
    evidence = acc.describe()
    return [
        measured(ids[0], titles[0], acc.rate, section.min_acceptance_rate, direction="higher_is_better",
                 source="/metrics", evidence=evidence,
                 message=f"{LABEL}: acceptance rate {acc.rate:.3f} (limit >= {section.min_acceptance_rate:g}); {counts}"),
        measured(ids[1], titles[1], acc.mean_length, section.min_mean_acceptance_length, unit="tokens",
                 direction="higher_is_better", source="/metrics", evidence=evidence,
                 message=(f"{LABEL}: mean acceptance length {acc.mean_length:.3f} tokens per step (limit >= "
                          f"{section.min_mean_acceptance_length:g}); {counts}")),
    ]
