"""Small real safetensors checkpoints for the weights-audit tests, and ways to break them.

Why a factory: every audit failure mode (missing shard, truncation, a tensor in the wrong shard,
a wrong dtype...) must be reproduced on genuine files written by the ``safetensors`` library,
so the audit is tested against the format as it exists, not against our idea of it. The tensor
lists here are written out by hand, independently of ``day0.model.arch_tensors``, so the tests also
catch an arch_tensors.py that disagrees with the Hugging Face layout.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

INDEX_NAME = "model.safetensors.index.json"

Shapes = dict[str, tuple[int, ...]]


def llama_config(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def mixtral_config(**overrides: Any) -> dict[str, Any]:
    cfg = llama_config(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4,
                       num_experts_per_tok=2, num_hidden_layers=2)
    cfg.update(overrides)
    return cfg


def llama_tensors(cfg: dict[str, Any]) -> Shapes:
    """HF Llama tensor names and shapes, written out from the modeling code's layout."""
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out: Shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = (h, h)
        out[p + "self_attn.k_proj.weight"] = (kv, h)
        out[p + "self_attn.v_proj.weight"] = (kv, h)
        out[p + "self_attn.o_proj.weight"] = (h, h)
        if cfg["architectures"][0] == "MixtralForCausalLM":
            m = p + "block_sparse_moe."
            out[m + "gate.weight"] = (cfg["num_local_experts"], h)
            for e in range(cfg["num_local_experts"]):
                out[f"{m}experts.{e}.w1.weight"] = (inter, h)
                out[f"{m}experts.{e}.w2.weight"] = (h, inter)
                out[f"{m}experts.{e}.w3.weight"] = (inter, h)
        else:
            out[p + "mlp.gate_proj.weight"] = (inter, h)
            out[p + "mlp.up_proj.weight"] = (inter, h)
            out[p + "mlp.down_proj.weight"] = (h, inter)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
    out["model.norm.weight"] = (h,)
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = (v, h)
    return out


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Ckpt:
    """A checkpoint on disk and what was written into it."""

    dir: Path
    config: dict[str, Any]
    weight_map: dict[str, str]  # tensor -> shard file name
    shards: list[str]
    shapes: Shapes = field(default_factory=dict)

    def path(self, shard: str | int) -> Path:
        return self.dir / (self.shards[shard] if isinstance(shard, int) else shard)

    def shard_of(self, tensor: str) -> str:
        return self.weight_map[tensor]

    def tensors_in(self, shard: str | int) -> list[str]:
        name = self.shards[shard] if isinstance(shard, int) else shard
        return [t for t, s in self.weight_map.items() if s == name]


def make_checkpoint(
    directory: Path,
    *,
    config: dict[str, Any] | None = None,
    num_shards: int = 3,
    tensors: Shapes | None = None,
    seed: int = 0,
    write_index: bool | None = None,
) -> Ckpt:
    """Write config.json, ``num_shards`` safetensors shards and (for >1 shard) the index.

    Tensors are split over shards in HF order (embeddings first, lm_head last), in contiguous
    runs of nearly equal count (``save_pretrained`` fills shards in order, by size).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = config or llama_config()
    shapes = tensors or llama_tensors(cfg)
    dtype = _DTYPES[cfg.get("torch_dtype", "bfloat16")]
    gen = torch.Generator().manual_seed(seed)
    names = list(shapes)
    with_index = num_shards > 1 if write_index is None else write_index
    if with_index:
        shard_names = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    else:
        shard_names = ["model.safetensors"]
    if len(shard_names) > len(names):
        raise ValueError(f"{len(names)} tensors cannot fill {len(shard_names)} shards")
    bounds = [len(names) * k // len(shard_names) for k in range(len(shard_names) + 1)]  # even, none empty
    weight_map: dict[str, str] = {}
    total_size = 0
    for k, shard in enumerate(shard_names):
        chunk = names[bounds[k]:bounds[k + 1]]
        data = {n: torch.randn(shapes[n], generator=gen).to(dtype) for n in chunk}
        save_file(data, str(directory / shard), metadata={"format": "pt"})
        for n, t in data.items():
            weight_map[n] = shard
            total_size += t.numel() * t.element_size()
    if with_index:
        _write_json(directory / INDEX_NAME, {"metadata": {"total_size": total_size}, "weight_map": weight_map})
    _write_json(directory / "config.json", cfg)
    return Ckpt(directory, cfg, weight_map, shard_names, dict(shapes))


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _rewrite(ck: Ckpt, shard: str, change: Any) -> None:
    path = ck.path(shard)
    data = load_file(str(path))
    change(data)
    save_file(data, str(path), metadata={"format": "pt"})


# --------------------------------------------------------------------------- ways to break it


def remove_shard(ck: Ckpt, shard: int | str = 1) -> str:
    path = ck.path(shard)
    path.unlink()
    return path.name


def truncate_shard(ck: Ckpt, shard: int | str = 1, nbytes: int = 100) -> tuple[str, int, int]:
    """Cut ``nbytes`` off the end; returns (name, size before, size after)."""
    path = ck.path(shard)
    before = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(before - nbytes)
    return path.name, before, before - nbytes


def pad_shard(ck: Ckpt, shard: int | str = 1, nbytes: int = 64) -> tuple[str, int, int]:
    path = ck.path(shard)
    before = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\0" * nbytes)
    return path.name, before, before + nbytes


def drop_tensor(ck: Ckpt, tensor: str) -> str:
    """Remove ``tensor`` from its shard's file; the index still lists it there."""
    shard = ck.shard_of(tensor)
    _rewrite(ck, shard, lambda d: d.pop(tensor))
    return shard


def duplicate_tensor(ck: Ckpt, tensor: str, into: int | str) -> str:
    """Write a copy of ``tensor`` into another shard too (the index names only the first)."""
    src = load_file(str(ck.path(ck.shard_of(tensor))))[tensor]
    target = ck.path(into).name
    _rewrite(ck, target, lambda d: d.__setitem__(tensor, src.clone()))
    return target


def add_orphan_shard(ck: Ckpt, name: str = "model-00004-of-00003.safetensors") -> str:
    save_file({"stray.weight": torch.zeros(4, 4)}, str(ck.dir / name))
    return name


def retype_tensor(ck: Ckpt, tensor: str, dtype: torch.dtype = torch.float32) -> str:
    shard = ck.shard_of(tensor)
    _rewrite(ck, shard, lambda d: d.__setitem__(tensor, d[tensor].to(dtype)))
    return shard


def reshape_tensor(ck: Ckpt, tensor: str, shape: tuple[int, ...]) -> str:
    shard = ck.shard_of(tensor)
    _rewrite(ck, shard, lambda d: d.__setitem__(tensor, torch.zeros(shape, dtype=d[tensor].dtype)))
    return shard


def corrupt_index(ck: Ckpt, text: str = '{"metadata": {"total_size": 12}, "weight_map": {"model.embed') -> None:
    (ck.dir / INDEX_NAME).write_text(text, encoding="utf-8")


def remove_config(ck: Ckpt) -> None:
    (ck.dir / "config.json").unlink()


def write_config(ck: Ckpt, **overrides: Any) -> None:
    ck.config = {**ck.config, **overrides}
    _write_json(ck.dir / "config.json", ck.config)


def write_raw_shard(path: Path, header: bytes | dict[str, Any], data_len: int = 0,
                    length_field: int | None = None) -> Path:
    """A shard from raw parts: any header bytes/JSON, any length field, ``data_len`` zero bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length_field is None else length_field
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", n))
        fh.write(raw)
        fh.write(b"\0" * data_len)
    return path


def header_of(path: Path) -> dict[str, Any]:
    """The JSON header of a shard (test-side reader, deliberately minimal)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def rewrite_header(path: Path, change: Any) -> None:
    """Edit a real shard's JSON header in place, keeping its data bytes (for offset faults)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        data = fh.read()
    change(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.write(data)


def deepseek_fp8_config(**overrides: Any) -> dict[str, Any]:
    """A DeepSeek-V3-shaped config, tiny, with block-wise FP8 like the published checkpoint."""
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
        "vocab_size": 128,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [32, 32]},
    }
    cfg.update(overrides)
    return cfg


def make_fp8_checkpoint(directory: Path, shapes: Shapes, config: dict[str, Any], num_shards: int = 2) -> Ckpt:
    """Block-FP8 layout: every ``*_proj`` weight in F8_E4M3 plus an F32 ``weight_scale_inv`` of
    shape ceil(out/block) x ceil(in/block); router bias in F32; the rest in BF16."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    b0, b1 = config["quantization_config"]["weight_block_size"]
    tensors: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=gen)
        if name.endswith(("_proj.weight", "_proj_with_mqa.weight")) and len(shape) == 2:
            tensors[name] = t.to(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = torch.ones(math.ceil(shape[0] / b0), math.ceil(shape[1] / b1))
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = t.float()
        else:
            tensors[name] = t.to(torch.bfloat16)
    names = list(tensors)
    shard_names = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    per = math.ceil(len(names) / num_shards)
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shard_names):
        chunk = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
        save_file(chunk, str(directory / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in chunk})
    _write_json(directory / INDEX_NAME, {"metadata": {}, "weight_map": weight_map})
    _write_json(directory / "config.json", config)
    return Ckpt(directory, config, weight_map, shard_names, {n: tuple(t.shape) for n, t in tensors.items()})
