"""Stage 4 - kvcache: PagedAttention internal fragmentation at long context, pool capacity, prefix caching.

Two views measure fragmentation (definitions in docs/metrics.md, ``## KV cache``; the stage in
docs/stages/kvcache.md): the **exact** view reads an in-process engine's scheduler after every
step (``exact``), the **black box** estimates it from ``/metrics`` and the client's own streams
(``blackbox``). Modules: ``fragmentation`` (the formula, block counting, samples, summaries),
``workload`` (the request mix), ``exact``, ``blackbox``,
``capacity``, ``prefix`` (the warm/cold probe), ``checks`` (every check built from them),
``views`` (running them on the session's engines), ``errors``. Plain functions and dataclasses:
testable without pytest; the suite (``day0/suites/test_kvcache.py``) records what they return.
"""

from day0.client.kv_metrics import parse_kv_metrics
from day0.core.stages import Figure, Stage, ViewNeed
from day0.stages.kvcache.blackbox import BlackBoxRun, BlackBoxSample, Flight, blackbox_sample, run_blackbox
from day0.stages.kvcache.capacity import Capacity, config_kv_bytes_per_token, live_capacity
from day0.stages.kvcache.checks import (
    agreement_check,
    blackbox_checks,
    capacity_checks,
    exact_checks,
    expected_hit_tokens,
    prefix_check,
    rejected_check,
)
from day0.stages.kvcache.errors import KvCacheError, WorkloadRejected
from day0.stages.kvcache.exact import ExactRun, RequestRecord, SchedulerSampler, run_exact
from day0.stages.kvcache.fragmentation import Holding, KvSample, count_blocks, fragmentation, is_steady, summarize
from day0.stages.kvcache.prefix import PrefixProbe, prefix_probe_http, prefix_probe_inprocess, probe_prompt
from day0.stages.kvcache.views import ViewRuns, prefix_cache_checks, run_in_turn, run_views
from day0.stages.kvcache.workload import build_workload, check_fits, rejection_from_message, workload_vocab

__all__ = [
    # the formula and samples
    "fragmentation", "Holding", "count_blocks", "KvSample", "summarize", "is_steady",
    # the workload
    "build_workload", "check_fits", "rejection_from_message", "workload_vocab", "WorkloadRejected", "KvCacheError",
    # the exact view (scheduler)
    "ExactRun", "RequestRecord", "SchedulerSampler", "run_exact",
    # the black-box view (/metrics)
    "parse_kv_metrics", "Flight", "BlackBoxSample", "blackbox_sample", "BlackBoxRun", "run_blackbox",
    # capacity and the prefix-cache probe
    "Capacity", "config_kv_bytes_per_token", "live_capacity",
    "PrefixProbe", "probe_prompt", "prefix_probe_inprocess", "prefix_probe_http",
    # checks
    "exact_checks", "blackbox_checks", "agreement_check", "capacity_checks", "prefix_check", "rejected_check",
    "expected_hit_tokens",
    # running the views
    "run_in_turn", "ViewRuns", "run_views", "prefix_cache_checks",
]

STAGE = Stage(
    name="kvcache", order=40, suite="day0.suites.test_kvcache", section="kvcache", repeatable=True,
    title="KV cache at long context",
    question="is PagedAttention fragmentation under the limit?",
    # the exact (scheduler) view when it ran, else the /metrics estimate: the figure that was measured
    figures=(Figure("frag_mean", "KV fragmentation, mean", ("kvcache.fragmentation", "kvcache.blackbox_fragmentation")),
             Figure("frag_peak", "KV fragmentation, peak", ("kvcache.fragmentation_peak",)),
             Figure("kv_tokens", "KV tokens held vs needed", ("kvcache.capacity",), need=True)),
    required=("kvcache.capacity", "kvcache.fragmentation"),
    view_needs=(ViewNeed("kvcache.fragmentation", "scheduler",
                         "require kvcache.blackbox_fragmentation (the estimate from /metrics) instead",
                         stand_in="kvcache.blackbox_fragmentation", stand_in_view="http"),),
)
