"""HYB: an ELL part holding each row's first ``width`` entries, and a COO part for the rest."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import ConversionLimits, FormatData, row_of_each_entry
from sparserl.formats.ell import ell_arrays, ell_entries


def auto_width(lengths: np.ndarray) -> int:
    """The widest ELL part that at least a third of the rows fill completely."""
    m = lengths.size
    need = -(-m // 3)
    counts = np.bincount(lengths)  # counts[w] = rows of length w
    at_least = np.cumsum(counts[::-1])[::-1]  # at_least[w] = rows with length >= w
    ok = np.flatnonzero(at_least >= need)
    return int(ok.max()) if ok.size else 0


def encode(A: sp.csr_array, params: dict[str, int], limits: ConversionLimits):
    m = A.shape[0]
    lengths = np.diff(A.indptr)
    width = params.get("width")
    chosen = width is None
    if chosen:
        width = auto_width(lengths)
    limits.check("HYB", width * m, A.nnz, "choose a smaller width")
    col, val, keep = ell_arrays(A, width)
    spill = ~keep
    rows = row_of_each_entry(A.indptr, m)
    arrays = {
        "ell_col_idx": col,
        "ell_val": val,
        "coo_row_idx": np.ascontiguousarray(rows[spill]),
        "coo_col_idx": np.ascontiguousarray(A.indices[spill], dtype=np.int32),
        "coo_val": np.ascontiguousarray(A.data[spill], dtype=np.float32),
    }
    out_params = dict(params, width=width)
    return out_params, {"width": width, "coo_nnz": int(spill.sum())}, arrays


def decode(fd: FormatData) -> sp.csr_array:
    a = fd.arrays
    r, c, v = ell_entries(a["ell_col_idx"], a["ell_val"], fd.m)
    rows = np.concatenate([r, a["coo_row_idx"].astype(np.int64)])
    cols = np.concatenate([c, a["coo_col_idx"].astype(np.int64)])
    vals = np.concatenate([v, a["coo_val"]])
    return sp.coo_array((vals, (rows, cols)), shape=fd.shape).tocsr()
