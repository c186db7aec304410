"""The CG solver on the GPU: the solution scipy's fp64 CG finds, in cupyx's number of iterations, on a
tuned kernel and on cuSPARSE, with the stop, the iteration limit and the breakdown reported as cupyx
(and scipy) report them.

Mutations killed: scalars updated in the wrong order or in float32 where the recurrences need them
(the solution misses scipy's); an iteration after the stop that still moves x or counts (the counts
and iterates differ between ``check_every`` 1 and 7); a stop tested once per replay instead of per
iteration (the same); a solver that trusts the first replay (maxiter 40 at check_every 16 needs three);
a graph that drops a launch (graph and eager results differ); a breakdown reported as convergence."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import SparseRLError
from tests.operator.test_operator_gpu import operator as kernel_operator  # the library variant of a format
from tests.operator.test_operator_gpu import poisson3d

pytestmark = pytest.mark.gpu


def cupyx_iterations(A, b, rtol: float, maxiter: int) -> tuple[int, object]:
    import cupyx.scipy.sparse as csp
    from cupyx.scipy.sparse import linalg as cla

    count = [0]
    x, _ = cla.cg(csp.csr_matrix(A), b, rtol=rtol, maxiter=maxiter,
                  callback=lambda xk: count.__setitem__(0, count[0] + 1))
    return count[0], x


@pytest.mark.parametrize("backend", ["DIA", "CSR", "library"])
def test_cg_solution_matches_scipys_in_cupyxs_iterations(backend) -> None:
    import cupy as cp
    from scipy.sparse import linalg as sla

    from sparserl.operator import from_library, solve_cg

    A = poisson3d(20)
    b = np.random.default_rng(2).standard_normal(A.shape[0]).astype(np.float32)
    ref, info = sla.cg(A.astype(np.float64), b.astype(np.float64), rtol=1e-12, maxiter=5000)
    assert info == 0
    op = from_library(A) if backend == "library" else kernel_operator(A, backend)
    res = solve_cg(op, cp.asarray(b), rtol=1e-6, maxiter=2000)
    its, x_cupyx = cupyx_iterations(A, cp.asarray(b), 1e-6, 2000)

    def error(x) -> float:
        return float(np.linalg.norm(cp.asnumpy(x).astype(np.float64) - ref) / np.linalg.norm(ref))

    assert res.converged and res.graph and res.replays >= 2
    assert abs(res.iterations - its) <= 2, (res.iterations, its)
    assert error(res.x) < 1e-4 and error(res.x) <= 2 * error(x_cupyx) + 1e-6, (error(res.x), error(x_cupyx))
    true = np.linalg.norm(b - A.astype(np.float64) @ cp.asnumpy(res.x).astype(np.float64)) / np.linalg.norm(b)
    assert true < 1e-5 and res.residual_norm <= res.atol


def test_the_stop_is_per_iteration_whatever_the_replay_length() -> None:
    import cupy as cp

    from sparserl.operator import solve_cg

    A = poisson3d(16)
    op = kernel_operator(A, "DIA")
    b = cp.asarray(np.random.default_rng(3).standard_normal(A.shape[0]).astype(np.float32))
    runs = [solve_cg(op, b, rtol=1e-6, check_every=c) for c in (1, 7, 16)]
    eager = solve_cg(op, b, rtol=1e-6, check_every=7, graph=False)
    assert len({r.iterations for r in runs + [eager]}) == 1, [r.iterations for r in runs]
    assert runs[0].replays == runs[0].iterations  # check_every 1: one replay an iteration
    for r in runs[1:] + [eager]:
        assert cp.array_equal(r.x, runs[0].x), "the iterate moved after the stop, or a launch was dropped"
    assert not eager.graph and runs[1].graph


def test_maxiter_breakdown_zero_rhs_and_a_solved_start() -> None:
    import cupy as cp
    from cupyx.scipy.sparse import linalg as cla
    import cupyx.scipy.sparse as csp

    from sparserl.operator import from_library, solve_cg

    A = poisson3d(12)
    b = cp.asarray(np.random.default_rng(4).standard_normal(A.shape[0]).astype(np.float32))
    op = from_library(A)
    res = solve_cg(op, b, rtol=1e-12, maxiter=40)  # three replays of 16, the last stopped inside
    assert res.info == 40 and res.iterations == 40 and res.replays == 3
    x40, info = cla.cg(csp.csr_matrix(A), b, rtol=1e-12, maxiter=40)
    assert info == 40
    assert float(cp.linalg.norm(res.x - x40) / cp.linalg.norm(x40)) < 1e-4

    neg = from_library(-A)  # negative definite: p.q < 0 at the first iteration
    bad = solve_cg(neg, b, rtol=1e-6)
    assert bad.info == -1 and bad.iterations == 0 and not bad.converged
    assert float(cp.abs(bad.x).max()) == 0.0  # x0 = 0 kept: no step was taken

    zero = solve_cg(op, cp.zeros_like(b))
    assert zero.info == 0 and zero.iterations == 0 and float(cp.abs(zero.x).max()) == 0.0
    solved = solve_cg(op, b, x0=res.x, rtol=1e-2)
    assert solved.info == 0 and solved.iterations == 0 and cp.array_equal(solved.x, res.x)
    x, info = op.cg(b, rtol=1e-6)  # the operator's method: cupyx's (x, info)
    assert info == 0 and x.shape == b.shape


def test_bad_vectors_are_one_line() -> None:
    import cupy as cp

    from sparserl.operator import from_library

    A = poisson3d(8)
    op = from_library(A)
    n = A.shape[0]
    for bad, words in ((cp.ones(n, dtype=cp.float64), "float32"), (cp.ones(n + 1, dtype=cp.float32), "shape"),
                       (np.ones(n, dtype=np.float32), "GPU")):
        with pytest.raises(SparseRLError) as exc:
            op.cg(bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(SparseRLError, match="x0"):
        op.cg(cp.ones(n, dtype=cp.float32), x0=cp.ones(n - 1, dtype=cp.float32))


def test_torch_tensors_are_taken_without_a_copy() -> None:
    torch = pytest.importorskip("torch")
    import cupy as cp

    from sparserl.operator import from_library

    A = poisson3d(10)
    op = from_library(A)
    b = torch.randn(A.shape[0], device="cuda", dtype=torch.float32)
    x, info = op.cg(b, rtol=1e-6)
    assert info == 0 and isinstance(x, torch.Tensor) and x.device == b.device and x.dtype == torch.float32
    r = cp.asarray(b) - op.matvec(cp.asarray(x))
    assert float(cp.linalg.norm(r) / cp.linalg.norm(cp.asarray(b))) < 1e-5


@pytest.mark.parametrize("backend", ["DIA", "library"])
def test_new_values_are_what_the_next_solve_uses(backend) -> None:
    """The graph captured by the first solve reads the values where update_values writes them: a
    second solve after new values solves the new system (kills a graph holding stale values, or
    values written to a new array the graph never reads)."""
    import cupy as cp

    from sparserl.operator import from_library, solve_cg

    A = poisson3d(12)
    op = from_library(A) if backend == "library" else kernel_operator(A, backend)
    b = cp.asarray(np.random.default_rng(5).standard_normal(A.shape[0]).astype(np.float32))
    first = solve_cg(op, b, rtol=1e-6)
    B = sp.csr_array((A.data * np.where(A.indices == np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)), 2.0, 1.0)
                      .astype(np.float32), A.indices, A.indptr), shape=A.shape)  # diagonal doubled: still SPD
    op.update_values(cp.asarray(B.data))
    second = solve_cg(op, b, rtol=1e-6)
    assert first.graph and second.graph and first.converged and second.converged

    def residual(M, x) -> float:
        xb = cp.asnumpy(x).astype(np.float64)
        return float(np.linalg.norm(cp.asnumpy(b) - M.astype(np.float64) @ xb) / np.linalg.norm(cp.asnumpy(b)))

    assert residual(B, second.x) < 1e-5 and residual(A, second.x) > 1e-2


def test_a_solvers_library_descriptors_outlive_the_product_cache() -> None:
    """The library backend's per-call descriptors live in a bounded cache (256 address pairs); a
    solver's runner owns its own. Kills a runner whose descriptors the cache evicts and destroys
    while the solver's loop still calls them (the second solve would run on freed descriptors)."""
    import cupy as cp

    from sparserl.operator import from_library, solve_cg

    A = poisson3d(10)
    n = A.shape[0]
    op = from_library(A)
    b = cp.asarray(np.random.default_rng(6).standard_normal(n).astype(np.float32))
    first = solve_cg(op, b, rtol=1e-6, graph=False)
    xs = [cp.full(n, float(i), dtype=cp.float32) for i in range(300)]  # 300 address pairs: the cache evicts
    ys = [op.matvec(x) for x in xs]
    assert float(cp.abs(ys[-1] - op.matvec(xs[-1])).max()) == 0.0
    second = solve_cg(op, b, rtol=1e-6, graph=False)
    assert second.converged and second.iterations == first.iterations and cp.array_equal(second.x, first.x)
    op.close()
    assert "_cg_workspaces" not in op.__dict__  # close drops the work vectors and graphs
