"""What vLLM 0.32's CPU backend refuses or quietly changes, as one table of small specs.

Why a table and not an if-chain: each fact is a measurement (``shared/notes/vllm-cpu.md``,
"MoE, expert parallelism, pipeline stages...") or a line of vLLM's source, and each has to say
where it comes from; a new kernel limit is one more row, and the docs and the tests read the same
rows (:data:`CPU_KERNEL_LIMITS`). The lint applies them when ``topology.device == "cpu"``, before
an engine spends minutes starting only to fail at the first request. A row reads the engine args,
``config.json`` and, where a kernel exists only for some CPUs, this host's CPU flags (``cpu_int4_moe``).

Severity: ``error`` where the CPU backend certainly refuses or crashes the same way every time,
``warning`` where it starts but drops what the profile asked for (or crashed in a measurement the
run itself must repeat), ``info`` where it overrides a setting harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from day0.model import archs
from day0.stages.preflight.findings import Finding, Severity

# vllm/v1/attention/backends/cpu_attn.py CPUAttentionBackend.get_supported_head_sizes (0.32.0)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vllm/v1/attention/backends/mla/cpu_mla.py and amx_mla.py: get_supported_head_sizes() == [576]
CPU_MLA_LATENT = (512, 64)  # (kv_lora_rank, qk_rope_head_dim): 512 + 64 = 576
CPU_MLA_BLOCK_SIZE = 16  # platforms/cpu.py forces it for the reference CPU MLA kernel
# amx_mla.py's convert_weight_packed takes bfloat16, float16 and int8 weights; "auto" serves a float32
# checkpoint in bfloat16 on x86 (vllm/config/model.py downcasts to the platform's first dtype), so only
# an explicit float32 reaches it in float32
FLOAT32_DTYPES = ("float32", "float")
CPU_BLOCK_MULTIPLE = 32  # CPU_ATTN: get_supported_kernel_block_sizes() == [MultipleOf(32)]
NOTES = "notes/vllm-cpu.md (measured on day0's CPU box, vLLM 0.32)"
# vllm/model_executor/layers/quantization/: the methods whose MoE layers take vLLM's WNA16 MoE oracle
WNA16_MOE_METHODS = ("gptq", "auto_gptq", "awq", "auto_awq")


def host_cpu_flags() -> frozenset[str]:
    """This host's CPU flags (``/proc/cpuinfo``), empty where it has none to read. A CPU target's engine
    runs on this host (local, or emulated nodes); on srun/ssh nodes the flags are the lint host's."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    return frozenset(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


def simd_summary(flags: frozenset[str]) -> str:
    """The vector extensions among CPU flags, for a message: what decides which CPU kernels exist."""
    return ", ".join(sorted(f for f in flags if f.startswith(("avx", "amx")))) or "none listed"


def int4_weight_only(args: dict[str, Any], config: dict[str, Any]) -> str:
    """The checkpoint's 4-bit integer weight-only scheme (what vLLM serves through its WNA16 kernels), in
    words, or ``""``: compressed-tensors with an int4 weight group and no input quantization, or GPTQ/AWQ
    with ``bits = 4``."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return ""
    method = str(args.get("quantization") or qc.get("quant_method") or "").lower()
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        for group in groups.values() if isinstance(groups, dict) else ():
            weights = group.get("weights") if isinstance(group, dict) else None
            if (isinstance(weights, dict) and weights.get("num_bits") == 4 and weights.get("type", "int") == "int"
                    and not group.get("input_activations")):
                size = weights.get("group_size")
                return f"compressed-tensors int4 weight-only ({weights.get('strategy') or 'group'}" + (
                    f" {size})" if size else ")")
    elif method in WNA16_MOE_METHODS and (qc.get("bits") or qc.get("w_bit")) == 4:
        return f"{method} int4"
    return ""


@dataclass(frozen=True)
class CpuFacts:
    """What the CPU rules read from the engine args and config.json, read once."""

    tp: int
    pp: int
    dp: int
    eager: bool
    mla: bool
    kv_lora_rank: int
    qk_rope_head_dim: int
    head_dim: int
    moe: bool
    expert_parallel: bool
    eplb: bool
    block_size: int | None
    prefix_caching: bool | None
    chunked_prefill: bool | None
    kv_cache_dtype: str
    int4: str = ""  # int4_weight_only(): the checkpoint's int4 weight-only scheme, "" for none
    cpu_flags: frozenset[str] = field(default_factory=frozenset)  # host_cpu_flags(); empty: unknown
    dtype: str = "auto"  # engine.args.dtype as given ("auto": vLLM's pick, bfloat16 for a float32 checkpoint on x86)
    attention_backend: str = ""  # engine.args.attention_backend (or attention_config.backend), "" for vLLM's pick

    @property
    def latent(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def simd(self) -> str:
        return simd_summary(self.cpu_flags)

    @property
    def amx_mla(self) -> bool:
        """vLLM picks AMX_MLA for this MLA model: the host has AMX tiles and CPU_MLA was not asked for
        (``platforms/cpu.py get_attn_backend_cls``). Unknown flags count as the reference kernel."""
        return self.mla and "amx_tile" in self.cpu_flags and self.attention_backend.upper() != "CPU_MLA"

    @property
    def reference_mla(self) -> bool:
        """The reference CPU_MLA kernel serves this MLA model: block size 16, no prefix caching or chunking."""
        return self.mla and not self.amx_mla

    @property
    def no_int4_moe_kernel(self) -> bool:
        """Known x86 flags with neither AMX tiles (vLLM's CPU int4 MoE experts) nor AVX-512 (the Zen platform
        zentorch's int4 MoE experts need): none of the CPU WNA16 MoE backends can be picked."""
        return bool(self.cpu_flags) and "amx_tile" not in self.cpu_flags and not any(
            f.startswith("avx512") for f in self.cpu_flags)

    @classmethod
    def read(cls, args: dict[str, Any], config: dict[str, Any], cpu_flags: frozenset[str] | None = None) -> CpuFacts:
        mla = archs.is_mla(config)
        block = args.get("block_size")
        attention = args.get("attention_config")
        backend = args.get("attention_backend") or (attention.get("backend") if isinstance(attention, dict) else None)
        return cls(
            tp=int(args.get("tensor_parallel_size") or 1), pp=int(args.get("pipeline_parallel_size") or 1),
            dp=int(args.get("data_parallel_size") or 1), eager=bool(args.get("enforce_eager")), mla=mla,
            kv_lora_rank=int(config["kv_lora_rank"]) if mla else 0,
            qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0) if mla else 0,
            head_dim=archs.head_dim(config), moe=archs.routed_experts(config) > 0,
            expert_parallel=bool(args.get("enable_expert_parallel")), eplb=bool(args.get("enable_eplb")),
            block_size=None if block is None else int(block),
            prefix_caching=args.get("enable_prefix_caching"), chunked_prefill=args.get("enable_chunked_prefill"),
            kv_cache_dtype=str(args.get("kv_cache_dtype") or "auto"), int4=int4_weight_only(args, config),
            cpu_flags=host_cpu_flags() if cpu_flags is None else cpu_flags,
            dtype=str(args.get("dtype") or "auto").removeprefix("torch."), attention_backend=str(backend or ""),
        )


@dataclass(frozen=True)
class KernelLimit:
    """One thing the CPU backend refuses or changes: when it applies, what the finding says, and its source.

    ``why`` and ``fix`` are ``str.format`` templates over ``f`` (the :class:`CpuFacts`) and the
    module's constants (``sizes``, ``latent``).
    """

    rule: str
    severity: Severity
    key: str
    applies: Callable[[CpuFacts], bool]
    value: Callable[[CpuFacts], Any]
    why: str
    fix: str
    source: str

    def finding(self, facts: CpuFacts) -> Finding:
        words = {"f": facts, "sizes": ", ".join(map(str, CPU_HEAD_SIZES)), "latent": sum(CPU_MLA_LATENT)}
        return Finding(self.severity, self.rule, self.key, self.value(facts),
                       self.why.format(**words) + f" [{self.source}]", self.fix.format(**words))


CPU_KERNEL_LIMITS: tuple[KernelLimit, ...] = (
    KernelLimit(
        "cpu_pp_eager", "error", "engine.args.pipeline_parallel_size", lambda f: f.pp > 1 and f.eager, lambda f: f.pp,
        "pipeline_parallel_size={f.pp} with enforce_eager=true: the second stage fails on the first step "
        "('assert self.intermediate_tensors is not None'); compiled PP serves and equals transformers",
        "drop enforce_eager (compiled PP works), or use pipeline_parallel_size=1", NOTES),
    KernelLimit(
        "cpu_mla_latent", "error", "config.json.kv_lora_rank",
        lambda f: f.mla and (f.kv_lora_rank, f.qk_rope_head_dim) != CPU_MLA_LATENT,
        lambda f: f"{f.kv_lora_rank}+{f.qk_rope_head_dim}",
        "the CPU MLA kernels (CPU_MLA, AMX_MLA) only take a latent of {latent} (kv_lora_rank 512 + "
        "qk_rope_head_dim 64); this model's is {f.kv_lora_rank} + {f.qk_rope_head_dim} = {f.latent}",
        "serve it on GPUs; on CPU use kv_lora_rank=512 and qk_rope_head_dim=64",
        "vllm/v1/attention/backends/mla/cpu_mla.py get_supported_head_sizes"),
    KernelLimit(
        "cpu_head_dim", "error", "config.json.head_dim", lambda f: not f.mla and f.head_dim not in CPU_HEAD_SIZES,
        lambda f: f.head_dim,
        "CPU attention supports head sizes {sizes}; head_dim={f.head_dim} fails at the first request "
        "('Unsupported CPU attention configuration')",
        "serve it on GPUs; on CPU give the model a head_dim of {sizes}",
        "vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes; " + NOTES),
    KernelLimit(
        "block_size", "error", "engine.args.block_size",
        lambda f: not f.mla and f.block_size is not None and f.block_size % CPU_BLOCK_MULTIPLE != 0,
        lambda f: f.block_size,
        "the CPU attention backend needs a multiple of 32 (vLLM: 'No common block size for {f.block_size} "
        "(CPU_ATTN: [MultipleOf(32)])')", "use 32, 64 or 128 (the CPU default)",
        "vllm/v1/attention/backends/cpu_attn.py get_supported_kernel_block_sizes"),
    KernelLimit(
        "block_size_cpu_mla", "info", "engine.args.block_size",
        lambda f: f.reference_mla and f.block_size is not None and f.block_size != CPU_MLA_BLOCK_SIZE,
        lambda f: f.block_size,
        "vLLM's reference CPU MLA kernel only runs block_size=16 and overrides the setting",
        "set block_size=16 (or leave it unset)", "vllm/platforms/cpu.py check_and_update_config"),
    KernelLimit(
        "cpu_mla_prefix_caching", "warning", "engine.args.enable_prefix_caching",
        lambda f: f.reference_mla and f.prefix_caching is True, lambda f: True,
        "with the reference CPU MLA kernel (no AMX on this host, or attention_backend=CPU_MLA) the CPU platform turns prefix caching off "
        "for MLA models ('MLA is enabled on a non-GPU platform; forcing "
        "chunked prefill and prefix caching to be disabled'): the profile asks for it and will not get it",
        "leave it unset on a CPU MLA profile; check prefix caching on GPUs",
        "vllm/platforms/cpu.py check_and_update_config; " + NOTES),
    KernelLimit(
        "cpu_mla_chunked_prefill", "warning", "engine.args.enable_chunked_prefill",
        lambda f: f.reference_mla and f.chunked_prefill is True, lambda f: True,
        "with the reference CPU MLA kernel the CPU platform turns chunked prefill off for MLA models and raises max_num_batched_tokens to "
        "max_model_len: every prompt is prefilled in one step", "leave it unset on a CPU MLA profile",
        "vllm/platforms/cpu.py check_and_update_config; " + NOTES),
    KernelLimit(
        "cpu_mla_amx_dtype", "error", "engine.args.attention_backend",
        lambda f: f.amx_mla and f.dtype in FLOAT32_DTYPES, lambda f: f.attention_backend or "auto",
        "this host's CPU has AMX tiles, so vLLM serves MLA with AMX_MLA, whose weight packing takes bfloat16, "
        "float16 or int8 only: dtype={f.dtype} fails at start-up ('expect weight to be bfloat16, float16, int8, "
        "fp8_e4m3 or uint8'; measured 2026-12-03)",
        "set attention_backend=CPU_MLA (the reference kernel, any dtype, any x86 CPU) or dtype=bfloat16",
        "vllm/platforms/cpu.py get_attn_backend_cls; vllm/v1/attention/backends/mla/amx_mla.py"),
    KernelLimit(
        "cpu_mla_kv_cache_dtype", "warning", "engine.args.kv_cache_dtype",
        lambda f: f.mla and f.kv_cache_dtype != "auto", lambda f: f.kv_cache_dtype,
        "the CPU MLA backend declares only kv_cache_dtype 'auto' (the model dtype)",
        "use kv_cache_dtype=auto on CPU", "vllm/v1/attention/backends/mla/cpu_mla.py supported_kv_cache_dtypes"),
    KernelLimit(
        "cpu_eplb", "error", "engine.args.enable_eplb", lambda f: f.eplb, lambda f: True,
        "vLLM refuses EPLB off GPUs ('Expert parallelism load balancing is only supported on CUDA devices or ROCm "
        "devices or XPU devices now')", "remove enable_eplb on CPU", "vllm/config/parallel.py ParallelConfig"),
    KernelLimit(
        "cpu_expert_parallel", "warning", "engine.args.enable_expert_parallel",
        lambda f: f.moe and f.expert_parallel and f.tp * f.dp > 1, lambda f: True,
        "vLLM 0.32's CPU fused-MoE kernel segfaulted with expert parallelism (TP=2, Qwen3-MoE and DeepSeek-V3, eager "
        "and compiled, float32 and bfloat16: csrc/cpu/cpu_fused_moe.cpp:242 on the first request; the server then "
        "answers 500). The run must show it works here; the lint does not refuse it",
        "drop enable_expert_parallel on CPU (experts are then split by TP and served), or keep it to test it", NOTES),
    KernelLimit(
        "cpu_int4_moe", "error", "config.json.quantization_config",
        lambda f: f.moe and bool(f.int4) and f.no_int4_moe_kernel, lambda f: f.int4,
        "MoE experts in {f.int4}: vLLM picks their kernel while it builds the model, and on CPU it has two, "
        "CPU (CPUExpertsInt4, needs AMX tiles) and ZEN_CPU (zentorch's, on an AVX-512 Zen); this host's CPU has "
        "neither (SIMD flags: {f.simd}), so start-up fails ('No WNA16 MoE backend supports the deployment "
        "configuration'). vLLM's AVX2 kernels register no int4 MoE op either (fused_experts_cpu)",
        "serve the int4 MoE on a CPU with AMX or on GPUs; on this CPU serve the unquantized checkpoint",
        "vllm/model_executor/layers/fused_moe/oracle/int_wna16.py, experts/cpu_moe.py; measured 2026-12-02 "
        "(docs/engine.md)"),
)


def cpu_kernel_findings(args: dict[str, Any], config: dict[str, Any],
                        cpu_flags: frozenset[str] | None = None) -> list[Finding]:
    """Every :data:`CPU_KERNEL_LIMITS` row that applies to these engine args, this config.json and these CPU
    flags (default: this host's, :func:`host_cpu_flags`)."""
    facts = CpuFacts.read(args, config, cpu_flags)
    return [limit.finding(facts) for limit in CPU_KERNEL_LIMITS if limit.applies(facts)]
