"""A :class:`~day0.model.plan_model.Plan` as people and the run record read it: the summary and
per-stage tables, the plain text ``day0 plan`` prints, the per-stage memory chart, and the
``preflight.plan.*`` checks."""

from __future__ import annotations

import math
from typing import Any

from day0.core.inputs import term_safe
from day0.core.record import Check, measured
from day0.model.plan_model import Plan
from day0.model.ranks import GIB


def _count(n: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _gib(n: float) -> float:
    return round(n / GIB, 3)


def plan_table(p: Plan) -> dict[str, Any]:
    rows = [
        ["architecture", p.architecture],
        ["parameters", f"{_count(p.parameters)} (active {_count(p.active_parameters)})"],
        ["layout", f"TP={p.tp} x PP={p.pp} = {p.ranks} ranks on {p.nodes} node(s) x {p.devices_per_node}"],
        ["dtype / weights / kv cache", f"{p.dtype} / {p.quantization} / {p.kv_cache_dtype}"],
        ["weights, whole model", f"{_gib(p.weight_bytes_total)} GiB"],
        ["weights per rank (busiest stage)", f"{_gib(p.weight_bytes_per_rank)} GiB"],
        ["usable per rank", f"{_gib(p.budget_bytes)} GiB of {_gib(p.device_memory_bytes)} GiB "
                            f"(gpu_memory_utilization {p.gpu_memory_utilization:g})"],
        ["weights may take per rank", f"{_gib(p.weight_limit_bytes)} GiB"],
        ["activation headroom", f"{_gib(p.activation_headroom_bytes)} GiB"],
        ["KV pool per rank (smallest stage)", f"{_gib(p.kv_pool_bytes)} GiB"],
        ["KV bytes per token per rank", f"{p.kv_bytes_per_token} (whole model {p.kv_bytes_per_token_model})"],
        *_mla_rows(p),
        ["KV tokens held", f"{p.kv_tokens} ({p.kv_blocks} blocks of {p.block_size})"],
        ["max_model_len", str(p.max_model_len)],
        ["needed", f"{p.tokens_needed} tokens = {p.target_concurrency} x {p.target_context}"],
        ["max concurrency at target context", f"{p.max_concurrency} sequences of {p.target_context} tokens"],
        *_moe_rows(p),
        *_node_rows(p),
        ["verdict", p.verdict + ("" if not p.reasons else ": " + "; ".join(p.reasons))],
        ["smallest layout that fits",
         f"TP={p.smallest_tp} x PP={p.smallest_pp} ({p.smallest_verdict})" if p.smallest_tp else "none (does_not_fit)"],
    ]
    rows += [["note", n] for n in p.notes]
    return {"columns": ["item", "value"], "rows": rows}


def _mla_rows(p: Plan) -> list[list[str]]:
    m = p.mla
    if m is None:
        return []
    layers = m.bytes_per_token_per_rank // m.bytes_per_token_layer
    return [["MLA latent per token per rank",
             f"{m.latent_width} values ({m.kv_lora_rank} + {m.qk_rope_head_dim}) = {m.bytes_per_token_layer} B per layer "
             f"x {layers} layers = {m.bytes_per_token_per_rank} B, the same on every TP rank (not divided by TP)"],
            ["K/V cache of the same heads", f"{m.mha_bytes_per_token_per_rank} B per token per rank "
                                            f"({m.mha_ratio:g}x the latent)"]]


def _moe_rows(p: Plan) -> list[list[str]]:
    m = p.moe
    if m is None:
        return []
    layout = (f"EP: {m.experts_per_rank} whole experts per rank per MoE layer over EP={m.ep_size} (= TP x DP, DP 1)"
              + ("" if m.experts_even else f", {m.experts_per_rank_min} on the last ranks ({m.routed_experts} % "
                                           f"{m.ep_size} = {m.routed_experts % m.ep_size}: uneven)")
              if m.expert_parallel else
              f"TP: every rank holds a 1/{p.tp} slice of all {m.routed_experts} experts of its stage's layers")
    return [
        ["experts per MoE layer", f"{m.routed_experts} routed (top-{m.experts_per_token} per token) + "
                                  f"{m.shared_experts} shared; {m.moe_layers} MoE layers, {m.dense_layers} dense"],
        ["routed expert parameters", f"{_count(m.routed_expert_parameters)} ({_count(m.expert_parameters)} per expert)"],
        ["expert placement", layout],
        ["routed expert weights per rank", f"{_gib(m.expert_bytes_per_rank)} GiB (under TP {_gib(m.expert_bytes_per_rank_tp)}"
                                           f" GiB, under EP {_gib(m.expert_bytes_per_rank_ep)} GiB; busiest stage)"],
    ]


def _node_rows(p: Plan) -> list[list[str]]:
    if p.nodes_used <= 1 and p.devices_per_node <= 1:
        return []
    experts = f", {_gib(p.expert_bytes_per_node)} GiB of it routed experts" if p.moe else ""
    return [["weights per node (busiest)",
             f"{_gib(p.weight_bytes_per_node)} GiB{experts}, of {_gib(p.node_weight_limit_bytes)} GiB weights may take on "
             f"{p.devices_per_node} x {_gib(p.device_memory_bytes)} GiB = {_gib(p.node_memory_bytes)} GiB; "
             f"holds its share: {'yes' if p.node_holds_share else 'no'} ({p.nodes_used} node(s) used)"]]


def stage_table(p: Plan) -> dict[str, Any]:
    experts = p.moe is not None
    return {
        "columns": ["stage", "layers", "weights GiB", *(["experts GiB"] if experts else []), "KV pool GiB",
                    "KV bytes/token", "KV tokens"],
        "rows": [[s.stage, f"{s.layers[0]}-{s.layers[1] - 1}", _gib(s.weight_bytes),
                  *([_gib(s.expert_bytes)] if experts else []), _gib(s.kv_pool_bytes),
                  s.kv_bytes_per_token, s.kv_tokens] for s in p.stages],
    }


def format_table(p: Plan) -> str:
    """Plain-text plan for the CLI: the summary, then one line per pipeline stage."""
    summary = plan_table(p)["rows"]
    width = max(len(r[0]) for r in summary)
    lines = [f"{k.ljust(width)}  {v}" for k, v in summary]
    st = stage_table(p)
    cells = [st["columns"]] + [[str(c) for c in r] for r in st["rows"]]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(st["columns"]))]
    lines.append("")
    for row in cells:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return "\n".join(term_safe(line) for line in lines)  # config.json's architecture, notes: untrusted text


def plan_checks(p: Plan) -> list[Check]:
    """``preflight.plan.*`` checks: devices, weights per rank, KV for max_model_len and for the target."""
    src = "static"
    evidence = {"table": plan_table(p), "plan": p.to_dict(), "charts": [_stage_chart(p)]}
    hint = (f"; smallest layout that fits: tp={p.smallest_tp} pp={p.smallest_pp}" if p.smallest_tp
            else "; no layout on this hardware fits: quantize, lower max_model_len or concurrency, or add nodes")
    usable = p.weight_limit_bytes
    len_limit = math.ceil(p.max_model_len / p.block_size) * p.block_size
    checks = [
        measured("preflight.plan.devices", "Ranks fit the devices", p.ranks, p.devices_available,
                 unit="devices", direction="lower_is_better", source=src,
                 message="" if p.ranks <= p.devices_available else
                 f"TP x PP = {p.ranks} ranks but the topology has {p.devices_available} devices{hint}"),
        measured("preflight.plan.weights_per_rank", "Weights fit each rank", _gib(p.weight_bytes_per_rank), _gib(usable),
                 unit="GiB", direction="lower_is_better", source=src, evidence={"table": stage_table(p)},
                 message="" if p.weight_bytes_per_rank <= usable else
                 f"weights need {_gib(p.weight_bytes_per_rank)} GiB on the busiest rank but {_gib(usable)} GiB is usable "
                 f"after {_gib(p.activation_headroom_bytes)} GiB headroom (and any fixed KV pool){hint}"),
        measured("preflight.plan.kv_max_model_len", "KV pool holds one max_model_len sequence", p.kv_tokens,
                 len_limit, unit="tokens", direction="higher_is_better",
                 source=src,
                 message="" if p.kv_tokens >= len_limit else
                 f"KV pool holds {p.kv_tokens} tokens but max_model_len={p.max_model_len}: vLLM refuses to start; "
                 f"raise gpu_memory_utilization, use kv_cache_dtype=fp8, or raise tp/pp{hint}"),
        measured("preflight.plan.kv_capacity", "KV pool holds target context x concurrency", p.kv_tokens, p.tokens_needed,
                 unit="tokens", direction="higher_is_better", source=src,
                 message="" if p.kv_tokens >= p.tokens_needed else
                 f"KV pool holds {p.kv_tokens} tokens, {p.target_concurrency} x {p.target_context} needs {p.tokens_needed}"
                 f" ({p.kv_tokens // max(1, math.ceil(p.target_context / p.block_size) * p.block_size)} sequences fit){hint}"),
        measured("preflight.plan.context", "max_model_len covers the target context", p.max_model_len, p.target_context,
                 unit="tokens", direction="higher_is_better", source=src,
                 message="" if p.max_model_len >= p.target_context else
                 f"max_model_len={p.max_model_len} is below the target context {p.target_context}: raise max_model_len"),
    ]
    verdict_msg = (
        f"{p.verdict}: TP={p.tp} x PP={p.pp}, {_gib(p.weight_bytes_per_rank)} GiB weights/rank, "
        f"{p.kv_tokens} KV tokens for {p.tokens_needed} needed"
        + (f" ({'; '.join(p.reasons)})" if p.reasons else "")
        + (f"; smallest fitting layout TP={p.smallest_tp} x PP={p.smallest_pp} ({p.smallest_verdict})"
           if p.smallest_tp else "; no layout on this hardware fits")
    )
    checks.append(Check(id="preflight.plan.verdict", title="Memory plan verdict", status="pass" if p.fits else "fail",
                        value=p.verdict, limit=None, unit="", direction="exact", message=verdict_msg,
                        evidence=evidence, source=src))
    return checks


def _stage_chart(p: Plan) -> dict[str, Any]:
    xs = [f"stage {s.stage}" for s in p.stages]
    return {
        "kind": "bar",
        "title": f"Memory per rank by pipeline stage (TP={p.tp}, PP={p.pp})",
        "x_label": "pipeline stage",
        "y_label": "GiB",
        "x_log": False,
        "series": [
            {"name": "weights", "x": xs, "y": [_gib(s.weight_bytes) for s in p.stages]},
            {"name": "activation headroom", "x": xs, "y": [_gib(p.activation_headroom_bytes)] * len(xs)},
            {"name": "KV pool", "x": xs, "y": [_gib(s.kv_pool_bytes) for s in p.stages]},
        ],
        "reference": [{"y": _gib(p.budget_bytes), "label": "device memory x gpu_memory_utilization"}],
    }
