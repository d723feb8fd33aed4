"""How long the static weights audit takes on a checkpoint the size of the largest MoE models.

Builds, in a temporary folder, a checkpoint with ``--shards`` shards and about ``--tensors``
tensors (a Qwen3-MoE-shaped config with tiny dimensions, so headers are full-size but the data is
a few bytes per tensor, written sparse), then times:

* the full headers-only :func:`day0.stages.weights.audit` (index, presence, orphans, every header,
  placement, dtypes and shapes against config.json, parameter count), with 1 worker and with the
  default thread count;
* the baseline, measured in the same run: opening every shard with ``safetensors.safe_open`` and
  listing its tensors' dtypes and shapes (what the library offers for the same question).

Target: the audit finishes in under 10 s. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_weights_audit.py [--shards 1000] [--tensors 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from day0.model import arch_tensors  # noqa: E402
from day0.model.safetensors_header import DTYPE_BITS  # noqa: E402
from day0.stages.weights import audit  # noqa: E402


def moe_config(target_tensors: int) -> dict:
    experts = 128
    per_layer = 4 + 2 + 1 + 3 * experts + 2  # q,k,v,o + q/k norm + router + experts + 2 norms
    layers = max(1, round((target_tensors - 3) / per_layer))
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 16,
        "intermediate_size": 32,
        "moe_intermediate_size": 8,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "num_experts": experts,
        "num_experts_per_tok": 8,
        "vocab_size": 64,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def synthesize(root: Path, shards: int, tensors: int) -> tuple[Path, int]:
    """Write config.json, the index and ``shards`` valid safetensors files (sparse data)."""
    cfg = moe_config(tensors)
    shapes = arch_tensors.expected_tensors(cfg)
    names = list(shapes)
    bounds = [len(names) * k // shards for k in range(shards + 1)]  # even split, no empty shard
    weight_map: dict[str, str] = {}
    total = 0
    width = DTYPE_BITS["BF16"] // 8
    for k in range(shards):
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for n in names[bounds[k]:bounds[k + 1]]:
            nbytes = math.prod(shapes[n]) * width
            header[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[n] = shard
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * ((8 - len(raw) % 8) % 8)
        with open(root / shard, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)))
            fh.write(raw)
            fh.truncate(8 + len(raw) + offset)  # sparse: data bytes are never written
        total += offset
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(cfg))
    return root, len(names)


def time_it(fn, repeat: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds of this process) per run; CPU time shows the cost on a busy box."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--tensors", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="day0-bench-audit-") as tmp:
        t0 = time.perf_counter()
        root, n = synthesize(Path(tmp), args.shards, args.tensors)
        files = list(root.glob("*.safetensors"))
        print(f"synthesized {len(files)} shards, {n} tensors in {time.perf_counter() - t0:.1f} s "
              f"(JSON headers {sum(_header_len(p) for p in files) / 1e6:.1f} MB, "
              f"index {(root / 'model.safetensors.index.json').stat().st_size / 1e6:.1f} MB)")

        checks = audit(root)
        bad = [c for c in checks if c.failed]
        print(f"audit verdict: {len(checks)} checks, {len(bad)} failed" + (f": {bad[0].message}" if bad else ""))

        load = os.getloadavg()[0]
        one = time_it(lambda: audit(root, workers=1), args.repeat)
        many = time_it(lambda: audit(root), args.repeat)

        from safetensors import safe_open

        def library() -> None:
            for p in sorted(root.glob("*.safetensors")):
                with safe_open(str(p), framework="np") as fh:
                    for k in fh.keys():
                        s = fh.get_slice(k)
                        s.get_dtype(), s.get_shape()

        base = time_it(library, args.repeat)

    def fmt(t: tuple[list[float], list[float]]) -> str:
        wall, cpu = t
        return (f"wall best {min(wall):.2f} s / median {statistics.median(wall):.2f} s, "
                f"CPU best {min(cpu):.2f} s")

    print(f"load average before timing: {load:.2f} on {os.cpu_count()} CPUs (a shared box inflates wall time)")
    print(f"audit, 1 worker:           {fmt(one)}  ({n / min(one[0]):,.0f} tensors/s wall)")
    print(f"audit, default workers:    {fmt(many)}  ({n / min(many[0]):,.0f} tensors/s wall)")
    print(f"baseline safe_open+slices: {fmt(base)}  (lists dtypes/shapes only, no cross-checks)")
    best = min(min(one[0]), min(many[0]))
    print(f"audit / baseline ratio: wall {best / min(base[0]):.2f}, CPU {min(many[1]) / min(base[1]):.2f}")
    print(f"target: audit under 10 s -> {'met' if best < 10 else 'MISSED'} (best wall {best:.2f} s)")


def _header_len(p: Path) -> int:
    with open(p, "rb") as fh:
        return int.from_bytes(fh.read(8), "little")


if __name__ == "__main__":
    main()
