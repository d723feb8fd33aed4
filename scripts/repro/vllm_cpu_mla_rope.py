"""Minimal reproduction: vLLM's CPU rotary-embedding op rotates the wrong memory for MLA's strided views.

Found by day0's golden-token check on the cpu-deepseek-v3 preset (docs/engine.md, "The MoE
targets"). vLLM's MLA layer (``vllm/model_executor/layers/mla.py``) applies RoPE in place to two
views of larger buffers: ``q[..., nope:]`` of shape [T, N, 64] and ``k_pe`` of shape [T, 1, 64]. In
eager mode custom ops are on, so ``RotaryEmbedding.forward_cpu`` calls the C++ op
``torch.ops._C.rotary_embedding`` (``csrc/cpu/pos_encoding.cpp``), which walks ``positions.numel()``
tokens with the head stride as the token stride: only T of the T x N query rows are rotated (with
the wrong positions) and only token 0 of ``k_pe``. A contiguous 2-D [T, N * 64] call, the way
Llama-style models call it, is correct, which is why the dense and Qwen3-MoE targets match.

No engine is started: the script loads vLLM's CPU kernel library and calls the one op on small
tensors, next to a correct GPT-J-style (interleaved) rotation written out here.

    .venv/bin/python scripts/repro/vllm_cpu_mla_rope.py

Exit 0 when the op rotates MLA's views correctly (the bug is fixed in the installed vLLM), 1 when
it does not (the bug is present), 2 when this vLLM has no CPU kernel library to load.
"""

from __future__ import annotations

import sys


def gptj_rope(pos, x, cache):
    """Interleaved rotation of x [T, H, R] at positions pos: what vLLM's forward_native computes."""
    import torch

    cos, sin = cache.index_select(0, pos).chunk(2, -1)
    cos = cos.unsqueeze(-2).repeat_interleave(2, -1)
    sin = sin.unsqueeze(-2).repeat_interleave(2, -1)
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    return x * cos + rotated * sin


def kernel_loaded() -> bool:
    """The CPU kernels vLLM itself loads for this CPU (importing vllm._custom_ops picks AVX-512 or AVX2)."""
    import torch

    try:
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
    except ImportError:
        return False
    return hasattr(torch.ops._C, "rotary_embedding")


def main() -> int:
    import torch

    if not kernel_loaded():
        print("no vLLM CPU kernel library with rotary_embedding could be loaded")
        return 2
    torch.manual_seed(0)
    tokens, heads, nope, rope, latent = 5, 4, 64, 64, 512  # the CPU MLA kernel's only latent: 512 + 64
    inv = 1.0 / (10000 ** (torch.arange(0, rope, 2, dtype=torch.float) / rope))
    freqs = torch.arange(64, dtype=torch.float)[:, None] * inv[None]
    cache = torch.cat((freqs.cos(), freqs.sin()), -1)
    pos = torch.arange(tokens, dtype=torch.long) + 3
    q0, kv0 = torch.randn(tokens, heads, nope + rope), torch.randn(tokens, latent + rope)

    q, kv = q0.clone(), kv0.clone()  # exactly the views mla.py hands the op, in place
    torch.ops._C.rotary_embedding(pos, q[..., nope:], kv[..., latent:].unsqueeze(1), rope, cache, False)
    q_ok = gptj_rope(pos, q0[..., nope:], cache)
    k_ok = gptj_rope(pos, kv0[:, latent:].unsqueeze(1), cache)[:, 0]
    q_right = torch.allclose(q[..., nope:], q_ok, atol=1e-5)
    k_right = torch.allclose(kv[:, latent:], k_ok, atol=1e-5)
    rows = (q != q0).any(-1).nonzero().tolist()
    print(f"vLLM {__import__('vllm').__version__}: torch.ops._C.rotary_embedding on MLA's views")
    print(f"q_pe [T={tokens}, N={heads}, 64] (strides {tuple(q[..., nope:].stride())}): "
          f"{'correct' if q_right else 'WRONG'}; rows rotated: {len(rows)} of {tokens * heads}")
    print(f"k_pe [T={tokens}, 1, 64] (strides {tuple(kv[..., latent:].unsqueeze(1).stride())}): "
          f"{'correct' if k_right else 'WRONG'}; tokens rotated right: "
          f"{[t for t in range(tokens) if torch.allclose(kv[t, latent:], k_ok[t], atol=1e-5)]}")
    qc, kc = q0[..., nope:].reshape(tokens, heads * rope).contiguous(), kv0[:, latent:].contiguous()
    torch.ops._C.rotary_embedding(pos, qc, kc, rope, cache, False)
    contiguous = torch.allclose(qc.view(tokens, heads, rope), q_ok, atol=1e-5) and torch.allclose(kc, k_ok, atol=1e-5)
    print(f"the same op on contiguous 2-D copies: {'correct' if contiguous else 'WRONG'}")
    return 0 if q_right and k_right else 1


if __name__ == "__main__":
    sys.exit(main())
