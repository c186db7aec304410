"""ELL: every row padded to the longest, stored column-major (slot j of row i at ``j*m + i``).

The helpers here also build HYB's ELL part.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, position_in_row, row_of_each_entry


def ell_arrays(A: sp.csr_array, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column-major ELL arrays of the first ``width`` entries of each row.

    Returns ``(col_idx, val, keep)`` where ``keep`` marks the CSR entries that went
    into the ELL part (the rest overflow, as HYB's COO part).
    """
    m = A.shape[0]
    rows = row_of_each_entry(A.indptr, m)
    pos = position_in_row(A.indptr, rows)
    keep = pos < width
    flat = pos[keep] * m + rows[keep]
    col = np.full(width * m, -1, dtype=np.int32)
    val = np.zeros(width * m, dtype=np.float32)
    col[flat] = A.indices[keep]
    val[flat] = A.data[keep]
    return col, val, keep


def ell_entries(col: np.ndarray, val: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, vals) of the non-padding slots of column-major ELL arrays."""
    slot = np.flatnonzero(col >= 0)
    return (slot % m).astype(np.int64), col[slot].astype(np.int64), val[slot]


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    m = A.shape[0]
    width = int(np.diff(A.indptr).max())
    limits.check("ELL", width * m, A.nnz, "rows are too uneven for ELL; try SELL, HYB or CSR")
    col, val, _ = ell_arrays(A, width)
    return params, {"width": width}, {"col_idx": col, "val": val}


def decode(fd: FormatData) -> sp.csr_array:
    r, c, v = ell_entries(fd.arrays["col_idx"], fd.arrays["val"], fd.m)
    return sp.coo_array((v, (r, c)), shape=fd.shape).tocsr()
