"""The Triton kernels of :mod:`sparserl.model.decode_fused` (imported only when used).

Each kernel repeats the arithmetic of the PyTorch ops it replaces, rounding to the model's dtype
where they round (every PyTorch elementwise op on bf16 computes in float32 and rounds its
result): ``rnd`` below is that rounding (the identity for a float32 model)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rnd(x, like_ptr):
    """float32 x rounded to the element type of ``like_ptr`` and widened back to float32. bf16 is
    rounded to nearest-even by hand (Triton's interpreter truncates in its conversion; the GPU's
    rounds to nearest-even, as PyTorch does): the result converts to bf16 exactly either way."""
    if like_ptr.dtype.element_ty == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return tl.where(x == x, u.to(tl.float32, bitcast=True), x)  # a NaN stays NaN (the carry would not keep it)
    return x.to(like_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def add_rms_norm(x_ptr, r_ptr, sum_ptr, w_ptr, out_ptr, sx, sr, ss, so, n, eps,
                 HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row: ``s = x + r`` (rounded; written to ``sum_ptr``) when HAS_RES, else
    ``s = x``; then ``w * rnd(s * rsqrt(mean(s^2) + eps))``, the RMS norms of Qwen3, Qwen2 and
    Llama (float32 statistics, the normalised row cast back, times the weight)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    s = tl.load(x_ptr + row * sx + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        s = _rnd(s + tl.load(r_ptr + row * sr + offs, mask=ok, other=0.0).to(tl.float32), sum_ptr)
        tl.store(sum_ptr + row * ss + offs, s.to(sum_ptr.dtype.element_ty), mask=ok)
    inv = tl.rsqrt(tl.sum(s * s, axis=0) / n + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = _rnd(s * inv, out_ptr)
    tl.store(out_ptr + row * so + offs, _rnd(w * y, out_ptr).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _norm_rope(src, w_ptr, cos, sin, eps, like_ptr, NH: tl.constexpr, NHP: tl.constexpr, D: tl.constexpr,
               HAS_NORM: tl.constexpr):
    """Heads [0, NH) of one row at ``src`` (head h, element d at h * D + d): the per-head RMS norm
    (when HAS_NORM), then the rotary embedding ``x * cos + rotate_half(x) * sin``, each op rounded
    as PyTorch rounds it. Returns the (NHP, D) float32 block and its row mask."""
    offs_h = tl.arange(0, NHP)
    offs_d = tl.arange(0, D)
    rot_d = (offs_d + D // 2) % D  # rotate_half(x)[d] = -x[d + D/2] (d < D/2), x[d - D/2] (d >= D/2)
    sign = tl.where(offs_d < D // 2, -1.0, 1.0)
    live = offs_h < NH
    x = tl.load(src + offs_h[:, None] * D + offs_d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    xr = tl.load(src + offs_h[:, None] * D + rot_d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # (NHP,)
        w = tl.load(w_ptr + offs_d).to(tl.float32)
        wr = tl.load(w_ptr + rot_d).to(tl.float32)
        x = _rnd(w[None, :] * _rnd(x * inv[:, None], like_ptr), like_ptr)
        xr = _rnd(wr[None, :] * _rnd(xr * inv[:, None], like_ptr), like_ptr)
    a = _rnd(x * cos[None, :], like_ptr)
    b = _rnd(sign[None, :] * xr * sin[None, :], like_ptr)
    return _rnd(a + b, like_ptr), live


@triton.jit
def qk_rope_store(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, col_ptr,
                  qo_ptr, kc_ptr, vc_ptr, sq, sk, sv, s_tab, s_pos, skc_b, skc_h, skc_n, svc_b, svc_h, svc_n,
                  q_eps, k_eps, NQ: tl.constexpr, NK: tl.constexpr, NQP: tl.constexpr, NKP: tl.constexpr,
                  D: tl.constexpr, HAS_NORM: tl.constexpr):
    """One program per row of the batch, for one decode step of one layer: the queries and keys
    (q/k norms, then the rotary embedding at the row's position, from the angle tables), the
    queries written to ``qo_ptr`` (B, NQ, D), the keys and values into the cache at position
    ``col`` (a device scalar, so a captured graph reads each step's value)."""
    b = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, D)
    p = tl.load(pos_ptr + b * s_pos)
    cos = tl.load(cos_ptr + p * s_tab + offs_d).to(tl.float32)
    sin = tl.load(sin_ptr + p * s_tab + offs_d).to(tl.float32)
    col = tl.load(col_ptr)
    q, q_live = _norm_rope(q_ptr + b * sq, qw_ptr, cos, sin, q_eps, qo_ptr, NQ, NQP, D, HAS_NORM)
    offs_q = tl.arange(0, NQP)
    tl.store(qo_ptr + b * NQ * D + offs_q[:, None] * D + offs_d[None, :], q.to(qo_ptr.dtype.element_ty),
             mask=q_live[:, None])
    k, k_live = _norm_rope(k_ptr + b * sk, kw_ptr, cos, sin, k_eps, kc_ptr, NK, NKP, D, HAS_NORM)
    offs_k = tl.arange(0, NKP)
    tl.store(kc_ptr + b * skc_b + offs_k[:, None] * skc_h + col * skc_n + offs_d[None, :],
             k.to(kc_ptr.dtype.element_ty), mask=k_live[:, None])
    v = tl.load(v_ptr + b * sv + offs_k[:, None] * D + offs_d[None, :], mask=k_live[:, None], other=0.0)
    tl.store(vc_ptr + b * svc_b + offs_k[:, None] * svc_h + col * svc_n + offs_d[None, :],
             v.to(vc_ptr.dtype.element_ty), mask=k_live[:, None])


@triton.jit
def silu_mul(g_ptr, u_ptr, out_ptr, sg, su, so, n, BLOCK: tl.constexpr):
    """``rnd(silu(g)) * u``, rounded: the gated MLP's activation (a program per row and block)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(g_ptr + row * sg + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * su + offs, mask=ok, other=0.0).to(tl.float32)
    act = _rnd(g / (1.0 + tl.exp(-g)), out_ptr)
    tl.store(out_ptr + row * so + offs, _rnd(act * u, out_ptr).to(out_ptr.dtype.element_ty), mask=ok)
