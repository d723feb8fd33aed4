"""The ordered Day0 stages. One list, so markers, gating, the record and the report agree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    question: str  # what the stage answers, shown in --markers and the report
    # Its figures come from timing a live system: --day0-repeat N measures it N times on the same
    # engine to show their spread (static audits and one-off correctness probes are not repeated).
    repeatable: bool = False


STAGES: tuple[Stage, ...] = (
    Stage("preflight", "Preflight: config lint and memory plan", "can this profile work at all, before any GPU-hour?"),
    Stage("weights", "Weight-shard loading", "are the shards complete and loaded right, within memory?"),
    Stage("collectives", "Collective communication", "are collectives correct and fast on this topology?",
          repeatable=True),
    Stage("latency", "Prefill/decode latency", "do TTFT, TPOT and throughput meet the SLA?", repeatable=True),
    Stage("kvcache", "KV cache at long context", "is PagedAttention fragmentation under the limit?", repeatable=True),
    Stage("risks", "Risks: tenant isolation, accuracy, cost",
          "are tenants kept apart, is the served model as accurate as its reference, and is it within budget?"),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
REPEATABLE: frozenset[str] = frozenset(s.name for s in STAGES if s.repeatable)

# Added by the session after the Day0 stages ran, from the record alone: no marker, gate nothing;
# a failed check in them rejects the run like any other.
REGRESSION_STAGE = Stage("regression", "Regression against the history",
                         "is this run as good as the last runs of the same system, beyond their run-to-run spread?")
REPEAT_STAGE = Stage("repeat", "Verdict stability across repeats",
                     "does every check give the same verdict each time it is measured on the same engine?")


def stage_index(name: str) -> int:
    return STAGE_NAMES.index(name)
