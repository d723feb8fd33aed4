"""The memory plan for a profile: the profile's topology, engine args and targets as
:func:`day0.model.plan.plan` arguments, so stage 0 and the stages that compare a live engine with
the plan (kvcache capacity, weights per rank) price the same thing."""

from __future__ import annotations

import math
from typing import Any, Mapping

from day0.config.profile import Profile
from day0.model import archs
from day0.model.config import ConfigUnavailable, model_config
from day0.model.plan import MLA_FP8_DS_BYTES, Plan, kv_dtype_bytes, plan, plan_kwargs, resolve_dtype
from day0.model.what_if import check_engine_args


def config_kv_bytes_per_token(config: dict[str, Any], engine_args: Mapping[str, Any]) -> int:
    """KV bytes per token on the busiest rank from config.json and the engine args (TP x PP, dtypes)."""
    tp = int(engine_args.get("tensor_parallel_size", 1) or 1)
    pp = int(engine_args.get("pipeline_parallel_size", 1) or 1)
    dtype = resolve_dtype(str(engine_args.get("dtype", "auto")), config)
    kv_dtype = str(engine_args.get("kv_cache_dtype", "auto"))
    if archs.is_mla(config) and kv_dtype.lower() == "fp8_ds_mla":
        return MLA_FP8_DS_BYTES * math.ceil(archs.num_layers(config) / pp)
    return archs.kv_bytes_per_token(config, kv_dtype_bytes(kv_dtype, dtype), tp=tp, pp=pp)


def kv_cache_memory_bytes(profile: Profile) -> int | None:
    """On the CPU backend the KV pool is VLLM_CPU_KVCACHE_SPACE GiB, not a memory fraction."""
    args = profile.engine.args
    if args.get("kv_cache_memory_bytes"):
        return int(args["kv_cache_memory_bytes"])
    space = profile.engine.env.get("VLLM_CPU_KVCACHE_SPACE")
    if profile.topology.device == "cpu" and space:
        try:
            gib = float(space)
        except ValueError:
            gib = math.nan
        if not 0 <= gib <= 1 << 20:  # nan, inf and garbage alike
            raise ValueError(f"engine.env.VLLM_CPU_KVCACHE_SPACE: {space[:40]!r} is not a size in GiB (0 to 1048576)")
        return int(gib * 2**30)
    return None


def plan_arguments(profile: Profile, what_if: dict[str, Any] | None = None) -> dict[str, Any]:
    check_engine_args(profile.engine.args)
    t = profile.topology
    kw: dict[str, Any] = {
        "device_memory_gib": t.device_memory_gib,
        "devices_per_node": t.devices_per_node,
        "nodes": t.nodes,
        "target_context": profile.kvcache.target_context,
        "target_concurrency": profile.kvcache.target_concurrency,
        "activation_headroom_gib": profile.preflight.activation_headroom_gib,
        "kv_cache_memory_bytes": kv_cache_memory_bytes(profile),
    }
    kw.update(plan_kwargs(profile.engine.args))
    if what_if:
        kw.update(what_if)
    return kw


def plan_for(profile: Profile) -> Plan | None:
    """The stage-0 plan for this profile (None when it cannot be priced), without the lint."""
    try:
        config, _ = model_config(profile)
        return plan(config, **plan_arguments(profile))
    except (ConfigUnavailable, ValueError):
        return None
