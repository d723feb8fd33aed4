"""Stage 3b - experts: on an MoE, are the tokens spread over the experts and the expert-parallel
ranks evenly enough, is no expert taking far more than its share, and has the router not collapsed
onto the same few experts?

Two views of the same routing (definitions in docs/metrics.md, "Expert load"; the stage in
docs/stages/experts.md): the **router** view counts each MoE layer's top-k choices inside vLLM's
workers (:mod:`.router_hook`, read through ``collective_rpc``); the **routed** view decodes vLLM's
own ``routed_experts`` field of each response (:mod:`.routed`). Modules: ``load`` (counts, placement
on ranks, balancedness), ``views`` (the workload and reading both views), ``checks``, ``stage``
(against the run's engine). On a dense model the stage does not apply and starts nothing.
"""

from day0.core.stages import Figure, Stage
from day0.stages.experts.checks import AGREE, BALANCE, HOT, SPREAD, agreement_check, load_checks, unmeasured
from day0.stages.experts.load import LayerLoad, LoadError, LoadSummary, Placement, balancedness, merge
from day0.stages.experts.routed import Routed, RoutedError, count, decode, moe_layers, read_npy
from day0.stages.experts.router_hook import EXTENSION
from day0.stages.experts.stage import (
    Target,
    judge,
    not_applicable,
    placement_of,
    router_untrusted,
    run_stage,
    target_of,
    workload,
)
from day0.stages.experts.views import HttpDriver, InprocessDriver, Observed, ViewMissing, combine, observe, rpc_refusal

__all__ = [
    # counting and balance
    "LayerLoad", "LoadError", "LoadSummary", "Placement", "balancedness", "merge",
    # vLLM's routed_experts field
    "Routed", "RoutedError", "count", "decode", "moe_layers", "read_npy",
    # the views
    "EXTENSION", "HttpDriver", "InprocessDriver", "Observed", "ViewMissing", "combine", "observe", "rpc_refusal",
    # the stage
    "AGREE", "BALANCE", "HOT", "SPREAD", "Target", "agreement_check", "judge", "load_checks", "not_applicable",
    "placement_of", "router_untrusted", "run_stage", "target_of", "unmeasured", "workload",
]

STAGE = Stage(
    name="experts", order=35, suite="day0.suites.test_experts", section="experts", repeatable=True,
    title="Expert load balance",
    question="on an MoE, do the latency workload's tokens spread evenly over the experts and expert-parallel ranks?",
    figures=(Figure("balance", "Expert balancedness, worst layer", ("experts.balance",)),
             Figure("hot_expert", "Hottest expert vs its share", ("experts.hot_expert",), unit="x")),
    required=("experts.balance", "experts.hot_expert", "experts.spread"),
)
