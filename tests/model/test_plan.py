"""Memory plan: exact per-rank arithmetic on known models, verdicts, checks, and the what-if parser."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.model import arch_tensors, archs
from day0.model import plan as P
from day0.model.plan_report import plan_checks
from day0.model.quantization import stays_unquantized, weight_scheme
from day0.model.ranks import pp_partition
from day0.model.what_if import format_what_if, parse_human_int

GIB = 1024**3
H200_GIB = 140.0  # "141 GB" H200: CUDA reports ~143,700 MiB


def cfg(name: str) -> dict:
    return archs.example_config(name)


def test_llama_8b_one_device_exact_numbers() -> None:
    c = cfg("llama-3.1-8b")
    p = P.plan(c, device_memory_gib=80, max_model_len=32768, gpu_memory_utilization=0.9,
               activation_headroom_gib=1.5, target_concurrency=2)
    assert p.weight_bytes_total == arch_tensors.parameter_count(c) * 2  # bf16, nothing quantized
    assert p.weight_bytes_per_rank == p.weight_bytes_total  # vocab 128256 is a multiple of 64: no padding
    budget = int(80 * GIB * 0.9)
    pool = budget - p.weight_bytes_total - int(1.5 * GIB)
    assert p.kv_pool_bytes == pool
    assert p.kv_bytes_per_token == 131072
    assert p.kv_blocks == pool // (131072 * 16)
    assert p.kv_tokens == p.kv_blocks * 16
    assert p.tokens_needed == 2 * 32768
    assert p.verdict == "fits_one_device" and p.smallest_verdict == "fits_one_device"
    assert (p.smallest_tp, p.smallest_pp) == (1, 1)


def test_tp_splits_everything_but_norms() -> None:
    c = cfg("llama-3.1-8b")
    p1 = P.plan(c, device_memory_gib=80)
    p8 = P.plan(c, tp=8, device_memory_gib=80)
    norms = (2 * 32 + 1) * 4096 * 2  # two norms per layer plus the final norm, replicated
    # 8 KV heads over 8 ranks: one each, so k/v split cleanly too
    assert abs(p8.weight_bytes_per_rank - ((p1.weight_bytes_total - norms) / 8 + norms)) <= 64
    assert p8.kv_bytes_per_token == 131072 // 8


def test_kv_heads_replicated_beyond_tp() -> None:
    c = dict(cfg("llama-3.1-8b"), num_key_value_heads=2)
    p = P.plan(c, tp=8, device_memory_gib=80)
    assert p.kv_bytes_per_token == 2 * 32 * 1 * 128 * 2  # one (replicated) KV head per rank
    kv_proj = 32 * 2 * (2 * 128 * 4096) * 2  # k and v of all layers, bf16
    p_split = P.plan(dict(c, num_key_value_heads=8), tp=8, device_memory_gib=80)
    # per rank: 1 of 2 heads (replicated) instead of 1 of 8 heads' worth of a 4x larger projection
    assert p.weight_bytes_per_rank - (p_split.weight_bytes_per_rank - 4 * kv_proj / 8) == pytest.approx(kv_proj / 2, abs=64)


def test_max_model_len_minus_one_is_fitted_to_the_kv_pool_as_vllm_does() -> None:
    """vLLM 0.32 fits -1 to what the pool holds (kv_cache_utils._auto_fit_max_model_len); priced as
    the model's own 131072 tokens the plan said a 24 GiB device "refuses to start"."""
    c = cfg("llama-3.1-8b")
    fitted = P.plan(c, max_model_len=-1, device_memory_gib=24, target_context=8192)
    assert fitted.verdict != "does_not_fit", fitted.reasons
    tokens = min(s.kv_tokens for s in fitted.stages)
    assert fitted.max_model_len == tokens < 131072
    assert any(n.startswith(f"max_model_len = -1: vLLM fits it to the KV pool, {tokens} tokens") for n in fitted.notes)
    derived = P.plan(c, max_model_len=131072, device_memory_gib=24, target_context=8192)
    assert derived.verdict == "does_not_fit" and any("vLLM refuses to start" in r for r in derived.reasons)
    roomy = P.plan(c, max_model_len=-1, device_memory_gib=80, target_context=8192)
    assert roomy.max_model_len == 131072  # the model's own length fits: kept


def test_w4a16_group_scales_and_unquantized_tensors() -> None:
    c = cfg("llama-3.1-8b")
    p = P.plan(c, quantization="w4a16", device_memory_gib=80)
    t = arch_tensors.expected_tensors(c)
    quantized = sum(math.prod(s) for n, s in t.items() if not stays_unquantized(n, s))
    kept = sum(math.prod(s) for n, s in t.items() if stays_unquantized(n, s))
    # every linear input dim here is a multiple of 128: 4 bits + one bf16 scale per 128 weights
    assert p.weight_bytes_total == pytest.approx(quantized * (0.5 + 2 / 128) + kept * 2, abs=1)
    assert kept == 2 * 128256 * 4096 + (2 * 32 + 1) * 4096  # embeddings, lm_head, norms


def test_moe_router_stays_unquantized_and_experts_quantize() -> None:
    c = cfg("mixtral-8x7b")
    t = arch_tensors.expected_tensors(c)
    assert stays_unquantized("model.layers.0.block_sparse_moe.gate.weight", t["model.layers.0.block_sparse_moe.gate.weight"])
    assert not stays_unquantized("model.layers.0.block_sparse_moe.experts.0.w1.weight", (14336, 4096))
    p16 = P.plan(c, device_memory_gib=80)
    p4 = P.plan(c, quantization="w4a16", device_memory_gib=80)
    assert p4.weight_bytes_total < 0.3 * p16.weight_bytes_total


def test_fp8_checkpoint_block_scales() -> None:
    c = cfg("deepseek-v3")  # ships quantization_config fp8, weight_block_size [128, 128]
    scheme = weight_scheme(None, c)
    assert scheme.bits == 8 and scheme.block == (128, 128)
    assert scheme.linear_bytes(7168, 2048, 2) == 7168 * 2048 + 56 * 16 * 4
    p = P.plan(c, tp=8, device_memory_gib=H200_GIB)
    assert 600 * GIB < p.weight_bytes_total < 640 * GIB  # ~671 GB of fp8 weights
    assert any("quantization_config" in n for n in p.notes) and any("MTP" in n for n in p.notes)
    assert p.kv_bytes_per_token == 61 * 576 * 2  # MLA: not split by TP


def test_gptq_has_zero_points_and_unknown_scheme_errors() -> None:
    c = dict(cfg("llama-3.1-8b"), quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    s = weight_scheme(None, c)
    assert s.zero_points and s.linear_bytes(128, 128, 2) == 128 * 128 / 2 + 128 * 2 + 128 / 2
    with pytest.raises(ValueError, match="quantization='bitsandbytes'.*sizes"):
        weight_scheme("bitsandbytes", cfg("llama-3.1-8b"))


def test_dtype_int4_is_refused_with_the_quantization_hint() -> None:
    with pytest.raises(ValueError, match=r"dtype='int4' is not a vLLM dtype.*quantization="):
        P.plan(cfg("llama-3.1-8b"), dtype="int4", device_memory_gib=80)


def test_70b_needs_more_than_one_device() -> None:
    p = P.plan(cfg("llama-3.1-70b"), device_memory_gib=80, max_model_len=8192)
    assert p.verdict == "does_not_fit"
    assert any("weights" in r for r in p.reasons)
    assert p.smallest_verdict == "fits_one_node" and p.smallest_tp * p.smallest_pp in (2, 4)
    fits = P.plan(cfg("llama-3.1-70b"), tp=4, device_memory_gib=80, max_model_len=8192)
    assert fits.verdict == "fits_one_node"


def test_405b_bf16_needs_the_supernode() -> None:
    p = P.plan(cfg("llama-3.1-405b"), tp=8, device_memory_gib=80, max_model_len=8192, nodes=2)
    assert p.verdict == "does_not_fit"  # 756 GiB of bf16 weights on 8 x 80 GiB
    assert p.smallest_verdict == "needs_supernode"
    p2 = P.plan(cfg("llama-3.1-405b"), tp=8, pp=2, device_memory_gib=80, max_model_len=8192, nodes=2)
    assert p2.verdict == "needs_supernode"
    assert [s.layers for s in p2.stages] == [(0, 63), (63, 126)]


def test_2_8t_moe_at_1m_tokens_on_32_h200() -> None:
    p = P.plan(cfg("moe-2.8t-1m"), tp=8, pp=4, nodes=4, device_memory_gib=H200_GIB, quantization="w4a16",
               kv_cache_dtype="fp8", max_model_len=1_048_576, target_context=1_000_000, target_concurrency=4)
    assert p.max_model_len == 1_048_576
    assert p.kv_bytes_per_token == 28 * 576  # 112 layers / 4 stages, fp8 latent
    assert p.verdict == "needs_supernode", p.reasons
    bf16 = P.plan(cfg("moe-2.8t-1m"), tp=8, pp=4, nodes=4, device_memory_gib=H200_GIB, target_context=1_000_000)
    assert bf16.verdict == "does_not_fit"  # 5.2 TiB of bf16 weights over 32 x 141 GB


def test_tied_head_copy_on_last_stage() -> None:
    c = dict(cfg("llama-3.1-8b"), tie_word_embeddings=True)
    p = P.plan(c, pp=2, device_memory_gib=80)
    embed = 128256 * 4096 * 2
    first, last = p.stages
    assert first.layers == (0, 16) and last.layers == (16, 32)
    assert last.weight_bytes - first.weight_bytes == 4096 * 2  # same layers + embedding/head; last adds final norm
    assert first.weight_bytes > embed


def test_fixed_kv_pool_replaces_utilization() -> None:
    c = cfg("llama-3.1-8b")
    p = P.plan(c, device_memory_gib=24, kv_cache_memory_bytes=4 * GIB, max_model_len=8192)
    assert p.kv_pool_bytes == 4 * GIB and p.kv_tokens == 4 * GIB // (131072 * 16) * 16 == 32768
    assert p.weight_limit_bytes == 24 * GIB - 2 * GIB - 4 * GIB and p.fits
    tight = P.plan(c, device_memory_gib=24, kv_cache_memory_bytes=8 * GIB, max_model_len=8192)
    assert not tight.fits and any("fixed KV pool" in r for r in tight.reasons)


def test_fp8_ds_mla_cache_is_656_bytes_per_layer() -> None:
    p = P.plan(cfg("deepseek-v3"), kv_cache_dtype="fp8_ds_mla", tp=8, device_memory_gib=H200_GIB)
    assert p.kv_bytes_per_token == 61 * 656


@pytest.mark.parametrize("num_layers,pp", [(61, 4), (32, 3), (126, 8), (7, 7), (10, 4), (5, 4)])
def test_pp_partition_matches_vllm(num_layers: int, pp: int) -> None:
    vllm_utils = pytest.importorskip("vllm.distributed.utils")
    expected = [vllm_utils.get_pp_indices(num_layers, r, pp) for r in range(pp)]
    assert pp_partition(num_layers, pp) == expected


def test_plan_checks_ids_and_statuses() -> None:
    p = P.plan(cfg("llama-3.1-8b"), device_memory_gib=24, max_model_len=131072, target_concurrency=8)
    checks = {c.id: c for c in plan_checks(p)}
    assert set(checks) == {"preflight.plan.devices", "preflight.plan.weights_per_rank", "preflight.plan.kv_max_model_len",
                           "preflight.plan.kv_capacity", "preflight.plan.context", "preflight.plan.verdict"}
    assert checks["preflight.plan.weights_per_rank"].status == "pass"
    assert checks["preflight.plan.kv_capacity"].status == "fail"
    assert "smallest layout that fits" in checks["preflight.plan.kv_capacity"].message
    assert checks["preflight.plan.verdict"].status == "fail" and checks["preflight.plan.verdict"].value == "does_not_fit"
    ev = checks["preflight.plan.verdict"].evidence
    assert ev["table"]["columns"] == ["item", "value"] and ev["charts"][0]["kind"] == "bar"
    assert all("\n" not in c.message for c in checks.values())


def test_format_table_lists_every_stage() -> None:
    text = P.format_table(P.plan(cfg("deepseek-v3"), tp=8, pp=2, nodes=2, device_memory_gib=H200_GIB))
    assert "weights per rank" in text and "KV tokens held" in text
    assert "0-30" in text and "31-60" in text  # 61 layers: the extra one goes to stage 0 (not the last)


def test_bad_inputs_name_the_key() -> None:
    c = cfg("llama-3.1-8b")
    with pytest.raises(ValueError, match="pipeline_parallel_size=40 exceeds num_hidden_layers=32"):
        P.plan(c, pp=40, device_memory_gib=80)
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        P.plan(c, gpu_memory_utilization=1.5, device_memory_gib=80)
    with pytest.raises(ValueError, match="kv_cache_dtype='int2'"):
        P.plan(c, kv_cache_dtype="int2", device_memory_gib=80)


# --------------------------------------------------------------------------- what-if parser


def test_what_if_example() -> None:
    assert P.parse_what_if("tp=8,pp=4,max_model_len=1000000") == {"tp": 8, "pp": 4, "max_model_len": 1_000_000}
    assert P.parse_what_if(" tensor_parallel_size = 2 , max_model_len=1m, kv_cache_dtype=fp8 ") == \
        {"tp": 2, "max_model_len": 1_000_000, "kv_cache_dtype": "fp8"}
    assert P.parse_what_if("max_model_len=1M,quantization=none") == {"max_model_len": 2**20, "quantization": None}


@pytest.mark.parametrize("text,match", [
    ("tp8", "not key=value"),
    ("tpp=8", "unknown key 'tpp'"),
    ("tp=eight", "tp='eight' is not an integer"),
    ("gpu_memory_utilization=high", "gpu_memory_utilization='high' is not a number"),
    ("gpu_memory_utilization=nan", "not a finite number"),
    ("pp=", "pp has no value"),
    ("max_model_len=1.5M", "decimals are not allowed"),
    ("tp=\u0663", "is not an integer"),  # an Arabic-Indic three: counts on the command line are ASCII digits
    ("max_model_len=\u0661k", "is not an integer"),
])
def test_what_if_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        P.parse_what_if(text)


_VALUES = {
    "tp": st.integers(1, 1024), "pp": st.integers(1, 256), "max_model_len": st.integers(1, 10**8),
    "block_size": st.sampled_from([16, 32, 64, 128]), "devices_per_node": st.integers(1, 72),
    "nodes": st.integers(1, 64), "target_context": st.integers(1, 10**8), "target_concurrency": st.integers(1, 4096),
    "gpu_memory_utilization": st.floats(0.01, 1.0), "device_memory_gib": st.floats(1, 1024),
    "activation_headroom_gib": st.floats(0, 64), "kv_cache_memory_bytes": st.integers(0, 2**50),
    "dtype": st.sampled_from(["auto", "bfloat16", "float16"]),
    "quantization": st.sampled_from(["fp8", "w4a16", "awq", None]),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8", "fp8_e5m2"]),
}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_VALUES)), st.none(), min_size=1).flatmap(
    lambda d: st.fixed_dictionaries({k: _VALUES[k] for k in d})))
def test_what_if_round_trip(changes: dict) -> None:
    assert P.parse_what_if(format_what_if(changes)) == changes


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.sampled_from("kmgtKMGT"))
def test_human_int_suffixes(n: int, suffix: str) -> None:
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    assert parse_human_int(f"{n}{suffix}") == n * mult
    assert P.parse_what_if(f"max_model_len={n}{suffix}") == {"max_model_len": n * mult}


# --------------------------------------------------------------------------- plan arithmetic properties


def tiny(heads: int, kv: int, layers: int, hidden_mult: int, vocab: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": heads * 64 * hidden_mult, "head_dim": 64,
            "intermediate_size": 256 * hidden_mult, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": 4096,
            "tie_word_embeddings": False}


configs = st.builds(tiny, heads=st.sampled_from([4, 8, 16]), kv=st.sampled_from([1, 2, 4]), layers=st.integers(1, 12),
                    hidden_mult=st.integers(1, 4), vocab=st.integers(100, 5000))


@settings(max_examples=60, deadline=None)
@given(c=configs, tp=st.sampled_from([1, 2, 4]), pp=st.integers(1, 4), mem=st.floats(0.05, 4.0),
       util=st.floats(0.3, 1.0), bs=st.sampled_from([16, 32, 64]), quant=st.sampled_from([None, "fp8", "w4a16"]),
       kvd=st.sampled_from(["auto", "fp8"]), conc=st.integers(1, 64), ctx=st.integers(1, 4096))
def test_plan_arithmetic_properties(c: dict, tp: int, pp: int, mem: float, util: float, bs: int, quant: str | None,
                                    kvd: str, conc: int, ctx: int) -> None:
    pp = min(pp, c["num_hidden_layers"])
    kw = dict(tp=tp, pp=pp, gpu_memory_utilization=util, block_size=bs, quantization=quant, kv_cache_dtype=kvd,
              activation_headroom_gib=0.01, target_concurrency=conc, target_context=ctx, max_model_len=4096)
    p = P.plan(c, device_memory_gib=mem, **kw)
    for s in p.stages:
        assert s.kv_tokens % bs == 0
        assert s.kv_tokens * s.kv_bytes_per_token <= s.kv_pool_bytes
        assert (s.kv_blocks + 1) * bs * s.kv_bytes_per_token > s.kv_pool_bytes  # no whole block left unused
        assert s.kv_pool_bytes == max(0, p.budget_bytes - s.weight_bytes - p.activation_headroom_bytes)
    # every rank together holds at least the whole model (replicated parts counted on each rank)
    assert sum(s.weight_bytes for s in p.stages) * tp >= p.weight_bytes_total - len(p.stages) * tp
    assert p.tokens_needed == conc * math.ceil(ctx / bs) * bs
    assert (p.verdict == "does_not_fit") == bool(p.reasons)
    more = P.plan(c, device_memory_gib=mem * 2, **kw)
    assert more.kv_tokens >= p.kv_tokens
    if p.fits:
        assert more.fits
    if c["num_attention_heads"] % (tp * 2) == 0:
        wider = P.plan(c, device_memory_gib=mem, **{**kw, "tp": tp * 2})
        assert wider.weight_bytes_per_rank <= p.weight_bytes_per_rank
        assert wider.kv_bytes_per_token <= p.kv_bytes_per_token
    if p.smallest_tp is not None:
        best = P.plan(c, device_memory_gib=mem, **{**kw, "tp": p.smallest_tp, "pp": p.smallest_pp})
        assert best.fits and best.ranks <= max(p.ranks, best.ranks)
        if p.fits:
            assert best.ranks <= p.ranks


@pytest.mark.parametrize("text, problem", [
    ("tp=0", "outside"), ("nodes=5000", "outside"), ("gpu_memory_utilization=0", "outside"),
    ("device_memory_gib=nan", "finite"), ("max_model_len=" + "9" * 60, "characters"),
])
def test_what_if_values_are_bounded(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        P.parse_what_if(text)


@pytest.mark.parametrize("args, key", [
    ({"tensor_parallel_size": "8"}, "tensor_parallel_size"), ({"max_model_len": -5}, "max_model_len"),
    ({"gpu_memory_utilization": True}, "gpu_memory_utilization"), ({"enforce_eager": "yes"}, "enforce_eager"),
    ({"block_size": 16.0}, "block_size"),
])
def test_engine_args_the_plan_reads_are_typed(args: dict, key: str) -> None:
    from day0.model.what_if import check_engine_args

    with pytest.raises(ValueError, match=f"engine.args.{key}: "):
        check_engine_args(args)
    check_engine_args({"tensor_parallel_size": 8, "max_model_len": -1, "enforce_eager": True, "dtype": "auto"})
