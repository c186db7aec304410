"""The fp64 reference and the tolerance a kernel's output is judged by: one implementation, on the
GPU (CuPy) in the harness and on the host (NumPy/SciPy) in CPU tests.

For row i with ``L_i`` stored entries, a correct fp32 kernel's result may differ from
the fp64 product by rounding only. We accept::

    |y_i - ref_i| <= rtol(L_i) * (|A| |x|)_i + atol,   rtol(L) = 16 * eps32 * sqrt(max(L, 1))

``(|A| |x|)_i`` scales the bound by the magnitudes actually summed (a cancelling row
gets no looser bound than its terms justify), and ``sqrt(L)`` is the typical growth
of summation error in any order (atomics included). For a row of 4096 terms the
bound is 1.2e-4 relative to ``|A||x|``: dropping one average term of such a row (2.4e-4)
fails. ``atol`` (1e-30) only keeps all-zero rows well defined. NaN or Inf never passes.
SpMM applies the same bound per column of X.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

EPS32 = float(np.finfo(np.float32).eps)
ATOL = 1e-30


def rtol_per_row(A: sp.csr_array) -> np.ndarray:
    lengths = np.diff(A.indptr).astype(np.float64)
    return 16.0 * EPS32 * np.sqrt(np.maximum(lengths, 1.0))


@dataclass(frozen=True)
class Comparison:
    """How a kernel's output compares with the fp64 reference."""

    ok: bool
    bad_rows: int
    """Rows (SpMM: rows with any bad column) outside the tolerance, NaN/Inf included."""
    nonfinite: int
    """Output entries that are NaN or Inf (e.g. never written: outputs are NaN-poisoned)."""
    max_scaled_error: float
    """max |y - ref| / bound over all entries (<= 1 passes); inf when an entry is not finite."""
    first_bad_row: int | None

    def describe(self) -> str:
        """One line on what is wrong (for messages)."""
        what = f"{self.nonfinite} entries never written or not finite" if self.nonfinite else "wrong values"
        return (f"{self.bad_rows} rows out of tolerance ({what}), first bad row {self.first_bad_row}, "
                f"max error {self.max_scaled_error:.3g}x the tolerance")


class Fp64Reference:
    """``A x`` and ``|A| |x|`` in fp64 for one matrix, and the comparison of a kernel's output with them.

    ``xp`` is the array module the matrix is kept in: ``cupy`` (the worker: everything stays on the
    GPU) or ``numpy`` (CPU tests and tools). Inputs and outputs must be of that module.
    """

    def __init__(self, A: sp.csr_array, xp=np):
        self.xp = xp
        self.shape = A.shape
        rtol = rtol_per_row(A)
        if xp is np:
            self.A64 = sp.csr_array((A.data.astype(np.float64), A.indices, A.indptr), shape=A.shape)
            self.absA = sp.csr_array((np.abs(self.A64.data), A.indices, A.indptr), shape=A.shape)
            self.rtol = rtol
        else:
            import cupyx.scipy.sparse as csp

            data = xp.asarray(A.data, dtype=xp.float64)
            indices, indptr = xp.asarray(A.indices), xp.asarray(A.indptr)
            self.A64 = csp.csr_matrix((data, indices, indptr), shape=A.shape)
            self.absA = csp.csr_matrix((xp.abs(data), indices, indptr), shape=A.shape)
            self.rtol = xp.asarray(rtol)

    def expected(self, x) -> tuple:
        """``(A x, |A| |x|)`` in fp64 for an fp32 ``x`` of shape (n,) or (n, k)."""
        x64 = self.xp.asarray(x, dtype=self.xp.float64)
        return self.A64 @ x64, self.absA @ self.xp.abs(x64)

    def compare(self, x, y) -> Comparison:
        """Judge ``y`` (a kernel's fp32 output) against the product with ``x``."""
        ref, mag = self.expected(x)
        return compare_to(ref, mag, self.rtol, y)

    def device_arrays(self) -> list:
        """The arrays this reference keeps (fingerprinted by the worker to catch stray writes)."""
        return [self.A64.data, self.absA.data, self.rtol]


def compare_to(ref, mag, rtol, y) -> Comparison:
    """Check ``y`` against a precomputed reference; works on NumPy or CuPy arrays alike.

    ``ref`` and ``mag`` are ``A x`` and ``|A| |x|`` in fp64, ``rtol`` the per-row factor
    from :func:`rtol_per_row` (same array module as ``ref``).
    """
    xp = _array_module(ref)
    y64 = xp.asarray(y, dtype=xp.float64).reshape(ref.shape)
    if ref.ndim == 2:
        rtol = rtol[:, None]
    bound = rtol * mag + ATOL
    finite = xp.isfinite(y64)
    err = xp.where(finite, xp.abs(y64 - ref), xp.inf)
    scaled = err / bound
    bad = ~(scaled <= 1.0)
    bad_rows_mask = bad.any(axis=1) if bad.ndim == 2 else bad
    idx = xp.flatnonzero(bad_rows_mask)
    n_bad = int(idx.size)
    return Comparison(
        ok=n_bad == 0,
        bad_rows=n_bad,
        nonfinite=int((~finite).sum()),
        max_scaled_error=float(scaled.max()) if scaled.size else 0.0,
        first_bad_row=int(idx[0]) if n_bad else None,
    )


def _array_module(a):
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np
