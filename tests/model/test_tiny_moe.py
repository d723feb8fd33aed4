"""The MoE targets in miniature: checkpoints transformers loads whole, routing that does what the spec says.

transformers is the independent side here: it reads the builder's config.json and safetensors with
its own DeepseekV3/Qwen3Moe classes, so a tensor the builder names or shapes wrong is a missing,
unexpected or mismatched key, and a config key it reads differently shows in its routing.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from day0.config.tiny import TinySpec
from day0.model.tiny import BUILDER_VERSION, build, spec_digest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPECS = {
    "qwen3-moe": TinySpec(arch="qwen3-moe", num_hidden_layers=2, vocab_size=320),
    "deepseek-v3": TinySpec(arch="deepseek-v3", num_hidden_layers=3, vocab_size=320, n_shared_experts=1,
                            first_k_dense_replace=1),
}


def _load(model_dir):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_transformers_loads_every_tensor_and_nothing_else(arch, tmp_path):
    spec = SPECS[arch]
    d = build(spec, tmp_path / arch)
    model, info = _load(d)
    assert {k: v for k, v in info.items() if v} == {}  # no missing, unexpected or mismatched key
    cfg = json.loads((d / "config.json").read_text())
    index = json.loads((d / "model.safetensors.index.json").read_text())
    bias = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))  # a buffer there
    assert index["metadata"]["total_size"] == 4 * (sum(p.numel() for p in model.parameters()) + bias)
    assert len(set(index["weight_map"].values())) == spec.num_shards
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts")
    assert experts == spec.num_experts and cfg["num_experts_per_tok"] == spec.num_experts_per_tok


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_same_spec_same_bytes_and_the_seed_changes_them(arch, tmp_path):
    spec = SPECS[arch]
    a, b = build(spec, tmp_path / "a"), build(spec, tmp_path / "b")
    c = build(spec.model_copy(update={"seed": 1}), tmp_path / "c")
    shard = "model-00001-of-00003.safetensors"
    assert (a / shard).read_bytes() == (b / shard).read_bytes() != (c / shard).read_bytes()


def test_deepseek_routing_and_attention_read_as_written(tmp_path):
    """transformers' defaults for DeepSeek-V3 (8 groups, 4 kept, a scaling of 2.5, one MTP layer)
    are not what vLLM assumes for a missing key; the builder writes each, so both read the same."""
    d = build(SPECS["deepseek-v3"], tmp_path / "m")
    config = transformers.AutoConfig.from_pretrained(str(d))
    assert (config.n_group, config.topk_group, config.routed_scaling_factor) == (1, 1, 1.0)
    assert config.num_nextn_predict_layers == 0 and config.q_lora_rank is None
    assert config.kv_lora_rank + config.qk_rope_head_dim == 576  # the only latent the CPU MLA kernel takes
    model, _ = _load(d)
    assert type(model.model.layers[0].mlp).__name__.endswith("MLP")  # first_k_dense_replace = 1
    assert "MoE" in type(model.model.layers[1].mlp).__name__


def _routed(model, ids):
    """Experts transformers' own router picks per token in every MoE layer."""
    picks = []

    def hook(module, args, out):
        logits = out[0] if isinstance(out, tuple) else out
        scores = logits.sigmoid() + module.e_score_correction_bias
        picks.append(scores.topk(module.top_k, dim=-1).indices)

    handles = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers
               if hasattr(layer.mlp, "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias")]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return picks


def test_a_planted_router_bias_draws_every_token_to_that_expert(tmp_path):
    plain = SPECS["deepseek-v3"]
    biased = plain.model_copy(update={"router_bias": {"5": 4.0}})
    ids = torch.arange(3, 67).unsqueeze(0)
    for spec, name in ((plain, "plain"), (biased, "biased")):
        model, _ = _load(build(spec, tmp_path / name))
        for layer in model.model.layers[1:]:
            layer.mlp.gate.top_k = spec.num_experts_per_tok
        picks = _routed(model, ids)
        assert picks, "no MoE gate was found to hook"
        share = sum((p == 5).any(-1).float().mean().item() for p in picks) / len(picks)
        if name == "plain":
            assert share < 0.6  # top-2 of 8 at random: about a quarter of tokens
        else:
            assert share == 1.0


def test_a_dense_spec_keeps_the_cache_key_it_had_before_moe():
    """Adding MoE keys must not rename every dense model already cached: the dense identity is
    the pre-MoE field set, spelled out here by hand."""
    spec = TinySpec()
    old = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 131072, "num_shards": 3,
           "seed": 0, "rope_theta": 10000.0}
    payload = json.dumps({"builder": BUILDER_VERSION, **old}, sort_keys=True)
    assert spec_digest(spec) == hashlib.sha256(payload.encode()).hexdigest()[:16]
    assert spec_digest(spec.model_copy(update={"num_experts": 16})) == spec_digest(spec)  # unused by a dense model
    moe = TinySpec(arch="qwen3-moe")
    assert spec_digest(moe) != spec_digest(spec)
    assert spec_digest(moe.model_copy(update={"num_experts": 16})) != spec_digest(moe)


@pytest.mark.parametrize("bad, words", [
    ({"arch": "qwen3-moe", "n_shared_experts": 1}, "deepseek-v3 keys"),
    ({"arch": "deepseek-v3", "router_bias": {"8": 1.0}}, "not an expert index below 8"),
    ({"arch": "qwen3-moe", "num_experts_per_tok": 9}, "exceeds num_experts"),
    ({"arch": "deepseek-v3", "first_k_dense_replace": 4}, "leaves no MoE layer"),
    ({"arch": "mixtral"}, "arch"),
])
def test_an_impossible_moe_spec_is_refused_naming_why(bad, words):
    with pytest.raises(ValidationError, match=words):
        TinySpec(**bad)


def test_the_cli_builds_another_architecture_from_the_default_profile(tmp_path):
    out = subprocess.run([sys.executable, "-m", "day0.cli", "tiny", "build", "--arch", "qwen3-moe", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "qwen3-moe" in out.stdout
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["num_experts"] == 8
