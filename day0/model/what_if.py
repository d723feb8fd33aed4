"""The plan's keywords from outside: a profile section's engine args (:func:`plan_kwargs`) and a
command line's ``--what-if tp=8,pp=4,max_model_len=1m`` (:func:`parse_what_if`)."""

from __future__ import annotations

import math
import re
import reprlib
from typing import Any

PLAN_KEYS = (
    "tp", "pp", "dtype", "quantization", "kv_cache_dtype", "max_model_len", "block_size",
    "gpu_memory_utilization", "device_memory_gib", "devices_per_node", "nodes", "target_context",
    "target_concurrency", "activation_headroom_gib", "kv_cache_memory_bytes", "enable_expert_parallel",
)
_ALIASES = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "concurrency": "target_concurrency",
            "context": "target_context", "expert_parallel": "enable_expert_parallel"}
_INT_KEYS = {"kv_cache_memory_bytes", "tp", "pp", "max_model_len", "block_size", "devices_per_node", "nodes", "target_context", "target_concurrency"}
_FLOAT_KEYS = {"gpu_memory_utilization", "device_memory_gib", "activation_headroom_gib"}
_STR_KEYS = {"dtype", "quantization", "kv_cache_dtype"}
_BOOL_KEYS = {"enable_expert_parallel"}
_BOOL_WORDS = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}


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
    if len(s) > 40:  # past any size, and past what int() converts (sys.get_int_max_str_digits)
        raise ValueError(f"{key}={reprlib.repr(text)} has {len(s)} characters: not a size day0 reads")
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT])", s)  # ASCII: \d takes '٣' too
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        if "." in number:
            raise ValueError(f"{key}={text!r}: decimals are not allowed with binary suffix {suffix}")
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    if re.fullmatch(r"[+-]?[0-9]+", s):
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
        if k in _BOOL_KEYS:
            if value.lower() not in _BOOL_WORDS:
                raise ValueError(f"--what-if: {key}={value!r} is not true or false")
            out[k] = _BOOL_WORDS[value.lower()]
        elif k in _INT_KEYS:
            out[k] = parse_human_int(value, f"--what-if: {key}")
        elif k in _FLOAT_KEYS:
            try:
                out[k] = float(value)
            except ValueError:
                raise ValueError(f"--what-if: {key}={value!r} is not a number") from None
            if not math.isfinite(out[k]):
                raise ValueError(f"--what-if: {key}={value!r} is not a finite number")
        else:
            out[k] = None if value.lower() in ("none", "null") and k == "quantization" else value
        problem = _out_of_range(k, out[k])
        if problem:
            raise ValueError(f"--what-if: {key}={value}: {problem}")
    return out


# Ranges of the plan's numeric keywords: (least, most). Past them no deployment exists, and the
# plan's arithmetic or its layout search would only spend time.
_RANGES: dict[str, tuple[int, int]] = {
    "tp": (1, 1 << 20), "pp": (1, 1 << 20), "block_size": (1, 1 << 20), "max_model_len": (1, 1 << 62),
    "target_context": (1, 1 << 62), "target_concurrency": (1, 1 << 30), "kv_cache_memory_bytes": (0, 1 << 50),
    "devices_per_node": (1, 1024), "nodes": (1, 4096), "gpu_memory_utilization": (0, 1),
    "device_memory_gib": (0, 1 << 20), "activation_headroom_gib": (0, 1 << 20),
}
# Floats whose least value is excluded: no memory at all is not a device.
_OPEN_BELOW = {"gpu_memory_utilization", "device_memory_gib"}
# vLLM's engine-arg names for the plan's keys, and the other engine args day0 reads as numbers or flags.
ENGINE_ARG_KEYS: dict[str, str] = {
    "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "max_model_len": "max_model_len",
    "block_size": "block_size", "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes", "max_num_batched_tokens": "target_context",
    "data_parallel_size": "tp",  # the EP group is TP x DP: a whole number of ranks, like tp
}
_ENGINE_FLAGS = ("enable_chunked_prefill", "enable_prefix_caching", "enforce_eager", "enable_expert_parallel",
                 "enable_eplb")


def _out_of_range(key: str, value: Any) -> str:
    """Why a plan keyword's value is unusable, or "" when it is fine."""
    if key in _STR_KEYS:
        return "" if value is None or isinstance(value, str) else f"expected a string, got {reprlib.repr(value)}"
    if key in _BOOL_KEYS:
        return "" if type(value) is bool else f"expected true or false, got {reprlib.repr(value)}"
    least, most = _RANGES.get(key, (-math.inf, math.inf))
    if key in _INT_KEYS and type(value) is not int:  # bool is an int to Python, not to a layout
        return f"expected a whole number, got {reprlib.repr(value)}"
    if key in _FLOAT_KEYS and (type(value) not in (int, float) or not math.isfinite(value)):
        return f"expected a finite number, got {reprlib.repr(value)}"
    if key == "max_model_len" and value == -1:  # vLLM's "derive it from config.json"
        return ""
    below = value <= least if key in _OPEN_BELOW else value < least
    if below or value > most:
        bracket = "(" if key in _OPEN_BELOW else "["
        return f"{value} is outside {bracket}{least}, {most}]"
    return ""


def check_engine_args(args: dict[str, Any]) -> None:
    """The engine args day0 reads to lint and plan are of the type vLLM takes, within range.

    Why: ``[engine.args]`` is passed to vLLM unchanged, so the profile's schema does not type it;
    but the plan prices ``tensor_parallel_size = "8"`` or ``max_model_len = -5`` and would judge a
    layout vLLM refuses. Raises ValueError naming ``engine.args.<key>``.
    """
    for raw_key, value in args.items():
        key = str(raw_key).replace("-", "_")
        if value is None:
            continue
        if key in _ENGINE_FLAGS and type(value) is not bool:
            raise ValueError(f"engine.args.{raw_key}: expected true or false, got {reprlib.repr(value)}")
        plan_key = ENGINE_ARG_KEYS.get(key) or (key if key in _STR_KEYS else None)
        problem = _out_of_range(plan_key, value) if plan_key else ""
        if problem:
            raise ValueError(f"engine.args.{raw_key}: {problem}")


def format_what_if(changes: dict[str, Any]) -> str:
    """The inverse of :func:`parse_what_if` (used to label a what-if row)."""
    return ",".join(f"{k}={'none' if v is None else v}" for k, v in changes.items())
