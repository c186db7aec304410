"""The fp64 reference and the tolerance a kernel's output is judged by: one definition, computed on
the GPU (one CUDA pass per comparison) in the harness and on the host (SciPy) in CPU tests.

For row i with ``L_i`` stored entries, a correct fp32 kernel's result may differ from
the fp64 product by rounding only. We accept::

    |y_i - ref_i| <= rtol(L_i) * (|A| |x|)_i + atol,   rtol(L) = 16 * eps32 * sqrt(min(max(L, 1), 65536))

``(|A| |x|)_i`` scales the bound by the magnitudes actually summed (a cancelling row
gets no looser bound than its terms justify), and ``sqrt(L)`` is the typical growth
of rounding errors of random sign, in any order (atomics included); a long row of one sign
summed in one accumulator drifts faster (below). For a row of 4096 terms the
bound is 1.2e-4 relative to ``|A||x|``: dropping one average term of such a row (2.4e-4)
fails. ``atol`` (1e-30) only keeps all-zero rows well defined. NaN or Inf never passes.
SpMM applies the same bound per column of X.

The growth stops at 65536 entries (4.9e-4 relative): beyond it a statistical answer came within
a bound that kept growing. A kernel that recognised a timed run could answer a row of 1.5e6
entries with the mean of x times the sum of its values, never reading x, within 0.71 of the
uncapped bound over 200 timed runs (a review's host experiment), and one that replaced 40% of a
row of 10^6 by that mean within 0.74. Capped, the worst of 200 runs is about 3 times over and each
timed run catches the whole-row answer about half the time (its error's median is 0.97 of the
capped bound at 10^6 entries): a kernel timed in full (21 to 41 checked runs) escapes with a
probability under 1e-6, one stopped early as ``slow`` (5 runs) with about 4%. The price: one fp32
accumulator (a thread a row, or an atomic per entry) summing a row of one sign drifts low,
systematically: measured on the host with ``A_alt``'s values, 0.42 of the capped bound on average
at 10^6 entries with timed x and 0.54 with the non-negative input (0.62 at worst), 0.95 at
1.5 x 10^6 and 1.9 at 2 x 10^6, so such a kernel fails on rows past about 1.5 x 10^6 entries (on
such a matrix every SpMM library strategy but COO and HYB does); a warp's 32 strided partial sums
and a tree use 0.04 of it at 10^7 entries and 0.4 at 3 x 10^7, 256 partial sums 0.01.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

EPS32 = float(np.finfo(np.float32).eps)
ATOL = 1e-30


RTOL_LENGTH_CAP = 65536
"""Row length past which the tolerance stops growing (module docstring)."""


def rtol_per_row(A: sp.csr_array) -> np.ndarray:
    lengths = np.diff(A.indptr).astype(np.float64)
    return 16.0 * EPS32 * np.sqrt(np.clip(lengths, 1.0, RTOL_LENGTH_CAP))


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


_CHECK = r"""
extern "C" __global__ void fp64_check(int m, int k, const int* __restrict__ indptr, const int* __restrict__ indices,
                                      const float* __restrict__ val, const float* __restrict__ x,
                                      const float* __restrict__ y, const double* __restrict__ rtol,
                                      unsigned long long* __restrict__ stats)
{
    // One thread per row: A x and |A| |x| in fp64 for each of the k columns, the scaled error of y,
    // and the row's verdict. stats: bad rows, non-finite entries, max scaled error (the bits of a
    // non-negative double, so atomicMax orders them), first bad row.
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    const int s = indptr[row], e = indptr[row + 1];
    const double rt = rtol[row];
    bool bad = false;
    double worst = 0.0;
    unsigned long long nonfinite = 0;
    for (int c = 0; c < k; ++c) {
        double ref = 0.0, mag = 0.0;
        for (int j = s; j < e; ++j) {
            const double a = (double)val[j], xv = (double)x[(size_t)indices[j] * k + c];
            ref = fma(a, xv, ref);
            mag = fma(fabs(a), fabs(xv), mag);
        }
        const double yv = (double)y[(size_t)row * k + c];
        double scaled = fabs(yv - ref) / (rt * mag + 1e-30);
        if (!isfinite(yv)) { ++nonfinite; scaled = __longlong_as_double(0x7ff0000000000000ll); }
        if (scaled != scaled) scaled = __longlong_as_double(0x7ff0000000000000ll);
        if (!(scaled <= 1.0)) bad = true;
        worst = fmax(worst, scaled);
    }
    if (bad) { atomicAdd(stats, 1ull); atomicMin(stats + 3, (unsigned long long)row); }
    if (nonfinite) atomicAdd(stats + 1, nonfinite);
    atomicMax(stats + 2, (unsigned long long)__double_as_longlong(worst));
}
"""
_cuda_check = None
"""The compiled ``fp64_check`` (CuPy), made at the first one-pass comparison."""


def cuda_check_kernel(cp):
    """``fp64_check`` compiled by CuPy (once per process), called as ``kernel(grid, block, args)``."""
    global _cuda_check
    if _cuda_check is None:
        _cuda_check = cp.RawKernel(_CHECK, "fp64_check")
    return _cuda_check


STATS_SLOTS = 4
"""``fp64_check``'s result slots: bad rows, non-finite entries, the bits of the max scaled error, first bad row."""
CHECK_BLOCK = 256
"""Threads per block of ``fp64_check`` (one thread per row)."""


def check_grid(m: int) -> int:
    """Blocks of :data:`CHECK_BLOCK` threads that cover ``m`` rows."""
    return (m + CHECK_BLOCK - 1) // CHECK_BLOCK


def columns_of(shape: tuple[int, int], x, y) -> int:
    """k, the columns of ``x`` (1 for a vector), after checking that ``x`` and ``y`` fit the matrix."""
    m, n = shape
    k = 1 if x.ndim == 1 else int(x.shape[1])
    if x.ndim > 2 or x.shape[0] != n or y.size != m * k:
        raise ValueError(f"x {x.shape} and y {y.shape} do not fit a {m} x {n} matrix")
    return k


def reset_stats(stats) -> None:
    """The slots before a check: counts and the max at 0, the first bad row at its largest value
    (``atomicMin`` lowers it)."""
    stats[:3] = 0  # one scalar fill per part: CuPy fills a slice from a scalar, not from a tuple
    stats[3] = 2 ** 64 - 1


def decode_stats(values) -> Comparison:
    """The verdict from ``fp64_check``'s four slots (host integers or a host array)."""
    bad, nonfinite, worst_bits, first = (int(v) for v in values)
    return Comparison(ok=bad == 0, bad_rows=bad, nonfinite=nonfinite,
                      max_scaled_error=struct.unpack("<d", struct.pack("<Q", worst_bits))[0],
                      first_bad_row=first if bad else None)


class Fp64Reference:
    """``A x`` and ``|A| |x|`` in fp64 for one matrix, and the comparison of a kernel's output with them.

    ``xp`` is the array module the matrix is kept in: ``cupy`` (the worker: everything stays on the
    GPU, and one kernel computes the reference and judges every row in a single pass) or ``numpy``
    (CPU tests and tools, through SciPy). Inputs and outputs must be of that module.

    ``check`` is the one-pass kernel, called as ``check(grid, block, args)`` with the arguments of
    ``fp64_check``. With CuPy it defaults to the CUDA kernel. With NumPy, ``None`` selects the SciPy
    path; CPU tests pass a host double of the kernel, to run the one-pass path's own code (upload,
    shape checks, slot reset and decoding) without a GPU.
    """

    def __init__(self, A: sp.csr_array, xp=np, check=None):
        self.xp = xp
        self.shape = A.shape
        self.one_pass = xp is not np or check is not None
        self._check = check
        rtol = rtol_per_row(A)
        if self.one_pass:
            self._upload(A, rtol)
        else:
            self.A64 = sp.csr_array((A.data.astype(np.float64), A.indices, A.indptr), shape=A.shape)
            self.absA = sp.csr_array((np.abs(self.A64.data), A.indices, A.indptr), shape=A.shape)
            self.rtol = rtol

    def _upload(self, A: sp.csr_array, rtol: np.ndarray) -> None:
        """The one-pass side: the matrix in the CSR arrays the check kernel reads, and its result slots."""
        xp = self.xp
        self.indptr, self.indices = xp.asarray(A.indptr, dtype=xp.int32), xp.asarray(A.indices, dtype=xp.int32)
        self.val = xp.asarray(A.data, dtype=xp.float32)
        self.rtol = xp.asarray(rtol)  # fp64, as rtol_per_row makes it
        self._stats = xp.zeros(STATS_SLOTS, dtype=xp.uint64)

    def expected(self, x) -> tuple:
        """``(A x, |A| |x|)`` in fp64 for an fp32 ``x`` of shape (n,) or (n, k) (SciPy path only)."""
        if self.one_pass:
            raise NotImplementedError("on the one-pass path the reference is computed inside compare()")
        x64 = np.asarray(x, dtype=np.float64)
        return self.A64 @ x64, self.absA @ np.abs(x64)

    def compare(self, x, y) -> Comparison:
        """Judge ``y`` (a kernel's fp32 output) against the product with ``x``."""
        if self.one_pass:
            return self._compare_in_one_pass(x, y)
        ref, mag = self.expected(x)
        return compare_to(ref, mag, self.rtol, y)

    def _compare_in_one_pass(self, x, y) -> Comparison:
        xp = self.xp
        kernel = self._check if self._check is not None else cuda_check_kernel(xp)
        m = self.shape[0]
        k = columns_of(self.shape, x, y)
        x, y = xp.ascontiguousarray(x, dtype=xp.float32), xp.ascontiguousarray(y, dtype=xp.float32)
        reset_stats(self._stats)
        kernel((check_grid(m),), (CHECK_BLOCK,), (np.int32(m), np.int32(k), self.indptr, self.indices, self.val,
                                                  x, y, self.rtol, self._stats))
        return decode_stats(to_host(self._stats))

    def device_arrays(self) -> list:
        """The arrays this reference keeps (fingerprinted by the worker to catch stray writes)."""
        if self.one_pass:
            return [self.indptr, self.indices, self.val, self.rtol]
        return [self.A64.data, self.absA.data, self.rtol]


def to_host(a) -> np.ndarray:
    """A NumPy copy of a CuPy array, or the NumPy array itself."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


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
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite reference (x held NaN or inf) fails its row
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
