"""What the installed vLLM accepts (its engine argument names, dtypes, KV-cache dtypes,
quantization methods and the server's own flags), read from vLLM's own classes once per install.

Why once: reading them imports vLLM, ~10 s of CPU and ~700 MB on a 2-core box, and every
``day0 plan``, every preflight and every lint paid that for a few lists that change only when vLLM
does. So the lists are kept under day0's cache folder, named by what is installed: the path of the
vllm package and the size and modification time of each file they come from (``install_key``).
A reinstall, an upgrade or an edited checkout rewrites those files and is read again; nothing
expires with time. Without vLLM the rules are a snapshot of 0.32.0, and a snapshot is never kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from day0.core.inputs import InputError, read_text
from day0.core.outputs import cache_root, write_file

__all__ = ["SNAPSHOT", "VllmRules", "install_key", "read_vllm_rules", "vllm_root", "vllm_rules"]

# Snapshot of vLLM 0.32.0 for machines without vLLM (the live values win when vLLM imports).
_SNAPSHOT_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_SNAPSHOT_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
_SNAPSHOT_QUANT = ("awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
                   "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
                   "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
                   "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
                   "nvfp4_per_token", "mxfp8")

# The files of the vllm package the rules are read from (and its version): a change to any of
# them is a new key. Bump RULES_FORMAT when VllmRules or the way it is read changes.
RULES_SOURCES = ("_version.py", "engine/arg_utils.py", "config/model.py", "config/cache.py",
                 "model_executor/layers/quantization/__init__.py", "entrypoints/launchers/cli_args.py")
RULES_FORMAT = 1
CACHE_CAP = 1 << 20  # bytes: a kept rules file is a few KiB


@dataclass(frozen=True)
class VllmRules:
    """What the installed vLLM accepts; passed in where it is used (no module-level state): kept on
    disk once per install (:func:`vllm_rules`), never in a process."""

    version: str
    engine_arg_names: frozenset[str]
    dtypes: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    quantization_methods: tuple[str, ...]
    default_gpu_memory_utilization: float
    from_vllm: bool
    # The OpenAI server's own flags (FrontendArgs: api_key, host, chat_template, ...): not EngineArgs,
    # but what `engine.args` may hold when day0 starts vLLM's server.
    server_arg_names: frozenset[str] = frozenset()


SNAPSHOT = VllmRules("0.32.0 (snapshot)", frozenset(), _SNAPSHOT_DTYPES, _SNAPSHOT_KV_DTYPES, _SNAPSHOT_QUANT, 0.92,
                     False)


def vllm_rules(cache: Path | None = None) -> VllmRules:
    """The installed vLLM's rules: kept ones when this install's were read before (under
    ``cache``, default day0's cache folder), else read from vLLM and kept; the snapshot
    (``from_vllm=False``) when vLLM is absent or does not import."""
    root = vllm_root()
    if root is None:
        return SNAPSHOT
    path = (cache or cache_root()) / "vllm-rules" / f"{install_key(root)}.json"
    kept = _load(path)
    if kept is not None:
        return kept
    rules = read_vllm_rules()
    if rules.from_vllm:
        _keep(path, rules)
    return rules


def vllm_root() -> Path | None:
    """The vllm package's folder, found without importing it; None: not installed."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def install_key(root: Path) -> str:
    """What names one install of vLLM: its folder, and the size and modification time (ns) of
    each file the rules come from (absent ones as absent)."""
    parts: list[Any] = [RULES_FORMAT, str(root)]
    for rel in RULES_SOURCES:
        try:
            st = (root / rel).stat()
        except OSError:
            parts.append([rel, None])
            continue
        parts.append([rel, st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def read_vllm_rules() -> VllmRules:
    """Read the rules from vLLM's own classes (imports vLLM); the snapshot when it does not import."""
    try:
        from vllm import __version__ as version
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    except ImportError:
        return SNAPSHOT
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    try:
        from vllm.entrypoints.launchers.cli_args import FrontendArgs

        server_args = frozenset(f.name for f in dataclasses.fields(FrontendArgs)) - set(fields)
    except (ImportError, TypeError):  # the module moved between vLLM releases: accept the secret we know of
        server_args = frozenset({"api_key"})
    return VllmRules(
        version=str(version),
        engine_arg_names=frozenset(name for name in fields if not name.startswith("_")),
        dtypes=_literal_values(fields["dtype"].type) or _SNAPSHOT_DTYPES,
        kv_cache_dtypes=_literal_values(fields["kv_cache_dtype"].type) or _SNAPSHOT_KV_DTYPES,
        quantization_methods=tuple(QUANTIZATION_METHODS),
        default_gpu_memory_utilization=float(fields["gpu_memory_utilization"].default),
        from_vllm=True,
        server_arg_names=server_args,
    )


def _literal_values(tp: Any) -> tuple[str, ...]:
    """Strings of a ``Literal[...]`` (possibly inside ``X | None``), for vLLM's typed fields."""
    if typing.get_origin(tp) is Literal:
        return tuple(str(v) for v in typing.get_args(tp))
    out: list[str] = []
    for arg in typing.get_args(tp):
        out.extend(_literal_values(arg))
    return tuple(out)


def _load(path: Path) -> VllmRules | None:
    """Kept rules, or None for anything short of a whole, well-formed file (absent, unreadable,
    cut short, another format): the rules are then read from vLLM again."""
    try:
        data = json.loads(read_text(path, "kept vLLM rules", cap=CACHE_CAP))
        if data.pop("format") != RULES_FORMAT:
            return None
        return VllmRules(
            version=str(data["version"]),
            engine_arg_names=frozenset(map(str, data["engine_arg_names"])),
            dtypes=tuple(map(str, data["dtypes"])),
            kv_cache_dtypes=tuple(map(str, data["kv_cache_dtypes"])),
            quantization_methods=tuple(map(str, data["quantization_methods"])),
            default_gpu_memory_utilization=float(data["default_gpu_memory_utilization"]),
            from_vllm=bool(data["from_vllm"]),
            server_arg_names=frozenset(map(str, data["server_arg_names"])),
        )
    except (InputError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _keep(path: Path, rules: VllmRules) -> None:
    """Keep ``rules`` for the next process; a folder that cannot be written only costs that one
    the import again."""
    data = {key: sorted(value) if isinstance(value, frozenset) else value
            for key, value in dataclasses.asdict(rules).items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, json.dumps({"format": RULES_FORMAT, **data}, indent=1) + "\n")
    except (OSError, InputError):
        pass
