"""How quantized weights are stored, for sizing: packed bits plus per-group/block/channel scales.

:func:`weight_scheme` answers which scheme vLLM would use (the ``quantization=`` argument, else
the checkpoint's ``quantization_config``); :func:`stays_unquantized` names the tensors every
scheme keeps in the model dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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
    method = (quantization or qc.get("quant_method") or "").lower() or None
    if method is None or method == "none":
        return UNQUANTIZED
    if method in _FP8_NAMES:
        block = qc.get("weight_block_size") if qc.get("quant_method") == "fp8" else None
        if method == "fp8_per_block" and not block:
            block = [128, 128]
        if block:
            return WeightScheme(method, 8, block=(int(block[0]), int(block[1])))
        return WeightScheme(method, 8, per_channel=method == "fp8_per_channel")
    if method in _INT_GROUP_NAMES:
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
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
    weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
    if not weights:  # no checkpoint description: the common W4A16 group-128 recipe
        return WeightScheme("compressed-tensors(w4a16)", 4, group_size=128, scale_bytes=2)
    bits = int(weights.get("num_bits") or 4)
    strategy = weights.get("strategy") or "group"
    name = f"compressed-tensors({weights.get('type', 'int')}{bits},{strategy})"
    zeros = not weights.get("symmetric", True)
    if strategy == "group":
        return WeightScheme(name, bits, group_size=int(weights.get("group_size") or 128), scale_bytes=2, zero_points=zeros)
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        return WeightScheme(name, bits, block=(int(block[0]), int(block[1])))
    return WeightScheme(name, bits, per_channel=strategy == "channel", zero_points=zeros)


def stays_unquantized(name: str, shape: tuple[int, ...]) -> bool:
    """Tensors every scheme keeps in the model dtype: embeddings, lm_head, norms, routers, biases."""
    return (
        len(shape) != 2
        or not name.endswith(".weight")
        or "embed_tokens" in name
        or name.startswith("lm_head")
        or name.endswith((".mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight"))
    )
