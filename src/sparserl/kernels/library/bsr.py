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

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import FULL_MASK, Strategy, Variant, fill, make, vec_helpers


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


_spmv = Strategy(("grid=ceil_div(mb, BLOCK / G), block=BLOCK",), fill(
    """
${SIG}
{
    const int lane = threadIdx.x & (G - 1);
    const int brow = blockIdx.x * (BLOCK / G) + threadIdx.x / G;
    if constexpr (G >= R * C) {
        // G lanes per block row; lane owns position p = (rr, cc) of every G/(R*C)-th block.
        const int p = lane % (R * C);
        const int rr = p / C;
        const int cc = p % C;
        float sum = 0.f;
        if (brow < mb) {
            const int end = __ldg(block_row_ptr + brow + 1);
            for (int b = __ldg(block_row_ptr + brow) + lane / (R * C); b < end; b += G / (R * C)) {
                const int col = __ldg(block_col_idx + b) * C + cc;
                if (col < n) sum = fmaf(__ldg(block_val + (size_t)b * (R * C) + p), __ldg(x + col), sum);
            }
        }
        // Sum lanes with the same rr: over the column bits, then over the block bits.
        #pragma unroll
        for (int off = 1; off < C; off <<= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
        #pragma unroll
        for (int off = R * C; off < G; off <<= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
        if (brow < mb && lane < R * C && cc == 0) {
            const int row = brow * R + rr;
            if (row < m) y[row] = sum;
        }
    } else {
        // Lane owns positions lane + a*G (a < A) of every block, all in column cc,
        // so it loads x once per block.
        constexpr int A = (R * C + G - 1) / G;
        const int cc = lane % C;
        float sum[A];
        #pragma unroll
        for (int a = 0; a < A; ++a) sum[a] = 0.f;
        if (brow < mb) {
            const int end = __ldg(block_row_ptr + brow + 1);
            for (int b = __ldg(block_row_ptr + brow); b < end; ++b) {
                const int col = __ldg(block_col_idx + b) * C + cc;
                const float xv = col < n ? __ldg(x + col) : 0.f;
                const float* bv = block_val + (size_t)b * (R * C) + lane;
                #pragma unroll
                for (int a = 0; a < A; ++a) sum[a] = fmaf(__ldg(bv + a * G), xv, sum[a]);
            }
        }
        #pragma unroll
        for (int a = 0; a < A; ++a) {
            #pragma unroll
            for (int off = 1; off < C; off <<= 1) sum[a] += __shfl_xor_sync(${FULL}, sum[a], off);
        }
        if (brow < mb && cc == 0) {
            #pragma unroll
            for (int a = 0; a < A; ++a) {
                const int row = brow * R + (lane + a * G) / C;
                if (row < m) y[row] = sum[a];
            }
        }
    }
}
""", SIG=signature("BSR", Op.SPMV, None, "BLOCK"), FULL=FULL_MASK))

_spmm = Strategy(("grid=ceil_div(mb, BLOCK / G), block=BLOCK",), vec_helpers("load_x", "store_y") + fill(
    """
${SIG}
{
    const int lane = threadIdx.x & (G - 1);
    const int brow = blockIdx.x * (BLOCK / G) + threadIdx.x / G;
    if (brow >= mb) return;
    const int start = __ldg(block_row_ptr + brow);
    const int end = __ldg(block_row_ptr + brow + 1);
    for (int t0 = 0; t0 < k; t0 += G * VEC) {
        const int c0 = t0 + lane * VEC;
        if (c0 >= k) break;
        float acc[R][VEC] = {};
        for (int b = start; b < end; ++b) {
            const int col0 = __ldg(block_col_idx + b) * C;
            const float* bv = block_val + (size_t)b * (R * C);
            #pragma unroll
            for (int c = 0; c < C; ++c) {
                const int col = col0 + c;
                if (col >= n) continue;  // edge block: no x row there
                float xv[VEC];
                load_x(xv, X + (size_t)col * k + c0);
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float a = __ldg(bv + r * C + c);
                    #pragma unroll
                    for (int q = 0; q < VEC; ++q) acc[r][q] = fmaf(a, xv[q], acc[r][q]);
                }
            }
        }
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = brow * R + r;
            if (row < m) store_y(Y + (size_t)row * k + c0, acc[r]);
        }
    }
}
""", SIG=signature("BSR", Op.SPMM, None, "BLOCK")))


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
