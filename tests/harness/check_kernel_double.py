"""A host double of the CUDA kernel ``fp64_check`` (harness/reference.py), for CPU tests of the
one-pass comparison's own code: the upload, the shape checks, the reset of the result slots, the
launch configuration and the decoding of the verdict.

It takes exactly the kernel's arguments and refuses any other type (CuPy would pass a wrong dtype
through to the kernel as raw memory), runs only the rows its grid covers, and updates the four
slots as the kernel's atomics do. The sums are SciPy's in fp64, not the kernel's fma order: the
GPU test ``test_the_host_double_of_the_check_kernel_agrees_with_it`` holds the two to the same
verdicts on the same outputs."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

INF_BITS = np.float64(np.inf).view(np.uint64)


class CheckKernelDouble:
    """``fp64_check(m, k, indptr, indices, val, x, y, rtol, stats)`` in NumPy; counts its launches."""

    def __init__(self) -> None:
        self.launches = 0

    def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
        m, k, indptr, indices, val, x, y, rtol, stats = args
        for name, a, dtype in (("m", m, np.int32), ("k", k, np.int32)):
            assert type(a) is dtype, f"{name} must be passed as np.int32, not {type(a).__name__}"
        for name, a, dtype in (("indptr", indptr, np.int32), ("indices", indices, np.int32), ("val", val, np.float32),
                               ("x", x, np.float32), ("y", y, np.float32), ("rtol", rtol, np.float64),
                               ("stats", stats, np.uint64)):
            assert isinstance(a, np.ndarray) and a.dtype == dtype, f"{name}: {getattr(a, 'dtype', type(a))}"
            assert a.flags.c_contiguous, f"{name} is not contiguous"
        assert len(grid) == 1 and len(block) == 1 and stats.size == 4 and indptr.size == int(m) + 1
        self.launches += 1
        m, k = int(m), int(k)
        rows = min(m, int(grid[0]) * int(block[0]))  # threads past m return at once; rows past the grid are never read
        n = x.size // k
        end = int(indptr[rows])
        v = val[:end].astype(np.float64)  # every stored entry, repeated columns as separate terms
        A = sp.csr_array((v, indices[:end], indptr[:rows + 1]), shape=(rows, n))
        absA = sp.csr_array((np.abs(v), indices[:end], indptr[:rows + 1]), shape=(rows, n))
        X = x.astype(np.float64).reshape(n, k)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            ref, mag = A @ X, absA @ np.abs(X)
            Y = y.astype(np.float64).reshape(m, k)[:rows]
            scaled = np.abs(Y - ref) / (rtol[:rows, None] * mag + 1e-30)
        finite = np.isfinite(Y)
        scaled[~finite | np.isnan(scaled)] = np.inf
        bad = ~(scaled <= 1.0).all(axis=1)
        if bad.any():
            stats[0] += np.uint64(bad.sum())
            stats[3] = min(stats[3], np.uint64(np.flatnonzero(bad)[0]))
        stats[1] += np.uint64((~finite).sum())
        if rows:
            worst = np.float64(max(scaled.max(), 0.0))
            stats[2] = max(stats[2], worst.view(np.uint64))
