"""The Triton kernels of :mod:`sparserl.model.decode_attention` (imported only when used: Triton
is on the GPU image and in the dev extra, not a dependency of the package).

With ``TRITON_INTERPRET=1`` set before Triton is first imported (the CPU tests do, in
``tests/conftest.py``), ``triton.jit`` gives interpreted kernels that run on CPU tensors."""

from __future__ import annotations

import triton
import triton.language as tl


# span, chunk counts and the bias row's stride change from bucket to bucket: not specialised on, so
# the kernels compile once, in the engine's eager warm-up steps, and never during a graph capture
@triton.jit(do_not_specialize=["span", "n_chunks", "s_bias"])
def partial_softmax(q_ptr, k_ptr, v_ptr, bias_ptr, m_ptr, l_ptr, acc_ptr,
                    sq_b, sq_h, sq_g, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, s_bias,
                    span, n_kv, n_chunks, scale,
                    G: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: the G query rows of row b, key head h, over keys [c * CHUNK, (c + 1) * CHUNK)
    of the first ``span``; writes its running max, sum and weighted values (float32)."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    b = pid // n_kv
    h = pid % n_kv
    offs_g = tl.arange(0, G)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_g[:, None] * sq_g + offs_d[None, :]).to(tl.float32)  # (G, D)
    m = tl.full((G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((G,), tl.float32)
    acc = tl.zeros((G, D), tl.float32)
    for n0 in range(0, CHUNK, BLOCK_N):
        offs_n = c * CHUNK + n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < span
        k = tl.load(k_ptr + b * sk_b + h * sk_h + offs_n[:, None] * sk_n + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)  # (N, D)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + offs_n[:, None] * sv_n + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + b * s_bias + offs_n, mask=inside, other=float("-inf")).to(tl.float32)  # (N,)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale + bias[None, :]  # (G, N)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: every weight is exp(-inf) = 0
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    base = (pid * n_chunks + c) * G
    tl.store(m_ptr + base + offs_g, m)
    tl.store(l_ptr + base + offs_g, l_sum)
    tl.store(acc_ptr + (base + offs_g)[:, None] * D + offs_d[None, :], acc)


@triton.jit(do_not_specialize=["n_chunks"])
def merge_chunks(m_ptr, l_ptr, acc_ptr, out_ptr, so_b, so_h, so_g, n_kv, n_chunks,
                 G: tl.constexpr, D: tl.constexpr, NC: tl.constexpr):
    """One program per (row, key head): its chunks' partial softmaxes merged into the output."""
    pid = tl.program_id(0)
    b = pid // n_kv
    h = pid % n_kv
    offs_c = tl.arange(0, NC)
    offs_g = tl.arange(0, G)
    offs_d = tl.arange(0, D)
    ok = offs_c < n_chunks
    idx = (pid * n_chunks + offs_c)[:, None] * G + offs_g[None, :]  # (NC, G)
    m = tl.load(m_ptr + idx, mask=ok[:, None], other=float("-inf"))
    l_sum = tl.load(l_ptr + idx, mask=ok[:, None], other=0.0)
    acc = tl.load(acc_ptr + idx[:, :, None] * D + offs_d[None, None, :], mask=ok[:, None, None], other=0.0)
    mx = tl.max(m, axis=0)  # (G,): finite, since every row has a valid key in some chunk
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx[None, :]))  # (NC, G)
    total = tl.sum(l_sum * w, axis=0)
    out = tl.sum(acc * w[:, :, None], axis=0) / total[:, None]
    tl.store(out_ptr + b * so_b + h * so_h + offs_g[:, None] * so_g + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty))
