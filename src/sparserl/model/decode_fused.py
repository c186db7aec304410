"""Fused Triton kernels for the bucketed engine's decode step (with the Triton attention:
``SPARSERL_DECODE_ATTENTION=auto`` on a GPU, the default, or ``=triton``).

At batch 256 the default model's step ran about 335 kernels, most of them elementwise ops on a
few hundred kilobytes (the norms' casts, the rotary embedding's negation, concatenation, products
and sum, the cache writes), each a few microseconds, with a gap before the next one even inside a
CUDA graph (docs/results.md, 'How fast is decoding?'). Three kernels take their place:

* :func:`add_rms_norm`: the residual sum and the next RMS norm in one pass (was 5 kernels);
* :func:`qk_rope_store`: per-head q/k norms, the rotary embedding of queries and keys, and the
  cache writes of keys and values (was about 14);
* :func:`silu_mul`: the gated MLP's activation and product (was 2), after one product for the
  gate and up projections where both are plain linear layers.

Each rounds where PyTorch's ops round (see :mod:`sparserl.model.decode_fused_kernels`). In
Triton's interpreter (the CPU tests) the fused step is bit for bit the unfused one in bf16. On a
GPU the values rounded can differ in their last float32 bits (the hardware's exp and rsqrt, another
summation order), so a few bf16 elements may differ in their last bit: the GPU tests bound that,
and in GRPO runs on an H200 the sampler's log-probabilities stayed within 1.2e-6 nats per token
(mean) of the learner's (docs/results.md, 'How fast is decoding?').
"""

from __future__ import annotations

import torch

from sparserl.model.decode_attention import next_pow2
from sparserl.model.hf_parts import RMS_NORMS

ACTIVATIONS = ("SiLUActivation", "SiLU")
"""MLP activations :func:`silu_mul` computes."""
MLPS = ("Qwen3MLP", "Qwen2MLP", "LlamaMLP")
"""MLP classes whose forward is ``down(act(gate(x)) * up(x))`` (the fused step calls their parts)."""
SILU_BLOCK = 1024


def _k():
    from sparserl.model import decode_fused_kernels

    return decode_fused_kernels


def unfusable(layers, norm) -> str | None:
    """Why these decoder layers (and final ``norm``) cannot take the fused kernels (None: they can)."""
    mods = [norm] + [m for la in layers for m in (la.input_layernorm, la.post_attention_layernorm)]
    for la in layers:
        qn, kn = getattr(la.self_attn, "q_norm", None), getattr(la.self_attn, "k_norm", None)
        if (qn is None) != (kn is None):
            return "a layer normalises only one of queries and keys"
        mods += [m for m in (qn, kn) if m is not None]
        mlp = la.mlp
        if type(mlp).__name__ not in MLPS:
            return f"the MLP {type(mlp).__name__} is not one the kernels know"
        if mlp._forward_hooks or mlp._forward_pre_hooks:
            return "the MLP has forward hooks (the fused step calls its parts, not its forward)"
        if type(mlp.act_fn).__name__ not in ACTIVATIONS:
            return f"the MLP's activation {type(mlp.act_fn).__name__} is not SiLU"
    odd = sorted({type(m).__name__ for m in mods if type(m).__name__ not in RMS_NORMS})  # w * rnd(x * rsqrt(...))
    return f"norms {odd} are not RMS norms the kernels know" if odd else None


def add_rms_norm(x: torch.Tensor, res: torch.Tensor | None, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """(``norm(x + res)``, ``x + res``) for rows x, res (B, n), each sum rounded to x's dtype as
    PyTorch's addition rounds it; ``res`` None: (``norm(x)``, ``x``)."""
    B, n = x.shape
    if x.stride(1) != 1 or (res is not None and res.stride(1) != 1):
        raise ValueError("rows need unit stride")
    out = torch.empty_like(x)
    s = torch.empty_like(x) if res is not None else x
    r = res if res is not None else x
    _k().add_rms_norm[(B,)](x, r, s, norm.weight, out, x.stride(0), r.stride(0), s.stride(0), out.stride(0), n,
                            float(norm.variance_epsilon), HAS_RES=res is not None, BLOCK=next_pow2(n))
    return out, s


def qk_rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn, table: tuple[torch.Tensor, torch.Tensor],
                  pos: torch.Tensor, col: torch.Tensor, K: torch.Tensor, V: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Queries (B, nq, head_dim) after ``attn``'s q norm (if any) and the rotary embedding at
    ``pos`` (B, 1) from the angle ``table`` (cos, sin: (L, head_dim)); the keys (k norm, rotary)
    and the values ``v`` written into the caches K, V (B, Hkv, L, head_dim) at position ``col``
    (a one-element device tensor). q, k, v: rows (B, heads * head_dim), unit stride inside a row."""
    B = q.shape[0]
    D = head_dim
    nq, nk = q.shape[1] // D, k.shape[1] // D
    for t in (q, k, v):
        if t.stride(1) != 1:
            raise ValueError("q, k and v need unit stride inside a row")
    qo = torch.empty((B, nq, D), dtype=q.dtype, device=q.device)
    qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    has_norm = qn is not None
    cos, sin = table
    _k().qk_rope_store[(B,)](
        q, k, v, qn.weight if has_norm else q, kn.weight if has_norm else q, cos, sin, pos, col, qo, K, V,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0), pos.stride(0),
        K.stride(0), K.stride(1), K.stride(2), V.stride(0), V.stride(1), V.stride(2),
        float(qn.variance_epsilon) if has_norm else 0.0, float(kn.variance_epsilon) if has_norm else 0.0,
        NQ=nq, NK=nk, NQP=next_pow2(nq), NKP=next_pow2(nk), D=D, HAS_NORM=has_norm)
    return qo


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` for rows (B, n), rounded as PyTorch's two ops round."""
    B, n = g.shape
    if g.stride(1) != 1 or u.stride(1) != 1:
        raise ValueError("rows need unit stride")
    out = torch.empty((B, n), dtype=g.dtype, device=g.device)
    block = min(SILU_BLOCK, next_pow2(n))
    _k().silu_mul[(B, -(-n // block))](g, u, out, g.stride(0), u.stride(0), out.stride(0), n, BLOCK=block)
    return out


__all__ = ["ACTIVATIONS", "MLPS", "add_rms_norm", "qk_rope_store", "silu_mul", "unfusable"]
