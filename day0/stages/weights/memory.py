"""Weight memory per rank: what each vLLM worker's weight load took, against the memory plan.

The plan is stage 0's (:func:`day0.model.plan.plan` with the profile's arguments), so the
figure a person reads in ``day0 plan`` is the one the live engine is held to. The bytes are read
through vLLM's worker RPC, which only the in-process engine exposes, and only GPU workers record.
"""

from __future__ import annotations

from typing import Any

from day0.config.profile import Profile
from day0.core.record import Check, measured
from day0.engine.loaded import weight_bytes_per_rank
from day0.model.config import ConfigUnavailable, model_config
from day0.model.plan import Plan, plan
from day0.model.sizing import plan_arguments


class Unmeasurable(RuntimeError):
    """This engine cannot tell the memory its weights take; ``str()`` says why, in one line."""


def loaded_bytes_per_rank(engine: Any) -> list[int]:
    """Bytes each worker's weight load took, rank by rank; raises :class:`Unmeasurable` when unknown."""
    if getattr(engine, "llm", None) is None:
        raise Unmeasurable(f"weight memory per rank is read through vLLM's worker RPC, which the {engine.info.mode} "
                           "mode does not expose; run with engine.mode = \"inprocess\" to measure it")
    ranks = weight_bytes_per_rank(engine.llm)
    per_rank = [r["loaded_bytes"] for r in ranks]
    if None in per_rank:
        raise Unmeasurable("this vLLM worker does not record the memory its weight load took (the CPU backend "
                           "repacks linear weights into oneDNN handles, so parameter bytes undercount: "
                           f"{[round(r['parameter_bytes'] / 2**20, 2) for r in ranks]} MiB seen); "
                           "measured on GPU workers")
    return per_rank


def planned(profile: Profile) -> tuple[Plan | None, str]:
    """(stage 0's plan for this profile, or None and the one-line reason it cannot be priced)."""
    try:
        config, _ = model_config(profile)
        return plan(config, **plan_arguments(profile)), ""
    except (ConfigUnavailable, ValueError) as exc:
        return None, str(exc)


def memory_checks(per_rank: list[int], profile: Profile) -> list[Check]:
    """``weights.memory_per_rank`` (worst deviation from the plan) and ``weights.memory_headroom``
    (weights within device memory x gpu_memory_utilization); a skip when there is no plan."""
    plan_, reason = planned(profile)
    tol = profile.weights.memory_tolerance
    table = {"columns": ["rank", "measured GiB"], "rows": [[r, round(b / 2**30, 4)] for r, b in enumerate(per_rank)]}
    if plan_ is None:
        return [Check(id="weights.memory_per_rank", title="Weight memory per rank", status="skip",
                      value=max(per_rank), unit="bytes", source="scheduler",
                      message=f"no plan to compare with: {reason}", evidence={"table": table})]
    plan_bytes = plan_.weight_bytes_per_rank
    worst = max(abs(b - plan_bytes) / plan_bytes for b in per_rank)
    capacity = profile.topology.device_memory_gib * 2**30 * float(
        profile.engine.args.get("gpu_memory_utilization", 0.9))
    return [
        measured(
            "weights.memory_per_rank", "Weight memory per rank matches the plan", round(worst, 4), tol,
            unit="relative deviation", direction="lower_is_better", source="scheduler",
            message=(f"ranks hold {[round(b / 2**20, 2) for b in per_rank]} MiB of weights; plan "
                     f"{plan_bytes / 2**20:.2f} MiB (worst deviation {worst:.1%}, tolerance {tol:.0%})"),
            evidence={"table": table, "plan_bytes": plan_bytes, "measured_bytes": per_rank},
        ),
        measured(
            "weights.memory_headroom", "Weights per rank within device capacity x utilization",
            round(max(per_rank) / 2**30, 4), round(capacity / 2**30, 4), unit="GiB", direction="lower_is_better",
            source="scheduler"),
    ]
