"""Serving cost from measured throughput: what a million output tokens and an hour cost.

    cost per hour            = devices x price per device-hour
    output tokens per hour   = throughput (tok/s) x 3600 x utilization
    cost per 1M output tokens = cost per hour / output tokens per hour x 1e6

Throughput is the capacity search's sustained point (``latency.capacity``: the highest load
meeting the SLA, what a replica is bought for) when the run searched; otherwise stage 3's
``latency.output_throughput`` as this run recorded it (the record so far,
:class:`day0.stages.context.RecordSoFar`; the load the profile's ``[latency]`` table describes), or, when stage 3 did not run, a short run of stage 3's
workload that the risks suite measures (``day0.stages.latency.measure_throughput``) and hands
over. Prices and utilization are the profile's assumptions and are shown beside the result,
because a cost figure without them cannot be checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from day0.config.risks import CostSettings
from day0.core.record import Check, measured

THROUGHPUT_CHECK = "latency.output_throughput"
SUSTAINED_CHECK = "latency.capacity"  # the capacity search's answer: its sustained point's throughput


@dataclass(frozen=True)
class Throughput:
    tok_s: float
    source: str  # where the figure came from, in words
    detail: dict[str, Any]


def recorded_throughput(checks: Iterable[Check], check_id: str = THROUGHPUT_CHECK) -> Throughput | None:
    """The last recorded ``check_id`` of this run with a positive value (pass or fail: the figure
    was measured either way), or None when stage 3 did not record one."""
    found: Throughput | None = None
    for c in checks:
        v = c.value
        if c.id == check_id and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 \
                and c.status in ("pass", "fail"):
            found = Throughput(float(v), f"stage {c.stage}: {check_id}",
                               {"check": check_id, "status": c.status, "at": c.finished_at, "unit": c.unit})
    return found


def sustained_throughput(checks: Iterable[Check]) -> Throughput | None:
    """Output throughput at the highest load meeting the SLA (``latency.capacity``'s sustained
    point), or None when no capacity search found one: the load a replica is priced at."""
    found: Throughput | None = None
    for c in checks:
        point = c.evidence.get("sustained") if c.id == SUSTAINED_CHECK and c.status == "pass" else None
        tok_s = point.get("output_tok_s") if isinstance(point, dict) else None
        if isinstance(tok_s, (int, float)) and not isinstance(tok_s, bool) and tok_s > 0:
            load = point.get("load")
            found = Throughput(float(tok_s), f"stage {c.stage}: {SUSTAINED_CHECK}, the sustained load ({load} "
                                             "within the SLA)", {"check": SUSTAINED_CHECK, "load": load,
                                                                 "at": c.finished_at, "unit": "tok/s"})
    return found


@dataclass(frozen=True)
class CostEstimate:
    throughput_tok_s: float
    devices: int
    price_per_device_hour: float
    utilization: float
    currency: str

    @property
    def per_hour(self) -> float:
        return self.devices * self.price_per_device_hour

    @property
    def tokens_per_hour(self) -> float:
        return self.throughput_tok_s * 3600.0 * self.utilization

    @property
    def per_million_output_tokens(self) -> float:
        if self.tokens_per_hour <= 0:
            return math.inf
        return self.per_hour / self.tokens_per_hour * 1e6


def estimate(throughput_tok_s: float, devices: int, price_per_device_hour: float, utilization: float = 1.0,
             currency: str = "USD") -> CostEstimate:
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    if price_per_device_hour < 0:
        raise ValueError(f"price_per_device_hour must be >= 0, got {price_per_device_hour}")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if not throughput_tok_s >= 0:
        raise ValueError(f"throughput must be >= 0 tok/s, got {throughput_tok_s}")
    return CostEstimate(throughput_tok_s, devices, price_per_device_hour, utilization, currency)


def device_count(settings: CostSettings, nodes: int, devices_per_node: int) -> int:
    return settings.devices or nodes * devices_per_node


def cost_table(est: CostEstimate, source: str, devices_from: str) -> dict[str, Any]:
    c = est.currency
    return {"columns": ["quantity", "value", "basis"], "rows": [
        ["output throughput", f"{est.throughput_tok_s:.4g} tok/s", f"measured: {source}"],
        ["devices", est.devices, f"assumed: {devices_from}"],
        ["price per device-hour", f"{est.price_per_device_hour:g} {c}", "assumed: [risks.cost].price_per_device_hour"],
        ["utilization", f"{est.utilization:.0%}", "assumed: [risks.cost].utilization (share of hours at this load)"],
        ["cost per hour", f"{est.per_hour:.4g} {c}", "devices x price per device-hour"],
        ["output tokens per hour", f"{est.tokens_per_hour:.4g}", "throughput x 3600 x utilization"],
        ["cost per 1M output tokens", f"{est.per_million_output_tokens:.4g} {c}",
         "cost per hour / output tokens per hour x 1e6"],
    ]}


def cost_checks(est: CostEstimate, settings: CostSettings, source: str, devices_from: str) -> list[Check]:
    c = est.currency
    evidence = {"table": cost_table(est, source, devices_from), "throughput_source": source,
                "assumptions": {"devices": est.devices, "devices_from": devices_from,
                                "price_per_device_hour": est.price_per_device_hour, "utilization": est.utilization,
                                "currency": c}}
    per_m = est.per_million_output_tokens
    budget = settings.max_per_million_output_tokens
    per_token = measured(
        "risks.cost.per_million_output_tokens", "Cost per million output tokens", round(per_m, 6), budget,
        unit=f"{c}/Mtok", direction="lower_is_better", source="http", evidence=evidence, performance=True,
        message=(f"{per_m:.4g} {c} per 1M output tokens at {est.throughput_tok_s:.4g} tok/s on {est.devices} "
                 f"device(s) x {est.price_per_device_hour:g} {c}/h"
                 + (f" (budget {budget:g})" if budget is not None else " (no budget set)")
                 + (": over budget; raise throughput or lower the price" if budget is not None and per_m > budget
                    else "")))
    per_h = measured(
        "risks.cost.per_hour", "Cost per hour of the deployment", round(est.per_hour, 6), settings.max_per_hour,
        unit=f"{c}/h", direction="lower_is_better", source="profile", evidence={"assumptions": evidence["assumptions"]},
        message=(f"{est.per_hour:.4g} {c}/h = {est.devices} device(s) x {est.price_per_device_hour:g} {c}/h"
                 + (f" (budget {settings.max_per_hour:g})" if settings.max_per_hour is not None else "")))
    return [per_token, per_h]


def budget_checks(throughput: Throughput, settings: CostSettings, nodes: int, devices_per_node: int) -> list[Check]:
    """Cost per 1M output tokens and per hour at ``throughput`` on the profile's devices and price
    (the unpriced skips when the profile sets no price)."""
    if settings.price_per_device_hour is None:
        return unpriced_checks(settings)
    devices_from = ("[risks.cost].devices" if settings.devices else
                    f"topology: {nodes} node(s) x {devices_per_node} device(s)")
    est = estimate(throughput.tok_s, device_count(settings, nodes, devices_per_node),
                   settings.price_per_device_hour, settings.utilization, settings.currency)
    checks = cost_checks(est, settings, throughput.source, devices_from)
    checks[0].evidence["throughput_detail"] = throughput.detail
    return checks


def priced_checks(at_stage_load: Throughput, sustained: Throughput | None, settings: CostSettings, nodes: int,
                  devices_per_node: int) -> list[Check]:
    """The budget judged at the sustained load when a capacity search found one (what a replica
    serves at the SLA), else at the latency stage's load; with both, the stage-load figure is kept
    beside it, reported (``...per_million_output_tokens.latency_load``)."""
    checks = budget_checks(sustained or at_stage_load, settings, nodes, devices_per_node)
    if settings.price_per_device_hour is None:
        return checks
    checks[0].evidence["load"] = (f"priced at the sustained load, {sustained.detail['load']} ({SUSTAINED_CHECK})"
                                  if sustained else "priced at the latency stage's load")
    if sustained is not None:
        stage = budget_checks(at_stage_load, settings, nodes, devices_per_node)[0]
        checks.insert(1, Check(f"{stage.id}.latency_load", "Cost per million output tokens at the latency stage's "
                               "load", "pass", value=stage.value, unit=stage.unit, direction=stage.direction,
                               source=stage.source, evidence=stage.evidence, performance=True,
                               message=f"{stage.message.split(' (budget')[0]}: at the latency stage's load, "
                                       "reported (the budget is judged at the sustained load)"))
    return checks


def unpriced_checks(settings: CostSettings) -> list[Check]:
    """Without a price there is no cost: say which key to set rather than inventing one."""
    msg = "no price: set [risks.cost].price_per_device_hour (your contract price per device-hour)"
    return [Check(id=i, title=t, status="skip", message=msg, source="profile", evidence={"currency": settings.currency})
            for i, t in (("risks.cost.per_million_output_tokens", "Cost per million output tokens"),
                         ("risks.cost.per_hour", "Cost per hour of the deployment"))]
