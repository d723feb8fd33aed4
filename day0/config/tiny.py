"""``[model.tiny]``: the embedded target day0 builds offline, dense or a sparse MoE in miniature.

The Day-0 models are sparse MoEs; a harness that only ever serves a dense Llama certifies a shape
nobody launches. So the embedded target comes in the architectures where launches break: a dense
Llama (the default, the demo), a Qwen3-MoE (routed experts, top-k softmax routing) and a
DeepSeek-V3 (MLA's latent KV cache, routed + shared experts, a dense first layer, sigmoid
``noaux_tc`` routing with a score-correction bias). Dimensions default to what vLLM's CPU kernels
take (head_dim 64, the MLA latent of 512 + 64), measured in docs/engine.md.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from day0.config.section import Section

TinyArch = Literal["llama", "qwen3-moe", "deepseek-v3"]
ARCHS: tuple[str, ...] = ("llama", "qwen3-moe", "deepseek-v3")

# Keys that shape only a MoE or an MLA model: a dense spec's identity (its cache key) leaves them
# out, so adding MoE support did not rename (and rebuild) every dense model already cached.
MOE_KEYS = ("arch", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
            "first_k_dense_replace", "router_bias")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class TinySpec(Section):
    """The embedded model's shape; the same spec always builds the same bytes."""

    arch: TinyArch = "llama"
    # Upper bounds keep it tiny: it is built with random weights on whatever machine runs day0.
    hidden_size: int = Field(256, gt=0, le=8192)
    intermediate_size: int = Field(512, gt=0, le=32768, description="dense MLP width (MoE: the dense layers)")
    num_hidden_layers: int = Field(4, gt=0, le=128)
    num_attention_heads: int = Field(4, gt=0, le=256)
    num_key_value_heads: int = Field(2, gt=0, le=256, description="GQA; MLA has one latent, this is ignored")
    vocab_size: int = Field(384, ge=300, le=65536, description="BPE target; 256 byte tokens + merges")
    max_position_embeddings: int = Field(131072, gt=0, le=1 << 24)
    num_shards: int = Field(3, ge=1, le=64)
    seed: int = 0
    rope_theta: float = 10000.0
    # --- MoE (qwen3-moe, deepseek-v3)
    num_experts: int = Field(8, ge=2, le=256, description="routed experts per MoE layer")
    num_experts_per_tok: int = Field(2, ge=1, le=64, description="top-k")
    moe_intermediate_size: int = Field(64, gt=0, le=32768)
    n_shared_experts: int = Field(0, ge=0, le=8, description="always-on experts (deepseek-v3)")
    first_k_dense_replace: int = Field(0, ge=0, le=128, description="leading layers with a dense MLP")
    router_bias: dict[str, float] = Field(
        default_factory=dict,
        description="a planted routing bias, expert index -> bias (deepseek-v3's e_score_correction_bias): "
                    "the fault the expert-balance check must catch")
    # --- MLA (deepseek-v3); the CPU MLA kernel takes only a latent of 512 + 64
    kv_lora_rank: int = Field(512, gt=0, le=4096)
    q_lora_rank: Optional[int] = Field(None, gt=0, le=4096)
    qk_nope_head_dim: int = Field(64, gt=0, le=512)
    qk_rope_head_dim: int = Field(64, gt=0, le=512)
    v_head_dim: int = Field(64, gt=0, le=512)

    @model_validator(mode="after")
    def _shape(self) -> "TinySpec":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")
        if self.arch == "llama":
            return self
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts})")
        if self.first_k_dense_replace >= self.num_hidden_layers:
            raise ValueError("first_k_dense_replace leaves no MoE layer: it must be below num_hidden_layers")
        if self.arch == "qwen3-moe" and (self.n_shared_experts or self.router_bias):
            raise ValueError("qwen3-moe has no shared experts and no routing bias: n_shared_experts and "
                             "router_bias are deepseek-v3 keys")
        for key in self.router_bias:
            if not key.isdigit() or int(key) >= self.num_experts:
                raise ValueError(f"router_bias key {key!r} is not an expert index below {self.num_experts}")
        return self

    def identity(self) -> dict[str, object]:
        """What the cache key hashes: every key that changes the bytes, and no other."""
        data = self.model_dump()
        if self.arch == "llama":
            drop = MOE_KEYS + MLA_KEYS
        elif self.arch == "qwen3-moe":
            drop = MLA_KEYS
        else:
            drop = ()
        return {k: v for k, v in data.items() if k not in drop}
