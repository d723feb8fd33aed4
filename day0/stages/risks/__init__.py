"""Stage 5 - risks: tenant isolation in the prefix cache (:mod:`.isolation`), accuracy against a
reference (:mod:`.accuracy`, :mod:`.task_accuracy`) and cost (:mod:`.cost`)."""

from day0.core.stages import Figure, Stage

STAGE = Stage(
    name="risks", order=50, suite="day0.suites.test_risks", section="risks",
    title="Risks: tenant isolation, accuracy, cost",
    question="are tenants kept apart, is the served model as accurate as its reference, and is it within budget?",
    figures=(Figure("cost", "Cost per 1M output tokens", ("risks.cost.per_million_output_tokens",), answer_key="load"),
             Figure("ppl_delta", "Perplexity change", ("risks.accuracy.ppl_delta",), scale=100.0, unit="%")),
    required=("risks.accuracy.ppl_delta", "risks.accuracy.top1_agreement", "risks.accuracy.mean_kl"),
)
