"""DIA kernels.

* ``dia_rows``: one thread per row and ``rpt`` rows per thread (strided by the block, so
  every load of ``val`` and ``x`` is coalesced and unit-stride); no column indices are
  read at all, which is why DIA wins on banded and stencil matrices. Diagonal offsets
  are warp-uniform loads through the read-only cache.
* SpMM ``dia_rows``: ``g`` lanes per row over the columns of X.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op
from sparserl.kernels.library.common import Variant, acc_decl, acc_fma, acc_store, fill, make


def _spmv(v: Variant) -> str:
    b, rpt = v.t("block"), v.t("rpt")
    return v.header([f"grid=ceil_div(m, {b * rpt}), block={b}"]) + "\n" + fill(
        """
${SIG}
{
    const int base = blockIdx.x * ${TILE} + threadIdx.x;
    float sum[${RPT}];
    #pragma unroll
    for (int r = 0; r < ${RPT}; ++r) sum[r] = 0.f;
    for (int d = 0; d < num_diags; ++d) {
        const int off = __ldg(offsets + d);
        const float* vd = val + (size_t)d * m;
        #pragma unroll
        for (int r = 0; r < ${RPT}; ++r) {
            const int row = base + r * ${B};
            const int col = row + off;
            if (row < m && col >= 0 && col < n)
                sum[r] = fmaf(__ldg(vd + row), __ldg(x + col), sum[r]);
        }
    }
    #pragma unroll
    for (int r = 0; r < ${RPT}; ++r)
        if (base + r * ${B} < m) y[base + r * ${B}] = sum[r];
}
""",
        SIG=v.sig(launch_bounds=b), B=b, RPT=rpt, TILE=b * rpt,
    )


def _spmm(v: Variant) -> str:
    b, g, vec = v.t("block"), v.t("g"), v.t("vec")
    rpb = b // g
    return v.header([f"grid=ceil_div(m, {rpb}), block={b}"]) + "\n" + fill(
        """
${SIG}
{
    const int lane = threadIdx.x & ${GM1};
    const int row = blockIdx.x * ${RPB} + threadIdx.x / ${G};
    if (row >= m) return;
    for (int t0 = 0; t0 < k; t0 += ${G} * ${VEC}) {
        const int c0 = t0 + lane * ${VEC};
        if (c0 >= k) break;
        ${ACC_DECL}
        for (int d = 0; d < num_diags; ++d) {
            const int c = row + __ldg(offsets + d);
            if (c < 0 || c >= n) continue;
            const float a = __ldg(val + (size_t)d * m + row);
            ${FMA}
        }
        ${STORE}
    }
}
""",
        SIG=v.sig(launch_bounds=b), G=g, GM1=g - 1, RPB=rpb, VEC=vec,
        ACC_DECL=acc_decl(vec),
        FMA=acc_fma(vec, "a", "X + (size_t)c * k + c0"),
        STORE=acc_store(vec, "Y + (size_t)row * k + c0"),
    )


def variants() -> list[Variant]:
    out = []
    for b in (128, 256):
        for rpt in (1, 2, 4):
            out.append(make(Op.SPMV, "DIA", "dia_rows", _spmv, {"block": b, "rpt": rpt},
                            doc="thread per row over diagonals; no index traffic"))
    for g, vec in ((32, 4), (8, 4), (2, 4), (8, 1)):
        out.append(make(Op.SPMM, "DIA", "dia_rows", _spmm, {"g": g, "vec": vec, "block": 256},
                        k_multiple=vec, doc="g lanes per row over the columns of X"))
    return out
