"""DIA kernels.

* ``dia_rows``: one thread per row and ``rpt`` rows per thread (strided by the block, so
  every load of ``val`` and ``x`` is coalesced and unit-stride); no column indices are
  read at all, which is why DIA wins on banded and stencil matrices. Diagonal offsets
  are warp-uniform loads through the read-only cache.
* ``dia_vec4``: four consecutive rows per thread, 16-byte loads of ``val`` (and of ``x``
  on diagonals whose offset is a multiple of 4) and 16-byte stores of ``y`` when m is a
  multiple of 4; a guarded scalar path otherwise.
* SpMM ``dia_rows``: ``g`` lanes per row over the columns of X.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op
from sparserl.kernels.library.common import Variant, fill, make, spmm_row_group


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


def _spmv_vec4(v: Variant) -> str:
    b = v.t("block")
    return v.header([f"grid=ceil_div(m, {b * 4}), block={b}"]) + "\n" + fill(
        """
${SIG}
{
    // Four consecutive rows per thread: 16-byte loads of val (and of x where the diagonal's
    // offset keeps them aligned) and a 16-byte store of y; scalar path at the edges.
    const int r0 = (blockIdx.x * ${B} + threadIdx.x) * 4;
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
""",
        SIG=v.sig(launch_bounds=b), B=b,
    )


def _spmm(v: Variant) -> str:
    b, g, vec = v.t("block"), v.t("g"), v.t("vec")
    return v.header([f"grid=ceil_div(m, {b // g}), block={b}"]) + "\n" + spmm_row_group(
        v.sig(launch_bounds=b), b, g, vec,
        prologue="    const int row = grp;\n    if (row >= m) return;",
        entries="""        for (int d = 0; d < num_diags; ++d) {
            const int c = row + __ldg(offsets + d);
            if (c < 0 || c >= n) continue;
            const float a = __ldg(val + (size_t)d * m + row);
            ${FMA}
        }""",
    )


def variants() -> list[Variant]:
    out = []
    for b in (128, 256):
        for rpt in (1, 2, 4):
            out.append(make(Op.SPMV, "DIA", "dia_rows", _spmv, {"block": b, "rpt": rpt},
                            doc="thread per row over diagonals; no index traffic"))
    for b in (128, 256):
        out.append(make(Op.SPMV, "DIA", "dia_vec4", _spmv_vec4, {"block": b},
                        doc="four rows per thread with 16-byte loads of val (and aligned x) and stores of y"))
    for g, vec in ((32, 4), (8, 4), (2, 4), (8, 1)):
        out.append(make(Op.SPMM, "DIA", "dia_rows", _spmm, {"g": g, "vec": vec, "block": 256},
                        k_multiple=vec, doc="g lanes per row over the columns of X"))
    return out
