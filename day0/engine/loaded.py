"""What the engine actually loaded: weight bytes per rank and greedy tokens against a golden file.

Kept apart from the static audit (day0/stages/weights/audit.py), which reads headers only and needs no engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says",
                  "Tensor parallel ranks exchange"]
GOLDEN_TOKENS = 16


def _weight_bytes(worker: Any) -> dict[str, Any]:  # runs inside each vLLM worker (collective_rpc)
    runner = worker.model_runner
    params = int(sum(p.numel() * p.element_size() for p in runner.model.parameters()))
    loaded = getattr(runner, "model_memory_usage", None)  # GPU runners: device memory the load took
    return {"loaded_bytes": int(loaded) if loaded else None, "parameter_bytes": params}


def weight_bytes_per_rank(llm: Any) -> list[dict[str, Any]]:
    """Per worker: the memory its weight load took (GPU runners record it) and its parameter bytes.

    vLLM's CPU backend repacks linear weights into oneDNN handles and empties their parameters,
    so on CPU ``parameter_bytes`` undercounts and ``loaded_bytes`` is None: there is no honest
    per-rank figure to compare with the plan.
    """
    return list(llm.collective_rpc(_weight_bytes))


def write_golden(engine: Any, path: Path, *, model: str) -> Path:
    outs = engine.greedy(GOLDEN_PROMPTS, GOLDEN_TOKENS)
    data = {"model": model, "max_tokens": GOLDEN_TOKENS,
            "prompts": [{"prompt": p, "token_ids": o.token_ids, "text": o.text} for p, o in zip(GOLDEN_PROMPTS, outs)]}
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def read_golden(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        prompts = data["prompts"]
        _ = [(p["prompt"], p["token_ids"]) for p in prompts]
        int(data["max_tokens"])
    except FileNotFoundError:
        raise ValueError(f"{path}: golden file not found (write one with `day0 weights golden`)") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a day0 golden file ({type(exc).__name__}: {exc})") from None
    return data
