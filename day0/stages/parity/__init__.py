"""Stage 1b - parity: does every feature the deployment turns on keep the output right?

Public Day-0 failures are fluent and wrong under one feature (graphs, a cache, speculation), and a
smoke test passes all of them. From the resolved engine args (:mod:`.features`: the profile, with
vLLM's defaults where it is silent) the stage lists the features in force and runs, for each, the
cheapest request-level comparison that isolates it over the HTTP API (:mod:`.answers`), judged
with the golden-token near-tie margin and drift rule (:mod:`.compare`): prefix caching (a cold miss
vs a full hit), batch invariance (alone vs inside a concurrent batch), streaming vs not,
speculative decoding (greedy tokens vs transformers, :mod:`.reference`; acceptance from /metrics,
:mod:`.speculative`), chunked prefill and long context (a prompt past the chunk budget, and one 3/4
of max_model_len, vs transformers on the same text); graph mode and the parallel layout are
answered by the weights stage's golden tokens, read from the record so far. :mod:`.stage` runs
them against the run's engine, one test each in
day0/suites/test_parity.py. Runs after weights (a
wrong answer makes every later figure moot) and before collectives. docs/stages/parity.md.
"""

from day0.core.stages import Figure, Stage
from day0.stages.parity.answers import Answer, AnswerError, Ask, ask_many, ask_one
from day0.stages.parity.compare import Pair, compare_pair, feature_check, margin_for
from day0.stages.parity.features import VLLM_DEFAULTS, Feature, features
from day0.stages.parity.speculative import Acceptance, acceptance, acceptance_checks
from day0.stages.parity.stage import (
    COMPARED,
    GOLDEN,
    THROUGH_GOLDEN,
    Parity,
    check_feature,
    feature_matrix,
    run_parity,
    through_golden,
)

__all__ = [
    "COMPARED", "GOLDEN", "THROUGH_GOLDEN", "VLLM_DEFAULTS", "Acceptance", "Answer", "AnswerError", "Ask",
    "Feature", "Pair", "Parity", "acceptance", "acceptance_checks", "ask_many", "ask_one", "check_feature",
    "compare_pair", "feature_check", "feature_matrix", "features", "margin_for", "run_parity", "through_golden",
]


STAGE = Stage(
    name="parity", order=15, suite="day0.suites.test_parity", section="parity",
    title="Feature parity",
    question="does every feature the deployment turns on (prefix caching, batching, streaming, speculation, "
             "chunked prefill, long context, graph mode, parallel layout) keep the greedy output right?",
    figures=(Figure("features", "Features compared", ("parity.features",), unit="features"),
             Figure("spec_acceptance", "Speculative acceptance rate",
                    ("parity.speculative.acceptance_rate", "parity.speculative"))),
    required=("parity.streaming", "parity.batch_invariance", "parity.features"),
)
