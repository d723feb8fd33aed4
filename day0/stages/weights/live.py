"""What the running engine loaded, as the user sees it: greedy smoke decoding, start-up time, and
greedy tokens against a golden file recorded from a trusted run.

Every check records the engine view its tokens came from (``engine.view``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from day0.core.record import Check, measured
from day0.engine.loaded import read_golden

SMOKE_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says"]
SMOKE_TOKENS = 16


def smoke_checks(engine: Any) -> list[Check]:
    """``weights.smoke.tokens`` and ``weights.smoke.deterministic``: two greedy passes of fixed prompts."""
    first = engine.greedy(SMOKE_PROMPTS, SMOKE_TOKENS)
    second = engine.greedy(SMOKE_PROMPTS, SMOKE_TOKENS)
    counts = [c.completion_tokens for c in first + second]
    short = [n for n in counts if n != SMOKE_TOKENS]
    tokens = measured(
        "weights.smoke.tokens", "Greedy decoding returns the requested number of tokens",
        len(short), 0, unit="requests", direction="exact", source=engine.view,
        message=(f"every request returned {SMOKE_TOKENS} tokens" if not short
                 else f"{len(short)} of {len(counts)} requests returned {short} tokens, not {SMOKE_TOKENS}"),
        evidence={"completion_tokens": counts},
    )
    differ = [p for p, a, b in zip(SMOKE_PROMPTS, first, second)
              if (a.token_ids, a.text) != (b.token_ids, b.text)]
    deterministic = measured(
        "weights.smoke.deterministic", "Greedy decoding is deterministic across two passes",
        len(differ), 0, unit="prompts", direction="exact", source=engine.view,
        message=("greedy tokens identical across two passes" if not differ
                 else f"greedy tokens differ between passes for {differ}"),
        evidence={"prompts": SMOKE_PROMPTS, "token_ids": [c.token_ids for c in first],
                  "text": [c.text for c in first]},
    )
    return [tokens, deterministic]


def load_time_check(engine: Any, limit_s: float | None) -> Check:
    """``weights.load_time``: engine start-up, weight loading included, against ``limit_s`` (if set)."""
    info = engine.info
    return measured("weights.load_time", "Engine start-up including weight loading",
                    round(info.startup_s, 2), limit_s, unit="s",
                    direction="lower_is_better", source=engine.view, evidence={"mode": info.mode},
                    performance=True)


def golden_check(engine: Any, golden: str) -> Check:
    """``weights.golden_tokens``: greedy tokens equal the golden file at ``golden``, prompt by prompt."""
    data = read_golden(Path(golden))
    prompts = [p["prompt"] for p in data["prompts"]]
    outs = list(engine.greedy(prompts, int(data["max_tokens"])))
    outs += [None] * (len(prompts) - len(outs))  # a prompt the engine answered nothing for differs
    differ = [p["prompt"] for p, o in zip(data["prompts"], outs) if o is None or p["token_ids"] != o.token_ids]
    return measured("weights.golden_tokens", "Greedy tokens equal the golden file", len(differ), 0,
                    unit="prompts", direction="exact", source=engine.view,
                    message=("greedy tokens equal the golden file" if not differ
                             else f"greedy tokens differ from {golden} for {differ}"),
                    evidence={"golden": golden})
