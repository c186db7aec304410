"""Generators: canonical output, determinism, family structure, parameter validation, edge sizes."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import MatrixError
from sparserl.matrices import FAMILIES, compute_features, family_names, generate
from sparserl.matrices import generators as gen_mod

SQUARE_ONLY = {"stencil2d", "stencil3d_7", "stencil3d_27", "rmat"}
SIZES = [(1, None), (2, None), (10, None), (333, None), (97, 41), (50, 200)]


def assert_canonical(A: sp.csr_array) -> None:
    assert isinstance(A, sp.csr_array)
    assert A.data.dtype == np.float32
    assert A.indices.dtype == np.int32 and A.indptr.dtype == np.int32
    assert A.indptr[0] == 0 and A.indptr[-1] == A.nnz == A.indices.size == A.data.size
    assert np.all(np.diff(A.indptr) >= 0)
    assert A.nnz == 0 or (A.indices.min() >= 0 and A.indices.max() < A.shape[1])
    # strictly increasing columns within each row: sorted and duplicate-free
    row_start = np.zeros(A.nnz, dtype=bool)
    row_start[A.indptr[:-1][np.diff(A.indptr) > 0]] = True
    assert np.all((np.diff(A.indices.astype(np.int64)) > 0) | row_start[1:])
    mag = np.abs(A.data)
    assert np.all((mag >= 0.5) & (mag < 1.5))  # never zero, never 1.5


def rows_of(A: sp.csr_array) -> np.ndarray:
    return np.diff(A.indptr)


CASES = [(f, r, c) for f in family_names() for r, c in SIZES if c is None or f not in SQUARE_ONLY]


@pytest.mark.parametrize("family,rows,cols", CASES)
def test_every_family_is_canonical_and_deterministic(family: str, rows: int, cols: int | None) -> None:
    A = generate(family, rows, cols=cols, seed=7)
    assert_canonical(A)
    if family == "rmat":
        assert A.shape == (rows, rows)
    if family not in SQUARE_ONLY:
        want_cols = cols if cols is not None else (2 * rows if family == "rectangular" else rows)
        assert A.shape == (rows, want_cols)
    B = generate(family, rows, cols=cols, seed=7)
    for x, y in ((A.indptr, B.indptr), (A.indices, B.indices), (A.data, B.data)):
        np.testing.assert_array_equal(x, y)
    C = generate(family, rows, cols=cols, seed=8)
    assert C.shape == A.shape
    if A.nnz > 4:
        same = C.nnz == A.nnz and np.array_equal(C.indices, A.indices) and np.array_equal(C.data, A.data)
        assert not same


def test_family_registry() -> None:
    assert family_names() == [
        "diagonal", "banded", "stencil2d", "stencil3d_7", "stencil3d_27", "block",
        "random", "powerlaw", "skewed", "empty_rows", "rectangular", "dense_lines", "rmat",
    ]  # fmt: skip
    for name, spec in FAMILIES.items():
        assert spec.description and "\n" not in spec.description, name
        assert callable(spec.fn)
        assert spec.takes_cols == (name not in SQUARE_ONLY) or name not in family_names(), name
    # the application families: only lp takes any cols (rectangular by nature)
    assert [n for n in FAMILIES if n not in family_names() and FAMILIES[n].takes_cols] == ["lp"]


def test_diagonal() -> None:
    A = generate("diagonal", 1000)
    assert A.nnz == 1000 and compute_features(A).num_diagonals == 1
    np.testing.assert_array_equal(A.indices, np.arange(1000))
    tall = generate("diagonal", 10, cols=4)
    assert tall.shape == (10, 4) and tall.nnz == 4 and compute_features(tall).empty_rows == 6
    assert generate("diagonal", 4, cols=10).nnz == 4


@pytest.mark.parametrize("bands", [1, 2, 3, 9, 10])
def test_banded(bands: int) -> None:
    A = generate("banded", 200, bands=bands)
    f = compute_features(A)
    assert f.num_diagonals == bands and f.diag_fill == 1.0
    lo = bands // 2
    assert (f.lower_bandwidth, f.upper_bandwidth) == (lo, bands - 1 - lo)
    assert f.row_len_max == bands


def test_banded_wider_than_the_matrix() -> None:
    A = generate("banded", 3, bands=41)
    assert A.nnz == 9  # clipped to the full 3x3
    B = generate("banded", 1, cols=1000, bands=9)
    assert B.nnz == 5  # offsets 0..4 fit in row 0
    C = generate("banded", 50, cols=3)
    assert C.shape == (50, 3) and compute_features(C).empty_rows == 50 - 3 - 4


def _laplacian_pattern(sides: tuple[int, ...], full: bool) -> sp.csr_array:
    """Pattern of the 2D 5-point / 3D 7-point (full=False) or 27-point (full=True) stencil by kron."""
    ones = [
        sp.csr_array(np.abs(np.subtract.outer(np.arange(s), np.arange(s))) <= 1, dtype=float) for s in sides
    ]
    eyes = [sp.eye_array(s, format="csr") for s in sides]
    if full:
        P = ones[0]
        for T in ones[1:]:
            P = sp.kron(P, T)
        return _pattern(P)
    total = None
    for k in range(len(sides)):
        term = None
        for d in range(len(sides)):
            factor = ones[d] if d == k else eyes[d]
            term = factor if term is None else sp.kron(term, factor)
        total = term if total is None else total + term
    return _pattern(total)


def _pattern(P: object) -> sp.csr_array:
    out = sp.csr_array(P)
    out.eliminate_zeros()  # kron of sparse arrays may store zero blocks
    out.sum_duplicates()
    return out


@pytest.mark.parametrize(
    "family,rows,side,dims,full",
    [
        ("stencil2d", 1, 1, 2, False),
        ("stencil2d", 10, 3, 2, False),
        ("stencil2d", 400, 20, 2, False),
        ("stencil2d", 390, 20, 2, False),
        ("stencil3d_7", 2, 1, 3, False),
        ("stencil3d_7", 30, 3, 3, False),
        ("stencil3d_7", 1000, 10, 3, False),
        ("stencil3d_27", 1, 1, 3, True),
        ("stencil3d_27", 64, 4, 3, True),
        ("stencil3d_27", 1000, 10, 3, True),
    ],
)
def test_stencils_match_kron_construction(family: str, rows: int, side: int, dims: int, full: bool) -> None:
    A = generate(family, rows)
    N = side**dims
    assert A.shape == (N, N)
    want = _laplacian_pattern((side,) * dims, full)
    want.sort_indices()
    np.testing.assert_array_equal(A.indptr, want.indptr)
    np.testing.assert_array_equal(A.indices, want.indices)
    f = compute_features(A)
    assert f.pattern_symmetric
    cap = {"stencil2d": 5, "stencil3d_7": 7, "stencil3d_27": 27}[family]
    assert f.row_len_max <= cap
    if side >= 3:
        assert f.row_len_max == cap


def test_stencil_cols() -> None:
    assert generate("stencil2d", 10, cols=10).shape == (9, 9)  # the requested rows: accepted
    assert generate("stencil2d", 10, cols=9).shape == (9, 9)  # the actual size: accepted
    with pytest.raises(MatrixError, match="cols=12 disagrees"):
        generate("stencil2d", 10, cols=12)
    with pytest.raises(MatrixError, match="3x3x3"):
        generate("stencil3d_27", 27, cols=5)


@pytest.mark.parametrize("b", [1, 2, 4, 8])
def test_block_full_blocks_when_sizes_are_multiples(b: int) -> None:
    A = generate("block", 64 * b, cols=32 * b, block=b, blocks_per_row=3)
    f = compute_features(A)
    assert np.all(rows_of(A) == 3 * b)
    density = {1: 1.0, 2: f.block_density_2, 4: f.block_density_4, 8: f.block_density_8}
    assert density[b] == 1.0


def test_block_edges_are_cut() -> None:
    A = generate("block", 21, cols=13, block=8, blocks_per_row=2)  # 3 block rows, 2 block cols
    assert A.shape == (21, 13)
    assert np.all(rows_of(A) == 13)  # both block columns, the second cut to 5 columns
    B = generate("block", 20, cols=100, block=8, blocks_per_row=50)  # clipped to 13 block columns
    assert np.all(rows_of(B) == 100)


def test_random_rows_are_exact_and_distinct() -> None:
    A = generate("random", 500, nnz_per_row=16)
    assert np.all(rows_of(A) == 16)
    dense = generate("random", 300, cols=20, nnz_per_row=15)  # > cols/2: complement sampling
    assert np.all(rows_of(dense) == 15)
    half = generate("random", 300, cols=20, nnz_per_row=10)  # exactly cols/2: top-up sampling
    assert np.all(rows_of(half) == 10)
    full = generate("random", 30, cols=7, nnz_per_row=100)  # clipped to cols
    assert np.all(rows_of(full) == 7)
    # uniform: each column picked about equally often
    counts = np.bincount(generate("random", 4000, cols=50, nnz_per_row=5).indices, minlength=50)
    assert counts.min() > 0.7 * counts.mean() and counts.max() < 1.3 * counts.mean()


def test_powerlaw_is_skewed() -> None:
    A = generate("powerlaw", 20000, seed=1)
    f = compute_features(A)
    assert f.row_len_mean == pytest.approx(8.0, rel=0.25)
    assert f.row_len_max > 20 * f.row_len_mean
    col_counts = np.bincount(A.indices, minlength=A.shape[1])
    assert col_counts.max() > 10 * col_counts.mean()  # popular columns
    capped = generate("powerlaw", 2000, cols=30, mean_degree=20.0)
    assert rows_of(capped).max() <= 30
    assert_canonical(capped)


def test_skewed() -> None:
    A = generate("skewed", 10000, cols=20000, seed=3)
    lengths = rows_of(A)
    assert set(np.unique(lengths).tolist()) == {4, 4096}
    assert int((lengths == 4096).sum()) == 10  # round(0.001 * 10000)
    B = generate("skewed", 50, short_len=2, long_fraction=0.0001, long_len=30)
    assert int((rows_of(B) == 30).sum()) == 1  # at least one long row
    C = generate("skewed", 100, cols=64)  # long_len defaults to min(cols, 4096)
    assert rows_of(C).max() == 64


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.75])
def test_empty_rows_fraction(fraction: float) -> None:
    A = generate("empty_rows", 4000, empty_fraction=fraction)
    f = compute_features(A)
    assert f.empty_rows == round(fraction * 4000)
    assert set(np.unique(rows_of(A)).tolist()) <= {0, 16}
    one = generate("empty_rows", 1, empty_fraction=0.9)  # keeps at least one nonempty row
    assert one.nnz == 1


def test_rectangular() -> None:
    A = generate("rectangular", 300)
    assert A.shape == (300, 600) and np.all(rows_of(A) == 8)
    tall = generate("rectangular", 300, cols=40, nnz_per_row=8)
    assert tall.shape == (300, 40)


def test_dense_lines() -> None:
    A = generate("dense_lines", 4000, cols=3000, seed=2, nnz_per_row=6, dense_rows=3, dense_cols=5, dense_fill=0.6)
    assert A.shape == (4000, 3000)
    lengths = rows_of(A)
    dense = lengths >= 1800  # round(0.6 * 3000)
    assert int(dense.sum()) == 3
    assert lengths[~dense].min() >= 6 and lengths[~dense].max() <= 6 + 5  # body plus hits of the dense columns
    counts = np.bincount(A.indices, minlength=3000)
    assert int((counts >= 2400).sum()) == 5  # round(0.6 * 4000) rows each
    assert np.sort(counts)[-6] < 100  # the rest stay sparse
    full = generate("dense_lines", 300, seed=1, dense_rows=2, dense_cols=0, dense_fill=1.0)
    assert int((rows_of(full) == 300).sum()) == 2
    plain = generate("dense_lines", 300, seed=1, dense_rows=0, dense_cols=0)
    assert np.all(rows_of(plain) == 8)
    clipped = generate("dense_lines", 3, cols=2, dense_rows=10, dense_cols=10, dense_fill=1.0)  # clipped to 3 and 2
    assert_canonical(clipped)
    assert clipped.nnz == 6


def test_rmat_has_heavy_tails_in_rows_and_columns() -> None:
    A = generate("rmat", 1 << 14, seed=1)
    assert A.shape == (1 << 14, 1 << 14)
    target = 8 * (1 << 14)
    assert 0.8 * target <= A.nnz <= target  # duplicates merge
    rows, cols = rows_of(A), np.bincount(A.indices, minlength=A.shape[1])
    assert rows.max() > 20 * rows.mean() and cols.max() > 20 * cols.mean()
    assert (rows == 0).sum() > 0.1 * A.shape[0]  # R-MAT leaves many vertices without out-edges
    odd = generate("rmat", 1000, seed=2, edge_factor=4.0)  # not a power of two: ids past 1000 are dropped
    assert odd.shape == (1000, 1000) and 0.8 * 4000 <= odd.nnz <= 4000
    assert generate("rmat", 500, cols=500).shape == (500, 500)


def test_random_values() -> None:
    v = gen_mod.random_values(np.random.default_rng(0), 1_000_000)
    assert v.dtype == np.float32
    mag = np.abs(v)
    assert mag.min() >= 0.5 and mag.max() < 1.5
    assert 0.49 < float(np.mean(v > 0)) < 0.51
    assert abs(float(mag.mean()) - 1.0) < 0.01
    # the largest possible mantissa still stays below 1.5
    top = (np.array([0x007FFFFF], np.uint32) | np.uint32(0x3F800000)).view(np.float32) - np.float32(0.5)
    assert top[0] < 1.5


def test_small_chunks_give_the_same_structured_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked building (used at tens of millions of rows) joins chunks correctly."""
    big = {f: generate(f, 3000, cols=None if f in SQUARE_ONLY else 2500) for f in
           ("diagonal", "banded", "stencil2d", "stencil3d_7", "stencil3d_27")}  # fmt: skip
    monkeypatch.setattr(gen_mod, "_CHUNK_NNZ", 97)
    for family, A in big.items():
        B = generate(family, 3000, cols=None if family in SQUARE_ONLY else 2500)
        np.testing.assert_array_equal(A.indptr, B.indptr)
        np.testing.assert_array_equal(A.indices, B.indices)
    for family in ("block", "random", "powerlaw", "skewed", "empty_rows", "rectangular", "dense_lines"):
        C = generate(family, 700, cols=900, seed=2)
        assert_canonical(C)
    assert_canonical(generate("rmat", 700, seed=2))
    assert np.all(rows_of(generate("random", 700, nnz_per_row=9)) == 9)


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: generate("nope", 10), "unknown matrix family 'nope'; valid: diagonal, banded"),
        (
            lambda: generate("random", 10, bogus=3),
            "unknown parameter(s) bogus; valid (with defaults): nnz_per_row=16",
        ),
        (lambda: generate("diagonal", 10, bands=3), "valid (with defaults): none"),
        (lambda: generate("random", 10, nnz_per_row=2.5), "nnz_per_row must be an integer"),
        (lambda: generate("random", 10, nnz_per_row=True), "nnz_per_row must be an integer"),
        (lambda: generate("powerlaw", 10, alpha="x"), "alpha must be a finite number"),
        (lambda: generate("powerlaw", 10, alpha=float("nan")), "alpha must be a finite number"),
        (lambda: generate("powerlaw", 10, alpha=1.0), "alpha must be > 1"),
        (lambda: generate("random", 0), "rows must be an integer >= 1"),
        (lambda: generate("random", 10.0), "rows must be an integer >= 1"),  # type: ignore[arg-type]
        (lambda: generate("random", 10, cols=0), "cols must be an integer >= 1"),
        (lambda: generate("random", 10, seed=-1), "seed must be an integer >= 0"),
        (lambda: generate("random", 10, nnz_per_row=0), "nnz_per_row must be >= 1"),
        (lambda: generate("banded", 10, bands=0), "bands must be >= 1"),
        (lambda: generate("block", 10, block=0), "block must be >= 1"),
        (lambda: generate("empty_rows", 10, empty_fraction=1.0), "empty_fraction must be in [0, 1)"),
        (lambda: generate("skewed", 10, long_fraction=2.0), "long_fraction must be in [0, 1]"),
        (lambda: generate("random", 2**30, nnz_per_row=16), "exceed the 2**31-1 limit"),
        (lambda: generate("diagonal", 2**31), "exceeds the 2**31-1 limit"),
        (lambda: generate("dense_lines", 10, dense_fill=0.0), "dense_fill must be in (0, 1]"),
        (lambda: generate("dense_lines", 10, dense_rows=-1), "dense_rows and dense_cols must be >= 0"),
        (lambda: generate("rmat", 10, cols=20), "rmat: builds a square graph matrix"),
        (lambda: generate("rmat", 10, a=0.5, b=0.3, c=0.3), "a + b + c < 1"),
        (lambda: generate("rmat", 10, edge_factor=0.0), "edge_factor must be > 0"),
    ],
)
def test_invalid_input_is_one_line_matrix_error(call, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MatrixError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg
    assert needle in msg, msg
