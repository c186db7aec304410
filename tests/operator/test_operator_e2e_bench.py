"""The end-to-end benchmark's CPU side: its matrices are what the cases claim (SPD where CG runs, a
symmetric normalised adjacency for the GCN), its break-even arithmetic, its table, and its one-line
exit without a GPU. Mutations killed: a Poisson or Laplacian that is not SPD (CG would be
meaningless), an adjacency that is not D^-1/2 (S+I) D^-1/2, a break-even that counts when ours is
slower, a table row that hides a failed check."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.conftest import assert_no_gpu_is_one_line, load_benchmark

bench = load_benchmark("operator_e2e")


def smallest_eigenvalue(A) -> float:
    from scipy.sparse.linalg import eigsh

    return float(eigsh(A.astype(np.float64), k=1, which="SA", return_eigenvectors=False)[0])


def test_poisson_and_the_graph_laplacian_are_spd() -> None:
    P = bench.poisson3d(6)
    assert P.shape == (216, 216) and abs(P - P.T).max() == 0
    assert np.all(P.diagonal() == 6) and P.nnz == 216 + 2 * 3 * 6 * 6 * 5
    assert smallest_eigenvalue(P) > 0
    L = bench.graph_laplacian_spd(2000, 6)
    assert abs(L - L.T).max() == 0 and smallest_eigenvalue(L) > 0.99  # L + I: eigenvalues >= 1
    lengths = np.diff(L.indptr)
    assert lengths.max() > 10 * np.median(lengths)  # irregular rows: a power-law graph


def test_the_gcn_adjacency_is_symmetrically_normalised() -> None:
    from sparserl.matrices import generate

    P = generate("powerlaw", 3000, seed=0, mean_degree=4)
    A = bench.gcn_adjacency(P)
    assert abs(A - A.T).max() < 1e-7
    S = ((P + P.T) != 0).astype(np.float64).tolil()
    S.setdiag(1.0)
    S = sp.csr_array(S)
    d = 1 / np.sqrt(np.asarray(S.sum(axis=1)).ravel())
    np.testing.assert_allclose(A.toarray(), (sp.diags_array(d) @ S @ sp.diags_array(d)).toarray(), rtol=1e-6)


def test_wall_pair_alternates_and_takes_each_median(monkeypatch) -> None:
    """Kills a pair timer that runs one function's reps before the other's (a drift then falls on
    one side), returns the two medians swapped, ignores its floor in seconds or its cap."""
    monkeypatch.setattr(bench, "sync", lambda: None)
    order = []
    clock = iter(range(1000))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))

    def a():
        order.append("a")
        next(clock)  # a takes 2 ticks from start to end

    def b():
        order.append("b")
        for _ in range(3):  # b takes 4
            next(clock)

    ta, tb = bench.wall_pair(a, b, 3)
    assert order == ["a", "b"] * 4 and (ta, tb) == (2.0, 4.0)
    order.clear()  # a floor in seconds: pairs go on until the runs timed add up to it (6 a pair: 5 pairs for 30)
    assert bench.wall_pair(a, b, 3, min_seconds=30) == (2.0, 4.0) and order == ["a", "b"] * 6
    order.clear()  # and stop at the cap
    assert bench.wall_pair(a, b, 3, min_seconds=1e9, max_reps=7) == (2.0, 4.0) and order == ["a", "b"] * 8


def test_break_even() -> None:
    assert bench.break_even(10.0, 0.8, 1.0) == pytest.approx(50.0)
    assert bench.break_even(10.0, 1.0, 1.0) is None and bench.break_even(10.0, 1.2, 1.0) is None


def test_the_table_shows_a_failed_check() -> None:
    row = {"case": "cg", "matrix": "m", "nnz": 10, "k": None, "action": "search", "format": "DIA kernel",
           "tune_s": 12.0, "retune_s": 0.2, "ours_s": 0.01, "ref_s": 0.013, "speedup": 1.3, "break_even": 4000.0,
           "ours_updated_s": 0.011, "ref_updated_s": 0.014, "speedup_updated": 1.27, "update_over_spmv": 0.9,
           "checks": {"ok": False}}
    text = bench.table([row])
    assert text.count("\n") == 2 and "FAILED" in text and "| 4000 |" in text and "1.30x" in text
    assert "never" in bench.table([row | {"break_even": None, "checks": {"ok": True}}])


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, capsys) -> None:
    assert_no_gpu_is_one_line(bench.main, ["--quick"], tmp_path / "e2e.json", capsys)


def test_the_update_benchmark_without_a_gpu_says_so_in_one_line(tmp_path, capsys) -> None:
    assert_no_gpu_is_one_line(load_benchmark("operator_update").main, [], tmp_path / "u.json", capsys)
