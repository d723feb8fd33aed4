"""How quantized weights are stored, for sizing: packed bits plus per-group/block/channel scales.

:func:`weight_scheme` answers which scheme vLLM would use (the ``quantization=`` argument, else
the checkpoint's ``quantization_config``); :func:`stays_unquantized` names the tensors every
scheme keeps in the model dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from day0.model.archs import ConfigError, describe_value


@dataclass(frozen=True)
class WeightScheme:
    """How a quantized linear weight is stored: packed bits plus per-group/block/channel scales."""

    name: str
    bits: int | None  # None: unquantized (stored in the model dtype)
    group_size: int | None = None  # scales per group of input features (int4/mxfp4/nvfp4)
    block: tuple[int, int] | None = None  # scales per [out, in] block (fp8 block-wise)
    per_channel: bool = False  # one scale per output channel
    scale_bytes: float = 4.0
    zero_points: bool = False  # awq/gptq keep packed zero points per group
    experts_only: bool = False  # experts_int8 quantizes MoE experts only

    def linear_bytes(self, out_f: int, in_f: int, dtype_bytes: int) -> float:
        if self.bits is None:
            return out_f * in_f * dtype_bytes
        packed = out_f * in_f * self.bits / 8
        if self.group_size:
            groups = out_f * math.ceil(in_f / self.group_size)
            extra = groups * self.scale_bytes + (groups * self.bits / 8 if self.zero_points else 0)
        elif self.block:
            extra = math.ceil(out_f / self.block[0]) * math.ceil(in_f / self.block[1]) * self.scale_bytes
        elif self.per_channel:
            extra = out_f * self.scale_bytes
        else:
            extra = self.scale_bytes  # one per-tensor scale
        return packed + extra


UNQUANTIZED = WeightScheme("none", None)

_FP8_NAMES = {"fp8", "fbgemm_fp8", "fp8_per_tensor", "fp8_per_channel", "fp8_per_block", "modelopt", "deepseek_v4_fp8"}
_INT_GROUP_NAMES = {"awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq", "moe_wna16"}
_PLAN_ONLY = {"w4a16": "compressed-tensors", "int4": "compressed-tensors", "w8a16": "compressed-tensors",
              "int8": "compressed-tensors", "w8a8": "compressed-tensors"}
SIZEABLE_QUANTIZATION = tuple(sorted(_FP8_NAMES | _INT_GROUP_NAMES | set(_PLAN_ONLY)
                                     | {"compressed-tensors", "experts_int8", "int8_per_channel_weight_only",
                                        "mxfp4", "gpt_oss_mxfp4", "modelopt_fp4", "nvfp4"}))


def weight_scheme(quantization: str | None, config: dict[str, Any]) -> WeightScheme:
    """The storage scheme vLLM would use: the ``quantization=`` arg, else the checkpoint's own.

    ``w4a16``/``int4``/``w8a8``/``int8`` are planning shorthands (the vLLM method for such a
    checkpoint is ``compressed-tensors``); they size int4 with group-128 scales, int8 per channel.
    """
    qc = config.get("quantization_config") or {}
    if not isinstance(qc, dict):
        raise ConfigError("quantization_config", f"expected an object, got {describe_value(qc)}")
    ckpt_method = qc.get("quant_method")
    if ckpt_method is not None and not isinstance(ckpt_method, str):
        raise ConfigError("quantization_config.quant_method", f"expected a string, got {describe_value(ckpt_method)}")
    method = (quantization or ckpt_method or "").lower() or None
    if method is None or method == "none":
        return UNQUANTIZED
    if method in _FP8_NAMES:
        block = _pair(qc, "weight_block_size") if ckpt_method == "fp8" else None
        if method == "fp8_per_block" and not block:
            block = (128, 128)
        if block:
            return WeightScheme(method, 8, block=block)
        return WeightScheme(method, 8, per_channel=method == "fp8_per_channel")
    if method in _INT_GROUP_NAMES:
        bits = _int(qc, "bits", None) or _int(qc, "w_bit", None) or 4
        group = _int(qc, "group_size", None, least=-1) or _int(qc, "q_group_size", None, least=-1) or 128
        group = group if group > 0 else None  # gptq group_size=-1: one group per row
        return WeightScheme(method, bits, group_size=group, per_channel=group is None, scale_bytes=2, zero_points=True)
    if method in ("w4a16", "int4"):
        return WeightScheme(method, 4, group_size=128, scale_bytes=2)
    if method in ("w8a16", "int8", "w8a8", "int8_per_channel_weight_only"):
        return WeightScheme(method, 8, per_channel=True, scale_bytes=4)
    if method == "experts_int8":
        return WeightScheme(method, 8, per_channel=True, experts_only=True)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return WeightScheme(method, 4, group_size=32, scale_bytes=1)
    if method in ("modelopt_fp4", "nvfp4"):
        return WeightScheme(method, 4, group_size=16, scale_bytes=1)
    if method == "compressed-tensors":
        return _compressed_tensors_scheme(qc)
    raise ValueError(
        f"quantization={method!r}: day0 cannot size this scheme; it sizes: " + ", ".join(SIZEABLE_QUANTIZATION)
    )


def _compressed_tensors_scheme(qc: dict[str, Any]) -> WeightScheme:
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise ConfigError("quantization_config.config_groups", f"expected an object, got {describe_value(groups)}")
    weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
    if not weights:  # no checkpoint description: the common W4A16 group-128 recipe
        return WeightScheme("compressed-tensors(w4a16)", 4, group_size=128, scale_bytes=2)
    if not isinstance(weights, dict):
        raise ConfigError("quantization_config.config_groups.weights", f"expected an object, got {describe_value(weights)}")
    where = "quantization_config.config_groups.weights"
    bits = _int(weights, "num_bits", where) or 4
    strategy = weights.get("strategy") or "group"
    if not isinstance(strategy, str):
        raise ConfigError(f"{where}.strategy", f"expected a string, got {describe_value(strategy)}")
    name = f"compressed-tensors({weights.get('type', 'int')}{bits},{strategy})"
    zeros = not weights.get("symmetric", True)
    if strategy == "group":
        group = _int(weights, "group_size", where) or 128
        return WeightScheme(name, bits, group_size=group, scale_bytes=2, zero_points=zeros)
    if strategy == "block":
        return WeightScheme(name, bits, block=_pair(weights, "block_structure", where) or (128, 128))
    return WeightScheme(name, bits, per_channel=strategy == "channel", zero_points=zeros)


def _int(table: dict[str, Any], key: str, where: str | None, least: int = 1, most: int = 1 << 20) -> int | None:
    """An integer field of the quantization config (None when unset), refused in one line otherwise."""
    value = table.get(key)
    if value is None:
        return None
    name = f"{where or 'quantization_config'}.{key}"
    if type(value) is not int:
        raise ConfigError(name, f"expected an integer, got {describe_value(value)}")
    if not least <= value <= most:
        raise ConfigError(name, f"{value} is outside [{least}, {most}]")
    return value


def _pair(table: dict[str, Any], key: str, where: str | None = None) -> tuple[int, int] | None:
    """A ``[out, in]`` block of positive integers (None when unset)."""
    value = table.get(key)
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and 0 < v <= 1 << 20 for v in value)):
        raise ConfigError(f"{where or 'quantization_config'}.{key}",
                          f"expected [out, in] positive integers, got {describe_value(value)}")
    return (value[0], value[1])


def stays_unquantized(name: str, shape: tuple[int, ...]) -> bool:
    """Tensors every scheme keeps in the model dtype: embeddings, lm_head, norms, routers, biases."""
    return (
        len(shape) != 2
        or not name.endswith(".weight")
        or "embed_tokens" in name
        or name.startswith("lm_head")
        or name.endswith((".mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight"))
    )
