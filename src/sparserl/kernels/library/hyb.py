"""HYB kernels: an ELL pass that writes y, then a COO pass that adds the overflow.

The harness zeroes y for HYB; the ELL kernel assigns every row anyway (so it is also
correct on its own), and the second LAUNCH line adds the COO part with atomics. When
the COO part is empty its grid is 0 and the launch is skipped.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op
from sparserl.kernels.library import coo, ell
from sparserl.kernels.library.common import Variant, make

_ELL = dict(col="ell_col_idx", val="ell_val")
_COO = dict(row="coo_row_idx", col="coo_col_idx", val="coo_val", count="coo_nnz")


def _spmv(v: Variant) -> str:
    b, batches = v.t("block"), v.t("batches")
    launches = [ell.spmv_launch(b, 1), coo.segmented_launch(256, batches, "coo_nnz") + ", kernel=spmv_coo_part"]
    return "\n".join([
        v.header(launches),
        ell.spmv_function(v.sig(launch_bounds=b), b, 1, **_ELL),
        coo.segmented_function(v.sig("spmv_coo_part", launch_bounds=256), 256, batches, **_COO),
    ])


def _spmm(v: Variant) -> str:
    b, g, vec, nzpg = v.t("block"), v.t("g"), v.t("vec"), v.t("nzpg")
    launches = [ell.spmm_launch(b, g), coo.runs_launch(b, g, nzpg, "coo_nnz") + ", kernel=spmm_coo_part"]
    return "\n".join([
        v.header(launches),
        ell.spmm_function(v.sig(launch_bounds=b), b, g, vec, **_ELL),
        coo.runs_function(v.sig("spmm_coo_part", launch_bounds=b), b, g, vec, nzpg, **_COO),
    ])


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
