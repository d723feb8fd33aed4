"""The KV-cache facts in a vLLM /metrics exposition: pool usage, block size and count, request gauges, counters
(read by the kvcache stage, and by the weights stage for the pool each rank holds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from day0.client.prom import PromError, samples, scrape_sync
from day0.core.numbers import TOKEN_COUNT_MAX, token_count

# The metrics summed over engines; each sample must be a finite, non-negative number.
_SUMMED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_queries",
           "vllm:prefix_cache_hits", "vllm:num_preemptions")


@dataclass(frozen=True)
class KvMetrics:
    """The KV-cache facts in one /metrics exposition, summed over engines (data-parallel ranks)."""

    used_blocks: int  # sum over engines of round(usage x (num_gpu_blocks - 1))
    usable_blocks: int  # sum of num_gpu_blocks - 1 (vLLM keeps one null block)
    block_size: int
    usage: float  # used / usable
    running: int | None
    waiting: int | None
    prefix_queries: float | None
    prefix_hits: float | None
    preemptions: float | None
    engines: int
    kv_cache_memory_bytes: int | None = None  # the pool's bytes per engine, when cache_config_info says


def parse_kv_metrics(text: str) -> KvMetrics:
    """Read usage, block size/count, request gauges and counters; raise PromError when absent.

    Usage is a fraction of the pool without its null block (``1 - free / (num_gpu_blocks - 1)``),
    so used blocks are recovered exactly by rounding; engines are matched by their ``engine`` label.
    """
    usage: dict[str, float] = {}
    info: dict[str, tuple[int, int]] = {}
    pool_bytes: dict[str, int] = {}
    sums: dict[str, float] = {}
    for s in samples(text):
        name = s.name[:-6] if s.name.endswith("_total") else s.name
        eng = s.labels.get("engine", "0")
        if name == "vllm:kv_cache_usage_perc":
            usage[eng] = _in_domain(name, s.value, 1.0)
        elif name == "vllm:cache_config_info":
            try:
                info[eng] = (int(s.labels["block_size"]), int(s.labels["num_gpu_blocks"]))
            except (KeyError, ValueError):
                raise PromError("vllm:cache_config_info has no integer block_size / num_gpu_blocks labels "
                                "(the engine has not finished allocating its KV cache?)") from None
            if not all(1 <= v <= TOKEN_COUNT_MAX for v in info[eng]):
                raise PromError(f"vllm:cache_config_info has block_size {str(info[eng][0])[:20]} and "
                                f"num_gpu_blocks {str(info[eng][1])[:20]}, not counts of at least 1")
            if s.labels.get("kv_cache_memory_bytes", "").isdigit():
                pool_bytes[eng] = int(s.labels["kv_cache_memory_bytes"])
        elif name in _SUMMED:
            sums[name] = sums.get(name, 0.0) + _in_domain(name, s.value, math.inf)
    if not usage:
        raise PromError("no vllm:kv_cache_usage_perc in /metrics (not a vLLM engine, or stats logging is off)")
    missing = sorted(set(usage) - set(info))
    if missing:
        raise PromError(f"no vllm:cache_config_info for engine(s) {missing}: block size and count unknown")
    sizes = {info[e][0] for e in usage}
    if len(sizes) != 1:
        raise PromError(f"engines report different block sizes {sorted(sizes)}")
    used = sum(round(usage[e] * (info[e][1] - 1)) for e in usage)
    usable = sum(info[e][1] - 1 for e in usage)

    def opt(key: str) -> float | None:
        return sums.get(key)

    return KvMetrics(used_blocks=int(used), usable_blocks=int(usable), block_size=sizes.pop(),
                     usage=used / usable if usable else 0.0,
                     running=_requests(sums, "vllm:num_requests_running"),
                     waiting=_requests(sums, "vllm:num_requests_waiting"),
                     prefix_queries=opt("vllm:prefix_cache_queries"), prefix_hits=opt("vllm:prefix_cache_hits"),
                     preemptions=opt("vllm:num_preemptions"), engines=len(usage),
                     kv_cache_memory_bytes=pool_bytes.get(min(usage)) if pool_bytes else None)


def _in_domain(name: str, value: float, top: float) -> float:
    """A sample's value when finite and in [0, top], else PromError naming the metric: NaN, +Inf or
    1e400 (read as inf) once reached ``round`` or ``int`` and raised ValueError or OverflowError,
    which the kvcache stage's callers, catching PromError, did not expect."""
    v = float(value)
    if not (math.isfinite(v) and 0.0 <= v <= top):
        raise PromError(f"{name} is {v!r}, not " + (f"a number in [0, {top:g}]" if top < math.inf
                                                        else "a finite number >= 0"))
    return v


def _requests(sums: dict[str, float], name: str) -> int | None:
    """The engines' summed request gauge as a count (None when not exported); PromError naming it
    when the sum is not a whole number a server could hold (2.5, or 1e300 requests)."""
    if name not in sums:
        return None
    count = token_count(sums[name])
    if count is None:
        raise PromError(f"{name} is {sums[name]!r}, not a count of requests")
    return count


def http_cache_info(base_url: str) -> KvMetrics:
    return parse_kv_metrics(scrape_sync(base_url))
