"""One feature's comparison judged: two answers of the same prompt, with and without the feature,
near-tie aware with the golden-token rule (day0.model.reference.compare_tokens).

A first difference whose two picks are within the margin in both distributions is a near-tie:
reported, never failed, since two correct numerics part ways there. Anything else, equal tokens
whose logprobs moved further than the margin included (the drift rule), fails and names the
feature, the prompt, the position, both tokens and both logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from day0.client.stream import same_text
from day0.core.record import Check, measured
from day0.core.verdict import NOT_APPLICABLE
from day0.model.reference import TokenComparison, compare_tokens, near_tie_margin, summarize
from day0.stages.parity.answers import Answer
from day0.stages.parity.features import Feature

SOURCE = "http"


def margin_for(args: dict[str, Any], override: float | None) -> float:
    """The near-tie margin: the profile's ``parity.margin``, else the golden-token margin for the
    engine's dtype (:data:`day0.model.reference.NEAR_TIE_MARGINS`)."""
    if override is not None:
        return override
    return near_tie_margin(str(args.get("dtype", "auto")))


def short(prompt: str, n: int = 40) -> str:
    return prompt if len(prompt) <= n else prompt[:n] + "..."


@dataclass
class Pair:
    """The same prompt answered without (``a``) and with (``b``) the feature."""

    a: Answer
    b: Answer
    sides: tuple[str, str]  # what each answer is: ("cold miss", "full hit")


def compare_pair(pair: Pair, margin: float, dtype: str) -> TokenComparison:
    """Tokens and logprobs (near-tie aware), then the finish reason, then the text the server made
    of the same tokens where both sides are a server's (the incremental detokenizer is a suspect of its
    own when streaming; transformers' side has no server text)."""
    ids = pair.a.prompt_ids or pair.b.prompt_ids or []
    a, b = pair.a.sequence(pair.sides[0], dtype), pair.b.sequence(pair.sides[1], dtype)
    a.prompt_ids, b.prompt_ids = list(pair.a.prompt_ids or ids), list(pair.b.prompt_ids or ids)
    comp = compare_tokens(a, b, margin, drift_limit=margin)
    fa, fb = pair.a.finish_reason, pair.b.finish_reason
    if comp.status == "match" and fa != fb:
        comp.status = "diverged"
        comp.message = (f"{short(pair.a.prompt)!r}: finish reason {fa!r} ({pair.sides[0]}) vs {fb!r} "
                        f"({pair.sides[1]}) with the same {comp.compared} tokens")
    elif comp.status == "match" and None not in (pair.a.text, pair.b.text) and not same_text(pair.a.text, pair.b.text):
        comp.status = "diverged"
        comp.message = (f"{short(pair.a.prompt)!r}: the same {comp.compared} tokens read {short(pair.a.text)!r} "
                        f"({pair.sides[0]}) vs {short(pair.b.text)!r} ({pair.sides[1]})")
    return comp


def feature_check(feature: Feature, pairs: Sequence[Pair], margin: float, dtype: str, *,
                  note: str = "", evidence: dict[str, Any] | None = None) -> Check:
    """``parity.<feature>``: diverged prompts against 0, near-ties counted and named."""
    comps = [compare_pair(p, margin, dtype) for p in pairs]
    for p, c in zip(pairs, comps):  # the message must keep the position, tokens and logprobs in one line
        c.message = c.message.replace(repr(p.a.prompt), repr(short(p.a.prompt)))
    counts = summarize(comps)
    bad = [c.message for c in comps if c.status == "diverged"]
    ties = [c.message for c in comps if c.status == "near_tie"]
    deltas = [c.max_logprob_delta for c in comps if c.max_logprob_delta is not None]
    summary = (f"{feature.label}: {counts['match']} match, {counts['near_tie']} near-tie, {counts['diverged']} "
               f"diverged of {len(comps)} ({feature.compared_against}; margin {margin:g} nats, "
               f"max |dlogprob| {max(deltas, default=0.0):.3g})")
    if bad:
        message = f"{feature.label} changes the output: {bad[0]}; {summary}"
    else:
        message = summary + (f"; near-tie: {ties[0]}" if ties else "")
    if note:
        message += f"; {note}"
    table = {"columns": ["prompt", "sides", "status", "position", "token without", "token with",
                         "logprob without", "logprob with", "finish reasons"],
             "rows": [[p.a.prompt[:60], " vs ".join(p.sides), c.status, c.position, c.token_a, c.token_b,
                       c.logprob_a, c.logprob_b, f"{p.a.finish_reason} / {p.b.finish_reason}"]
                      for p, c in zip(pairs, comps)]}
    return measured(f"parity.{feature.name}", f"Output with {feature.label} equals without it (near-ties allowed)",
                    counts["diverged"], 0, unit="prompts", direction="exact", source=SOURCE, message=message,
                    evidence={**(evidence or {}), **counts, "feature": feature.describe(), "margin": margin,
                              "table": table, "comparisons": [c.to_dict() for c in comps]})


def not_in_force(feature: Feature) -> Check:
    """A feature the deployment does not turn on: a skip that says so, never a pass, marked as not
    applying to this target (its headline figure, if any, is left out rather than shown absent)."""
    return Check(id=f"parity.{feature.name}", title=f"Output with {feature.label} equals without it",
                 status="skip", source="profile", evidence={NOT_APPLICABLE: True},
                 message=f"not in force: {feature.source}; nothing to compare")


def unmeasured(feature: Feature, why: str) -> Check:
    """The comparison could not be made (a request failed, the cache never hit): an error, not a verdict."""
    return Check(id=f"parity.{feature.name}", title=f"Output with {feature.label} equals without it",
                 status="error", source=SOURCE, message=f"{feature.label}: not compared: {why}",
                 evidence={"feature": feature.describe()})
