"""ELL kernels (column-major slots, ``-1`` padding).

* ``ell_rows``: one thread per row, ``rpt`` rows per thread (strided by the block so loads
  stay coalesced; more rows in flight per thread). Consecutive threads read consecutive
  slots: every load of ``col_idx`` and ``val`` is coalesced. Best for near-uniform rows.
* SpMM ``ell_rows``: ``g`` lanes per row over the columns of X (``vec`` each).

The function builders take array names so HYB reuses them for its ELL part.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op
from sparserl.kernels.library.common import Variant, fill, make, spmm_row_group


def spmv_launch(block: int, rpt: int) -> str:
    return f"grid=ceil_div(m, {block * rpt}), block={block}"


def spmv_function(sig: str, block: int, rpt: int, col: str = "col_idx", val: str = "val") -> str:
    """SpMV over column-major ELL arrays ``col``/``val`` of ``width`` slots; writes y."""
    if rpt == 1:
        return fill(
            """
${SIG}
{
    const int row = blockIdx.x * ${B} + threadIdx.x;
    if (row >= m) return;
    float sum = 0.f;
    for (int j = 0; j < width; ++j) {
        const size_t s = (size_t)j * m + row;
        const int c = __ldg(${COL} + s);
        if (c < 0) break;  // padding comes after a row's entries
        sum = fmaf(__ldg(${VAL} + s), __ldg(x + c), sum);
    }
    y[row] = sum;
}
""",
            SIG=sig, B=block, COL=col, VAL=val,
        )
    return fill(
        """
${SIG}
{
    const int base = blockIdx.x * ${TILE} + threadIdx.x;
    float sum[${RPT}];
    #pragma unroll
    for (int r = 0; r < ${RPT}; ++r) sum[r] = 0.f;
    for (int j = 0; j < width; ++j) {
        #pragma unroll
        for (int r = 0; r < ${RPT}; ++r) {
            const int row = base + r * ${B};
            if (row < m) {
                const size_t s = (size_t)j * m + row;
                const int c = __ldg(${COL} + s);
                if (c >= 0) sum[r] = fmaf(__ldg(${VAL} + s), __ldg(x + c), sum[r]);
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < ${RPT}; ++r)
        if (base + r * ${B} < m) y[base + r * ${B}] = sum[r];
}
""",
        SIG=sig, B=block, RPT=rpt, TILE=block * rpt, COL=col, VAL=val,
    )


def spmm_launch(block: int, g: int) -> str:
    return f"grid=ceil_div(m, {block // g}), block={block}"


def spmm_function(sig: str, block: int, g: int, vec: int, col: str = "col_idx", val: str = "val") -> str:
    """SpMM over column-major ELL arrays: g lanes per row, vec columns of Y per lane."""
    return spmm_row_group(
        sig, block, g, vec,
        prologue="    const int row = grp;\n    if (row >= m) return;",
        entries=fill("""        for (int j = 0; j < width; ++j) {
            const size_t s = (size_t)j * m + row;
            const int c = __ldg(${COL} + s);
            if (c < 0) break;
            const float a = __ldg(${VAL} + s);
            $${FMA}
        }""", COL=col, VAL=val),
    )


def _spmv(v: Variant) -> str:
    b, rpt = v.t("block"), v.t("rpt")
    return v.header([spmv_launch(b, rpt)]) + "\n" + spmv_function(v.sig(launch_bounds=b), b, rpt)


def _spmm(v: Variant) -> str:
    b, g, vec = v.t("block"), v.t("g"), v.t("vec")
    return v.header([spmm_launch(b, g)]) + "\n" + spmm_function(v.sig(launch_bounds=b), b, g, vec)


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
