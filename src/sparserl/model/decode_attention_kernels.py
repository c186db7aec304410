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
                    G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr,
                    BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """One program: the G query rows of row b, key head h (padded to GP >= 16 rows for the matrix
    units, the padding masked), over keys [c * CHUNK, (c + 1) * CHUNK) of the first ``span``;
    writes its running max, sum and weighted values (float32) for the G real rows. Keys, values
    and queries are widened to float32 and multiplied on the matrix units in TF32: a bf16 value is
    exact in TF32, so a bf16 model's scores are exact products summed in float32; the softmax
    weights are rounded to TF32 once (to nearest), and their sum is taken after that rounding, so
    the normalisation matches what is multiplied. ``IEEE``: full float32 products instead
    (float32 models)."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    b = (pid // n_kv).to(tl.int64)  # row offsets in 64 bits: B * S * Hkv * D may pass 2**31 on long caches
    h = pid % n_kv
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    real = offs_g < G
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_g[:, None] * sq_g + offs_d[None, :], mask=real[:, None],
                other=0.0).to(tl.float32)  # (GP, D)
    m = tl.full((GP,), float("-inf"), tl.float32)
    l_sum = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, D), tl.float32)
    for n0 in range(0, CHUNK, BLOCK_N):
        offs_n = c * CHUNK + n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < span
        k = tl.load(k_ptr + b * sk_b + h * sk_h + offs_n[:, None] * sk_n + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)  # (N, D)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + offs_n[:, None] * sv_n + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + b * s_bias + offs_n, mask=inside, other=float("-inf")).to(tl.float32)  # (N,)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale + bias[None, :]  # (GP, N), float32
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: every weight is exp(-inf) = 0
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        if not IEEE:  # round to TF32 once (to nearest) and sum what the matrix units will multiply
            p = ((p.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    base = (pid.to(tl.int64) * n_chunks + c) * G  # scratch offsets in 64 bits too
    tl.store(m_ptr + base + offs_g, m, mask=real)
    tl.store(l_ptr + base + offs_g, l_sum, mask=real)
    tl.store(acc_ptr + (base + offs_g)[:, None] * D + offs_d[None, :], acc, mask=real[:, None])


@triton.jit(do_not_specialize=["n_chunks"])
def merge_chunks(m_ptr, l_ptr, acc_ptr, out_ptr, so_b, so_h, so_g, n_kv, n_chunks,
                 G: tl.constexpr, D: tl.constexpr, NC: tl.constexpr):
    """One program per (row, key head): its chunks' partial softmaxes merged into the output."""
    pid = tl.program_id(0)
    b = (pid // n_kv).to(tl.int64)
    h = pid % n_kv
    offs_c = tl.arange(0, NC)
    offs_g = tl.arange(0, G)
    offs_d = tl.arange(0, D)
    ok = offs_c < n_chunks
    idx = (pid.to(tl.int64) * n_chunks + offs_c)[:, None] * G + offs_g[None, :]  # (NC, G), 64-bit offsets
    m = tl.load(m_ptr + idx, mask=ok[:, None], other=float("-inf"))
    l_sum = tl.load(l_ptr + idx, mask=ok[:, None], other=0.0)
    acc = tl.load(acc_ptr + idx[:, :, None] * D + offs_d[None, None, :], mask=ok[:, None, None], other=0.0)
    mx = tl.max(m, axis=0)  # (G,): finite, since every row has a valid key in some chunk
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx[None, :]))  # (NC, G)
    total = tl.sum(l_sum * w, axis=0)
    out = tl.sum(acc * w[:, :, None], axis=0) / total[:, None]
    tl.store(out_ptr + b * so_b + h * so_h + offs_g[:, None] * so_g + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty))
