"""DIA: one array slot per (diagonal, row); ``val[d*m + i] = A[i, i + offsets[d]]``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, row_of_each_entry


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    m, n = A.shape
    rows = row_of_each_entry(A.indptr, m)
    shifted = A.indices.astype(np.int64) - rows + (m - 1)  # the diagonal of each entry, in 0 .. m + n - 2
    present = np.zeros(m + n - 1, dtype=bool)
    present[shifted] = True  # one pass over the entries, no sort (a refusal is decided here)
    offsets = np.flatnonzero(present) - (m - 1)  # increasing
    limits.check("DIA", offsets.size * m, A.nnz, f"the matrix has {offsets.size} distinct diagonals")
    d = (np.cumsum(present) - 1)[shifted]  # each entry's diagonal's place among the offsets
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
