"""SELL-C-sigma: slices of C rows, each slice padded to its longest row, column-major inside.

Rows are sorted by decreasing length inside windows of ``sigma`` rows (stable, so
equal lengths keep their order); ``sigma = 1`` keeps the natural order (sliced ELL).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, position_in_row, row_of_each_entry


def row_permutation(lengths: np.ndarray, sigma: int) -> np.ndarray:
    """Permuted row order: stable sort by decreasing length within windows of ``sigma`` rows."""
    m = lengths.size
    rows = np.arange(m, dtype=np.int64)
    if sigma <= 1:
        return rows
    window = rows // sigma
    return np.lexsort((rows, -lengths.astype(np.int64), window))


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    C, sigma = params["C"], params["sigma"]
    m = A.shape[0]
    lengths = np.diff(A.indptr).astype(np.int64)
    perm = row_permutation(lengths, sigma)
    num_slices = -(-m // C)
    row_perm = np.full(num_slices * C, -1, dtype=np.int32)
    row_perm[:m] = perm
    plen = np.zeros(num_slices * C, dtype=np.int64)
    plen[:m] = lengths[perm]
    widths = plen.reshape(num_slices, C).max(axis=1)
    slice_ptr = np.zeros(num_slices + 1, dtype=np.int64)
    np.cumsum(widths * C, out=slice_ptr[1:])
    total = int(slice_ptr[-1])
    limits.check("SELL", total, A.nnz, "try a smaller C or a larger sigma")
    if total > np.iinfo(np.int32).max:
        raise AssertionError("unreachable: max_slots keeps SELL offsets in int32")

    inv = np.empty(m, dtype=np.int64)
    inv[perm] = np.arange(m, dtype=np.int64)
    rows = row_of_each_entry(A.indptr, m)
    pos = position_in_row(A.indptr, rows)
    p = inv[rows]
    flat = slice_ptr[p // C] + pos * C + p % C
    col = np.full(total, -1, dtype=np.int32)
    val = np.zeros(total, dtype=np.float32)
    col[flat] = A.indices
    val[flat] = A.data
    arrays = {"slice_ptr": slice_ptr.astype(np.int32), "row_perm": row_perm, "col_idx": col, "val": val}
    return params, {"num_slices": num_slices}, arrays


def decode(fd: FormatData) -> sp.csr_array:
    C = fd.params["C"]
    a = fd.arrays
    slice_ptr = a["slice_ptr"].astype(np.int64)
    slot = np.flatnonzero(a["col_idx"] >= 0)
    s = np.searchsorted(slice_ptr, slot, side="right") - 1
    lane = (slot - slice_ptr[s]) % C
    rows = a["row_perm"][s * C + lane]
    return sp.coo_array((a["val"][slot], (rows, a["col_idx"][slot])), shape=fd.shape).tocsr()
