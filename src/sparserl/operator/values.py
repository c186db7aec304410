"""Where each nonzero's value goes in a converted format: new values for the same structure without
converting again.

A kernel is specialised to a structure and reads every value from its format's value arrays (the
contract). The operator converts a matrix's *pattern* once, with each nonzero's 1-based position
as its value (:func:`sparserl.harness.preconvert.convert_pattern`, as the harness's workers do):
the converters move values bit for bit, so every value slot of that conversion names the nonzero
it holds. :func:`map_of` reads those names into a :class:`ValueMap` and checks that they name
every nonzero exactly once; the format's value arrays for any values in CSR order are then one
gather per array (on the GPU: :func:`sparserl.operator.backends.gather_values`; on the host:
:meth:`ValueMap.apply`), padding slots kept zero. ``None`` marks an array that is the CSR values
in their order (CSR's and COO's ``val``), which a plain copy fills.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.formats import ConversionLimits, FormatData


@dataclass(frozen=True)
class ValueMap:
    """CSR value order -> the value slots of one converted format."""

    format: str
    nnz: int
    """Nonzeros of the canonical CSR matrix (the length of a value vector)."""
    where: dict[str, np.ndarray | None]
    """Per float array of the format, in contract order: the 1-based CSR position of the value each
    slot holds (int32; 0: padding, stays zero), or None when the array is the CSR values in order."""

    def apply(self, values: np.ndarray) -> dict[str, np.ndarray]:
        """The format's value arrays for ``values`` (length ``nnz``, in CSR order), on the host."""
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (self.nnz,):
            raise ValueError(f"values has shape {values.shape}, the map needs ({self.nnz},)")
        padded = np.concatenate([np.zeros(1, np.float32), values])  # position 0: padding
        return {name: values.copy() if w is None else padded[w] for name, w in self.where.items()}

    @property
    def slots(self) -> int:
        """Value slots the arrays hold, padding included."""
        return int(sum(self.nnz if w is None else w.size for w in self.where.values()))


def map_of(fd: FormatData) -> ValueMap:
    """The value map of a pattern conversion (its value slots hold 1-based positions as float32 bit
    patterns); a :class:`FormatError` when they do not name every nonzero exactly once."""
    nnz = fd.nnz
    where: dict[str, np.ndarray | None] = {}
    named = []
    for name, arr in fd.arrays.items():
        if arr.dtype != np.float32:
            continue
        w = arr.view(np.int32)
        if w.size == nnz and np.array_equal(w, np.arange(1, nnz + 1, dtype=np.int32)):
            where[name] = None
            named.append(w)
        else:
            where[name] = w
            named.append(w[w != 0])
    names = np.concatenate(named) if named else np.zeros(0, np.int32)
    if names.size != nnz or (names.size and (names.min() < 1 or names.max() > nnz)) or \
            np.bincount(names, minlength=nnz + 1)[1:].min(initial=1) != 1:
        raise FormatError(f"{fd.format}: the conversion does not hold each of the {nnz} values exactly once "
                          "(a converter that computes with values): its values cannot be updated in place")
    return ValueMap(fd.format, nnz, where)


def pattern_conversion(A: sp.csr_array, fmt: str, params: dict[str, int],
                       limits: ConversionLimits | None = None) -> tuple[FormatData, ValueMap]:
    """``A``'s pattern converted to ``fmt`` (values: positions) and its value map; raises the
    converter's :class:`FormatError` when the format refuses the matrix."""
    from sparserl.harness.preconvert import convert_pattern

    fd = convert_pattern(A, fmt, params, limits)
    return fd, map_of(fd)


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
