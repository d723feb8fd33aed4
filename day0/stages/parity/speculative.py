"""Speculative decoding's acceptance from vLLM's /metrics counters, and the token comparison that
holds its greedy output to an independent reference.

Speculation is lossless by construction: the target model verifies every drafted token, so greedy
output with it must equal greedy output without it. The engine cannot turn speculation off per
request, so "without it" is transformers on the same checkpoint (cpu/float32), which shares none
of vLLM's kernels. Acceptance is vLLM's own arithmetic over the counters' change around the
stage's own requests, defined once in ``day0.client.spec_decode`` (the latency stage reads the same
figures over its measured workload).
"""

from __future__ import annotations

from day0.client.prom import PromError
from day0.client.spec_decode import LABEL, Acceptance, acceptance  # noqa: F401  (Acceptance: the stage re-exports it)
from day0.config.parity import ParitySection
from day0.core.record import Check, measured


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
    counts = acc.summary()
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
