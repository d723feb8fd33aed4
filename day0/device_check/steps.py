"""The device check's model steps: CUDA, the tiny model, the plan, memory per rank, reference tokens.

Each step records its checks through :class:`~day0.device_check.runner.DeviceRun` as it measures
them. torch, transformers and safetensors are imported inside the steps, and day0's modules
that lean on pydantic (the profile, the tiny model's spec, the plan) only in the steps that use
them, so a machine missing one of them still returns a record saying which step could not run
and why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from day0.core.record import Check, measured
from day0.device_check.runner import TOKENS_FILE, DeviceRun, Step
from day0.model.reference import RefSequence, compare_all, greedy_reference, summarize

#: Weight memory per rank (and the plan against the checkpoint's tensors) may differ from the plan
#: by this much. Not the weights stage's 10 %: on the tiny model the smallest tensor class that is
#: not a norm (lm_head, or the embedding) is 3.9 % of the parameters, and a plan that left it out is
#: off by only 3.24 % once vLLM's vocabulary padding (to a multiple of 64: +1.24 %, the one known
#: difference) is counted; 10 % passed that. 2 % holds the padding with room to spare (every tiny
#: tensor is a multiple of 512 bytes and under 1 MiB, so the CUDA allocator adds nothing), and a
#: missing lm_head exceeds it. A norm class (0.1 %) is below anything a tolerance can see.
MEMORY_TOLERANCE = 0.02
GIB = 1 << 30
MIB = 1 << 20
#: Bytes per element as the plan prices them (the tiny model's tensors are all floating point).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
#: Where the GPU references run (tests point it at the CPU to exercise the comparison path).
REF_DEVICE = "cuda:0"


def cuda_step(run: DeviceRun) -> None:
    """Whether CUDA answers, and the versions a closing note quotes; the GPU steps wait on it."""
    st = run.state
    try:
        import torch
    except ImportError as exc:
        st.no_cuda = f"no CUDA device: torch cannot be imported ({exc})"
        raise
    info: dict[str, Any] = {"torch": str(torch.__version__), "torch_cuda": torch.version.cuda}
    try:
        available = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
        available, st.no_cuda = False, f"no CUDA device: torch.cuda.is_available() raised {type(exc).__name__}: {exc}"
    if not available:
        st.cuda = {"available": False, "reason": st.no_cuda, **info}
        run.record("device", Check(id="device.cuda", title="CUDA devices answer", status="skip",
                                   message=st.no_cuda or "", evidence=info, source="torch.cuda"))
        return
    devices = []
    try:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory),
                            "capability": f"{p.major}.{p.minor}", "multiprocessors": int(p.multi_processor_count)})
    except Exception as exc:  # e.g. a device busy in exclusive-process mode: the GPU steps' skips must say so
        st.no_cuda = (f"no usable CUDA device: torch.cuda.is_available() is True, but the first query raised "
                      f"{type(exc).__name__}: {exc}")
        st.cuda = {"available": False, "reason": st.no_cuda, **info}
        raise
    try:
        info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as exc:  # noqa: BLE001 - a torch built without NCCL says so in the collectives step
        info["nccl"] = f"unknown ({type(exc).__name__})"
    st.no_cuda, st.cuda = None, {"available": True, "devices": devices, **info}
    run.facts["cuda"] = st.cuda
    names = ", ".join(f"{d['name']} ({d['memory_bytes'] / GIB:.1f} GiB)" for d in devices)
    run.record("device", Check(
        id="device.cuda", title="CUDA devices answer", status="pass", value=len(devices), unit="devices",
        message=f"{len(devices)} CUDA device(s): {names}; torch {info['torch']}, CUDA {info['torch_cuda']}, "
                f"NCCL {info['nccl']}", evidence=st.cuda, source="torch.cuda"))


def build_step(run: DeviceRun) -> None:
    """The embedded tiny model from the default profile's spec (or the checkpoint ``--model-dir`` names)."""
    st = run.state
    t0 = time.perf_counter()
    if run.opts.model_dir is not None:
        st.model_dir, how = run.opts.model_dir, f"given with --model-dir {run.opts.model_dir}"
    else:
        from day0.config.profile import DEFAULT_PROFILE, load_profile
        from day0.model.tiny import build, spec_digest

        spec = load_profile(DEFAULT_PROFILE).model.tiny
        st.model_dir = build(spec, st.work / "tiny")  # type: ignore[operator]
        how = f"built from profile {DEFAULT_PROFILE}'s [model.tiny] (spec {spec_digest(spec)})"
    st.config = json.loads((st.model_dir / "config.json").read_text(encoding="utf-8"))
    shards = _shards(st.model_dir)
    total = sum(p.stat().st_size for p in shards)
    run.record("device", Check(
        id="device.tiny_model", title="The tiny model's checkpoint is ready", status="pass", value=total,
        unit="bytes", message=f"{len(shards)} shards, {total / MIB:.2f} MiB, {how} in {time.perf_counter() - t0:.1f} s",
        evidence={"dir": str(st.model_dir), "shards": [p.name for p in shards]}, source="device_check"))


def _shards(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


def plan_step(run: DeviceRun) -> None:
    """Stage 0's plan (tp=1) against the checkpoint's own tensors, in each dtype the GPU step loads:
    the plan the GPU figures are held to must price this checkpoint right before it means anything."""
    from day0.model.plan import plan
    from day0.model.safetensors_header import read_header

    st = run.state
    assert st.model_dir is not None and st.config is not None
    tensors = [t for p in _shards(st.model_dir) for t in read_header(p).tensors.values()]
    stored = sum(t.nbytes for t in tensors)
    numel = sum(t.numel for t in tensors)
    devices = st.cuda.get("devices") or []
    memory_gib = devices[0]["memory_bytes"] / GIB if devices else 80.0  # sizes the KV pool only, unused here
    kw: dict[str, Any] = {"tp": 1, "pp": 1, "device_memory_gib": memory_gib, "devices_per_node": 1,
                          "max_model_len": 4096}
    rows, worst = [], 0.0
    for dtype, size in DTYPE_BYTES.items():
        st.planned[dtype] = plan(st.config, dtype=dtype, **kw).weight_bytes_per_rank
        dev = abs(st.planned[dtype] - numel * size) / (numel * size)
        worst = max(worst, dev)
        rows.append([dtype, st.planned[dtype], numel * size, round(dev, 6)])
    auto = plan(st.config, dtype="auto", **kw).dtype  # what vLLM would load this checkpoint as
    run.facts["plan"] = {"weight_bytes_per_rank": dict(st.planned), "checkpoint_bytes": stored,
                         "parameters": numel, "auto_dtype": auto}
    mib = ", ".join(f"{d} {b / MIB:.3f} MiB" for d, b in st.planned.items())
    run.record("device", measured(
        "device.plan", "The stage-0 plan prices the checkpoint's weights (tp=1)", round(worst, 6),
        MEMORY_TOLERANCE, unit="relative deviation", direction="lower_is_better", source="static",
        message=(f"plan per rank: {mib}, for {numel} parameters ({stored / MIB:.3f} MiB stored; dtype=auto "
                 f"plans {auto}); worst deviation {worst:.2%}, tolerance {MEMORY_TOLERANCE:.0%}"),
        evidence={"table": {"columns": ["dtype", "plan bytes per rank", "parameters x dtype bytes", "deviation"],
                            "rows": rows}}))


def memory_step(run: DeviceRun) -> None:
    """Every visible GPU loads the whole checkpoint through safetensors (tp=1, one replica per
    device), in float32 as stored and cast to bfloat16; torch.cuda's allocator says what it took."""
    import torch

    st = run.state
    assert st.model_dir is not None
    shards = _shards(st.model_dir)
    rows = {dtype: [] for dtype in DTYPE_BYTES}
    for dev in range(torch.cuda.device_count()):
        for dtype, figures in _load_on(torch, shards, dev).items():
            rows[dtype].append(figures)
    run.facts["memory_per_rank"] = {}
    for dtype, per_rank in rows.items():
        planned = st.planned[dtype]
        worst = max(abs(r["allocated_bytes"] - planned) / planned for r in per_rank)
        mib = [round(r["allocated_bytes"] / MIB, 3) for r in per_rank]
        run.facts["memory_per_rank"][dtype] = {"planned_bytes": planned, "ranks": per_rank}
        table = {"columns": ["rank (device)", "allocated bytes", "plan bytes", "deviation", "peak bytes", "load s"],
                 "rows": [[r["device"], r["allocated_bytes"], planned,
                           round(abs(r["allocated_bytes"] - planned) / planned, 6), r["peak_bytes"], r["seconds"]]
                          for r in per_rank]}
        run.record("device", measured(
            f"device.memory_per_rank.{dtype}", f"Weight memory per rank matches the plan ({dtype}, torch.cuda)",
            round(worst, 6), MEMORY_TOLERANCE, unit="relative deviation", direction="lower_is_better",
            source="torch.cuda",
            message=(f"ranks hold {mib} MiB of {dtype} weights (torch.cuda.memory_allocated); plan "
                     f"{planned / MIB:.3f} MiB (worst deviation {worst:.2%}, tolerance {MEMORY_TOLERANCE:.0%})"),
            evidence={"table": table, "plan_bytes": planned}))


def _load_on(torch: Any, shards: list[Path], dev: int) -> dict[str, dict[str, Any]]:
    """(dtype -> figures) for one device: bytes the loaded weights hold, the peak, the time."""
    from safetensors.torch import load_file

    out: dict[str, dict[str, Any]] = {}
    with torch.cuda.device(dev):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loaded: dict[str, Any] = {}
        for shard in shards:
            loaded.update(load_file(str(shard), device=f"cuda:{dev}"))
        held = loaded
        for dtype in DTYPE_BYTES:  # float32 first: a no-op on the tiny model, which is stored so
            held = {k: (v.to(getattr(torch, dtype)) if v.is_floating_point() else v) for k, v in held.items()}
            loaded = {}
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            out[dtype] = _figures(torch, dev, base, t0)
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
        del held, loaded
        torch.cuda.empty_cache()
    return out


def _figures(torch: Any, dev: int, base: int, t0: float) -> dict[str, Any]:
    return {"device": dev, "name": torch.cuda.get_device_name(dev),
            "allocated_bytes": int(torch.cuda.memory_allocated(dev) - base),
            "peak_bytes": int(torch.cuda.max_memory_allocated(dev) - base),
            "seconds": round(time.perf_counter() - t0, 3)}


def _prompts() -> list[str]:
    """The weights stage's golden prompts: the tokens recorded here are the ones a golden file holds."""
    from day0.engine.loaded import GOLDEN_PROMPTS

    return list(GOLDEN_PROMPTS)


def cpu_tokens_step(run: DeviceRun) -> None:
    """The CPU float32 reference every GPU reference is compared with."""
    st = run.state
    prompts = _prompts()
    t0 = time.perf_counter()
    refs = greedy_reference(st.model_dir, prompts, run.opts.max_new_tokens, device="cpu", dtype="float32",
                            top_k=run.opts.top_k)
    st.references["cpu/float32"] = refs
    _write_tokens(run)
    short = [r.prompt for r in refs if len(r.tokens) != run.opts.max_new_tokens]
    run.record("device", measured(
        "device.tokens.cpu_float32", "transformers greedy reference on CPU (float32)", len(short), 0,
        unit="prompts", direction="exact", source="transformers",
        message=(f"{len(refs)} prompts x {run.opts.max_new_tokens} greedy tokens in {time.perf_counter() - t0:.1f} s"
                 if not short else f"short sequences for {short}"),
        evidence={"token_ids": {r.prompt: r.tokens for r in refs}}))


def cuda_tokens_step(run: DeviceRun, dtype: str) -> None:
    """The same prompts on the GPU in ``dtype``, compared with CPU float32; near-ties are not failures."""
    st = run.state
    cpu = st.references["cpu/float32"]
    margin = run.opts.margins[dtype]
    t0 = time.perf_counter()
    refs = greedy_reference(st.model_dir, [r.prompt for r in cpu], run.opts.max_new_tokens, device=REF_DEVICE,
                            dtype=dtype, top_k=run.opts.top_k)
    seconds = time.perf_counter() - t0
    st.references[f"cuda/{dtype}"] = refs
    comps = compare_all(cpu, refs, margin)
    counts = summarize(comps)
    run.facts.setdefault("tokens", {})[f"cuda/{dtype}"] = {"margin": margin, **counts,
                                                           "comparisons": [c.message for c in comps]}
    _write_tokens(run)
    deltas = [c.max_logprob_delta for c in comps if c.max_logprob_delta is not None]
    table = {"columns": ["prompt", "status", "position", "cpu token", "gpu token", "gap cpu", "gap gpu",
                         "max |dlogprob| before"],
             "rows": [[c.prompt, c.status, c.position, c.token_a, c.token_b, c.gap_a, c.gap_b, c.max_logprob_delta]
                      for c in comps]}
    bad = [c.message for c in comps if c.status == "diverged"]
    run.record("device", measured(
        f"device.tokens.cuda_{dtype}", f"GPU {dtype} greedy tokens equal CPU float32 (near-ties allowed)",
        counts["diverged"], 0, unit="prompts", direction="exact", source="transformers",
        message=(f"{counts['match']} match, {counts['near_tie']} near-tie, {counts['diverged']} diverged "
                 f"(margin {margin:g} nats; max |dlogprob| {max(deltas, default=0.0):.3g}; {seconds:.1f} s)"
                 + (f"; first: {bad[0]}" if bad else "")),
        evidence={"table": table, "comparisons": [c.to_dict() for c in comps]}))


def _write_tokens(run: DeviceRun) -> None:
    refs = run.state.references
    run.write_json(TOKENS_FILE, {
        "max_new_tokens": run.opts.max_new_tokens, "top_k": run.opts.top_k, "margins": run.opts.margins,
        "references": {k: [r.to_dict() for r in v] for k, v in refs.items()},
    })


def load_tokens(path: Path) -> dict[str, list[RefSequence]]:
    """The references of a tokens.json back as :class:`RefSequence` lists: how a test proves the file
    the device check writes holds what it compared (nothing in day0 reads it back yet)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {k: [RefSequence.from_dict(r) for r in v] for k, v in data["references"].items()}


def model_steps() -> list[Step]:
    """The steps before the sweep (CUDA, model, plan, memory), in order."""
    mem = {f"device.memory_per_rank.{d}": f"Weight memory per rank matches the plan ({d}, torch.cuda)"
           for d in DTYPE_BYTES}
    return [
        Step("cuda", "device", {"device.cuda": "CUDA devices answer"}, cuda_step),
        Step("tiny_model", "device", {"device.tiny_model": "The tiny model's checkpoint is ready"}, build_step,
             needs=("work",)),
        Step("plan", "device", {"device.plan": "The stage-0 plan prices the checkpoint's weights (tp=1)"},
             plan_step, needs=("model_dir", "config")),
        Step("memory_per_rank", "device", mem, memory_step, needs_cuda=True, needs=("model_dir", "planned")),
    ]


def token_steps() -> list[Step]:
    """The reference-token steps (after the sweep: the longest GPU step goes first within the budget)."""
    steps = [Step("tokens_cpu_float32", "device", {"device.tokens.cpu_float32":
                                                   "transformers greedy reference on CPU (float32)"},
                  cpu_tokens_step, needs=("model_dir",))]
    for dtype in ("float32", "bfloat16"):
        steps.append(Step(f"tokens_cuda_{dtype}", "device",
                          {f"device.tokens.cuda_{dtype}": f"GPU {dtype} greedy tokens equal CPU float32 "
                                                          "(near-ties allowed)"},
                          lambda run, d=dtype: cuda_tokens_step(run, d), needs_cuda=True, needs=("references",)))
    return steps
