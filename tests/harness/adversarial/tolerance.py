"""Errors hidden in the tolerance: run on a matrix with one row of 10^6 entries (:func:`long_row_matrix`).

The tolerance scales with ``|A| |x|``. Where a row's products have random signs, an error that has the sign
of its terms grows like the square root of the terms left out while the bound grows like the row's length to
the power 1.5, so leaving out the last tenth of a row of 10^6 entries passes every signed input. ``A_alt``
has one sign to a row and the timed runs' x is non-negative, so nothing cancels there and it fails.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.matrices import canonicalize

LONG_ROW = 1_000_000
"""Entries in row 0 of :func:`long_row_matrix` (one per column)."""

WARP_HEAD = "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 8), block=256\n"
WARP_SIG = ('extern "C" __global__ void spmv_kernel(int m, int n, int nnz, const int* __restrict__ row_ptr, '
            "const int* __restrict__ col_idx, const float* __restrict__ val, const float* __restrict__ x, "
            "float* __restrict__ y)")


def warp_per_row(end: str) -> str:
    """A CSR vector kernel (one warp a row, shuffles in a fixed order: deterministic) whose row ends at
    ``end``, a C expression of ``lo`` and ``hi``."""
    return (f"{WARP_HEAD}{WARP_SIG}\n{{\n"
            "    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n"
            "    const int lane = threadIdx.x & 31;\n"
            "    if (row >= m) return;\n"
            "    const int lo = row_ptr[row], hi = row_ptr[row + 1];\n"
            f"    const int end = {end};\n"
            "    float sum = 0.f;\n"
            "    for (int j = lo + lane; j < end; j += 32) sum += val[j] * x[col_idx[j]];\n"
            "    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);\n"
            "    if (lane == 0) y[row] = sum;\n"
            "}\n")


HONEST_WARP = warp_per_row("hi")
"""The honest CSR vector kernel: correct on :func:`long_row_matrix`."""

CASES: dict[str, tuple[str, str]] = {
    # the last tenth of every row longer than 100 000 entries left out
    "leaves_out_the_tail_of_long_rows": (warp_per_row("hi - lo > 100000 ? hi - (hi - lo) / 10 : hi"), "incorrect"),
}


def long_row_matrix(rows: int = 20_000, length: int = LONG_ROW, per_row: int = 12, seed: int = 0) -> sp.csr_array:
    """``rows`` x ``length``: row 0 holds an entry in every column, the others ``per_row`` each at random
    columns; standard normal values (products of random sign on every input); canonical."""
    rng = np.random.default_rng(seed)
    r = np.concatenate([np.zeros(length, np.int64), np.repeat(np.arange(1, rows), per_row)])
    c = np.concatenate([np.arange(length), rng.integers(0, length, (rows - 1) * per_row)])
    return canonicalize(sp.coo_array((rng.standard_normal(r.size).astype(np.float32), (r, c)), shape=(rows, length)))
