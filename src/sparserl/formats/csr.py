"""CSR: the matrix's own arrays (``row_ptr``, ``col_idx``, ``val``)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    arrays = {
        "row_ptr": np.ascontiguousarray(A.indptr, dtype=np.int32),
        "col_idx": np.ascontiguousarray(A.indices, dtype=np.int32),
        "val": np.ascontiguousarray(A.data, dtype=np.float32),
    }
    return params, {}, arrays


def decode(fd: FormatData) -> sp.csr_array:
    a = fd.arrays
    return sp.csr_array((a["val"], a["col_idx"], a["row_ptr"]), shape=fd.shape)
