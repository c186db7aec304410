"""DIA: one array slot per (diagonal, row); ``val[d*m + i] = A[i, i + offsets[d]]``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, row_of_each_entry, sorted_unique


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    m = A.shape[0]
    rows = row_of_each_entry(A.indptr, m)
    diff = A.indices.astype(np.int64) - rows
    offsets = sorted_unique(diff)
    limits.check("DIA", offsets.size * m, A.nnz, f"the matrix has {offsets.size} distinct diagonals")
    d = np.searchsorted(offsets, diff)
    val = np.zeros(offsets.size * m, dtype=np.float32)
    val[d * m + rows] = A.data
    arrays = {"offsets": offsets.astype(np.int32), "val": val}
    return params, {"num_diags": int(offsets.size)}, arrays


def decode(fd: FormatData) -> sp.csr_array:
    m, n = fd.shape
    offsets = fd.arrays["offsets"].astype(np.int64)
    val = fd.arrays["val"].reshape(offsets.size, m)
    d, i = np.nonzero(val)
    j = i + offsets[d]
    if np.any((j < 0) | (j >= n)):
        raise AssertionError("DIA holds a nonzero outside the matrix")
    return sp.coo_array((val[d, i], (i, j)), shape=fd.shape).tocsr()
