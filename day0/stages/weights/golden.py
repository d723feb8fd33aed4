"""``weights.golden_tokens`` against an independent implementation: the engine's greedy tokens and
logprobs held against transformers on the same checkpoint (or a golden file recorded from a
trusted copy), with near-ties told apart from divergences.

vLLM compared with itself (TP=2 vs TP=1, a second server) shares its kernels, its weight loader
and its rotary code: a bug in any of them passes. transformers shares none of that, so where the
model fits in host memory (the embedded model always) it is the reference; where it does not,
the golden file recorded on a trusted run is. Two correct numerics still part ways where the two
best candidates are nearly tied, so a first difference whose two picks are within the margin in
both distributions is a near-tie (reported, not failed); any other difference is a wrong weight,
kernel or tokenizer, and fails naming the prompt, the position, both tokens and both logprobs. The
margin is how far two correct numerics move a logprob, so equal tokens whose logprobs moved further
fail too: a wrong kernel shows in the numbers before it flips a token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from day0.core.record import Check, measured
from day0.engine.loaded import GOLDEN_PROMPTS, GOLDEN_TOKENS, greedy_logprobs, read_golden
from day0.model.reference import (
    RefSequence,
    compare_all,
    from_completion,
    greedy_reference,
    host_reference_unavailable,
    near_tie_margin,
    summarize,
)
from day0.stages.weights.live import golden_check

TOP_K = 5


def golden_tokens_check(engine_of: Callable[[], Any], golden: str | None, model_dir: Path | None) -> Check:
    """``weights.golden_tokens`` with the best reference this target has: the golden file when the
    profile names one (a trusted copy's tokens, so it also catches bytes that changed since), else
    transformers on the checkpoint when it fits in host memory, else a skip that says why.

    ``engine_of`` gives the engine and is called once the reference is in hand: transformers then
    runs while an early-launched server is still loading (``engine.start_early``)."""
    if golden:
        engine = engine_of()
        check = golden_file_check(engine, golden)
        return check if check is not None else golden_check(engine, golden)
    reason = host_reference_unavailable(model_dir)
    if reason is not None:
        return Check(id="weights.golden_tokens", title="Greedy tokens equal an independent reference",
                     status="skip", source="profile",
                     message=(f"not verified: weights.golden is not set and transformers cannot be the reference "
                              f"here: {reason} (record a golden file where it fits with `day0 weights golden`)"))
    assert model_dir is not None
    return reference_check(engine_of, model_dir)


def margin_for(engine: Any) -> float:
    """The near-tie margin for the engine's dtype (float32 engines are held tighter)."""
    return near_tie_margin(_engine_dtype(engine))


def engine_sequences(engine: Any, refs: Sequence[RefSequence], max_tokens: int,
                     top_k: int = TOP_K) -> list[RefSequence]:
    """The engine's greedy answers to the references' prompts, as :class:`RefSequence` s."""
    outs = greedy_logprobs(engine, [r.prompt for r in refs], max_tokens, top_k)
    seqs = []
    for ref, out in zip(refs, outs):
        prompt_ids = out.prompt_token_ids if out.prompt_token_ids is not None else ref.prompt_ids
        seqs.append(from_completion(ref.prompt, prompt_ids, out.token_ids or [], out.top_logprobs or [],
                                    device=f"vllm/{engine.view}", dtype=_engine_dtype(engine)))
    return seqs


def _engine_dtype(engine: Any) -> str:
    profile = getattr(engine, "profile", None)
    return str(profile.engine.args.get("dtype", "auto")) if profile is not None else "auto"


def reference_check(engine_of: Callable[[], Any], model_dir: Path, *, margin: float | None = None,
                    top_k: int = TOP_K) -> Check:
    """transformers (CPU, float32) on ``model_dir`` computes the golden tokens now; the engine's
    (``engine_of()``, asked for after the reference is computed) must match."""
    t0 = time.perf_counter()
    refs = greedy_reference(model_dir, GOLDEN_PROMPTS, GOLDEN_TOKENS, top_k=top_k)
    seconds = time.perf_counter() - t0
    engine = engine_of()
    return judge(engine, refs, f"the transformers reference ({model_dir}, cpu/float32)",
                 margin=margin_for(engine) if margin is None else margin, top_k=top_k,
                 evidence={"reference": "transformers", "model_dir": str(model_dir),
                           "reference_seconds": round(seconds, 3)})


def golden_file_check(engine: Any, golden: str, *, margin: float | None = None) -> Check | None:
    """The golden file as the reference when it holds logprobs (recorded with transformers);
    None for a tokens-only file, which :func:`~day0.stages.weights.live.golden_check` judges exactly."""
    data = read_golden(Path(golden))
    if not all(isinstance(p.get("sequence"), dict) for p in data["prompts"]):
        return None
    refs = [RefSequence.from_dict(p["sequence"]) for p in data["prompts"]]
    return judge(engine, refs, f"the golden file {golden} ({data.get('reference', 'recorded')})",
                 margin=margin_for(engine) if margin is None else margin, top_k=int(data.get("top_k", TOP_K)),
                 evidence={"reference": "golden file", "golden": golden}, max_tokens=int(data["max_tokens"]))


def judge(engine: Any, refs: Sequence[RefSequence], what: str, *, margin: float, top_k: int,
          evidence: dict[str, Any], max_tokens: int = GOLDEN_TOKENS) -> Check:
    """Diverged prompts against 0; near-ties counted and named, never failed. The margin bounds
    the numbers as well as the picks: equal tokens from logprobs further apart diverge too."""
    mine = engine_sequences(engine, refs, max_tokens, top_k)
    comps = compare_all(refs, mine, margin, drift_limit=margin)
    counts = summarize(comps)
    deltas = [c.max_logprob_delta for c in comps if c.max_logprob_delta is not None]
    table = {"columns": ["prompt", "status", "position", "reference token", "engine token", "reference logprob",
                         "engine logprob", "max |dlogprob| before"],
             "rows": [[c.prompt, c.status, c.position, c.token_a, c.token_b, c.logprob_a, c.logprob_b,
                       c.max_logprob_delta] for c in comps]}
    bad = [c.message for c in comps if c.status == "diverged"]
    ties = [c.message for c in comps if c.status == "near_tie"]
    summary = (f"{counts['match']} match, {counts['near_tie']} near-tie, {counts['diverged']} diverged of "
               f"{len(comps)} prompts x {max_tokens} greedy tokens vs {what} (margin {margin:g} nats; "
               f"max |dlogprob| {max(deltas, default=0.0):.3g})")
    message = (f"{summary}; first divergence: {bad[0]}" if bad
               else summary + (f"; near-tie: {ties[0]}" if ties else ""))
    return measured("weights.golden_tokens", "Greedy tokens equal an independent reference (near-ties allowed)",
                    counts["diverged"], 0, unit="prompts", direction="exact", source=engine.view, message=message,
                    evidence={**evidence, **counts, "margin": margin, "top_k": top_k, "table": table,
                              "comparisons": [c.to_dict() for c in comps]})
