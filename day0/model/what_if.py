"""The plan's keywords from outside: a profile section's engine args (:func:`plan_kwargs`) and a
command line's ``--what-if tp=8,pp=4,max_model_len=1m`` (:func:`parse_what_if`)."""

from __future__ import annotations

import math
import re
from typing import Any

PLAN_KEYS = (
    "tp", "pp", "dtype", "quantization", "kv_cache_dtype", "max_model_len", "block_size",
    "gpu_memory_utilization", "device_memory_gib", "devices_per_node", "nodes", "target_context",
    "target_concurrency", "activation_headroom_gib", "kv_cache_memory_bytes",
)
_ALIASES = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "concurrency": "target_concurrency",
            "context": "target_context"}
_INT_KEYS = {"kv_cache_memory_bytes", "tp", "pp", "max_model_len", "block_size", "devices_per_node", "nodes", "target_context", "target_concurrency"}
_FLOAT_KEYS = {"gpu_memory_utilization", "device_memory_gib", "activation_headroom_gib"}
_STR_KEYS = {"dtype", "quantization", "kv_cache_dtype"}


def plan_kwargs(mapping: dict[str, Any]) -> dict[str, Any]:
    """Pick the plan's keywords out of a merged profile section (vLLM names accepted), ignoring the rest."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        k = _ALIASES.get(key, key)
        if k in PLAN_KEYS and value is not None:
            out[k] = value
    return out


def parse_human_int(text: str, key: str = "value") -> int:
    """Integers as vLLM's CLI reads them: ``1m`` = 1,000,000, ``1M`` = 1,048,576, ``25.6k`` = 25,600."""
    s = text.strip().replace("_", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", s)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        if "." in number:
            raise ValueError(f"{key}={text!r}: decimals are not allowed with binary suffix {suffix}")
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    raise ValueError(f"{key}={text!r} is not an integer (forms: 1000000, 1m, 1M, 25.6k)")


def parse_what_if(text: str) -> dict[str, Any]:
    """``"tp=8,pp=4,max_model_len=1m"`` -> ``{"tp": 8, "pp": 4, "max_model_len": 1000000}``.

    Why a parser and not eval: the string comes from a command line; every key is checked against
    the plan's keywords and every value gets the plan's type, with one-line errors naming the key.
    """
    out: dict[str, Any] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"--what-if: {item!r} is not key=value (e.g. tp=8,pp=4,max_model_len=1000000)")
        key, value = (part.strip() for part in item.split("=", 1))
        k = _ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if k not in PLAN_KEYS:
            raise ValueError(f"--what-if: unknown key {key!r}; known: {', '.join(PLAN_KEYS)}")
        if not value:
            raise ValueError(f"--what-if: {key} has no value")
        if k in _INT_KEYS:
            out[k] = parse_human_int(value, key)
        elif k in _FLOAT_KEYS:
            try:
                out[k] = float(value)
            except ValueError:
                raise ValueError(f"--what-if: {key}={value!r} is not a number") from None
            if not math.isfinite(out[k]):
                raise ValueError(f"--what-if: {key}={value!r} is not a finite number")
        else:
            out[k] = None if value.lower() in ("none", "null") and k == "quantization" else value
    return out


def format_what_if(changes: dict[str, Any]) -> str:
    """The inverse of :func:`parse_what_if` (used to label a what-if row)."""
    return ",".join(f"{k}={'none' if v is None else v}" for k, v in changes.items())
