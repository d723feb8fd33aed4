"""vLLM's own communicator path: the greedy tokens of a second engine at another TP size equal the
engine under test's, prompt for prompt (CPU targets, where both fit)."""

from __future__ import annotations

from typing import Any

from day0.core.record import Check, measured

TP_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says"]
TP_TOKENS = 12


def tp_equivalence_check(engine: Any, engines: Any, base_tp: int) -> Check:
    """Greedy tokens of ``engine`` (at ``base_tp``) against a short-lived variant at TP=2 (or TP=1
    when the engine already runs TP>1), started from ``engines`` and stopped before this returns."""
    other_tp = 2 if base_tp == 1 else 1
    reference = engine.greedy(TP_PROMPTS, TP_TOKENS)
    # CPU workers bind OpenMP threads per rank: one core each (shared/notes/vllm-cpu.md)
    with engines.variant(f"tp{other_tp}", {"tensor_parallel_size": other_tp},
                         {"VLLM_CPU_OMP_THREADS_BIND": "0|1"} if other_tp == 2 else None) as other:
        candidate = other.greedy(TP_PROMPTS, TP_TOKENS)
    differ = [p for p, a, b in zip(TP_PROMPTS, reference, candidate) if a.token_ids != b.token_ids]
    return measured(
        f"collectives.engine_tp{other_tp}_matches_tp{base_tp}",
        f"Greedy tokens with TP={other_tp} equal TP={base_tp}", len(differ), 0, unit="prompts",
        direction="exact", source=engine.view,
        message=(f"TP={other_tp} and TP={base_tp} give identical greedy tokens for {len(TP_PROMPTS)} prompts"
                 if not differ else f"TP={other_tp} differs from TP={base_tp} for {differ}"),
        evidence={"prompts": TP_PROMPTS, f"tp{base_tp}": [c.token_ids for c in reference],
                  f"tp{other_tp}": [c.token_ids for c in candidate]},
    )
