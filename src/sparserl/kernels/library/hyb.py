"""HYB kernels: an ELL pass that writes y, then a COO pass that adds the overflow.

The harness zeroes y for HYB; the ELL kernel assigns every row anyway (so it is also
correct on its own), and the second LAUNCH line adds the COO part with atomics. When
the COO part is empty its grid is 0 and the launch is skipped.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library import coo, ell
from sparserl.kernels.library.common import Strategy, Variant, make, vec_helpers

_ELL = dict(col="ell_col_idx", val="ell_val")
_COO = dict(row="coo_row_idx", col="coo_col_idx", val="coo_val", count="coo_nnz")

_spmv = Strategy(
    ("grid=ceil_div(m, BLOCK), block=BLOCK", coo.segmented_launch("256", "coo_nnz") + ", kernel=spmv_coo_part"),
    ell.spmv_row_function(signature("HYB", Op.SPMV, None, "BLOCK"), **_ELL)
    + coo.segmented_function(signature("HYB", Op.SPMV, "spmv_coo_part", 256), "256", **_COO))

_spmm = Strategy(
    (ell.SPMM_LAUNCH, coo.runs_launch("coo_nnz") + ", kernel=spmm_coo_part"),
    vec_helpers("fma_x", "load_x", "store_y", "add_y") + ell.spmm_function(signature("HYB", Op.SPMM, None, "BLOCK"), **_ELL)
    + coo.runs_function(signature("HYB", Op.SPMM, "spmm_coo_part", "BLOCK"), **_COO, owns_rows=False))


def variants() -> list[Variant]:
    out = []
    for b in (128, 256):
        for batches in (1, 4):
            out.append(make(Op.SPMV, "HYB", "hyb_ell_coo", _spmv, {"block": b, "batches": batches}, atomic=True,
                            doc="ELL for the regular part, segmented COO for long rows"))
    for g, vec in ((32, 4), (8, 1), (2, 4)):
        out.append(make(Op.SPMM, "HYB", "hyb_ell_coo", _spmm, {"g": g, "vec": vec, "nzpg": 16, "block": 256},
                        k_multiple=vec, atomic=True, doc="ELL rows then COO runs with atomics"))
    return out
