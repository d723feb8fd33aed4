"""Lint rules for expert parallelism: what ``enable_expert_parallel`` does to this model, on any device.

Why: EP changes where every routed expert lives (whole experts over TP x DP ranks instead of a
1/TP slice of each), vLLM accepts an uneven split without a word, and EPLB refuses one only after
the engine has started building layers. The arithmetic is vLLM 0.32's
(``FusedMoEParallelConfig.make``, ``determine_expert_map``) via :mod:`day0.model.ranks`.
"""

from __future__ import annotations

from typing import Any

from day0.model import archs
from day0.model.ranks import experts_on_rank
from day0.stages.preflight.findings import Finding


def expert_parallel_findings(args: dict[str, Any], config: dict[str, Any]) -> list[Finding]:
    """EP on a dense model or one rank (no effect), the experts per rank, an uneven split, EPLB without EP."""
    tp = int(args.get("tensor_parallel_size") or 1)
    dp = int(args.get("data_parallel_size") or 1)
    ep_on, eplb = bool(args.get("enable_expert_parallel")), bool(args.get("enable_eplb"))
    routed = archs.routed_experts(config)
    out: list[Finding] = []
    if dp > 1:
        out.append(Finding("info", "dp_not_planned", "engine.args.data_parallel_size", dp,
                           "day0's plan prices one replica (DP=1); with DP the MoE layers span TP x DP ranks and "
                           "each replica has its own KV pool", "read the plan per replica"))
    if eplb and not ep_on:
        out.append(Finding("error", "eplb_needs_ep", "engine.args.enable_eplb", True,
                           "vLLM refuses it: 'enable_expert_parallel must be True to use EPLB'",
                           "set enable_expert_parallel=true or drop enable_eplb"))
    if not ep_on:
        return out
    key = "engine.args.enable_expert_parallel"
    ep = tp * dp
    if not routed or ep == 1:
        what = "the model has no routed experts" if not routed else "TP x DP = 1: there is no EP group to split over"
        return out + [Finding("info", "expert_parallel_no_effect", key, True, f"{what}; the flag changes nothing",
                              "drop it")]
    most, least = experts_on_rank(routed, ep, 0), experts_on_rank(routed, ep, ep - 1)
    out.append(Finding("info", "expert_parallel", key, True,
                       f"EP={ep} (TP {tp} x DP {dp}) ranks per pipeline stage each hold {most} whole expert(s) per MoE "
                       f"layer of {routed}; attention stays TP={tp}; shared experts and routers are not EP-split",
                       "see the plan's expert placement and routed expert weights per rank"))
    out += _uneven(args, routed, ep, most, least, eplb)
    return out


def _uneven(args: dict[str, Any], routed: int, ep: int, most: int, least: int, eplb: bool) -> list[Finding]:
    """An expert count EP does not divide: accepted (first ranks hold one more) unless EPLB is on."""
    redundant = 0
    eplb_config = args.get("eplb_config")
    if isinstance(eplb_config, dict):
        redundant = int(eplb_config.get("num_redundant_experts") or 0)
    total = routed + (redundant if eplb else 0)
    if total % ep == 0:
        return []
    divisors = [d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256) if total % d == 0]
    if eplb:
        return [Finding("error", "ep_uneven", "engine.args.enable_eplb", True,
                        f"{total} experts (routed + redundant) over EP={ep}: vLLM refuses it ('EPLB currently only "
                        "supports even distribution of experts across ranks')",
                        f"use a TP x DP that divides {total} ({', '.join(map(str, divisors))}) or change "
                        "eplb_config.num_redundant_experts")]
    return [Finding("warning", "ep_uneven", "engine.args.enable_expert_parallel", True,
                    f"{routed} experts over EP={ep}: the first {routed % ep} rank(s) hold {most}, the rest {least} "
                    "(determine_expert_map); the busiest rank sets the memory and the slowest MoE step",
                    f"use a TP x DP that divides {routed} ({', '.join(map(str, divisors))})")]
