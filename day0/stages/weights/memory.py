"""Weight memory per rank: what each vLLM worker's weights take, against the memory plan.

The plan is stage 0's (:func:`day0.model.plan.plan` with the profile's arguments), so the
figure a person reads in ``day0 plan`` is the one the live engine is held to. The bytes are read
through vLLM's worker RPC, which only an in-process engine exposes: in server mode on a CPU target
the session's scheduler view (the in-process engine with the same model and args, which the kvcache
stage uses too) is measured; on GPU targets a second engine would not fit, and the check skips.

GPU workers record the device memory their load took. CPU workers do not, and vLLM's CPU backend
repacks linear weights into oneDNN handles and empties their parameters, so there the bytes are
the parameters that still hold data plus the repacked layers counted from their partition shapes
(:func:`day0.engine.loaded.weight_bytes_per_rank`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from day0.config.profile import Profile
from day0.core.record import Check, measured
from day0.engine.handle import ViewUnavailable
from day0.engine.loaded import weight_bytes_per_rank
from day0.model.config import ConfigUnavailable, model_config
from day0.model.plan import Plan, plan
from day0.model.sizing import plan_arguments

SERVER_NOTE = "the server's workers are not reachable over HTTP, so the in-process engine with the same args was measured"


class Unmeasurable(RuntimeError):
    """This engine cannot tell the memory its weights take; ``str()`` says why, in one line."""


@dataclass
class RankWeights:
    """Weight bytes per rank as held to the plan, how they were counted, and the parts per rank."""

    per_rank: list[int]
    note: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def _per_rank(values: list[Any]) -> str:
    """One figure when every rank has the same, else the list (keeps a TP=8 message within one line)."""
    return f"{values[0]}" if len(set(values)) == 1 else f"{values}"


def _mib(values: list[int]) -> str:
    return _per_rank([round(v / 2**20, 2) for v in values])


def _cpu_note(parts: dict[str, list[int]]) -> str:
    """How CPU ranks were counted, in one clause of the check's message (buffers named from 16 KiB)."""
    if not any(parts["repacked_layers"]):
        return "counted as parameters + persistent buffers"
    buffers = f" + buffers {_mib(parts['buffer_bytes'])} MiB" if max(parts["buffer_bytes"]) >= 2**14 else ""
    return (f"parameters {_mib(parts['parameter_bytes'])} MiB{buffers} + {_mib(parts['repacked_bytes'])} MiB "
            f"repacked into oneDNN handles ({_per_rank(parts['repacked_layers'])} linear layers), whose own "
            "allocation is not exposed, so counted from the partition shapes the engine holds (a wrong TP split "
            "still shows, since the shapes are the live engine's)")


def rank_weights(engine: Any) -> RankWeights:
    """Weight bytes each worker holds, rank by rank; raises :class:`Unmeasurable` without the worker RPC.

    Where every worker records the memory its load took (GPU runners), that is the figure; else
    parameters + persistent buffers + the linear weights repacked into oneDNN handles.
    """
    if getattr(engine, "llm", None) is None:
        raise Unmeasurable(f"weight memory per rank is read through vLLM's worker RPC, which the {engine.info.mode} "
                           "mode does not expose; run with engine.mode = \"inprocess\" to measure it")
    ranks = weight_bytes_per_rank(engine.llm)
    loaded = [r.get("loaded_bytes") for r in ranks]
    if None not in loaded:
        return RankWeights(loaded, "", {"basis": "memory the weight load took (worker record)"})
    parts = {k: [int(r.get(k, 0)) for r in ranks]
             for k in ("parameter_bytes", "buffer_bytes", "repacked_bytes", "repacked_layers")}
    per_rank = [int(r["weight_bytes"]) for r in ranks]
    return RankWeights(per_rank, _cpu_note(parts), {"basis": "parameters + buffers + repacked partition shapes", **parts})


def loaded_bytes_per_rank(engine: Any) -> list[int]:
    """Bytes each worker's weights take, rank by rank (:func:`rank_weights`)."""
    return rank_weights(engine).per_rank


def measure_weights(engines: Any) -> RankWeights:
    """:func:`rank_weights` of the session's primary engine, or, when it is a server on a CPU
    target, of its scheduler view (``engines.scheduler()``: started here if it is not up yet, and
    kept for the kvcache stage). Raises :class:`Unmeasurable` where neither exposes the worker RPC.

    Takes the session's engines, not the primary's handle: asking for the scheduler view does not
    wait for the server, so the in-process engine starts while an early-launched server is still
    loading (``engine.start_early``)."""
    if engines.primary_view == "scheduler":
        return rank_weights(engines.primary())
    try:
        engine = engines.scheduler()
    except ViewUnavailable:
        return rank_weights(engines.primary())  # raises, with the mode's reason
    found = rank_weights(engine)
    found.note = "; ".join(n for n in (SERVER_NOTE, found.note) if n)
    found.evidence["engine"] = "scheduler view (in-process, same model and args)"
    return found


def planned(profile: Profile) -> tuple[Plan | None, str]:
    """(stage 0's plan for this profile, or None and the one-line reason it cannot be priced)."""
    try:
        config, _ = model_config(profile)
        return plan(config, **plan_arguments(profile)), ""
    except (ConfigUnavailable, ValueError) as exc:
        return None, str(exc)


def planned_per_rank(plan_: Plan, ranks: int) -> list[int]:
    """Each rank's planned weight bytes: its own pipeline stage's (vLLM numbers a rank stage x TP + TP
    rank). The stages differ: the first holds the embedding, the last the lm_head, and layers split
    unevenly, so the busiest stage's figure failed an exactly-planned Llama-3.1-8B at TP1 x PP4 by
    23%. Ranks that are not the plan's TP x PP (a view of another layout) get the busiest stage's."""
    if ranks == plan_.tp * plan_.pp:
        return [plan_.stages[r // plan_.tp].weight_bytes for r in range(ranks)]
    return [plan_.weight_bytes_per_rank] * ranks


def memory_checks(per_rank: list[int], profile: Profile, *, note: str = "",
                  evidence: dict[str, Any] | None = None) -> list[Check]:
    """``weights.memory_per_rank`` (worst deviation from the plan) and ``weights.memory_headroom``
    (weights within device memory x gpu_memory_utilization); a skip when there is no plan.
    ``note`` (how the bytes were counted) ends the message; ``evidence`` joins the check's."""
    plan_, reason = planned(profile)
    tol = profile.weights.memory_tolerance
    table = {"columns": ["rank", "measured GiB"], "rows": [[r, round(b / 2**30, 4)] for r, b in enumerate(per_rank)]}
    extra = {**(evidence or {}), "table": table}
    tail = f"; {note}" if note else ""
    if plan_ is None:
        return [Check(id="weights.memory_per_rank", title="Weight memory per rank", status="skip",
                      value=max(per_rank), unit="bytes", source="scheduler",
                      message=f"no plan to compare with: {reason}{tail}", evidence=extra)]
    expected = planned_per_rank(plan_, len(per_rank))
    worst = max(abs(b - p) / p for b, p in zip(per_rank, expected))
    plan_text = (f"{expected[0] / 2**20:.2f} MiB" if len(set(expected)) == 1
                 else f"{[round(p / 2**20, 2) for p in expected]} MiB by pipeline stage")
    capacity = profile.topology.device_memory_gib * 2**30 * float(
        profile.engine.args.get("gpu_memory_utilization", 0.9))
    return [
        measured(
            "weights.memory_per_rank", "Weight memory per rank matches the plan", round(worst, 4), tol,
            unit="relative deviation", direction="lower_is_better", source="scheduler",
            message=(f"ranks hold {[round(b / 2**20, 2) for b in per_rank]} MiB of weights; plan "
                     f"{plan_text} (worst deviation {worst:.1%}, tolerance {tol:.0%}){tail}"),
            evidence={**extra, "plan_bytes": plan_.weight_bytes_per_rank, "plan_bytes_per_rank": expected,
                      "measured_bytes": per_rank},
        ),
        measured(
            "weights.memory_headroom", "Weights per rank within device capacity x utilization",
            round(max(per_rank) / 2**30, 4), round(capacity / 2**30, 4), unit="GiB", direction="lower_is_better",
            source="scheduler"),
    ]
