"""Same structure, new values every step (a Newton iteration, a time step): update_values writes
them into the tuned kernel's format on the GPU, without planning or tuning again.

    python examples/value_update.py
"""

import sys

import numpy as np

import sparserl
from sparserl.matrices import generate


def main() -> int:
    A = generate("powerlaw", 200_000, mean_degree=8)  # any structure; its values change below
    try:
        op = sparserl.tune(A, budget=16)
    except sparserl.SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import cupy as cp

    print(op.report.line)
    x = cp.random.standard_normal(A.shape[1], dtype=cp.float32)
    for step in range(3):
        values = cp.asarray(A.data) * cp.float32(1.0 + 0.1 * step)  # new values, in A's CSR order, on the GPU
        op.update_values(values)
        y = op @ x
        A_step = A.copy()
        A_step.data = cp.asnumpy(values)
        err = np.abs(cp.asnumpy(y) - A_step @ cp.asnumpy(x)).max()
        print(f"step {step}: max |op @ x - A x| = {err:.2e}")
    try:
        op.update_values(cp.asarray(A.data, dtype=cp.float64))  # a mistake: one line, nothing changed
    except sparserl.SparseRLError as exc:
        print(f"error: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
