"""Stage 0 glue: the profile's model config, lint findings and memory plan, before any engine.

The suite and ``day0 plan`` both call :func:`preflight`, so the table a person reads at the
shell and the checks in run.json come from one computation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from day0 import archs
from day0.lint import Finding, lint
from day0.plan import Plan, plan, plan_kwargs
from day0.profile import Profile


class ConfigUnavailable(RuntimeError):
    """No config.json can be read offline for this profile (a hub id without ``model.config``)."""


def model_config(profile: Profile) -> tuple[dict[str, Any], str]:
    """(config.json contents, where it came from): the model's own, else ``model.config``.

    The checkpoint's config is the truth when it is on disk; ``model.config`` lets a supernode be
    planned from a config.json (or a bundled example) before the weights exist.
    """
    if profile.model.source == "tiny":
        from day0.tiny import cached_model

        d = cached_model(profile.model.tiny)
        return _read(d / "config.json"), str(d / "config.json")
    assert profile.model.path is not None
    own = Path(profile.model.path) / "config.json"
    if own.is_file():
        return _read(own), str(own)
    ref = profile.model.config
    if ref:
        if ref in archs.example_names():
            return archs.example_config(ref), f"example config {ref!r}"
        path = Path(ref)
        return _read(path if path.name.endswith(".json") else path / "config.json"), str(path)
    raise ConfigUnavailable(f"model.path {profile.model.path!r} has no local config.json; set model.config to a "
                            f"config.json path or one of {', '.join(archs.example_names())}")


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigUnavailable(f"{path}: config.json not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigUnavailable(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None


def kv_cache_memory_bytes(profile: Profile) -> int | None:
    """On the CPU backend the KV pool is VLLM_CPU_KVCACHE_SPACE GiB, not a memory fraction."""
    args = profile.engine.args
    if args.get("kv_cache_memory_bytes"):
        return int(args["kv_cache_memory_bytes"])
    space = profile.engine.env.get("VLLM_CPU_KVCACHE_SPACE")
    if profile.topology.device == "cpu" and space:
        return int(float(space) * 2**30)
    return None


def plan_arguments(profile: Profile, what_if: dict[str, Any] | None = None) -> dict[str, Any]:
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


@dataclass
class Preflight:
    config_source: str
    findings: list[Finding]
    plan: Plan | None
    plan_error: str = ""  # why no plan could be priced (e.g. dtype="int4"), one line

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


def engine_args_with(profile: Profile, what_if: dict[str, Any] | None) -> dict[str, Any]:
    """The engine args a what-if would give (tp/pp spelt as vLLM spells them)."""
    args = dict(profile.engine.args)
    names = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size"}
    for key, value in (what_if or {}).items():
        args[names.get(key, key)] = value
    return args


def preflight(profile: Profile, what_if: dict[str, Any] | None = None, rules: Any = None) -> Preflight:
    config, source = model_config(profile)
    t = profile.topology
    # An NVLink fabric across nodes (NVL72) is one fast domain: TP may span its trays.
    fast_domain = t.world_size if t.inter_node == "nvlink" else t.devices_per_node
    findings = lint(engine_args_with(profile, what_if), config, device=t.device,
                    devices_per_node=fast_domain, nodes=t.nodes if fast_domain == t.devices_per_node else 1,
                    env={**profile.engine.env}, rules=rules)
    try:
        return Preflight(source, findings, plan(config, **plan_arguments(profile, what_if)))
    except ValueError as exc:  # the lint findings already say why; keep them
        return Preflight(source, findings, None, str(exc))
