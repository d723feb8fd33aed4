"""Weight memory per rank read beside the engine, where no worker RPC reaches it.

An external deployment or a server on GPUs exposes no worker RPC, so the exact weight bytes of
:mod:`.memory` cannot be had. When day0 runs on the engine's host it can still read what each rank
holds (:mod:`day0.engine.ranks`: device memory per process on GPUs, private resident memory on
CPU) and the KV pool each rank allocated (``vllm:cache_config_info`` on /metrics). What a rank holds
beyond its pool is its weights plus its runtime, so ``weights.rank_memory`` bounds the weights from
above: at most the plan's weights per rank within ``memory_tolerance``, plus
``runtime_allowance_gib``. A rank that loaded twice its share (a checkpoint read in the wrong dtype,
experts replicated instead of sharded, a TP split gone wrong) is past it; a tiny model's weights are
within the allowance's noise, and the message says the figure is a bound (docs/metrics.md).
``weights.rank_balance`` holds the TP ranks to one another, where a wrong split shows however
small the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from day0.client.kv_metrics import parse_kv_metrics
from day0.client.prom import PromError, scrape_sync
from day0.config.profile import Profile
from day0.core.record import Check, measured
from day0.engine.ranks import RankProcess, RanksUnavailable, listener_pid, ranks
from day0.model.config import ConfigUnavailable, model_config
from day0.model.sizing import config_kv_bytes_per_token
from day0.stages.weights.memory import planned

# Measured on this box for the tiny model on CPU: 0.56 GiB beyond the pool after start-up, 0.93 GiB
# after a whole Day0 run (8K prefills, grammars compiled): the runtime grows with what was served.
RUNTIME_ALLOWANCE_GIB = {"cpu": 2.0}
GPU_RUNTIME_ALLOWANCE_GIB = 4.0  # CUDA context, NCCL buffers, graphs, activation peak: not measured here


@dataclass
class Beside:
    """The ranks as read on this host, and the KV pool each allocated."""

    ranks: list[RankProcess]
    pool_bytes: int
    pool_basis: str


def root_pid(engine: Any) -> int:
    """The engine's top process: the server day0 started, or whoever listens on the external URL."""
    pid = getattr(engine.info, "pid", None)
    return pid if pid else listener_pid(str(engine.info.base_url))


def pool_bytes_per_rank(metrics_text: str, profile: Profile) -> tuple[int, str]:
    """(KV pool bytes on one rank, how it was read) from ``vllm:cache_config_info``
    (:func:`day0.client.kv_metrics.parse_kv_metrics`): its ``kv_cache_memory_bytes`` when the engine
    reports it, else one engine's blocks x block size x the KV bytes a token costs on a rank
    (config.json and the engine args)."""
    try:
        m = parse_kv_metrics(metrics_text)
    except PromError as exc:
        raise RanksUnavailable(f"the KV pool each rank holds is unknown: {exc}") from exc
    if m.kv_cache_memory_bytes:
        return m.kv_cache_memory_bytes, "kv_cache_memory_bytes (vllm:cache_config_info)"
    try:
        config, _ = model_config(profile)
    except ConfigUnavailable as exc:
        raise RanksUnavailable(f"no config.json to price the KV pool per rank: {exc}") from exc
    blocks = (m.usable_blocks + m.engines) // m.engines  # vLLM's num_gpu_blocks of one engine
    per_token = config_kv_bytes_per_token(config, profile.engine.args)
    return blocks * m.block_size * per_token, f"{blocks} blocks x {m.block_size} tokens x {per_token} B/token (config.json)"


def read_beside(engine: Any, profile: Profile) -> Beside:
    """The engine's ranks and their pool, read on this host; raises :class:`RanksUnavailable`."""
    found = ranks(root_pid(engine), profile.topology.device)
    pool, basis = pool_bytes_per_rank(scrape_sync(str(engine.info.base_url)), profile)
    return Beside(found, pool, basis)


def allowance_gib(profile: Profile) -> float:
    own = profile.weights.runtime_allowance_gib
    return own if own is not None else RUNTIME_ALLOWANCE_GIB.get(profile.topology.device, GPU_RUNTIME_ALLOWANCE_GIB)


def rank_memory_checks(seen: Beside, profile: Profile) -> list[Check]:
    """``weights.rank_memory`` (the largest rank's memory beyond its KV pool, against the plan's weights
    within tolerance plus the runtime allowance) and, at more than one rank, ``weights.rank_balance``."""
    beyond = [r.resident_bytes - seen.pool_bytes for r in seen.ranks]
    table = {"columns": ["rank", "pid", "process", "resident GiB", "beyond the KV pool GiB"],
             "rows": [[i, r.pid, r.title[:40], round(r.resident_bytes / 2**30, 3), round(b / 2**30, 3)]
                      for i, (r, b) in enumerate(zip(seen.ranks, beyond))]}
    evidence = {"basis": seen.ranks[0].basis, "pool_bytes_per_rank": seen.pool_bytes, "pool_basis": seen.pool_basis,
                "resident_bytes": [r.resident_bytes for r in seen.ranks], "table": table}
    plan_, reason = planned(profile)
    if plan_ is None:
        return [Check(id="weights.rank_memory", title="Rank memory beyond the KV pool", status="skip",
                      value=round(max(beyond) / 2**30, 4), unit="GiB", source="beside",
                      message=f"no plan to compare with: {reason}", evidence=evidence)]
    tol, allowance = profile.weights.memory_tolerance, allowance_gib(profile)
    weights_gib = plan_.weight_bytes_per_rank / 2**30
    limit = round(weights_gib * (1 + tol) + allowance, 4)
    worst = round(max(beyond) / 2**30, 4)
    out = [measured(
        "weights.rank_memory", "Rank memory beyond the KV pool within the planned weights + runtime",
        worst, limit, unit="GiB", direction="lower_is_better", source="beside",
        message=(f"{len(beyond)} rank(s) hold at most {worst:.3f} GiB beyond a {seen.pool_bytes / 2**30:.3f} GiB KV "
                 f"pool ({seen.ranks[0].basis}); limit: planned weights {weights_gib:.3f} GiB x {1 + tol:.2f} + "
                 f"runtime allowance {allowance:g} GiB. A bound on the weights, not their exact bytes"),
        evidence={**evidence, "plan_bytes": plan_.weight_bytes_per_rank, "allowance_gib": allowance})]
    groups = tp_groups(beyond, plan_.tp, plan_.pp)
    if any(len(g) > 1 for g in groups):
        spread = round(max((max(g) - min(g)) / max(g) if max(g) > 0 else 0.0 for g in groups), 4)
        where = "" if len(groups) == 1 else f", the widest within one of {len(groups)} pipeline stages"
        out.append(measured(
            "weights.rank_balance", "Ranks hold the same memory beyond the KV pool", spread, tol,
            unit="relative spread", direction="lower_is_better", source="beside",
            message=(f"ranks hold {[round(b / 2**30, 3) for b in beyond]} GiB beyond the pool: spread {spread:.1%}"
                     f"{where} (tolerance {tol:.0%}); TP ranks hold equal shards"), evidence=evidence))
    return out


def tp_groups(beyond: list[int], tp: int, pp: int) -> list[list[int]]:
    """The ranks that hold equal shards: each pipeline stage's TP ranks (stages differ by design:
    the first holds the embedding, the last the lm_head). Ranks that are not the plan's TP x PP are
    one group only at PP 1, else none is judged."""
    if len(beyond) == tp * pp:
        return [beyond[i:i + tp] for i in range(0, len(beyond), tp)]
    return [beyond] if pp == 1 else []


def beside_checks(engines: Any, profile: Profile) -> list[Check]:
    """The checks above for the session's HTTP engine, or the one line why they cannot be read: a
    skip where the ranks are not on this host (preflight said so); where they should be and are not
    readable, an error when they stand in for the exact check (the run cannot be accepted on them),
    else a skip (the exact figure was had through the scheduler view)."""
    from day0.engine.handle import beside_unavailable, scheduler_unavailable

    why = beside_unavailable(profile)
    if why:
        return [Check(id="weights.rank_memory", title="Rank memory beyond the KV pool", status="skip",
                      message=why, source="beside")]
    try:
        return rank_memory_checks(read_beside(engines.http(), profile), profile)
    except (RanksUnavailable, PromError) as exc:
        status = "error" if scheduler_unavailable(profile) else "skip"
        return [Check(id="weights.rank_memory", title="Rank memory beyond the KV pool", status=status,
                      message=f"the engine's ranks could not be read on this host: {exc}", source="beside")]
