"""Where each nonzero's value goes in a converted format: new values for the same structure without
converting again.

A kernel is specialised to a structure and reads every value from its format's value arrays (the
contract). When only the values change (Newton steps, time steps, learned edge weights), the
format's value arrays are a fixed rearrangement of the CSR values: ``value_map(A, fd)`` computes
that rearrangement once from the structure, and ``vm.apply(values)`` (or one gather per array on
the GPU) fills the arrays for new values in CSR order.

For every float array of the format, :attr:`ValueMap.gathers` holds one int32 per slot: the CSR
position whose value the slot holds, or -1 for a padding slot (which stays zero). ``None`` marks an
array that *is* the CSR value array (CSR's and COO's ``val``: same order, same length), which a
plain copy fills.

The slots are computed from the converted arrays themselves (SELL's row permutation and slice
pointers, DIA's offsets, BSR's block rows and columns, HYB's width), so the map follows the
conversion it was made for; the tests check ``apply`` against the converters for every format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sparserl.formats.base import FormatData, position_in_row, row_of_each_entry


@dataclass(frozen=True)
class ValueMap:
    """CSR value order -> the value slots of one converted format."""

    format: str
    nnz: int
    """Nonzeros of the canonical CSR matrix (the length of a value vector)."""
    gathers: dict[str, np.ndarray | None]
    """Per float array of the format, in contract order: the CSR position each slot reads (int32,
    -1: padding, stays zero), or None when the array is the CSR values themselves."""

    def apply(self, values: np.ndarray) -> dict[str, np.ndarray]:
        """The format's value arrays for ``values`` (length ``nnz``, in CSR order), on the host."""
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (self.nnz,):
            raise ValueError(f"values has shape {values.shape}, the map needs ({self.nnz},)")
        out = {}
        for name, src in self.gathers.items():
            if src is None:
                out[name] = values.copy()
            else:
                out[name] = np.where(src >= 0, values[np.maximum(src, 0)], np.float32(0)).astype(np.float32)
        return out

    @property
    def slots(self) -> int:
        """Value slots the arrays hold, padding included."""
        return int(sum(self.nnz if g is None else g.size for g in self.gathers.values()))


def _invert(slot: np.ndarray, size: int, entries: np.ndarray | None = None) -> np.ndarray:
    """The gather index of an array of ``size`` slots into which CSR entry ``entries[i]`` (default:
    ``i``) was written at ``slot[i]``; -1 where nothing was written."""
    src = np.full(size, -1, dtype=np.int32)
    src[slot] = np.arange(slot.size, dtype=np.int32) if entries is None else entries.astype(np.int32)
    return src


def _ell_slots(A: sp.csr_array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Column-major ELL slots (``pos * m + row``) of the entries within the first ``width`` of their
    row, and the mask of those entries."""
    m = A.shape[0]
    rows = row_of_each_entry(A.indptr, m).astype(np.int64)
    pos = position_in_row(A.indptr, rows)
    keep = pos < width
    return pos[keep] * m + rows[keep], keep


def _sell_slots(A: sp.csr_array, fd: FormatData) -> np.ndarray:
    C = fd.params["C"]
    m = A.shape[0]
    perm = fd.arrays["row_perm"][:m].astype(np.int64)
    inv = np.empty(m, dtype=np.int64)
    inv[perm] = np.arange(m, dtype=np.int64)
    slice_ptr = fd.arrays["slice_ptr"].astype(np.int64)
    rows = row_of_each_entry(A.indptr, m).astype(np.int64)
    pos = position_in_row(A.indptr, rows)
    p = inv[rows]
    return slice_ptr[p // C] + pos * C + p % C


def _dia_slots(A: sp.csr_array, fd: FormatData) -> np.ndarray:
    m = A.shape[0]
    rows = row_of_each_entry(A.indptr, m).astype(np.int64)
    offsets = fd.arrays["offsets"].astype(np.int64)
    d = np.searchsorted(offsets, A.indices.astype(np.int64) - rows)
    return d * m + rows


def _bsr_slots(A: sp.csr_array, fd: FormatData) -> np.ndarray:
    R, C = fd.params["R"], fd.params["C"]
    mb, nb = fd.sizes["mb"], fd.sizes["nb"]
    brow = np.repeat(np.arange(mb, dtype=np.int64), np.diff(fd.arrays["block_row_ptr"]))
    keys = brow * nb + fd.arrays["block_col_idx"].astype(np.int64)  # ascending: blocks sorted by row, column
    rows = row_of_each_entry(A.indptr, A.shape[0]).astype(np.int64)
    cols = A.indices.astype(np.int64)
    which = np.searchsorted(keys, (rows // R) * nb + cols // C)
    return which * (R * C) + (rows % R) * C + cols % C


def value_map(A: sp.csr_array, fd: FormatData) -> ValueMap:
    """The map from ``A``'s CSR value order to the value arrays of ``fd``, a conversion of ``A``
    (or of any matrix with ``A``'s structure)."""
    if fd.shape != tuple(A.shape) or fd.nnz != A.nnz:
        raise ValueError(f"{fd.format} data of shape {fd.shape} with {fd.nnz} nonzeros is not a conversion of a "
                         f"{A.shape} matrix with {A.nnz}")
    nnz = int(A.nnz)
    fmt = fd.format
    if fmt in ("CSR", "COO"):
        gathers: dict[str, np.ndarray | None] = {"val": None}
    elif fmt == "ELL":
        slot, _ = _ell_slots(A, fd.sizes["width"])
        gathers = {"val": _invert(slot, fd.arrays["val"].size)}
    elif fmt == "SELL":
        gathers = {"val": _invert(_sell_slots(A, fd), fd.arrays["val"].size)}
    elif fmt == "DIA":
        gathers = {"val": _invert(_dia_slots(A, fd), fd.arrays["val"].size)}
    elif fmt == "BSR":
        gathers = {"block_val": _invert(_bsr_slots(A, fd), fd.arrays["block_val"].size)}
    elif fmt == "HYB":
        slot, keep = _ell_slots(A, fd.sizes["width"])
        gathers = {"ell_val": _invert(slot, fd.arrays["ell_val"].size, np.flatnonzero(keep)),
                   "coo_val": np.flatnonzero(~keep).astype(np.int32)}
    else:  # pragma: no cover - every contract format is handled above
        raise AssertionError(f"no value map for {fmt}")
    floats = tuple(name for name, arr in fd.arrays.items() if arr.dtype == np.float32)
    if tuple(gathers) != floats:
        raise AssertionError(f"{fmt} value arrays {floats} != mapped {tuple(gathers)}")
    return ValueMap(fmt, nnz, gathers)


def transpose_order(A: sp.csr_array) -> tuple[sp.csr_array, np.ndarray]:
    """``A``'s transpose as a canonical CSR matrix, and for each of its nonzeros the position of the
    same entry in ``A``'s CSR order (so ``A.T``'s values are ``values[order]`` for new ``values``)."""
    m, n = A.shape
    tagged = sp.csr_array((np.arange(A.nnz, dtype=np.int64), A.indices, A.indptr), shape=(m, n))
    T = tagged.T.tocsr()
    T.sort_indices()
    order = T.data.astype(np.int64)
    AT = sp.csr_array((np.asarray(A.data, dtype=np.float32)[order], T.indices.astype(np.int32),
                       T.indptr.astype(np.int32)), shape=(n, m))
    return AT, order
