"""BSR: dense R x C blocks (row-major inside), block rows compressed like CSR."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, row_of_each_entry, sorted_unique


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    R, C = params["R"], params["C"]
    m, n = A.shape
    mb, nb = -(-m // R), -(-n // C)
    rows = row_of_each_entry(A.indptr, m).astype(np.int64)
    cols = A.indices.astype(np.int64)
    key = (rows // R) * nb + cols // C
    blocks, which = sorted_unique(key, return_inverse=True)
    nnzb = int(blocks.size)
    limits.check("BSR", nnzb * R * C, A.nnz, f"{R}x{C} blocks are {A.nnz / (nnzb * R * C):.0%} full")
    val = np.zeros(nnzb * R * C, dtype=np.float32)
    val[which * (R * C) + (rows % R) * C + cols % C] = A.data
    block_row_ptr = np.zeros(mb + 1, dtype=np.int64)
    np.cumsum(np.bincount(blocks // nb, minlength=mb), out=block_row_ptr[1:])
    arrays = {
        "block_row_ptr": block_row_ptr.astype(np.int32),
        "block_col_idx": (blocks % nb).astype(np.int32),
        "block_val": val,
    }
    return params, {"mb": mb, "nb": nb, "nnzb": nnzb}, arrays


def decode(fd: FormatData) -> sp.csr_array:
    R, C = fd.params["R"], fd.params["C"]
    a = fd.arrays
    nnzb = fd.sizes["nnzb"]
    vals = a["block_val"].reshape(nnzb, R, C)
    b, r, c = np.nonzero(vals)
    brow = np.repeat(np.arange(fd.sizes["mb"], dtype=np.int64), np.diff(a["block_row_ptr"]))
    i = brow[b] * R + r
    j = a["block_col_idx"][b].astype(np.int64) * C + c
    if np.any(i >= fd.m) or np.any(j >= fd.n):
        raise AssertionError("BSR holds a nonzero outside the matrix")
    return sp.coo_array((vals[b, r, c], (i, j)), shape=fd.shape).tocsr()
