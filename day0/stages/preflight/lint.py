"""Config lint: the engine arguments and ``config.json`` checked against vLLM's own rules, offline.

Why: vLLM finds most of these mistakes only after a multi-node launch has spent minutes loading
weights (or never: a wrong block size degrades silently to a slower backend). Each rule here is a
rule vLLM 0.32 enforces or a documented trap, and every finding says why and how to fix it.

The rules come from the installed vLLM (``rules.vllm_rules``): the argument names from
``vllm.engine.arg_utils.EngineArgs`` and the accepted values from its type literals, so the lint
follows the installed vLLM, read once per install. Without vLLM they are a snapshot of 0.32.0.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Mapping

from day0.core.record import Check, measured
from day0.model import archs
from day0.stages.preflight.cpu_kernels import cpu_kernel_findings
from day0.stages.preflight.experts import expert_parallel_findings
from day0.stages.preflight.findings import SEVERITIES, Finding, Severity
from day0.stages.preflight.rules import VllmRules, vllm_rules

__all__ = ["SEVERITIES", "Finding", "Severity", "VllmRules", "lint", "lint_checks", "vllm_rules"]


LONG_CONTEXT = 262_144  # from here on a prefill is long enough that chunking and prefix reuse decide memory and TTFT
ONE_MILLION = 1_000_000

# Quantization methods that read a quantized checkpoint (they cannot quantize bf16 weights online).
NEEDS_QUANTIZED_CHECKPOINT = frozenset({
    "awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "compressed-tensors", "modelopt",
    "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "quark", "moe_wna16", "gpt_oss_mxfp4", "fp_quant",
    "deepseek_v4_fp8",
})
# Methods vLLM accepts in place of the checkpoint's quant_method (its override list, by family).
COMPATIBLE_OVERRIDES = {
    "awq": {"awq", "auto_awq", "awq_marlin", "moe_wna16"},
    "gptq": {"gptq", "auto_gptq", "gptq_marlin", "moe_wna16"},
    "fp8": {"fp8"},
    "compressed-tensors": {"compressed-tensors"},
    "modelopt": {"modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed"},
    "mxfp4": {"mxfp4", "gpt_oss_mxfp4"},
}

def lint(
    engine_args: dict[str, Any],
    config: dict[str, Any],
    *,
    device: str = "cuda",
    devices_per_node: int | None = None,
    nodes: int = 1,
    env: Mapping[str, str] | None = None,
    rules: VllmRules | None = None,
    mode: str = "server",
) -> list[Finding]:
    """All findings for one engine-args dict (the profile's ``[engine.args]``) and one ``config.json``.

    ``device`` is ``"cuda"`` or ``"cpu"`` (the backend whose block sizes apply); ``env`` defaults
    to this process's environment (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``); ``rules`` defaults to
    :func:`vllm_rules` (pass one in to lint many profiles for one vLLM import); ``mode`` is
    ``engine.mode`` (the server takes its own flags, such as ``api_key``, beside the engine's).
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"lint: device={device!r} must be 'cuda' or 'cpu'")
    rules = rules or vllm_rules()
    env = os.environ if env is None else env
    archs.architecture(config)  # a clear error for an unknown architecture, before anything else
    f: list[Finding] = []
    if not rules.from_vllm:
        f.append(Finding("info", "vllm_missing", "vllm", None, "vLLM is not importable here",
                         f"rules come from day0's snapshot of vLLM {rules.version}; install vLLM to lint against it"))
    args = dict(engine_args)
    f += _unknown_args(args, rules, mode)
    args = {k.replace("-", "_"): v for k, v in args.items()}
    f += _dtype(args, config, rules)
    f += _kv_cache_dtype(args, config, rules)
    f += _quantization(args, config, rules)
    f += _parallel(args, config, devices_per_node, nodes)
    f += expert_parallel_findings(args, config)
    f += _block_size(args, config, device)
    if device == "cpu":
        f += cpu_kernel_findings(args, config)
    f += _max_model_len(args, config, env)
    f += _long_context(args, config)
    f += _memory(args, device, env)
    return f


# --------------------------------------------------------------------------- rules


def _unknown_args(args: dict[str, Any], rules: VllmRules, mode: str = "server") -> list[Finding]:
    if not rules.engine_arg_names:
        return []
    out = []
    for key in args:
        if key in rules.engine_arg_names:
            continue
        if key in rules.server_arg_names:
            if mode == "inprocess":
                out.append(Finding("info", "server_only_arg", f"engine.args.{key}", args[key],
                                   "only vLLM's OpenAI server takes it; engine.mode = \"inprocess\" serves no "
                                   "API and leaves it out of vllm.LLM's arguments (the engine's log names it)",
                                   "use engine.mode = \"server\" where what it configures is to be judged"))
            continue
        norm = key.replace("-", "_")
        if norm in rules.engine_arg_names:
            out.append(Finding("error", "arg_spelling", f"engine.args.{key}", args[key],
                               "vLLM's EngineArgs take underscores; the dashed form is only the CLI spelling",
                               f"write {norm}"))
            continue
        close = difflib.get_close_matches(norm, sorted(rules.engine_arg_names), n=3, cutoff=0.6)
        out.append(Finding("error", "unknown_arg", f"engine.args.{key}", args[key],
                           f"vLLM {rules.version} EngineArgs has no field {key!r} (vLLM would refuse to start)",
                           f"did you mean {' or '.join(close)}?" if close else "remove it or check the vLLM version"))
    return out


_NOT_DTYPES = {
    "int4": "4-bit", "w4a16": "4-bit", "int8": "8-bit", "w8a8": "8-bit", "w8a16": "8-bit", "fp8": "FP8",
    "float8": "FP8", "fp8_e4m3": "FP8", "nf4": "4-bit", "fp4": "4-bit", "nvfp4": "4-bit", "mxfp4": "4-bit",
}


def _dtype(args: dict[str, Any], config: dict[str, Any], rules: VllmRules) -> list[Finding]:
    value = args.get("dtype") or "auto"
    text = str(value).lower().replace("torch.", "")
    if text not in rules.dtypes:
        bits = _NOT_DTYPES.get(text)
        qc = config.get("quantization_config") or {}
        if qc.get("quant_method"):
            fix = (f"set dtype=auto (or bfloat16) and quantization={qc['quant_method']!r}, the method this checkpoint's "
                   "quantization_config names (vLLM also picks it up without the argument)")
        elif bits == "FP8":
            fix = "set dtype=auto and quantization='fp8' (online FP8 weights) and/or kv_cache_dtype='fp8'"
        elif bits == "8-bit":
            fix = ("set dtype=auto and quantization='int8_per_channel_weight_only' (online), or load a W8A8 "
                   "checkpoint with quantization='compressed-tensors'")
        else:
            fix = ("set dtype=auto and load a pre-quantized 4-bit checkpoint: quantization='compressed-tensors' "
                   "(W4A16 from llm-compressor), 'awq' or 'gptq'; this checkpoint has no quantization_config")
        why = (f"{value!r} is not a vLLM dtype ({', '.join(rules.dtypes)}): dtype is the compute/activation precision"
               + (f"; {bits} weights are a quantization= method, not a dtype" if bits else ""))
        return [Finding("error", "dtype", "engine.args.dtype", value, why, fix)]
    out = []
    ckpt = str(config.get("torch_dtype") or config.get("dtype") or "").replace("torch.", "")
    if text in ("half", "float16") and ckpt == "bfloat16":
        out.append(Finding("warning", "dtype_cast", "engine.args.dtype", value,
                           "the checkpoint is bfloat16; casting to float16 can overflow activations (vLLM warns)",
                           "use dtype=auto or bfloat16"))
    return out


def _kv_cache_dtype(args: dict[str, Any], config: dict[str, Any], rules: VllmRules) -> list[Finding]:
    value = args.get("kv_cache_dtype") or "auto"
    if str(value) not in rules.kv_cache_dtypes:
        return [Finding("error", "kv_cache_dtype", "engine.args.kv_cache_dtype", value,
                        f"not a vLLM kv_cache_dtype ({', '.join(rules.kv_cache_dtypes)})",
                        "use auto (model dtype) or fp8 (half the KV bytes per token)")]
    if str(value).endswith("_ds_mla") and not archs.is_mla(config):
        return [Finding("error", "kv_cache_dtype", "engine.args.kv_cache_dtype", value,
                        "the *_ds_mla cache formats exist only for DeepSeek MLA attention", "use auto or fp8")]
    return []


def _quantization(args: dict[str, Any], config: dict[str, Any], rules: VllmRules) -> list[Finding]:
    value = args.get("quantization")
    qc = config.get("quantization_config") or {}
    ckpt = qc.get("quant_method")
    if value is None:
        return []
    if value not in rules.quantization_methods:
        close = difflib.get_close_matches(str(value), rules.quantization_methods, n=3, cutoff=0.6)
        return [Finding("error", "quantization", "engine.args.quantization", value,
                        f"vLLM {rules.version} has no quantization method {value!r}",
                        f"use one of {', '.join(close) or ', '.join(rules.quantization_methods[:8]) + ', ...'}"
                        + (f" (the checkpoint says {ckpt!r})" if ckpt else ""))]
    if ckpt and value != ckpt and value not in COMPATIBLE_OVERRIDES.get(ckpt, {ckpt}):
        return [Finding("error", "quantization_mismatch", "engine.args.quantization", value,
                        f"the checkpoint's quantization_config says {ckpt!r}; vLLM raises 'Quantization method "
                        "specified in the model config does not match'",
                        f"set quantization={ckpt!r} or leave it unset")]
    if not ckpt and value in NEEDS_QUANTIZED_CHECKPOINT:
        return [Finding("error", "quantization_checkpoint", "engine.args.quantization", value,
                        f"{value!r} loads pre-quantized weights but config.json has no quantization_config",
                        "point model at a quantized checkpoint, or use an online method (fp8, "
                        "int8_per_channel_weight_only)")]
    return []


def _parallel(args: dict[str, Any], config: dict[str, Any], devices_per_node: int | None,
              nodes: int) -> list[Finding]:
    out = []
    tp = int(args.get("tensor_parallel_size", 1) or 1)
    pp = int(args.get("pipeline_parallel_size", 1) or 1)
    heads, kv = archs.num_attention_heads(config), archs.num_kv_heads(config)
    layers = archs.num_layers(config)
    if heads % tp:
        out.append(Finding("error", "tp_heads", "engine.args.tensor_parallel_size", tp,
                           f"num_attention_heads={heads} is not divisible by tp={tp} (vLLM: 'Total number of "
                           "attention heads must be divisible by tensor parallel size')",
                           "use a tp that divides " + str(heads) + ": " + ", ".join(
                               str(t) for t in range(1, min(heads, 64) + 1) if heads % t == 0)))
    if archs.is_mla(config):
        if tp > 1:
            out.append(Finding("info", "mla_kv_replicated", "engine.args.tensor_parallel_size", tp,
                               "MLA caches one latent per token and layer on every TP rank: TP does not shrink KV "
                               "per token, PP and more nodes do", "size the KV pool with `day0 plan`"))
    elif kv % tp and tp % kv:
        out.append(Finding("error", "tp_kv_heads", "engine.args.tensor_parallel_size", tp,
                           f"num_key_value_heads={kv} and tp={tp}: neither divides the other, so KV heads can be "
                           "neither split nor replicated evenly (vLLM's QKVParallelLinear asserts)",
                           f"use a tp that divides {kv} or a multiple of {kv}"))
    elif tp > kv:
        out.append(Finding("info", "tp_kv_replicated", "engine.args.tensor_parallel_size", tp,
                           f"tp={tp} > num_key_value_heads={kv}: each KV head is replicated on {tp // kv} ranks, "
                           "so KV bytes per token per rank stop shrinking beyond tp=" + str(kv),
                           "expected for GQA models; prefer PP or more replicas to grow the KV pool further"))
    if pp > layers:
        out.append(Finding("warning", "pp_layers", "engine.args.pipeline_parallel_size", pp,
                           f"pp={pp} exceeds num_hidden_layers={layers}: some stages would hold no layer and only "
                           "pass activations on (vLLM accepts it, day0's plan refuses it)",
                           f"use pp <= {layers}"))
    elif pp > 1 and layers % pp:
        out.append(Finding("info", "pp_uneven", "engine.args.pipeline_parallel_size", pp,
                           f"{layers} layers over {pp} stages are split unevenly (extra layers go to middle stages)",
                           "fine as is; set VLLM_PP_LAYER_PARTITION to choose the split"))
    if devices_per_node:
        total = devices_per_node * nodes
        if tp * pp > total:
            out.append(Finding("error", "topology_devices", "engine.args", f"tp={tp} x pp={pp}",
                               f"{tp * pp} ranks but the topology has {total} devices ({nodes} x {devices_per_node})",
                               "lower tp/pp or add nodes"))
        if tp > devices_per_node:
            out.append(Finding("warning", "tp_across_nodes", "engine.args.tensor_parallel_size", tp,
                               f"tp={tp} > {devices_per_node} devices per node: every layer's all-reduce crosses the "
                               "inter-node network",
                               f"keep tp <= {devices_per_node} and use pipeline_parallel_size across nodes"))
    return out


def _block_size(args: dict[str, Any], config: dict[str, Any], device: str) -> list[Finding]:
    value = args.get("block_size")
    mla = archs.is_mla(config)
    if value is None:
        picks = ((16 if mla else 128) if device == "cpu"
                 else "64 (FlashMLA) or 128 (CUTLASS MLA), the MLA backend's preferred size" if mla else 16)
        return [Finding("info", "block_size_default", "engine.args.block_size", None,
                        f"unset: vLLM picks {picks} for this model on {device}", "nothing to do")]
    bs = int(value)
    if device == "cpu":  # the CPU kernels' block sizes are rows of cpu_kernels.CPU_KERNEL_LIMITS
        return []
    if bs % 16:
        return [Finding("error", "block_size", "engine.args.block_size", bs,
                        "GPU attention backends (FlashAttention, FlashInfer, Triton MLA) need a multiple of 16",
                        "use 16 (the GPU default)")]
    if mla and bs not in (64, 128):
        return [Finding("warning", "block_size_mla", "engine.args.block_size", bs,
                        f"block_size={bs} precludes FlashMLA (64) and CUTLASS MLA (128); vLLM falls back to a slower "
                        "MLA backend", "leave block_size unset or use 64")]
    return []


def _max_model_len(args: dict[str, Any], config: dict[str, Any], env: Mapping[str, str]) -> list[Finding]:
    value = args.get("max_model_len")
    derived, key = archs.derived_max_model_len(config)
    if value is None or int(value) in (-1,):
        return []
    n = int(value)
    if n <= derived:
        return []
    rope = archs.rope_parameters(config)
    rope_txt = (f"; rope {rope.get('rope_type', rope.get('type'))} factor {rope.get('factor')} is already included"
                if rope else "; config.json has no rope scaling")
    allowed = str(env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")).strip().lower() in ("1", "true")
    why = f"max_model_len={n} > {derived} derived from {key}{rope_txt}"
    if allowed:
        return [Finding("warning", "max_model_len", "engine.args.max_model_len", n,
                        why + "; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets vLLM start, but positions past the trained "
                              "length give NaNs or garbage with RoPE",
                        "only keep this if the model was trained or rope-scaled for it (hf_overrides rope_scaling)")]
    return [Finding("error", "max_model_len", "engine.args.max_model_len", n,
                    why + "; vLLM refuses to start",
                    f"lower max_model_len to <= {derived}, rope-scale the model (hf_overrides), or set "
                    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if it really supports the length")]


def _long_context(args: dict[str, Any], config: dict[str, Any]) -> list[Finding]:
    n = int(args.get("max_model_len") or archs.derived_max_model_len(config)[0])
    out = []
    chunked = args.get("enable_chunked_prefill")
    batched = args.get("max_num_batched_tokens")
    if chunked is False and batched is not None and int(batched) < n:
        out.append(Finding("error", "chunked_prefill", "engine.args.enable_chunked_prefill", False,
                           f"chunked prefill off and max_num_batched_tokens={batched} < max_model_len={n}: vLLM "
                           "refuses to start", "enable chunked prefill (the default)"))
    elif chunked is False and n >= LONG_CONTEXT:
        out.append(Finding("warning", "chunked_prefill", "engine.args.enable_chunked_prefill", False,
                           f"a {n}-token prompt would prefill in one step: activation memory spikes and every "
                           "running decode stalls for the whole prefill", "enable chunked prefill (the default)"))
    if n < LONG_CONTEXT:
        return out
    if args.get("enable_prefix_caching") is False:
        out.append(Finding("warning", "prefix_caching", "engine.args.enable_prefix_caching", False,
                           f"with {n}-token contexts a re-sent conversation or shared document is prefilled again "
                           "in full (minutes at 1M tokens)",
                           "enable prefix caching (the default); isolate tenants with the cache_salt request field"))
    if n >= ONE_MILLION and chunked is not False and batched is not None and int(batched) > 65536:
        out.append(Finding("info", "max_num_batched_tokens", "engine.args.max_num_batched_tokens", int(batched),
                           "a large chunk lengthens every decode step that shares a batch with a 1M prefill",
                           "8192-16384 keeps decode ITL bounded while 1M prefills proceed"))
    return out


def _memory(args: dict[str, Any], device: str, env: Mapping[str, str]) -> list[Finding]:
    value = args.get("gpu_memory_utilization")
    if value is not None and not 0 < float(value) <= 1:
        return [Finding("error", "gpu_memory_utilization", "engine.args.gpu_memory_utilization", value,
                        "must be a fraction in (0, 1]", "use e.g. 0.9")]
    if device == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in env:
        return [Finding("info", "cpu_kvcache_space", "env.VLLM_CPU_KVCACHE_SPACE", None,
                        "on the CPU backend gpu_memory_utilization is a fraction of host memory; without "
                        "VLLM_CPU_KVCACHE_SPACE start-up failed on day0's shared CPU box",
                        "set VLLM_CPU_KVCACHE_SPACE (GiB of KV cache) and gpu_memory_utilization=0.5")]
    return []


# --------------------------------------------------------------------------- checks


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")


def lint_checks(findings: list[Finding]) -> list[Check]:
    """One ``preflight.lint.<rule>`` check per error (fail) and warning (pass, flagged), plus a summary.

    Infos only appear in the summary's table: they explain defaults, they do not ask for action.
    """
    table = {"columns": ["severity", "rule", "key", "value", "why", "fix"],
             "rows": [[x.severity, x.rule, x.key, repr(x.shown), x.why, x.fix] for x in findings]}
    checks: list[Check] = []
    seen: set[str] = set()
    for x in findings:
        if x.severity == "info":
            continue
        cid = f"preflight.lint.{x.rule}"
        if cid in seen:
            cid = f"{cid}.{_slug(x.key.split('.')[-1])}"
        n = 2
        base = cid
        while cid in seen:
            cid, n = f"{base}_{n}", n + 1
        seen.add(cid)
        checks.append(Check(id=cid, title=f"Lint: {x.key}", status="fail" if x.severity == "error" else "pass",
                            value=x.shown if isinstance(x.shown, (int, float, str, bool)) or x.shown is None
                            else repr(x.shown),
                            message=("" if x.severity == "error" else "warning: ") + f"{x.key}: {x.why}; fix: {x.fix}",
                            evidence={"severity": x.severity, "why": x.why, "fix": x.fix}, source="static"))
    errors = sum(1 for x in findings if x.severity == "error")
    warnings = sum(1 for x in findings if x.severity == "warning")
    first = next((x for x in findings if x.severity == "error"), None)
    checks.append(measured("preflight.lint", "Engine args and config.json lint", errors, 0, unit="errors",
                           direction="lower_is_better", source="static", evidence={"table": table},
                           message=(f"{errors} error(s), {warnings} warning(s); first: {first.line()}" if first
                                    else f"no errors, {warnings} warning(s), "
                                         f"{len(findings) - errors - warnings} note(s)")))
    return checks
