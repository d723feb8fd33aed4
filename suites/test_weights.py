"""Stage 1 - weights: the shards are complete and consistent, and the engine loaded them right."""

import pytest

pytestmark = [pytest.mark.day0, pytest.mark.weights]

SMOKE_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says"]
SMOKE_TOKENS = 16


def test_engine_is_live(engine, day0_checks):
    """Smoke: greedy decoding of fixed prompts returns the requested tokens, twice the same."""
    first = engine.greedy(SMOKE_PROMPTS, SMOKE_TOKENS)
    second = engine.greedy(SMOKE_PROMPTS, SMOKE_TOKENS)
    counts = [c.completion_tokens for c in first + second]
    short = [n for n in counts if n != SMOKE_TOKENS]
    day0_checks.measured(
        "weights.smoke.tokens", "Greedy decoding returns the requested number of tokens",
        len(short), 0, unit="requests", direction="exact", source=engine.view,
        message=(f"every request returned {SMOKE_TOKENS} tokens" if not short
                 else f"{len(short)} of {len(counts)} requests returned {short} tokens, not {SMOKE_TOKENS}"),
        evidence={"completion_tokens": counts},
    )
    differ = [p for p, a, b in zip(SMOKE_PROMPTS, first, second)
              if (a.token_ids, a.text) != (b.token_ids, b.text)]
    day0_checks.measured(
        "weights.smoke.deterministic", "Greedy decoding is deterministic across two passes",
        len(differ), 0, unit="prompts", direction="exact", source=engine.view,
        message=("greedy tokens identical across two passes" if not differ
                 else f"greedy tokens differ between passes for {differ}"),
        evidence={"prompts": SMOKE_PROMPTS, "token_ids": [c.token_ids for c in first],
                  "text": [c.text for c in first]},
    )
