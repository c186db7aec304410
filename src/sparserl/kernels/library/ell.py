"""ELL kernels (column-major slots, ``-1`` padding).

* ``ell_rows``: one thread per row, ``rpt`` rows per thread (strided by the block so loads
  stay coalesced; more rows in flight per thread). Consecutive threads read consecutive
  slots: every load of ``col_idx`` and ``val`` is coalesced. Best for near-uniform rows.
* SpMM ``ell_rows``: ``g`` lanes per row over the columns of X (``vec`` each).

The function builders take array names so HYB reuses them for its ELL part (a thread per row).
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import VEC_HELPERS, Strategy, Variant, fill, make, spmm_row_group

_ONE_ROW = """
    const int row = blockIdx.x * BLOCK + threadIdx.x;
    if (row >= m) return;
    float sum = 0.f;
    for (int j = 0; j < width; ++j) {
        const size_t s = (size_t)j * m + row;
        const int c = __ldg(${COL} + s);
        if (c < 0) break;  // padding comes after a row's entries
        sum = fmaf(__ldg(${VAL} + s), __ldg(x + c), sum);
    }
    y[row] = sum;"""


def spmv_row_function(sig: str, col: str = "col_idx", val: str = "val") -> str:
    """SpMV over column-major ELL arrays ``col``/``val`` of ``width`` slots, a thread per row,
    BLOCK threads per block; writes y."""
    return fill("\n${SIG}\n{" + _ONE_ROW + "\n}\n", SIG=sig, COL=col, VAL=val)


_spmv = Strategy(("grid=ceil_div(m, BLOCK * RPT), block=BLOCK",), fill(
    """
${SIG}
{
    if constexpr (RPT == 1) {  // a thread per row, stopping at the row's padding
""" + _ONE_ROW.replace("\n    ", "\n        ") + """
    } else {  // RPT rows per thread, strided by the block
        const int base = blockIdx.x * (BLOCK * RPT) + threadIdx.x;
        float sum[RPT];
        #pragma unroll
        for (int r = 0; r < RPT; ++r) sum[r] = 0.f;
        for (int j = 0; j < width; ++j) {
            #pragma unroll
            for (int r = 0; r < RPT; ++r) {
                const int row = base + r * BLOCK;
                if (row < m) {
                    const size_t s = (size_t)j * m + row;
                    const int c = __ldg(col_idx + s);
                    if (c >= 0) sum[r] = fmaf(__ldg(val + s), __ldg(x + c), sum[r]);
                }
            }
        }
        #pragma unroll
        for (int r = 0; r < RPT; ++r)
            if (base + r * BLOCK < m) y[base + r * BLOCK] = sum[r];
    }
}
""", SIG=signature("ELL", Op.SPMV, None, "BLOCK"), COL="col_idx", VAL="val"))

SPMM_LAUNCH = "grid=ceil_div(m, BLOCK / G), block=BLOCK"


def spmm_function(sig: str, col: str = "col_idx", val: str = "val") -> str:
    """SpMM over column-major ELL arrays: G lanes per row, VEC columns of Y per lane (needs
    :data:`VEC_HELPERS` before it)."""
    return spmm_row_group(
        sig,
        prologue="    const int row = grp;\n    if (row >= m) return;",
        entries=fill("""        for (int j = 0; j < width; ++j) {
            const size_t s = (size_t)j * m + row;
            const int c = __ldg(${COL} + s);
            if (c < 0) break;
            const float a = __ldg(${VAL} + s);
            fma_x(acc, a, X + (size_t)c * k + c0);
        }""", COL=col, VAL=val),
    )


_spmm = Strategy((SPMM_LAUNCH,), VEC_HELPERS + spmm_function(signature("ELL", Op.SPMM, None, "BLOCK")))


def variants() -> list[Variant]:
    out = []
    for b in (128, 256):
        for rpt in (1, 2):
            out.append(make(Op.SPMV, "ELL", "ell_rows", _spmv, {"block": b, "rpt": rpt},
                            doc="thread per row over coalesced column-major slots"))
    for g, vec in ((32, 4), (8, 4), (2, 4), (8, 1)):
        out.append(make(Op.SPMM, "ELL", "ell_rows", _spmm, {"g": g, "vec": vec, "block": 256},
                        k_multiple=vec, doc="g lanes per row over the columns of X"))
    return out
