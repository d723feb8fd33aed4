"""Stage 1 - weights: the checkpoint is complete and consistent before any engine starts, and the
running engine loaded it right.

* :func:`audit` reads only the index, the shard headers and config.json (:mod:`.audit`, with its
  steps in :mod:`.index`, :mod:`.headers`, :mod:`.against_config` and :mod:`.integrity`);
  :func:`write_manifest` records a trusted copy's SHA-256 digests for it (:mod:`.manifest`).
* :func:`smoke_checks`, :func:`load_time_check` and :func:`golden_check` judge the live engine
  (:mod:`.live`); :func:`golden_tokens_check` holds its greedy tokens to an independent reference,
  transformers or a golden file (:mod:`.golden`); :func:`memory_checks` holds the weight bytes per
  rank to the plan (:mod:`.memory`).
"""

from day0.core.stages import Stage, ViewNeed
from day0.stages.weights.audit import audit
from day0.stages.weights.findings import CATEGORIES
from day0.stages.weights.golden import golden_tokens_check
from day0.stages.weights.integrity import write_manifest
from day0.stages.weights.live import golden_check, load_time_check, smoke_checks
from day0.stages.weights.memory import Unmeasurable, loaded_bytes_per_rank, memory_checks

__all__ = [
    "CATEGORIES",
    "Unmeasurable",
    "audit",
    "golden_check",
    "golden_tokens_check",
    "load_time_check",
    "loaded_bytes_per_rank",
    "memory_checks",
    "smoke_checks",
    "write_manifest",
]

STAGE = Stage(
    name="weights", order=10, suite="day0.suites.test_weights", section="weights",
    title="Weight-shard loading",
    question="are the shards complete and loaded right, within memory?",
    required=("weights.shards_present", "weights.smoke.*", "weights.manifest", "weights.golden_tokens",
              "weights.memory_per_rank"),
    view_needs=(ViewNeed("weights.memory_per_rank", "scheduler",
                         "run day0 on the engine's host (its ranks' memory is then read there, weights.rank_memory), "
                         "or require weights.smoke.* and weights.golden_tokens (through the HTTP API) instead",
                         stand_in="weights.rank_memory", stand_in_view="beside"),),
)
