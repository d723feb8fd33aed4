"""What the engine actually loaded: weight bytes per rank, greedy tokens with their logprobs, and
golden files (recorded from a trusted engine, or from the transformers reference).

Kept apart from the static audit (day0/stages/weights/audit.py), which reads headers only and needs no engine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from day0.core.inputs import InputError, path_problem
from day0.core.outputs import write_file
from day0.engine.handle import Completion, ViewUnavailable
from day0.model.jsonfile import MAX_CONFIG_BYTES, read_json
from day0.model.reference import RefSequence, greedy_reference

GOLDEN_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says",
                  "Tensor parallel ranks exchange"]
GOLDEN_TOKENS = 16
# Four prompts of 16 tokens with top-k logprobs are a few kB; a golden file is the user's path, so
# a FIFO or a runaway file must be one line, not a hang or the host's memory.
MAX_GOLDEN_BYTES = 64 << 20


def _persistent_buffers(model: Any) -> int:
    """Bytes of the buffers a checkpoint holds; derived caches (RoPE's cos/sin table, registered
    non-persistent) are left out: they are not weights, and a long max_position makes them large."""
    return int(sum(b.numel() * b.element_size() for m in model.modules() for name, b in m._buffers.items()
                   if b is not None and name not in m._non_persistent_buffers_set))


def _repacked(model: Any) -> tuple[int, int]:
    """(bytes, layers) of the linear weights vLLM's CPU backend moved out of ``layer.weight``.

    ``dispatch_cpu_unquantized_gemm`` packs them into a oneDNN (or sgl/zentorch) handle reached
    through ``layer.cpu_linear`` and leaves an empty parameter of the same dtype. The handle does
    not expose its allocation, so the bytes are counted from the partition shape vLLM gave the layer
    on this rank: ``input_size_per_partition`` x ``sum(output_partition_sizes)`` x the params dtype.
    """
    total = layers = 0
    for m in model.modules():
        w = getattr(m, "weight", None)
        if not hasattr(m, "cpu_linear") or w is None or w.is_meta or w.numel() > 0:
            continue
        k = getattr(m, "input_size_per_partition", None) or m.input_size  # ReplicatedLinear: whole input
        n = getattr(m, "output_partition_sizes", None) or [getattr(m, "output_size_per_partition", m.output_size)]
        dtype = getattr(m, "params_dtype", None) or w.dtype
        total += int(k) * int(sum(n)) * w.new_empty(0, dtype=dtype).element_size()
        layers += 1
    return total, layers


def _weight_bytes(worker: Any) -> dict[str, Any]:  # runs inside each vLLM worker (collective_rpc)
    runner = worker.model_runner
    model = runner.model
    params = int(sum(p.numel() * p.element_size() for p in model.parameters()))  # empty placeholders add 0
    buffers = _persistent_buffers(model)
    repacked, layers = _repacked(model)
    loaded = getattr(runner, "model_memory_usage", None)  # GPU runners: device memory the load took
    return {"loaded_bytes": int(loaded) if loaded else None, "parameter_bytes": params, "buffer_bytes": buffers,
            "repacked_bytes": repacked, "repacked_layers": layers, "weight_bytes": params + buffers + repacked}


def weight_bytes_per_rank(llm: Any) -> list[dict[str, Any]]:
    """Per worker: the memory its weight load took (GPU runners record it, else None) and the
    weight bytes it holds, in parts: parameters that still hold data, persistent buffers, and the
    linear weights the CPU backend repacked into oneDNN handles (counted from the layers' partition
    shapes; see :func:`_repacked`). ``weight_bytes`` is their sum.
    """
    return list(llm.collective_rpc(_weight_bytes))


def write_golden(engine: Any, path: Path, *, model: str) -> Path:
    outs = engine.greedy(GOLDEN_PROMPTS, GOLDEN_TOKENS)
    data = {"model": model, "max_tokens": GOLDEN_TOKENS,
            "prompts": [{"prompt": p, "token_ids": o.token_ids, "text": o.text} for p, o in zip(GOLDEN_PROMPTS, outs)]}
    return write_file(path, json.dumps(data, indent=2) + "\n")


def greedy_logprobs(engine: Any, prompts: list[str], max_tokens: int, top_k: int) -> list[Completion]:
    """Greedy answers with each step's top-``top_k`` logprobs, from any engine handle.

    The handles' ``greedy`` gives token ids only; a comparison with an independent reference needs
    the engine's own logprobs to tell a near-tie from a divergence. In-process engines take
    ``logprobs`` directly; HTTP ones (server, external) are asked through the completions API.
    """
    if getattr(engine, "llm", None) is not None:
        return list(engine.greedy(prompts, max_tokens, logprobs=top_k))
    if getattr(engine, "endpoint", None) is None or engine.info is None:
        raise ViewUnavailable(f"{type(engine).__name__} has neither an in-process LLM nor an HTTP endpoint")
    endpoint = engine.endpoint
    return [endpoint.greedy(p, max_tokens, logprobs=top_k) for p in prompts]


def write_reference_golden(model_dir: Path, path: Path, *, model: str, top_k: int = 5) -> Path:
    """A golden file computed by transformers (CPU, float32) from a trusted copy of the checkpoint,
    with each step's top-k logprobs, so a later comparison knows its near-ties.

    For targets whose model does not fit this host at check time: record it once where it fits
    (or from the trusted copy), and point ``weights.golden`` at it.
    """
    refs = greedy_reference(model_dir, GOLDEN_PROMPTS, GOLDEN_TOKENS, top_k=top_k)
    data = {"model": model, "max_tokens": GOLDEN_TOKENS, "reference": "transformers cpu/float32", "top_k": top_k,
            "prompts": [{"prompt": r.prompt, "token_ids": r.tokens, "text": r.text, "sequence": r.to_dict()}
                        for r in refs]}
    return write_file(path, json.dumps(data, indent=2) + "\n")


def read_golden(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = read_json(path, limit=MAX_GOLDEN_BYTES, what="a golden file")
        prompts = data["prompts"]
        _ = [(p["prompt"], p["token_ids"]) for p in prompts]
        int(data["max_tokens"])
        # nothing to compare passes everything: all([]) is True
        if not prompts or any(not isinstance(p["token_ids"], list) or not p["token_ids"] for p in prompts):
            raise ValueError("no prompt, or a prompt without tokens: nothing to compare an engine with")
        for i, p in enumerate(prompts):
            if "sequence" in p:
                try:
                    RefSequence.from_dict(p["sequence"])
                except ValueError as exc:
                    raise ValueError(f"prompts[{i}].sequence: {exc}") from None
    except InputError as exc:  # not there, not a regular file, too large, not JSON: named as it is
        if path_problem(path) == "does not exist":
            raise ValueError(f"{path}: golden file not found (write one with `day0 weights golden`)") from None
        raise ValueError(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a day0 golden file ({type(exc).__name__}: {exc})") from None
    return data


_EP_LINE = re.compile(r"\[EP Rank (\d+)/(\d+)\].*Local/global number of experts: (\d+)/(\d+)")


def expert_placement(model_dir: Path | None, args: dict[str, Any], logs: list[Path]) -> dict[str, Any] | None:
    """Where a MoE engine put its experts, for the record's engine note: what the layout implies
    (every rank a 1/TP slice of each expert, or whole experts over TP x DP under expert
    parallelism, placed as vLLM's ``determine_expert_map`` does) and, where vLLM logged it, what
    each EP rank says it holds. None for a dense model or a model whose config is not local, and
    for one day0 does not model or cannot read: this runs once the engine is healthy, and a note
    must never stop an engine that serves (preflight and ``weights.config`` say what is wrong)."""
    from day0.model import archs
    from day0.model.ranks import ep_size_of, experts_on_rank

    config_path = model_dir / "config.json" if model_dir else None
    if config_path is None or not os.path.lexists(config_path):
        return None
    try:
        config = read_json(config_path, limit=MAX_CONFIG_BYTES, what="a config.json")
        routed = archs.routed_experts(config) if isinstance(config, dict) else 0
        per_token, shared = (archs.experts_per_token(config), archs.shared_experts(config)) if routed else (0, 0)
    except (InputError, archs.ConfigError):
        return None
    if not routed:
        return None
    tp = int(args.get("tensor_parallel_size") or 1)
    ep = ep_size_of(args)
    note: dict[str, Any] = {"routed_experts": routed, "experts_per_token": per_token, "shared_experts": shared}
    if ep > 1:
        note.update(layout="expert_parallel", ep_size=ep,
                    experts_per_rank=[experts_on_rank(routed, ep, r) for r in range(ep)])
    else:
        note.update(layout="tensor_parallel", experts_per_rank=[routed] * tp, expert_slice=f"1/{tp}")
    said = sorted({m.groups() for lp in logs if lp.is_file()
                   for m in _EP_LINE.finditer(lp.read_text(encoding="utf-8", errors="replace"))})
    if said:
        note["vllm_says"] = [f"EP rank {r}/{n}: {local}/{total} experts" for r, n, local, total in said]
    return note
