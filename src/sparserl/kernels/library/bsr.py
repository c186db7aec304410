"""BSR kernels (dense R x C blocks, row-major inside; R, C powers of two in the library).

* ``bsr_group``: ``g`` lanes per block row. When ``g >= R*C`` each lane owns one fixed
  position (r, c) of the blocks it visits and lanes sweep ``g / (R*C)`` blocks at a
  time; when ``R*C > g`` each lane owns ``R*C / g`` positions of every block and loads
  x once per block. Block values are read with unit stride across lanes (coalesced),
  one column index serves R*C values, and lanes of the same block row are summed with
  xor-shuffles.
* SpMM ``bsr_group``: ``g`` lanes per block row over the columns of X, R accumulators
  per lane (``vec`` columns each).
"""

from __future__ import annotations

from sparserl.kernels.contract import Op
from sparserl.kernels.library.common import FULL_MASK, Variant, fill, make


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _spmv(v: Variant) -> str:
    b, g = v.t("block"), v.t("g")
    R, C = v.params["R"], v.params["C"]
    RC = R * C
    assert _is_pow2(R) and _is_pow2(C) and _is_pow2(g) and g <= 32 and g >= C
    header = v.header([f"grid=ceil_div(mb, {b // g}), block={b}"])
    common = dict(SIG=v.sig(launch_bounds=b), G=g, GM1=g - 1, BPB=b // g, R=R, C=C, RC=RC, FULL=FULL_MASK)
    if g >= RC:
        return header + "\n" + fill(
            """
${SIG}
{
    // ${G} lanes per block row; lane owns position p = (rr, cc) of every ${G}/${RC}-th block.
    const int lane = threadIdx.x & ${GM1};
    const int brow = blockIdx.x * ${BPB} + threadIdx.x / ${G};
    const int p = lane % ${RC};
    const int rr = p / ${C};
    const int cc = p % ${C};
    float sum = 0.f;
    if (brow < mb) {
        const int end = __ldg(block_row_ptr + brow + 1);
        for (int b = __ldg(block_row_ptr + brow) + lane / ${RC}; b < end; b += ${G} / ${RC}) {
            const int col = __ldg(block_col_idx + b) * ${C} + cc;
            if (col < n) sum = fmaf(__ldg(block_val + (size_t)b * ${RC} + p), __ldg(x + col), sum);
        }
    }
    // Sum lanes with the same rr: over the column bits, then over the block bits.
    #pragma unroll
    for (int off = 1; off < ${C}; off <<= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
    #pragma unroll
    for (int off = ${RC}; off < ${G}; off <<= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
    if (brow < mb && lane < ${RC} && cc == 0) {
        const int row = brow * ${R} + rr;
        if (row < m) y[row] = sum;
    }
}
""",
            **common,
        )
    assert RC % g == 0
    a = RC // g
    return header + "\n" + fill(
        """
${SIG}
{
    // ${G} lanes per block row; lane owns positions lane + a*${G} (a < ${A}) of every block,
    // all in column cc, so it loads x once per block.
    const int lane = threadIdx.x & ${GM1};
    const int brow = blockIdx.x * ${BPB} + threadIdx.x / ${G};
    const int cc = lane % ${C};
    float sum[${A}];
    #pragma unroll
    for (int a = 0; a < ${A}; ++a) sum[a] = 0.f;
    if (brow < mb) {
        const int end = __ldg(block_row_ptr + brow + 1);
        for (int b = __ldg(block_row_ptr + brow); b < end; ++b) {
            const int col = __ldg(block_col_idx + b) * ${C} + cc;
            const float xv = col < n ? __ldg(x + col) : 0.f;
            const float* bv = block_val + (size_t)b * ${RC} + lane;
            #pragma unroll
            for (int a = 0; a < ${A}; ++a) sum[a] = fmaf(__ldg(bv + a * ${G}), xv, sum[a]);
        }
    }
    #pragma unroll
    for (int a = 0; a < ${A}; ++a) {
        #pragma unroll
        for (int off = 1; off < ${C}; off <<= 1) sum[a] += __shfl_xor_sync(${FULL}, sum[a], off);
    }
    if (brow < mb && cc == 0) {
        #pragma unroll
        for (int a = 0; a < ${A}; ++a) {
            const int row = brow * ${R} + (lane + a * ${G}) / ${C};
            if (row < m) y[row] = sum[a];
        }
    }
}
""",
        A=a,
        **common,
    )


def _spmm(v: Variant) -> str:
    b, g, vec = v.t("block"), v.t("g"), v.t("vec")
    R, C = v.params["R"], v.params["C"]
    bpb = b // g
    if vec == 4:
        decl = f"float4 acc[{R}];\n        #pragma unroll\n        for (int r = 0; r < {R}; ++r) acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);"
        load = "const float4 xv = __ldg(reinterpret_cast<const float4*>(X + (size_t)col * k + c0));"
        fma = ("acc[r].x = fmaf(a, xv.x, acc[r].x); acc[r].y = fmaf(a, xv.y, acc[r].y); "
               "acc[r].z = fmaf(a, xv.z, acc[r].z); acc[r].w = fmaf(a, xv.w, acc[r].w);")
        store = "*reinterpret_cast<float4*>(Y + (size_t)row * k + c0) = acc[r];"
    else:
        decl = f"float acc[{R}];\n        #pragma unroll\n        for (int r = 0; r < {R}; ++r) acc[r] = 0.f;"
        load = "const float xv = __ldg(X + (size_t)col * k + c0);"
        fma = "acc[r] = fmaf(a, xv, acc[r]);"
        store = "Y[(size_t)row * k + c0] = acc[r];"
    return v.header([f"grid=ceil_div(mb, {bpb}), block={b}"]) + "\n" + fill(
        """
${SIG}
{
    const int lane = threadIdx.x & ${GM1};
    const int brow = blockIdx.x * ${BPB} + threadIdx.x / ${G};
    if (brow >= mb) return;
    const int start = __ldg(block_row_ptr + brow);
    const int end = __ldg(block_row_ptr + brow + 1);
    for (int t0 = 0; t0 < k; t0 += ${G} * ${VEC}) {
        const int c0 = t0 + lane * ${VEC};
        if (c0 >= k) break;
        ${DECL}
        for (int b = start; b < end; ++b) {
            const int col0 = __ldg(block_col_idx + b) * ${C};
            const float* bv = block_val + (size_t)b * ${RC};
            #pragma unroll
            for (int c = 0; c < ${C}; ++c) {
                const int col = col0 + c;
                if (col >= n) continue;  // edge block: no x row there
                ${LOAD}
                #pragma unroll
                for (int r = 0; r < ${R}; ++r) {
                    const float a = __ldg(bv + r * ${C} + c);
                    ${FMA}
                }
            }
        }
        #pragma unroll
        for (int r = 0; r < ${R}; ++r) {
            const int row = brow * ${R} + r;
            if (row < m) ${STORE}
        }
    }
}
""",
        SIG=v.sig(launch_bounds=b), G=g, GM1=g - 1, BPB=bpb, VEC=vec, R=R, C=C, RC=R * C,
        DECL=decl, LOAD=load, FMA=fma, STORE=store,
    )


def variants() -> list[Variant]:
    out = []
    groups = {(2, 2): (4, 16, 32), (4, 4): (16, 32), (8, 8): (8, 16, 32)}
    for (R, C), gs in groups.items():
        for g in gs:
            for b in (128, 256):
                out.append(make(Op.SPMV, "BSR", "bsr_group", _spmv, {"g": g, "block": b}, {"R": R, "C": C},
                                doc="g lanes per block row, coalesced block values, shuffle sums"))
    for R, C in ((2, 2), (4, 4), (8, 8)):
        for g, vec in ((32, 4), (8, 1), (2, 4)):
            out.append(make(Op.SPMM, "BSR", "bsr_group", _spmm, {"g": g, "vec": vec, "block": 256},
                            {"R": R, "C": C}, k_multiple=vec,
                            doc="g lanes per block row over the columns of X, R accumulators"))
    return out
