"""The correctness judge on the host: the fp64 reference, the per-row tolerance and the verdict
(harness/reference.py), each checked against an independent computation: exact row sums with
math.fsum (a product of two fp32 numbers is exact in fp64), the documented bound written out
again here, hand-derived numbers, and fp32 kernels simulated in NumPy (a correct kernel in several
summation orders must pass; a kernel that drops a term or rounds to half precision must fail).

Mutations these tests kill (each was applied to reference.py and seen to fail here): the factor 16
or the sqrt in ``rtol_per_row``, ``max(L, 1)`` dropped, ``<=`` turned into ``<`` in the verdict,
``|A| |x|`` replaced by ``|A x|``, ATOL raised, non-finite outputs counted as passing, the SpMM
bound not broadcast per row, the reference computed in fp32."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparserl.harness.reference import (
    ATOL,
    CHECK_BLOCK,
    Comparison,
    Fp64Reference,
    check_grid,
    columns_of,
    compare_to,
    decode_stats,
    reset_stats,
    rtol_per_row,
)
from sparserl.harness.verify import VerifyConfig, make_inputs
from tests.harness.check_kernel_double import CheckKernelDouble

EPS32 = 2.0 ** -23  # written out, not read from the module

PATHS = ["scipy", "one_pass"]
"""The two ways a reference judges: SciPy on the host, and the one-pass path the worker runs on the
GPU, here with the host double of its CUDA kernel (the verdict tests run on both)."""


def judge(path: str, A: sp.csr_array) -> Fp64Reference:
    return Fp64Reference(A) if path == "scipy" else Fp64Reference(A, np, check=CheckKernelDouble())



def csr(rows: list[list[tuple[int, float]]], n: int) -> sp.csr_array:
    """A CSR matrix from per-row (column, value) lists, values fp32, columns kept in the given order."""
    indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    indices = np.array([c for r in rows for c, _ in r], dtype=np.int32)
    data = np.array([v for r in rows for _, v in r], dtype=np.float32)
    return sp.csr_array((data, indices, indptr), shape=(len(rows), n))


def exact_rows(A: sp.csr_array, x: np.ndarray) -> tuple[list[float], list[float], list[float]]:
    """Per row (SpMV): the exact A x and |A| |x| (correctly rounded, math.fsum of exact products),
    and the documented bound 16 eps32 sqrt(max(L, 1)) |A||x| + 1e-30, one row at a time (rows here are
    shorter than the 65536 entries where its growth stops)."""
    ref, mag, bound = [], [], []
    for i in range(A.shape[0]):
        s, e = int(A.indptr[i]), int(A.indptr[i + 1])
        terms = [float(A.data[j]) * float(x[A.indices[j]]) for j in range(s, e)]
        ref.append(math.fsum(terms))
        mag.append(math.fsum(abs(t) for t in terms))
        bound.append(16 * EPS32 * math.sqrt(max(e - s, 1)) * mag[-1] + 1e-30)
    return ref, mag, bound


# -- the tolerance --------------------------------------------------------------------------


def test_rtol_is_the_documented_formula() -> None:
    """rtol(L) = 16 eps32 sqrt(min(max(L, 1), 65536)): rows of 0, 1, 4, 4096, 65536, 65537 and 10^5
    entries, by hand. The docstring's figures: 1.2e-4 for a row of 4096 terms, 4.9e-4 at most.
    Mutations killed: the cap dropped (a statistical answer on a long row passes again: tests/harness/
    test_verify_host.py::test_a_statistical_answer_on_a_long_row_fails_when_timed), or set elsewhere."""
    lengths = [0, 1, 4, 4096, 65536, 65537, 100_000]
    A = csr([[(j, 1.0) for j in range(L)] for L in lengths], 100_000)
    got = rtol_per_row(A)
    want = [16 * EPS32, 16 * EPS32, 32 * EPS32, 1024 * EPS32, 4096 * EPS32, 4096 * EPS32, 4096 * EPS32]
    assert got.dtype == np.float64 and got.tolist() == pytest.approx(want, rel=1e-15)
    assert got[3] == pytest.approx(1.2207e-4, rel=1e-4) and got[-1] == pytest.approx(4.883e-4, rel=1e-4)
    assert ATOL == 1e-30


# -- the reference ----------------------------------------------------------------------------


@st.composite
def matrices(draw, max_rows: int = 12, max_len: int = 40):
    """A small CSR matrix (empty rows, repeated columns, values of one scale among tiny to huge) and
    an fp32 x; the entries come from a drawn seed, the shape and the scale from hypothesis."""
    n, m = draw(st.integers(1, 60)), draw(st.integers(1, max_rows))
    scale = draw(st.sampled_from([1.0, 1e-20, 1e4, 2.0 ** 100]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    lengths = rng.integers(0, max_len + 1, m) * (rng.random(m) < 0.8)
    rows = [list(zip(rng.integers(0, n, L).tolist(), (rng.uniform(-1, 1, L) * scale).astype(np.float32).tolist()))
            for L in lengths]
    x = (rng.standard_normal(n) * draw(st.sampled_from([1.0, 1e4]))).astype(np.float32)
    return csr(rows, n), x


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_the_reference_is_the_exact_product(case) -> None:
    """``expected`` agrees with the exact row sums to fp64 rounding (L * 2^-53 of |A||x|), rows with
    repeated columns, tiny and huge values included. An fp32 reference would be ~2^29 times off."""
    A, x = case
    ref, mag = Fp64Reference(A).expected(x)
    eref, emag, _ = exact_rows(A, x)
    L = np.diff(A.indptr)
    for i in range(A.shape[0]):
        tol = (L[i] + 1) * 2.0 ** -52 * emag[i]
        assert abs(ref[i] - eref[i]) <= tol and abs(mag[i] - emag[i]) <= tol, (i, ref[i], eref[i])


# -- the verdict ------------------------------------------------------------------------------

DELTAS = [0.0, 0.5, -0.5, 0.9, -0.9, 1.2, -1.2, 3.0, -40.0, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=80, deadline=None)
@given(matrices(), st.data())
def test_verdicts_follow_the_documented_rule(path: str, case, data) -> None:
    """y_i = exact_i + delta_i * bound_i (then rounded to fp32, which moves it by at most 1/32 of
    the bound), delta drawn per row: rows with |delta| <= 0.9 pass, |delta| >= 1.2 and non-finite
    fail; bad_rows, first_bad_row, nonfinite and max_scaled_error are what the deltas say."""
    A, x = case
    eref, _, bound = exact_rows(A, x)
    m = A.shape[0]
    deltas = data.draw(st.lists(st.sampled_from(DELTAS), min_size=m, max_size=m))
    y = np.array([r + d * b if math.isfinite(d) else d for r, d, b in zip(eref, deltas, bound)], dtype=np.float64)
    y32 = y.astype(np.float32)
    if not all(np.isfinite(y32[i]) == math.isfinite(deltas[i]) for i in range(m)):
        return  # a huge row whose bound overflows fp32: not this test's subject
    res = judge(path, A).compare(x, y32)
    bad = [i for i, d in enumerate(deltas) if not abs(d) <= 0.9]
    assert res.ok == (not bad) and res.bad_rows == len(bad)
    assert res.first_bad_row == (bad[0] if bad else None)
    assert res.nonfinite == sum(not math.isfinite(d) for d in deltas)
    if all(math.isfinite(d) for d in deltas):
        assert res.max_scaled_error == pytest.approx(max(abs(d) for d in deltas), abs=0.04)
    else:
        assert res.max_scaled_error == math.inf


def test_the_bound_is_inclusive_at_its_edge() -> None:
    """A cancelling row (1e4 - 1e4 = 0 exactly, |A||x| = 2e4) judged at its edge, in fp64 outputs:
    |y| = bound passes, the next double above fails. Hand-derived: bound = 16 eps32 sqrt(2) 2e4 + 1e-30
    = 0.0539... (SciPy path only: its outputs are fp64, which the one-pass path rounds to fp32 as a
    kernel's output is.)"""
    A = csr([[(0, 1e4), (1, -1e4)]], 2)
    x = np.ones(2, np.float32)
    b = 16 * EPS32 * math.sqrt(2) * 2e4 + 1e-30
    assert b == pytest.approx(0.05394, rel=1e-3)
    ref = Fp64Reference(A)
    for sign in (1.0, -1.0):
        at = ref.compare(x, np.array([sign * b]))
        assert at.ok and at.max_scaled_error == 1.0
        over = ref.compare(x, np.array([sign * np.nextafter(b, np.inf)]))
        assert not over.ok and over.bad_rows == 1 and over.first_bad_row == 0


@pytest.mark.parametrize("path", PATHS)
def test_cancellation_gets_no_looser_bound_than_its_terms(path: str) -> None:
    """Rows whose terms cancel: the bound scales with |A||x| (the terms summed), not with |A x|
    (near 0) nor with a global norm. y = 0.04 passes the cancelling row of 2e4-sized terms
    (bound 0.054) and fails a row whose exact value is 0 with terms of 1 (bound 2.7e-6)."""
    A = csr([[(0, 1e4), (1, -1e4)], [(0, 1.0), (1, -1.0)]], 2)
    x = np.ones(2, np.float32)
    res = judge(path, A).compare(x, np.array([0.04, 0.04], np.float32))
    assert res.bad_rows == 1 and res.first_bad_row == 1
    assert res.max_scaled_error == pytest.approx(0.04 / (16 * EPS32 * math.sqrt(2) * 2), rel=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_empty_rows_must_be_written_as_zero(path: str) -> None:
    """A row with no entries: its product is 0 and its bound ATOL (1e-30). 0 passes, NaN (the poison
    of a row never written) fails as non-finite, and 1e-20 fails."""
    A = csr([[], [(0, 2.0)], []], 3)
    x = np.array([1.5, 0, 0], np.float32)
    ref = judge(path, A)
    assert ref.compare(x, np.array([0.0, 3.0, 0.0], np.float32)).ok
    unwritten = ref.compare(x, np.array([0.0, 3.0, np.nan], np.float32))
    assert (unwritten.ok, unwritten.bad_rows, unwritten.nonfinite, unwritten.first_bad_row) == (False, 1, 1, 2)
    assert unwritten.describe() == ("1 rows out of tolerance (1 entries never written or not finite), first bad row 2, "
                                    "max error infx the tolerance")
    small = ref.compare(x, np.array([1e-20, 3.0, 0.0], np.float32))
    assert small.bad_rows == 1 and small.first_bad_row == 0 and small.nonfinite == 0
    assert small.describe() == "1 rows out of tolerance (wrong values), first bad row 0, max error 1e+10x the tolerance"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_outputs_never_pass(path: str, bad: float) -> None:
    """NaN and +-inf in y fail their row however large the bound, and count as non-finite."""
    A = csr([[(0, 3e38)], [(0, 1.0)]], 1)
    x = np.array([1.0], np.float32)
    res = judge(path, A).compare(x, np.array([bad, 1.0], np.float32))
    assert (res.ok, res.bad_rows, res.nonfinite, res.first_bad_row) == (False, 1, 1, 0)
    assert res.max_scaled_error == math.inf


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_inputs_fail_the_rows_that_read_them(path: str, bad: float) -> None:
    """An x entry that is NaN or inf: the rows that read it can be judged correct by no output (their
    reference is not finite), whatever y holds there, even the same inf; rows that do not read it
    are judged as usual. (The verification inputs are finite; this is the judge's floor.)"""
    A = csr([[(0, 1.0), (1, 1.0)], [(1, 2.0)], [(0, -1.0)]], 2)
    x = np.array([bad, 1.0], np.float32)
    for y0 in (bad, 1.0, np.inf, np.nan):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and quietly: no RuntimeWarning in a worker's log
            res = judge(path, A).compare(x, np.array([y0, 2.0, -bad], np.float32))
        assert res.bad_rows == 2 and res.first_bad_row == 0, y0
    assert not judge(path, A).compare(x, np.array([0.0, 2.5, 0.0], np.float32)).ok


@pytest.mark.parametrize("path", PATHS)
def test_large_magnitudes_scale_out(path: str) -> None:
    """x near 2^100 (1.3e30, fp32 holds it): the verdicts of (x, y) and of (x * 2^100, y * 2^100) are
    the same, row for row, and so is the scaled error (powers of two scale exactly)."""
    rng = np.random.default_rng(0)
    A = sp.random_array((50, 40), density=0.3, format="csr", random_state=1, dtype=np.float32)
    x = rng.standard_normal(40).astype(np.float32)
    ref, mag = Fp64Reference(A).expected(x)
    rt = rtol_per_row(A)
    y = (ref + rng.choice([-2.0, -0.5, 0.5, 2.0], 50) * rt * mag).astype(np.float32)
    small = judge(path, A).compare(x, y)
    big = judge(path, A).compare(x * np.float32(2.0 ** 100), y * np.float32(2.0 ** 100))
    assert 0 < small.bad_rows < 50
    assert (big.bad_rows, big.first_bad_row) == (small.bad_rows, small.first_bad_row)
    assert big.max_scaled_error == pytest.approx(small.max_scaled_error, rel=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_spmm_judges_every_column(path: str) -> None:
    """SpMM: one wrong column in row 3 of a 5 x 4 output makes row 3 bad (and only it); the bound of
    each column uses that column's |A||X|."""
    A = sp.random_array((5, 6), density=0.6, format="csr", random_state=2, dtype=np.float32)
    X = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    exact = np.array([exact_rows(A, X[:, c])[0] for c in range(4)]).T
    bounds = np.array([exact_rows(A, X[:, c])[2] for c in range(4)]).T
    Y = exact.copy()
    Y[3, 2] += 5 * bounds[3, 2]
    Y[1, 0] += 0.5 * bounds[1, 0]
    res = judge(path, A).compare(X, Y.astype(np.float32))
    assert (res.ok, res.bad_rows, res.first_bad_row, res.nonfinite) == (False, 1, 3, 0)
    assert res.max_scaled_error == pytest.approx(5.0, abs=0.05)
    ref, mag = Fp64Reference(A).expected(X)
    assert compare_to(ref, mag, rtol_per_row(A), Y.reshape(-1)).bad_rows == 1  # flat y is reshaped


def test_an_empty_output_passes_trivially() -> None:
    res = compare_to(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, np.float32))
    assert res == Comparison(ok=True, bad_rows=0, nonfinite=0, max_scaled_error=0.0, first_bad_row=None)


# -- fp32 kernels, simulated -------------------------------------------------------------------


def long_rows() -> sp.csr_array:
    """Rows of 0, 1, 7, 300, 4096 and 10^5 entries (random columns, signed values of mixed scale)."""
    rng = np.random.default_rng(7)
    n = 100_000
    rows = []
    for L in (0, 1, 7, 300, 4096, 100_000):
        cols = rng.permutation(n)[:L] if L < n else rng.permutation(n)
        v = rng.standard_normal(L) * rng.choice([1e-3, 1.0, 1e3], L)
        rows.append(list(zip(cols.tolist(), v.astype(np.float32).tolist())))
    return csr(rows, n)


def fp32_kernel(A: sp.csr_array, x: np.ndarray, order: str) -> np.ndarray:
    """y = A x in fp32 arithmetic as a CUDA kernel would sum each row: 'sequential' (a thread per
    row), 'reverse', 'pairwise' (NumPy's fp32 sum), or 'warp' (32 strided partial sums, then a tree)."""
    y = np.empty(A.shape[0], np.float32)
    for i in range(A.shape[0]):
        s, e = A.indptr[i], A.indptr[i + 1]
        p = (A.data[s:e] * x[A.indices[s:e]]).astype(np.float32)
        if p.size == 0:
            y[i] = 0.0
        elif order == "sequential":
            y[i] = np.cumsum(p, dtype=np.float32)[-1]
        elif order == "reverse":
            y[i] = np.cumsum(p[::-1], dtype=np.float32)[-1]
        elif order == "pairwise":
            y[i] = p.sum(dtype=np.float32)
        else:
            lanes = np.zeros(32, np.float32)
            for j in range(32):
                lane = p[j::32]
                lanes[j] = np.cumsum(lane, dtype=np.float32)[-1] if lane.size else 0.0
            while lanes.size > 1:
                lanes = (lanes[: lanes.size // 2] + lanes[lanes.size // 2:]).astype(np.float32)
            y[i] = lanes[0]
    return y


@pytest.fixture(scope="module")
def rows_and_inputs():
    A = long_rows()
    return A, make_inputs((A.shape[1],), VerifyConfig())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("order", ["sequential", "reverse", "pairwise", "warp"])
def test_correct_fp32_kernels_pass_on_every_verification_input(path: str, rows_and_inputs, order: str) -> None:
    """A correct fp32 kernel passes in any summation order, on every verification input (normal,
    uniform, large signed, zeros, alternating, non-negative), rows of 0 to 10^5 entries included, with a margin:
    its worst row uses less than half the tolerance."""
    A, inputs = rows_and_inputs
    ref = judge(path, A)
    for name, x in inputs:
        res = ref.compare(x, fp32_kernel(A, x, order))
        assert res.ok and res.max_scaled_error < 0.5, (order, name, res.describe())


@pytest.mark.parametrize("path", PATHS)
def test_a_sequential_sum_of_equal_values_passes(path: str) -> None:
    """The worst common case for a thread-per-row kernel: 10^5 copies of 0.1f summed in order, where
    rounding errors do not cancel. Measured against a float128 sum its error is below the bound."""
    L = 100_000
    A = csr([[(j, 0.1) for j in range(L)]], L)
    x = np.ones(L, np.float32)
    y = np.cumsum(np.full(L, np.float32(0.1)), dtype=np.float32)[-1:]
    exact = np.sum(np.full(L, np.float32(0.1), dtype=np.float128), dtype=np.float128)
    bound = 16 * EPS32 * math.sqrt(min(L, 65536)) * float(exact)
    assert abs(float(y[0]) - float(exact)) < bound  # hand check of the premise, in float128
    assert judge(path, A).compare(x, y).ok


@pytest.mark.parametrize("path", PATHS)
def test_wrong_kernels_fail(path: str, rows_and_inputs) -> None:
    """Near-misses a cheap kernel makes: dropping a row's largest term (rows up to 4096 entries),
    dropping 1% of the terms of the 10^5 row, reading the next column of x, and half-precision
    products fail on the normal input. (Half-precision products pass on the long rows: their
    rounding errors, random in sign, grow like sqrt(L) in absolute terms while the bound grows like
    sqrt(L) times |A||x|; the short rows catch them.)"""
    A, inputs = rows_and_inputs
    ref = judge(path, A)
    x = inputs[0][1]
    good = fp32_kernel(A, x, "pairwise")
    for row in (1, 2, 3, 4):
        s, e = A.indptr[row], A.indptr[row + 1]
        p = A.data[s:e] * x[A.indices[s:e]]
        y = good.copy()
        y[row] -= p[np.argmax(np.abs(p))]
        res = ref.compare(x, y)
        assert res.bad_rows == 1 and res.first_bad_row == row, row
    s, e = A.indptr[5], A.indptr[6]
    p = (A.data[s:e] * x[A.indices[s:e]]).astype(np.float64)
    y = good.copy()
    y[5] = np.float32(p[1000:].sum())
    assert ref.compare(x, y).first_bad_row == 5
    shifted = A.copy()
    shifted.indices = (shifted.indices + 1) % A.shape[1]
    assert ref.compare(x, fp32_kernel(shifted, x, "pairwise")).bad_rows >= 4
    half = np.array([(A.data[A.indptr[i]:A.indptr[i + 1]].astype(np.float16)
                      * x[A.indices[A.indptr[i]:A.indptr[i + 1]]].astype(np.float16)).astype(np.float32).sum()
                     for i in range(A.shape[0])], dtype=np.float32)
    res = ref.compare(x, half)
    assert res.first_bad_row == 1 and res.bad_rows >= 2  # rows of 1 and 7 entries at least


def test_host_reference_keeps_its_arrays() -> None:
    """device_arrays on the host: the fp64 values, their magnitudes and the tolerances, so a stray
    write into any of them changes a fingerprint."""
    A = csr([[(0, -2.0), (1, 1.0)], []], 2)
    ref = Fp64Reference(A)
    vals, mags, rtol = ref.device_arrays()
    assert vals.tolist() == [-2.0, 1.0] and mags.tolist() == [2.0, 1.0]
    assert rtol.tolist() == pytest.approx([16 * EPS32 * math.sqrt(2), 16 * EPS32])


# -- the one-pass path's own code ----------------------------------------------------------------
# Mutations these tests kill: the grid rounded down (rows past the last full block never judged),
# the slots not reset between comparisons (a bad verdict leaks into the next), the first bad row
# reset to 0 instead of the largest value, the slots decoded in another order, k taken as 1 for
# SpMM, a shape check dropped, an argument uploaded as another dtype (the double refuses it as
# CuPy's raw memory would be misread), the max scaled error read as an integer.


def test_the_grid_covers_every_row() -> None:
    """Hand-derived: 0 rows need no block, 1 to 256 rows one, 257 two; a wrong last row is found
    on a matrix of 257 and of 513 rows."""
    assert CHECK_BLOCK == 256
    assert [check_grid(m) for m in (0, 1, 255, 256, 257, 512, 513)] == [0, 1, 1, 1, 2, 2, 3]
    for m in (257, 513):
        A = csr([[(0, 1.0)] for _ in range(m)], 1)
        y = np.ones(m, np.float32)
        y[-1] = 2.0
        res = judge("one_pass", A).compare(np.ones(1, np.float32), y)
        assert (res.bad_rows, res.first_bad_row) == (1, m - 1), m


@pytest.mark.parametrize("path", PATHS)
def test_a_verdict_does_not_leak_into_the_next_comparison(path: str) -> None:
    """One reference judges a bad output (rows 2 and 1 wrong, one NaN), then a correct one, then
    the bad one again: each verdict is the output's own."""
    A = csr([[(0, 1.0)], [(0, 2.0)], [(0, 3.0)], [(0, 4.0)]], 1)
    x = np.ones(1, np.float32)
    good, bad = np.array([1, 2, 3, 4], np.float32), np.array([1, np.nan, 7, 4], np.float32)
    ref = judge(path, A)
    for _ in range(2):
        wrong = ref.compare(x, bad)
        assert (wrong.ok, wrong.bad_rows, wrong.nonfinite, wrong.first_bad_row) == (False, 2, 1, 1)
        assert wrong.max_scaled_error == math.inf
        right = ref.compare(x, good)
        assert right == Comparison(ok=True, bad_rows=0, nonfinite=0, max_scaled_error=0.0, first_bad_row=None)


def test_a_verdict_whose_first_bad_row_is_the_last() -> None:
    """Only the last of 3 rows is wrong, on a reference that judged a correct output first: the
    first bad row is 2 (a slot reset to 0 instead of its largest value would say 0)."""
    A = csr([[(0, 1.0)], [(0, 1.0)], [(0, 1.0)]], 1)
    ref = judge("one_pass", A)
    x = np.ones(1, np.float32)
    assert ref.compare(x, np.ones(3, np.float32)).ok
    res = ref.compare(x, np.array([1, 1, 1.5], np.float32))
    assert (res.bad_rows, res.first_bad_row) == (1, 2)
    assert res.max_scaled_error == pytest.approx(0.5 / (16 * EPS32 + 1e-30), rel=1e-9)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("x_shape, y_size", [((3,), 2), ((2,), 1), ((2, 3), 5), ((2, 3), 7), ((2, 1, 1), 2)])
def test_shapes_that_do_not_fit_are_refused(path: str, x_shape, y_size: int) -> None:
    """A 2 x 2 matrix: x of 3 rows; y of 1 entry for 2 rows; SpMM y of 5 or 7 entries for 2 x 3; a 3-D x."""
    A = csr([[(0, 1.0)], [(1, 1.0)]], 2)
    with pytest.raises(ValueError):
        judge(path, A).compare(np.ones(x_shape, np.float32), np.ones(y_size, np.float32))


def test_columns_of_reads_k_and_checks_the_shapes() -> None:
    one, three = np.zeros(4), np.zeros((4, 3))
    assert columns_of((5, 4), one, np.zeros(5)) == 1
    assert columns_of((5, 4), three, np.zeros((5, 3))) == 3
    assert columns_of((5, 4), three, np.zeros(15)) == 3
    for x, y in ((one, np.zeros(4)), (three, np.zeros(5)), (np.zeros(3), np.zeros(5)), (np.zeros((4, 3, 1)), np.zeros(15))):
        with pytest.raises(ValueError, match="do not fit a 5 x 4 matrix"):
            columns_of((5, 4), x, y)


class ScalarFillOnly(np.ndarray):
    """A NumPy array that takes assignments as a CuPy array does: a slice filled from a scalar only
    (CuPy refuses a tuple: "non-scalar numpy.ndarray cannot be used for fill")."""

    def __setitem__(self, key, value) -> None:
        assert np.ndim(value) == 0, "CuPy fills a slice from a scalar only"
        super().__setitem__(key, value)


def test_the_slots_are_reset_and_decoded_as_the_kernel_writes_them() -> None:
    """reset: counts and the max at 0, the first bad row at 2^64 - 1, in scalar fills that CuPy
    takes (a fill from a tuple failed every GPU worker's start-up). decode: (bad, non-finite, the
    bits of the max scaled error, first bad row), the first bad row only when a row is bad."""
    stats = np.array([5, 6, 7, 8], np.uint64).view(ScalarFillOnly)
    reset_stats(stats)
    assert stats.tolist() == [0, 0, 0, 2 ** 64 - 1]
    assert decode_stats(stats) == Comparison(ok=True, bad_rows=0, nonfinite=0, max_scaled_error=0.0, first_bad_row=None)
    bits = int(np.float64(3.5).view(np.uint64))
    assert decode_stats([2, 1, bits, 7]) == Comparison(ok=False, bad_rows=2, nonfinite=1, max_scaled_error=3.5,
                                                       first_bad_row=7)
    assert decode_stats([0, 0, int(np.float64(0.25).view(np.uint64)), 2 ** 64 - 1]).max_scaled_error == 0.25


def test_the_one_pass_path_keeps_its_arrays_in_the_kernels_types() -> None:
    """The arrays fingerprinted on the one-pass path are the CSR arrays and tolerances the kernel
    reads, in its types; ``expected`` belongs to the SciPy path only; one launch per comparison."""
    A = csr([[(0, -2.0), (1, 1.0)], []], 2)
    double = CheckKernelDouble()
    ref = Fp64Reference(A, np, check=double)
    indptr, indices, val, rtol = ref.device_arrays()
    assert (indptr.dtype, indices.dtype, val.dtype, rtol.dtype) == (np.int32, np.int32, np.float32, np.float64)
    assert indptr.tolist() == [0, 2, 2] and indices.tolist() == [0, 1] and val.tolist() == [-2.0, 1.0]
    assert rtol.tolist() == pytest.approx([16 * EPS32 * math.sqrt(2), 16 * EPS32])
    with pytest.raises(NotImplementedError, match=r"^on the one-pass path the reference is computed inside compare\(\)$"):
        ref.expected(np.ones(2, np.float32))
    ref.compare(np.ones(2), np.array([-1.0, 0.0]))  # fp64 inputs are converted to the kernel's fp32
    ref.compare(np.ones((2, 3), np.float32)[:, ::2], np.zeros((2, 2), np.float32))  # and made contiguous
    assert double.launches == 2


def test_the_upload_gives_the_kernel_its_types() -> None:
    """A matrix held with int64 indices and fp64 values (SciPy's choice for large or converted
    matrices) is uploaded as the int32 / fp32 CSR arrays ``fp64_check`` reads (the double refuses
    any other dtype, as the kernel would misread the memory)."""
    A = csr([[(0, 0.5), (2, -1.0)], [(1, 2.0)]], 3)
    A64 = sp.csr_array((A.data.astype(np.float64), A.indices.astype(np.int64), A.indptr.astype(np.int64)), shape=A.shape)
    ref = Fp64Reference(A64, np, check=CheckKernelDouble())
    assert [a.dtype for a in ref.device_arrays()] == [np.int32, np.int32, np.float32, np.float64]
    res = ref.compare(np.array([2.0, 1.0, 1.0], np.float32), np.array([0.0, 2.0], np.float32))
    assert res.ok, res.describe()
