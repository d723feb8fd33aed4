"""The comparisons held to transformers on the same checkpoint: greedy output under speculation,
and a prompt long enough to be prefilled in chunks or to reach deep positions.

``parity.speculative``: greedy output under speculation held to transformers on the same checkpoint.

vLLM cannot turn speculation off per request, and a second engine without it costs a start-up
(~25-45 s on 2 cores), so the "without" side is the independent reference the weights stage uses
(day0.model.reference.greedy_reference, cpu/float32): lossless speculation gives the reference's
tokens, near-ties aside. Where transformers cannot be the reference on this host, the comparison
is an error that says why (the acceptance figures are still measured).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from day0.core.record import Check
from day0.model.reference import RefSequence, greedy_reference, host_reference_unavailable
from day0.stages.parity.answers import Answer
from day0.stages.parity.compare import Pair, feature_check, unmeasured
from day0.stages.parity.features import Feature


def as_answer(ref: RefSequence) -> Answer:
    """transformers' greedy continuation in the engine's answer shape (it always runs to max tokens)."""
    top = [dict(zip(ids, lps)) for ids, lps in zip(ref.top_ids, ref.top_logprobs)]
    for cells, tok, lp in zip(top, ref.tokens, ref.logprobs):
        cells.setdefault(tok, lp)
    return Answer(ref.prompt, list(ref.tokens), top, "length", list(ref.prompt_ids))


def speculative_check(feature: Feature, answers: Sequence[Answer], model_dir: Path | None, margin: float,
                      dtype: str, top_k: int) -> Check:
    """The engine's speculative greedy answers against transformers' for the same prompts."""
    why = host_reference_unavailable(model_dir)
    if why is not None:
        return unmeasured(feature, f"transformers cannot be the reference here: {why}")
    assert model_dir is not None
    t0 = time.perf_counter()
    try:
        refs = greedy_reference(model_dir, [a.prompt for a in answers], len(answers[0].tokens), top_k=top_k)
    except (OSError, ValueError, RuntimeError) as exc:
        return unmeasured(feature, f"the transformers reference failed: {type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    pairs = [Pair(as_answer(r), a, ("transformers", "vllm+speculation")) for r, a in zip(refs, answers)]
    return feature_check(feature, pairs, margin, dtype, note=f"reference took {seconds:.1f} s",
                         evidence={"reference": "transformers", "model_dir": str(model_dir),
                                   "reference_seconds": round(seconds, 3)})


def long_prompt_check(feature: Feature, text: str, ask_engine: Callable[[], Answer], model_dir: Path | None,
                      margin: float, dtype: str, top_k: int, max_tokens: int, *, min_tokens: int,
                      why_long: str) -> Check:
    """The engine's greedy answer to a long prompt (``ask_engine()``) against transformers' for the
    same ``text``; the prompt must have reached ``min_tokens`` on the engine's side (``why_long``
    says why that many), else the comparison would not exercise the feature.

    The two run side by side: the engine's prefill runs in its own process while transformers
    prefills in this one, so the comparison costs the longer of the two, not their sum (seconds
    for a prompt of thousands of tokens on 2 cores). A failed request raises, as elsewhere."""
    why = host_reference_unavailable(model_dir)
    if why is not None:
        return unmeasured(feature, f"transformers cannot be the reference here: {why}")
    assert model_dir is not None
    failed = ""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(ask_engine)
        t0 = time.perf_counter()
        try:
            ref = greedy_reference(model_dir, [text], max_tokens, top_k=top_k)[0]
        except (OSError, ValueError, RuntimeError) as exc:
            failed = f"the transformers reference failed: {type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - t0
        answer = pending.result()
    if failed:
        return unmeasured(feature, failed)
    served = len(answer.prompt_ids or [])
    if served < min_tokens:
        return unmeasured(feature, f"the prompt was {served} tokens on the engine, not the {min_tokens} "
                                   f"{why_long} needs")
    pair = Pair(as_answer(ref), answer, ("transformers", f"vllm, {served}-token prompt"))
    return feature_check(feature, [pair], margin, dtype, note=f"{served}-token prompt ({why_long}); reference "
                                                              f"took {seconds:.1f} s beside the engine",
                         evidence={"reference": "transformers", "model_dir": str(model_dir), "prompt_tokens": served,
                                   "reference_seconds": round(seconds, 3)})
