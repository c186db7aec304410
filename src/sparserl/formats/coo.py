"""COO: one (row, column, value) triple per entry, sorted by row then column."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, row_of_each_entry


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    arrays = {
        "row_idx": row_of_each_entry(A.indptr, A.shape[0]),
        "col_idx": np.ascontiguousarray(A.indices, dtype=np.int32),
        "val": np.ascontiguousarray(A.data, dtype=np.float32),
    }
    return params, {}, arrays


def decode(fd: FormatData) -> sp.csr_array:
    a = fd.arrays
    return sp.coo_array((a["val"], (a["row_idx"], a["col_idx"])), shape=fd.shape).tocsr()
