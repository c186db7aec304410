"""Solve A x = b by conjugate gradient on the GPU, the SpMV done by a kernel tuned for A's structure.

``op.cg`` keeps the iteration's scalars on the GPU and replays 16 iterations at a time as one CUDA
graph; ``cupyx.scipy.sparse.linalg.cg(op.as_linear_operator(), b)`` works too, at Python's pace.

    python examples/cg_solve.py            # a 3D Poisson matrix, 64^3 unknowns
"""

import sys

import numpy as np
import scipy.sparse as sp

import sparserl
from sparserl.matrices import generate


def poisson3d(side: int) -> sp.csr_array:
    A = generate("stencil3d_7", side**3)  # the 7-point structure; Poisson's values below
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    return sp.csr_array((np.where(rows == A.indices, 6.0, -1.0).astype(np.float32), A.indices, A.indptr),
                        shape=A.shape)


def main() -> int:
    A = poisson3d(64)
    try:
        op = sparserl.tune(A, budget=16)  # the store first; else a short search, kept in the store
    except sparserl.SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import cupy as cp

    print(op.report.line)
    b = cp.ones(A.shape[0], dtype=cp.float32)
    x, info = op.cg(b, rtol=1e-8, maxiter=2000)  # (x, info) as cupyx's cg returns them
    r = np.linalg.norm(A.astype(np.float64) @ cp.asnumpy(x) - 1.0) / np.sqrt(A.shape[0])
    print(f"cg: info {info}, true relative residual {r:.1e} (float32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
