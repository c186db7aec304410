"""SELL-C-sigma kernels.

* ``sell_lanes``: one thread per slice lane (row), C consecutive threads per slice, so
  each slot column of a slice is one coalesced load; padding is only up to the
  slice's longest row, and sorting inside sigma-windows makes slices even.
* SpMM ``sell_lanes``: ``g`` lanes per row over the columns of X.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import VEC_HELPERS, Strategy, Variant, fill, make, spmm_row_group

_spmv = Strategy(("grid=ceil_div(num_slices * C, BLOCK), block=BLOCK",), fill(
    """
${SIG}
{
    const int t = blockIdx.x * BLOCK + threadIdx.x;
    const int s = t / C;
    const int lane = t % C;
    if (s >= num_slices) return;
    const int row = __ldg(row_perm + t);
    if (row < 0) return;  // padding lane
    const int base = __ldg(slice_ptr + s);
    const int w = (__ldg(slice_ptr + s + 1) - base) / C;
    float sum = 0.f;
    for (int j = 0; j < w; ++j) {
        const int idx = base + j * C + lane;
        const int c = __ldg(col_idx + idx);
        if (c < 0) break;
        sum = fmaf(__ldg(val + idx), __ldg(x + c), sum);
    }
    y[row] = sum;
}
""", SIG=signature("SELL", Op.SPMV, None, "BLOCK")))

_spmm = Strategy(("grid=ceil_div(num_slices * C, BLOCK / G), block=BLOCK",), VEC_HELPERS + spmm_row_group(
    signature("SELL", Op.SPMM, None, "BLOCK"),
    prologue="""    if (grp >= num_slices * C) return;  // grp = slice * C + lane of the slice
    const int row = __ldg(row_perm + grp);
    if (row < 0) return;
    const int r = grp % C;
    const int base = __ldg(slice_ptr + grp / C);
    const int w = (__ldg(slice_ptr + grp / C + 1) - base) / C;""",
    entries="""        for (int j = 0; j < w; ++j) {
            const int idx = base + j * C + r;
            const int c = __ldg(col_idx + idx);
            if (c < 0) break;
            const float a = __ldg(val + idx);
            fma_x(acc, a, X + (size_t)c * k + c0);
        }""",
))


def variants() -> list[Variant]:
    out = []
    for C, sigma in ((32, 1), (32, 512), (8, 64), (128, 1024)):
        for b in (128, 256):
            out.append(make(Op.SPMV, "SELL", "sell_lanes", _spmv, {"block": b}, {"C": C, "sigma": sigma},
                            doc="thread per slice lane; uneven rows with little padding"))
    for C, sigma in ((32, 1), (32, 512)):
        for g, vec in ((32, 4), (8, 1), (2, 4)):
            out.append(make(Op.SPMM, "SELL", "sell_lanes", _spmm, {"g": g, "vec": vec, "block": 256},
                            {"C": C, "sigma": sigma}, k_multiple=vec,
                            doc="g lanes per slice row over the columns of X"))
    return out
