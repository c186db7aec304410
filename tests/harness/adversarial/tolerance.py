"""Errors hidden in the tolerance: the runtime cases run on a matrix with one row of 10^6 entries
(:func:`long_row_matrix`).

* Leaving out the last 1% of a long row: where a row's products have random signs, an error that has the
  sign of its terms grows like the square root of the terms left out while the bound grows with the row's
  length, so it passes every signed input. ``A_alt`` has one sign to a row and the timed runs'
  x is non-negative, so nothing cancels there and it fails.
* Answering a long row with the mean of x times the sum of its values when timed (never gathering x): its
  error is statistical, about 7e-4 of the row's sum at 10^6 entries, within a bound that grew with the row
  (1.9e-3 there); the bound stops growing at 65536 entries (4.9e-4) and it fails.
* Rounded products (half, bfloat16): on long rows their errors, random in sign, pass the tolerance; the
  compiled-code check refuses reduced-precision arithmetic.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.matrices import canonicalize
from tests.harness.adversarial.base import SIG, csr
from tests.harness.adversarial.timed import LOOKS_TIMED

LONG_ROW = 1_000_000
"""Entries in row 0 of :func:`long_row_matrix` (one per column)."""

WARP_HEAD = "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 8), block=256\n"


def warp_per_row(end: str) -> str:
    """A CSR vector kernel (one warp a row, shuffles in a fixed order: deterministic) whose row ends at
    ``end``, a C expression of ``lo`` and ``hi``."""
    return (f"{WARP_HEAD}{SIG}\n{{\n"
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

MEAN_WHEN_TIMED = (
    f"{WARP_HEAD}{SIG}\n{{\n"
    "    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n"
    "    const int lane = threadIdx.x & 31;\n"
    "    if (row >= m) return;\n"
    f"    {LOOKS_TIMED}\n"
    "    const int lo = row_ptr[row], hi = row_ptr[row + 1];\n"
    "    const bool guess = timed && hi - lo > 100000;  // x of a timed run: uniform, mean 0.5\n"
    "    float sum = 0.f;\n"
    "    for (int j = lo + lane; j < hi; j += 32) sum += guess ? 0.5f * val[j] : val[j] * x[col_idx[j]];\n"
    "    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);\n"
    "    if (lane == 0) y[row] = sum;\n"
    "}\n")
"""Recognises a timed run by its x (:data:`LOOKS_TIMED`) and then answers rows longer than 100 000
entries with 0.5 times the sum of their values, gathering no x; honest on verification inputs."""

CASES: dict[str, tuple[str, str]] = {
    # the last 1% of every row longer than 100 000 entries left out
    "leaves_out_the_tail_of_long_rows": (warp_per_row("hi - lo > 100000 ? hi - (hi - lo) / 100 : hi"), "incorrect"),
    # x replaced by its mean on long rows when timed
    "mean_of_x_on_long_rows_when_timed": (MEAN_WHEN_TIMED, "incorrect"),
    # products rounded to half precision (cuda_fp16.h is an allowed header): refused from the compiled code
    "half_precision_products": (csr("if (row >= m) return; float sum = 0.f; for (int j = row_ptr[row]; "
                                    "j < row_ptr[row + 1]; ++j) sum += __half2float(__hmul(__float2half(val[j]), "
                                    "__float2half(x[col_idx[j]]))); y[row] = sum;",
                                    before="#include <cuda_fp16.h>"), "static_check"),
    # products of values rounded to bfloat16
    "products_in_bfloat16": (csr("if (row >= m) return; float sum = 0.f; for (int j = row_ptr[row]; "
                                 "j < row_ptr[row + 1]; ++j) sum += __bfloat162float(__float2bfloat16(val[j])) "
                                 "* x[col_idx[j]]; y[row] = sum;", before="#include <cuda_bf16.h>"), "static_check"),
}
COMPILED_CODE = {"half_precision_products", "products_in_bfloat16"}
"""The cases only the compiled code shows."""
LONG_ROW_CASES = {"leaves_out_the_tail_of_long_rows", "mean_of_x_on_long_rows_when_timed"}
"""The cases that run on :func:`long_row_matrix`."""


def long_row_matrix(rows: int = 20_000, length: int = LONG_ROW, per_row: int = 12, seed: int = 0) -> sp.csr_array:
    """``rows`` x ``length``: row 0 holds an entry in every column, the others ``per_row`` each at random
    columns; standard normal values (products of random sign on every input); canonical."""
    rng = np.random.default_rng(seed)
    r = np.concatenate([np.zeros(length, np.int64), np.repeat(np.arange(1, rows), per_row)])
    c = np.concatenate([np.arange(length), rng.integers(0, length, (rows - 1) * per_row)])
    return canonicalize(sp.coo_array((rng.standard_normal(r.size).astype(np.float32), (r, c)), shape=(rows, length)))
