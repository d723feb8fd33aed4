"""Stage 3 (latency): TTFT, TPOT, ITL, E2E, throughput and goodput as vLLM's serving benchmark
defines them, judged against the SLA, with the engine's own view as a cross-check.

Modules: ``settings`` (the client objects the ``[latency]`` table of ``day0.config.latency``
describes), ``metrics`` (definitions and statistics of one phase), ``measurement`` (what a run
measured, as data), ``run`` (the measured run over HTTP), ``inprocess`` (the same on vLLM's own
engine), ``agreement`` (client vs engine), ``sweep`` (the SLA sweep), ``search`` (the capacity
search), ``checks`` (the run-record checks), ``speculative`` (speculative decoding's acceptance
over the measured workload and its speedup), ``stage`` (the stage against the run's engine),
``cli`` (``day0 latency``), and
``importing`` with ``imported``, ``from_vllm``, ``from_guidellm`` (``day0 latency import``: a
``vllm bench serve`` or GuideLLM result judged by the same checks).
"""

from day0.core.stages import Figure, Stage
from day0.stages.latency.agreement import agreement_allowance
from day0.stages.latency.checks import latency_checks
from day0.stages.latency.cli import add_cli, main
from day0.stages.latency.importing import import_checks, read_result
from day0.stages.latency.measurement import LatencyRun, SweepPoint
from day0.stages.latency.metrics import compute_metrics, per_token_itl, summarize, tpot_of
from day0.stages.latency.run import MeasuredThroughput, measure_throughput, run_latency
from day0.stages.latency.settings import SettingsError
from day0.stages.latency.stage import NoTokenizer, run_stage, workload_vocab

__all__ = [
    "LatencyRun",
    "MeasuredThroughput",
    "NoTokenizer",
    "SettingsError",
    "SweepPoint",
    "add_cli",
    "agreement_allowance",
    "compute_metrics",
    "import_checks",
    "latency_checks",
    "main",
    "measure_throughput",
    "per_token_itl",
    "read_result",
    "run_latency",
    "run_stage",
    "summarize",
    "tpot_of",
    "workload_vocab",
]

STAGE = Stage(
    name="latency", order=30, suite="day0.suites.test_latency", section="latency", repeatable=True,
    title="Prefill/decode latency",
    question="do TTFT, TPOT and throughput meet the SLA?",
    figures=(Figure("ttft_p99", "TTFT p99", ("latency.ttft_p99",)),
             Figure("tpot_p99", "TPOT p99", ("latency.tpot_p99",)),
             Figure("output_throughput", "Output throughput", ("latency.output_throughput",)),
             Figure("goodput", "Goodput", ("latency.goodput",)),
             Figure("capacity", "Capacity (req/s meeting the SLA)", ("latency.capacity",), opt_in=True,
                    answer_key="answer")),
    required=("latency.ttft_p99", "latency.tpot_p99", "latency.output_throughput"),
)
