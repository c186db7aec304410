"""DIA kernels.

* ``dia_rows``: one thread per row and ``rpt`` rows per thread (strided by the block, so
  every load of ``val`` and ``x`` is coalesced and unit-stride); no column indices are
  read at all, which is why DIA wins on banded and stencil matrices. Diagonal offsets
  are warp-uniform loads through the read-only cache.
* ``dia_vec4``: four consecutive rows per thread, 16-byte loads of ``val`` (and of ``x``
  on diagonals whose offset is a multiple of 4) and 16-byte stores of ``y`` when m is a
  multiple of 4; a guarded scalar path otherwise.
* ``dia_stream``: ``v`` groups of four rows per thread, the groups strided by the block (so
  every 16-byte access is coalesced); ``val`` is read with streaming loads (``__ldcs``: used
  once, evicted first) and ``y`` written with streaming stores (``__stcs``), so the L2 keeps
  ``x``, which neighbouring diagonals read again. Aligned 16-byte path when m is a multiple
  of 4, guarded scalar path otherwise.
* SpMM ``dia_rows``: ``g`` lanes per row over the columns of X.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import VEC_HELPERS, Strategy, Variant, fill, make, spmm_row_group

_SIG = signature("DIA", Op.SPMV, None, "BLOCK")

_spmv = Strategy(("grid=ceil_div(m, BLOCK * RPT), block=BLOCK",), fill(
    """
${SIG}
{
    const int base = blockIdx.x * (BLOCK * RPT) + threadIdx.x;
    float sum[RPT];
    #pragma unroll
    for (int r = 0; r < RPT; ++r) sum[r] = 0.f;
    for (int d = 0; d < num_diags; ++d) {
        const int off = __ldg(offsets + d);
        const float* vd = val + (size_t)d * m;
        #pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const int row = base + r * BLOCK;
            const int col = row + off;
            if (row < m && col >= 0 && col < n)
                sum[r] = fmaf(__ldg(vd + row), __ldg(x + col), sum[r]);
        }
    }
    #pragma unroll
    for (int r = 0; r < RPT; ++r)
        if (base + r * BLOCK < m) y[base + r * BLOCK] = sum[r];
}
""", SIG=_SIG))

_spmv_vec4 = Strategy(("grid=ceil_div(m, BLOCK * 4), block=BLOCK",), fill(
    """
${SIG}
{
    // Four consecutive rows per thread: 16-byte loads of val (and of x where the diagonal's
    // offset keeps them aligned) and a 16-byte store of y; scalar path at the edges.
    const int r0 = (blockIdx.x * BLOCK + threadIdx.x) * 4;
    if (r0 >= m) return;
    const bool vec = ((m & 3) == 0) && (r0 + 3 < m);
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    for (int d = 0; d < num_diags; ++d) {
        const int off = __ldg(offsets + d);
        const float* vd = val + (size_t)d * m;
        const int c = r0 + off;
        if (vec) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(vd + r0));
            if ((off & 3) == 0 && c >= 0 && c + 3 < n) {
                const float4 xv = __ldg(reinterpret_cast<const float4*>(x + c));
                s0 = fmaf(a.x, xv.x, s0); s1 = fmaf(a.y, xv.y, s1); s2 = fmaf(a.z, xv.z, s2); s3 = fmaf(a.w, xv.w, s3);
            } else {
                if (c >= 0 && c < n) s0 = fmaf(a.x, __ldg(x + c), s0);
                if (c + 1 >= 0 && c + 1 < n) s1 = fmaf(a.y, __ldg(x + c + 1), s1);
                if (c + 2 >= 0 && c + 2 < n) s2 = fmaf(a.z, __ldg(x + c + 2), s2);
                if (c + 3 >= 0 && c + 3 < n) s3 = fmaf(a.w, __ldg(x + c + 3), s3);
            }
        } else {
            if (r0 < m && c >= 0 && c < n) s0 = fmaf(__ldg(vd + r0), __ldg(x + c), s0);
            if (r0 + 1 < m && c + 1 >= 0 && c + 1 < n) s1 = fmaf(__ldg(vd + r0 + 1), __ldg(x + c + 1), s1);
            if (r0 + 2 < m && c + 2 >= 0 && c + 2 < n) s2 = fmaf(__ldg(vd + r0 + 2), __ldg(x + c + 2), s2);
            if (r0 + 3 < m && c + 3 >= 0 && c + 3 < n) s3 = fmaf(__ldg(vd + r0 + 3), __ldg(x + c + 3), s3);
        }
    }
    if (vec) {
        *reinterpret_cast<float4*>(y + r0) = make_float4(s0, s1, s2, s3);
    } else {
        y[r0] = s0;
        if (r0 + 1 < m) y[r0 + 1] = s1;
        if (r0 + 2 < m) y[r0 + 2] = s2;
        if (r0 + 3 < m) y[r0 + 3] = s3;
    }
}
""", SIG=_SIG))

_spmv_stream = Strategy(("grid=ceil_div(m, BLOCK * V * 4), block=BLOCK",), fill(
    """
${SIG}
{
    // V groups of four consecutive rows per thread, strided by the block: group j starts at
    // row 4 * (blockIdx.x * BLOCK * V + j * BLOCK + threadIdx.x). val streams (__ldcs), y too (__stcs).
    const int q0 = blockIdx.x * (BLOCK * V) + threadIdx.x;
    const bool aligned = (m & 3) == 0;
    float s[V][4];
    #pragma unroll
    for (int j = 0; j < V; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    for (int d = 0; d < num_diags; ++d) {
        const int off = __ldg(offsets + d);
        const float* vd = val + (size_t)d * m;
        #pragma unroll
        for (int j = 0; j < V; ++j) {
            const int r0 = (q0 + j * BLOCK) * 4;
            if (r0 >= m) continue;
            const int c = r0 + off;
            float a[4];
            if (aligned && r0 + 3 < m) {
                const float4 av = __ldcs(reinterpret_cast<const float4*>(vd + r0));
                a[0] = av.x; a[1] = av.y; a[2] = av.z; a[3] = av.w;
            } else {
                #pragma unroll
                for (int t = 0; t < 4; ++t) a[t] = r0 + t < m ? __ldcs(vd + r0 + t) : 0.f;
            }
            if ((off & 3) == 0 && c >= 0 && c + 3 < n) {
                const float4 xv = __ldg(reinterpret_cast<const float4*>(x + c));
                s[j][0] = fmaf(a[0], xv.x, s[j][0]); s[j][1] = fmaf(a[1], xv.y, s[j][1]);
                s[j][2] = fmaf(a[2], xv.z, s[j][2]); s[j][3] = fmaf(a[3], xv.w, s[j][3]);
            } else {
                #pragma unroll
                for (int t = 0; t < 4; ++t)
                    if (r0 + t < m && c + t >= 0 && c + t < n) s[j][t] = fmaf(a[t], __ldg(x + c + t), s[j][t]);
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < V; ++j) {
        const int r0 = (q0 + j * BLOCK) * 4;
        if (r0 >= m) continue;
        if (aligned && r0 + 3 < m) {
            __stcs(reinterpret_cast<float4*>(y + r0), make_float4(s[j][0], s[j][1], s[j][2], s[j][3]));
        } else {
            #pragma unroll
            for (int t = 0; t < 4; ++t)
                if (r0 + t < m) y[r0 + t] = s[j][t];
        }
    }
}
""", SIG=_SIG))

_spmm = Strategy(("grid=ceil_div(m, BLOCK / G), block=BLOCK",), VEC_HELPERS + spmm_row_group(
    signature("DIA", Op.SPMM, None, "BLOCK"),
    prologue="    const int row = grp;\n    if (row >= m) return;",
    entries="""        for (int d = 0; d < num_diags; ++d) {
            const int c = row + __ldg(offsets + d);
            if (c < 0 || c >= n) continue;
            const float a = __ldg(val + (size_t)d * m + row);
            fma_x(acc, a, X + (size_t)c * k + c0);
        }""",
))


def variants() -> list[Variant]:
    out = []
    for b in (128, 256):
        for rpt in (1, 2, 4):
            out.append(make(Op.SPMV, "DIA", "dia_rows", _spmv, {"block": b, "rpt": rpt},
                            doc="thread per row over diagonals; no index traffic"))
    for b in (128, 256):
        out.append(make(Op.SPMV, "DIA", "dia_vec4", _spmv_vec4, {"block": b},
                        doc="four rows per thread with 16-byte loads of val (and aligned x) and stores of y"))
    for b, g in ((256, 1), (256, 2), (128, 2)):
        out.append(make(Op.SPMV, "DIA", "dia_stream", _spmv_stream, {"block": b, "v": g},
                        doc="v coalesced groups of four rows per thread; streaming loads of val, stores of y"))
    for g, vec in ((32, 4), (8, 4), (2, 4), (8, 1)):
        out.append(make(Op.SPMM, "DIA", "dia_rows", _spmm, {"g": g, "vec": vec, "block": 256},
                        k_multiple=vec, doc="g lanes per row over the columns of X"))
    return out
