"""Sparse storage formats: conversions from CSR into the kernel contract's layouts, and back.

``convert(A, "SELL", {"C": 32, "sigma": 256})`` returns a :class:`FormatData` whose
sizes and arrays are exactly what the kernel receives; ``to_csr(fd)`` inverts it.
Each format lives in its own module with ``encode`` / ``decode``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import ModuleType

import numpy as np
import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.formats import bsr, coo, csr, dia, ell, hyb, sell
from sparserl.formats.base import ConversionLimits, FormatData
from sparserl.kernels.contract import FORMAT_NAMES, format_spec

_CODECS: dict[str, ModuleType] = {
    "CSR": csr, "COO": coo, "ELL": ell, "SELL": sell, "DIA": dia, "BSR": bsr, "HYB": hyb,
}
assert tuple(_CODECS) == FORMAT_NAMES

__all__ = ["ConversionLimits", "FormatData", "accepts", "convert", "to_csr", "FORMAT_NAMES"]


def _check_canonical(A: sp.csr_array) -> None:
    if not isinstance(A, (sp.csr_array, sp.csr_matrix)):
        raise FormatError(f"convert() takes a scipy CSR matrix, got {type(A).__name__}")
    if A.data.dtype != np.float32 or A.indices.dtype != np.int32 or A.indptr.dtype != np.int32:
        raise FormatError("convert() needs a canonical matrix (float32 values, int32 indices): use sparserl.matrices.canonicalize")
    if A.nnz == 0 or A.shape[0] == 0 or A.shape[1] == 0:
        raise FormatError("cannot convert an empty matrix")
    if not A.has_canonical_format:
        A.sum_duplicates()  # sorts indices; cheap when already sorted


def convert(
    A: sp.csr_array,
    fmt: str,
    params: Mapping[str, int] | None = None,
    limits: ConversionLimits | None = None,
) -> FormatData:
    """Convert canonical CSR ``A`` into ``fmt`` with FORMAT parameters ``params``."""
    spec = format_spec(fmt)
    resolved = spec.resolve_params(params or {})
    _check_canonical(A)
    t0 = time.perf_counter()
    out_params, sizes, arrays = _CODECS[spec.name].encode(A, resolved, limits or ConversionLimits())
    seconds = time.perf_counter() - t0
    return FormatData(
        format=spec.name,
        params=out_params,
        shape=(int(A.shape[0]), int(A.shape[1])),
        nnz=int(A.nnz),
        sizes={k: int(v) for k, v in sizes.items()},
        arrays=arrays,
        convert_seconds=seconds,
    )


def accepts(A: sp.csr_array, fmt: str, params: Mapping[str, int] | None = None,
            limits: ConversionLimits | None = None) -> bool:
    """Whether ``fmt`` with ``params`` converts ``A`` within the fill limits (by converting it)."""
    try:
        convert(A, fmt, params, limits)
        return True
    except FormatError:
        return False


def to_csr(fd: FormatData) -> sp.csr_array:
    """Rebuild a canonical CSR matrix (float32, int32, sorted) from converted data."""
    B = sp.csr_array(_CODECS[fd.format].decode(fd))
    B.sum_duplicates()
    B.sort_indices()
    return sp.csr_array(
        (B.data.astype(np.float32), B.indices.astype(np.int32), B.indptr.astype(np.int32)), shape=fd.shape
    )
