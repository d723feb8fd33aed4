"""The experts stage's checks: balance, the hot expert, the router's spread (is it collapsed?),
and the two views against each other.

Each is judged against ``[experts]``; a view that could not measure makes the check an ``error``
with the reason (never a pass on nothing). Evidence carries the per-layer table, the raw counts
and a layers x experts heatmap with the hot expert marked.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from day0.config.experts import ExpertsSection
from day0.core.record import Check, Direction, measured
from day0.core.verdict import NOT_APPLICABLE, judge
from day0.stages.experts.load import LayerLoad, LoadSummary

BALANCE, HOT, AGREE = "experts.balance", "experts.hot_expert", "experts.views_agree"
SPREAD = "experts.spread"
BALANCE_TITLE = "Expert load balancedness (mean/max), worst layer"
HOT_TITLE = "Hottest expert's load vs its uniform share"
SPREAD_TITLE = "Router spread from collapsed (0) to uniform (1), least spread layer"
AGREE_TITLE = "Router hook vs vLLM's routed_experts"


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def _places(value: float, limit: float, direction: Direction, nd: int) -> int:
    """Decimal places, ``nd`` or the fewest more, at which ``value`` rounded sits on the same side of
    ``limit`` as ``value`` itself: a spread of 0.49999727 is 0.5 at 4 places, which meets a limit
    of 0.5 that the figure misses. The check is judged on the exact figure (day0/core/verdict.py);
    the record and the message show it rounded, never rounded across its limit."""
    ok = judge(value, limit, direction)
    return next((p for p in range(nd, 17) if judge(round(value, p), limit, direction) == ok), 17)


def _judged(cid: str, title: str, value: float, limit: float, nd: int, *, direction: Direction,
            **kw: Any) -> Check:
    """:func:`measured` on the exact figure, recorded rounded (:func:`_places`). Judging the rounded
    figure passed a spread of 0.49999727 against 0.5 with a message saying "below the limit"."""
    check = measured(cid, title, value, limit, direction=direction, **kw)
    check.value = round(value, _places(value, limit, direction, nd))
    return check


def unmeasured(reason: str, section: ExpertsSection, source: str = "") -> list[Check]:
    """Every load figure as "could not measure", with the reason (status error: the run is INCOMPLETE)."""
    msg = f"could not measure: {reason}"
    return [Check(id=BALANCE, title=BALANCE_TITLE, status="error", limit=section.min_balancedness,
                  direction="higher_is_better", message=msg, source=source),
            Check(id=HOT, title=HOT_TITLE, status="error", limit=section.max_hot_expert_ratio, unit="x",
                  direction="lower_is_better", message=msg, source=source),
            Check(id=SPREAD, title=SPREAD_TITLE, status="error", limit=section.min_spread,
                  direction="higher_is_better", message=msg, source=source)]


def layer_table(summary: LoadSummary) -> dict[str, Any]:
    ep = summary.placement.expert_parallel
    cols = ["layer", "tokens routed", "hottest expert", "x its share", "balancedness (experts)",
            "spread (0 collapsed, 1 uniform)", "experts never chosen"]
    cols += ["tokens per EP rank", "balancedness (EP ranks)"] if ep else []
    rows = []
    for load in summary.layers:
        expert, ratio = load.hottest()
        row: list[Any] = [load.layer, load.tokens, expert, _r(ratio, 3), _r(load.expert_balance()),
                          _r(load.spread()), sum(1 for n in load.experts if not n)]
        if ep:
            row += [" / ".join(str(n) for n in load.rank_loads(summary.placement)),
                    _r(load.rank_balance(summary.placement))]
        rows.append(row)
    return {"columns": cols, "rows": rows}


def heatmap(summary: LoadSummary) -> dict[str, Any]:
    """Share of each layer's assignments per expert (%), the hot expert marked."""
    layers = [load for load in summary.layers if load.assignments]
    hot = summary.hottest()
    marked = [[i, hot.expert] for i, load in enumerate(layers) if hot and load.layer == hot.layer]
    return {"kind": "heatmap", "title": "Share of each MoE layer's routed tokens per expert",
            "rows": [f"layer {load.layer}" for load in layers],
            "cols": [str(e) for e in range(summary.placement.num_experts)],
            "values": [[round(100.0 * n / load.assignments, 3) for n in load.experts] for load in layers],
            "x_label": "expert", "y_label": "MoE layer", "unit": "%", "marked": marked}


def evidence(summary: LoadSummary, base: dict[str, Any]) -> dict[str, Any]:
    p = summary.placement
    return {**base, "table": layer_table(summary), "charts": [heatmap(summary)],
            "ep_size": p.ep_size, "placement": p.strategy if p.expert_parallel else "none (every rank holds every expert)",
            "ranks": [list(r) for r in p.ranks()] if p.expert_parallel else None,
            "vllm_eplb_balancedness": _r(summary.aggregate()),
            "loads": {str(load.layer): list(load.experts) for load in summary.layers},
            "tokens": {str(load.layer): load.tokens for load in summary.layers}}


def load_checks(summary: LoadSummary, section: ExpertsSection, source: str, base: dict[str, Any]) -> list[Check]:
    """``experts.balance`` and ``experts.hot_expert`` from one view's counts."""
    few = [load for load in summary.layers if load.tokens < section.min_tokens_per_layer]
    if not summary.layers or not summary.measured:
        return unmeasured("the view counted no routed tokens in any MoE layer", section, source)
    if few:
        return unmeasured(f"layer {few[0].layer} routed {few[0].tokens} tokens, under experts.min_tokens_per_layer = "
                          f"{section.min_tokens_per_layer}: too few to judge balance (raise experts.num_requests)",
                          section, source)
    ev = evidence(summary, base)
    p = summary.placement
    unit = f"{p.ep_size} EP ranks" if p.expert_parallel else f"{p.num_experts} experts"
    worst, hot = summary.worst(), summary.hottest()
    assert worst is not None and hot is not None  # summary.measured
    layer, value = worst
    ok = value >= section.min_balancedness
    shown = _places(value, section.min_balancedness, "higher_is_better", 3)
    balance = _judged(BALANCE, BALANCE_TITLE, value, section.min_balancedness, 4, direction="higher_is_better",
                      source=source, evidence={**ev, "over": unit, "worst_layer": layer},
                      message=(f"layer {layer}: mean/max load over {unit} is {value:.{shown}f} "
                               f"({'at or above' if ok else 'below'} the limit {section.min_balancedness:g}); "
                               f"hottest: {hot.sentence()}"))
    hot_ok = hot.ratio <= section.max_hot_expert_ratio
    hot_check = _judged(HOT, HOT_TITLE, hot.ratio, section.max_hot_expert_ratio, 3, unit="x",
                        direction="lower_is_better", source=source,
                        evidence={**ev, "layer": hot.layer, "expert": hot.expert, "share": _r(hot.share),
                                  "uniform_share": _r(hot.uniform), "token_share": _r(hot.token_share)},
                        message=(f"{hot.sentence(_places(hot.ratio, section.max_hot_expert_ratio, 'lower_is_better', 2))} "
                                 f"({'within' if hot_ok else 'over'} the limit {section.max_hot_expert_ratio:g}x)"))
    return [balance, hot_check, spread_check(summary, section, source, ev)]


def spread_check(summary: LoadSummary, section: ExpertsSection, source: str, ev: dict[str, Any]) -> Check:
    """``experts.spread``: the layer closest to a collapsed router, which balance and the hot expert
    miss when ``E/k`` is small (a collapse onto k of E experts scores ``k/E`` and ``E/k`` on them).
    With top-k every expert there is no choice to collapse: a skip marked not applicable
    (``NOT_APPLICABLE`` in its evidence), so the required spread does not hold the run INCOMPLETE."""
    routed = [load for load in summary.layers if load.assignments]
    if routed and all(load.top_k >= len(load.experts) for load in routed):
        return Check(id=SPREAD, title=SPREAD_TITLE, status="skip", source=source, evidence={NOT_APPLICABLE: True},
                     message=f"not applicable: {routed[0].spread_gap()}")
    gap = next(((load.layer, why) for load in routed if (why := load.spread_gap())), None)
    least = summary.least_spread()
    if gap is not None or least is None:
        why = f"layer {gap[0]}: {gap[1]}" if gap else "no layer routed anything"
        return Check(id=SPREAD, title=SPREAD_TITLE, status="error", limit=section.min_spread,
                     direction="higher_is_better", message=f"could not measure: {why}", source=source)
    layer, value = least
    load = next(x for x in routed if x.layer == layer)
    collapsed, observed, uniform = load.entropies()
    ok = value >= section.min_spread
    shown = _places(value, section.min_spread, "higher_is_better", 3)
    return _judged(SPREAD, SPREAD_TITLE, value, section.min_spread, 4, direction="higher_is_better",
                   source=source, evidence={**ev, "layer": layer,
                                            "spread": {str(x.layer): _r(x.spread()) for x in routed},
                                            "effective_experts": _r(math.exp(observed), 3)},
                   message=(f"layer {layer}: its routing is as even as {math.exp(observed):.2f} experts used "
                            f"evenly, where a collapse onto its top-{load.top_k:g} gives {math.exp(collapsed):g} "
                            f"and a uniform router at {load.tokens} tokens {math.exp(uniform):.2f}: {value:.{shown}f} "
                            f"of the way from collapsed to uniform ({'at or above' if ok else 'below'} the limit "
                            f"{section.min_spread:g})"))


def agreement_check(router: Sequence[LayerLoad], routed: Sequence[LayerLoad], section: ExpertsSection) -> Check:
    """The two views count the same tokens (prompt and output, less any served from the prefix
    cache, which the router never sees): each expert's share of its layer must match."""
    a, b = {x.layer: x for x in router}, {x.layer: x for x in routed}
    if set(a) != set(b):
        return Check(id=AGREE, title=AGREE_TITLE, status="fail", unit="", direction="lower_is_better",
                     limit=section.agreement_limit,
                     message=f"the views count different MoE layers: router {sorted(a)}, routed_experts {sorted(b)}")
    worst, where = 0.0, (None, None)
    for layer in a:
        ta, tb = a[layer].assignments or 1, b[layer].assignments or 1
        for e, (x, y) in enumerate(zip(a[layer].experts, b[layer].experts)):
            d = abs(x / ta - y / tb)
            if d > worst:
                worst, where = d, (layer, e)
    pp = _places(worst, section.agreement_limit, "lower_is_better", 4) - 2  # the fraction's places, in points
    msg = (f"largest per-expert share difference {100 * worst:.{pp}f} pp (layer {where[0]}, expert {where[1]})"
           if where[0] is not None else "identical shares in every layer")
    return _judged(AGREE, AGREE_TITLE, worst, section.agreement_limit, 5, direction="lower_is_better",
                   message=msg, source="router+routed_experts",
                   evidence={"router_tokens": {str(k): v.tokens for k, v in a.items()},
                             "routed_tokens": {str(k): v.tokens for k, v in b.items()}})


def agreement_skipped(why: str) -> Check:
    return Check(id=AGREE, title=AGREE_TITLE, status="skip", message=f"one view only: {why}")
