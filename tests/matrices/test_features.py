"""compute_features against a brute-force loop version, and exact values on hand-made matrices."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparserl.matrices import MatrixFeatures, canonicalize, compute_features
from sparserl.matrices.features import HIST_BUCKETS, row_length_bucket


def brute_force(A: sp.csr_array) -> dict[str, object]:
    """Every feature by plain Python loops over the stored entries (slow, obviously right)."""
    m, n = A.shape
    entries = {}
    for i in range(m):
        for k in range(A.indptr[i], A.indptr[i + 1]):
            entries[(i, int(A.indices[k]))] = float(A.data[k])
    lengths = [A.indptr[i + 1] - A.indptr[i] for i in range(m)]
    nnz = len(entries)
    hist = [0] * 16
    for L in lengths:
        b = 0
        if L > 0:
            b = 1
            while not (2 ** (b - 1) <= L < 2**b):
                b += 1
        hist[min(b, 15)] += 1
    offsets = Counter(j - i for (i, j) in entries)
    diag_len_total = sum(sum(1 for i in range(m) if 0 <= i + d < n) for d in offsets)
    top = sorted(offsets, key=lambda d: (-offsets[d], abs(d), d))[:8]
    blocks = {b: len({(i // b, j // b) for (i, j) in entries}) for b in (2, 4, 8)}
    square = m == n
    psym = square and all((j, i) in entries for (i, j) in entries)
    vsym = psym and all(entries[(j, i)] == v for (i, j), v in entries.items())
    mean = nnz / m
    return {
        "rows": m,
        "cols": n,
        "nnz": nnz,
        "density": nnz / (m * n),
        "row_len_min": min(lengths),
        "row_len_mean": mean,
        "row_len_max": max(lengths),
        "row_len_std": math.sqrt(sum((L - mean) ** 2 for L in lengths) / m),
        "row_len_hist": tuple(hist),
        "empty_rows": sum(1 for L in lengths if L == 0),
        "bandwidth": max(abs(j - i) for (i, j) in entries),
        "lower_bandwidth": max(0, max(i - j for (i, j) in entries)),
        "upper_bandwidth": max(0, max(j - i for (i, j) in entries)),
        "num_diagonals": len(offsets),
        "diag_fill": nnz / diag_len_total,
        "diagonal_offsets_top": tuple(top),
        "block_density_2": nnz / (blocks[2] * 4),
        "block_density_4": nnz / (blocks[4] * 16),
        "block_density_8": nnz / (blocks[8] * 64),
        "pattern_symmetric": psym,
        "value_symmetric": vsym,
    }


def assert_matches_brute_force(A: sp.csr_array) -> None:
    got = compute_features(A).to_dict()
    want = brute_force(canonicalize(A))
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
        elif isinstance(value, tuple):
            assert tuple(got[key]) == value, key
        else:
            assert got[key] == value, key


@st.composite
def small_sparse(draw: st.DrawFn) -> sp.csr_array:
    """Small matrices: rectangular or square, empty rows, explicit zeros, sometimes symmetric."""
    m = draw(st.integers(1, 24))
    n = draw(st.one_of(st.just(m), st.integers(1, 24)))
    cells = st.tuples(st.integers(0, m - 1), st.integers(0, n - 1))
    coords = draw(st.sets(cells, min_size=1, max_size=min(m * n, 80)))
    values = st.sampled_from([0.0, 1.0, -1.0, 2.5, 3.0])
    entries = {c: draw(values) for c in sorted(coords)}
    if m == n and draw(st.booleans()):  # mirror, with equal or (sometimes) perturbed values
        perturb = draw(st.booleans())
        for (i, j), v in list(entries.items()):
            entries.setdefault((j, i), v + (1.0 if perturb and i != j else 0.0))
    rows, cols = zip(*entries, strict=True)
    A = sp.coo_array((np.array(list(entries.values())), (np.array(rows), np.array(cols))), shape=(m, n))
    return canonicalize(A)


@settings(max_examples=150, deadline=None)
@given(small_sparse())
def test_features_match_brute_force(A: sp.csr_array) -> None:
    assert_matches_brute_force(A)


@pytest.mark.parametrize("seed", range(4))
def test_features_match_brute_force_on_larger_random(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(20, 90)), int(rng.integers(20, 90))
    A = sp.random_array((m, n), density=0.08, format="csr", rng=rng)
    A = sp.csr_array(A + sp.eye_array(m, n, k=int(rng.integers(-5, 5))))
    assert_matches_brute_force(A)


def test_tridiagonal_exact() -> None:
    n = 6
    A = sp.diags_array(
        [np.full(n - 1, -1.0), np.full(n, 2.0), np.full(n - 1, -1.0)], offsets=[-1, 0, 1]
    ).tocsr()
    f = compute_features(A)
    assert (f.rows, f.cols, f.nnz) == (6, 6, 16)
    assert (f.bandwidth, f.lower_bandwidth, f.upper_bandwidth) == (1, 1, 1)
    assert f.num_diagonals == 3 and f.diag_fill == 1.0
    assert f.diagonal_offsets_top == (0, -1, 1)  # 6 on the main diagonal, then the tie by offset
    assert (f.row_len_min, f.row_len_max, f.empty_rows) == (2, 3, 0)
    assert f.row_len_hist == (0, 0, 6) + (0,) * 13  # lengths 2 and 3 share bucket 2
    assert f.pattern_symmetric and f.value_symmetric
    # 2x2 blocks: 3 diagonal blocks full (4 each) + 4 off-diagonal blocks holding 1 entry
    assert f.block_density_2 == pytest.approx(16 / (7 * 4))


def test_upper_bidiagonal_rectangular_exact() -> None:
    A = sp.csr_array(np.array([[1.0, 2.0, 0, 0, 0], [0, 0, 3.0, 0, 0], [0, 0, 0, 0, 4.0]]))
    f = compute_features(A)
    assert (f.lower_bandwidth, f.upper_bandwidth, f.bandwidth) == (0, 2, 2)
    assert f.num_diagonals == 3  # offsets 0, 1, 2
    # in a 3x5 rectangle diagonals 0, 1 and 2 each have length 3
    assert f.diag_fill == pytest.approx(4 / 9)
    assert not f.pattern_symmetric and not f.value_symmetric


def test_dense_and_lower_triangle_exact() -> None:
    full = compute_features(np.ones((8, 8)))
    assert full.block_density_2 == full.block_density_4 == full.block_density_8 == 1.0
    assert full.num_diagonals == 15 and full.diag_fill == 1.0 and full.density == 1.0
    assert full.pattern_symmetric and full.value_symmetric
    low = compute_features(np.tril(np.ones((4, 7))))
    assert (low.lower_bandwidth, low.upper_bandwidth) == (3, 0)
    assert low.num_diagonals == 4 and low.diag_fill == 1.0
    wide = compute_features(np.ones((2, 9)))
    assert wide.num_diagonals == 10 and wide.diag_fill == 1.0


def test_empty_rows_and_histogram_buckets() -> None:
    lengths = [0, 1, 2, 3, 4, 7, 8, 0]
    m, n = len(lengths), 64
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([np.arange(L) * 3 for L in lengths])
    A = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(m, n))
    f = compute_features(A)
    assert f.empty_rows == 2 and f.row_len_min == 0 and f.row_len_max == 8
    assert f.row_len_hist[:5] == (2, 1, 2, 2, 1)
    assert sum(f.row_len_hist) == m


def test_row_length_bucket_edges() -> None:
    lengths = np.array([0, 1, 2, 3, 4, 2**13 - 1, 2**13, 2**14 - 1, 2**14, 2**20, 2**31 - 1])
    want = [0, 1, 2, 2, 3, 13, 14, 14, 15, 15, 15]
    assert row_length_bucket(lengths).tolist() == want
    assert HIST_BUCKETS == 16


def test_symmetry_needs_equal_values_and_explicit_zero_pattern() -> None:
    S = np.array([[1.0, 2.0], [2.0, 0.0]])
    assert compute_features(S).value_symmetric
    N = np.array([[1.0, 2.0], [3.0, 0.0]])
    f = compute_features(N)
    assert f.pattern_symmetric and not f.value_symmetric
    # an explicit zero at (0, 1) without (1, 0): the stored pattern is not symmetric
    Z = sp.csr_array((np.array([1.0, 0.0]), np.array([0, 1]), np.array([0, 2, 2])), shape=(2, 2))
    assert not compute_features(Z).pattern_symmetric


def test_top_offsets_order_and_cap() -> None:
    A = sp.diags_array(
        [np.ones(30 - abs(d)) for d in range(-6, 7)], offsets=list(range(-6, 7)), shape=(30, 30)
    )
    f = compute_features(A)
    assert f.diagonal_offsets_top == (0, -1, 1, -2, 2, -3, 3, -4)  # longest first, ties by |d| then d
    assert f.num_diagonals == 13


def test_to_dict_is_plain_json() -> None:
    f = compute_features(sp.random_array((30, 40), density=0.1, rng=3))
    d = f.to_dict()
    assert json.loads(json.dumps(d)) == d
    for value in d.values():
        assert type(value) in (int, float, bool, list)
    assert isinstance(d["row_len_hist"], list) and len(d["row_len_hist"]) == 16
    assert MatrixFeatures(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}) == f


def test_features_is_pure() -> None:
    A = canonicalize(sp.random_array((50, 50), density=0.1, rng=4))
    before = (A.data.copy(), A.indices.copy(), A.indptr.copy())
    assert compute_features(A) == compute_features(A)
    for x, y in zip(before, (A.data, A.indices, A.indptr), strict=True):
        np.testing.assert_array_equal(x, y)


def test_wide_offset_range_uses_sorted_counts() -> None:
    # offsets spread over a range far larger than nnz: exercises the sort-based counting path
    n = 3_000_000
    A = sp.csr_array((np.ones(3), (np.array([0, 1, n - 1]), np.array([n - 1, 0, 5]))), shape=(n, n))
    f = compute_features(A)
    assert f.num_diagonals == 3
    assert f.diagonal_offsets_top == (-1, 5 - (n - 1), n - 1)
    assert (f.lower_bandwidth, f.upper_bandwidth) == (n - 1 - 5, n - 1)
    assert f.diag_fill == pytest.approx(3 / (n - 1 + 1 + 6))
