"""The application families (circuit, lp, kkt, kronecker, cartesian, fem_mixed, road, arrow): each
one's structural signature, canonical output, determinism by seed, size control, and the family
sets that keep every earlier enumeration of "the families" as it was."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import MatrixError
from sparserl.matrices import generate
from sparserl.matrices.generators import (
    APPLICATION_FAMILIES,
    CLASSIC_FAMILIES,
    FAMILIES,
    HELD_OUT_FAMILIES,
    TARGET_FAMILIES,
    family_names,
    is_held_out,
)

from tests.matrices.test_generators import assert_canonical, rows_of

SIZES = (3, 10, 333, 4000)


def pattern(A) -> sp.csr_array:
    P = sp.csr_array((np.ones(A.nnz, dtype=np.int8), A.indices, A.indptr), shape=A.shape)
    return P


def same_pattern(A, B) -> bool:
    return A.shape == B.shape and (pattern(A) != pattern(B)).nnz == 0


def symmetric(A) -> bool:
    return same_pattern(A, sp.csr_array(pattern(A).T))


def test_the_classic_sets_stay_as_they_were() -> None:
    """Every default enumeration (data build, evaluate --matrices families, RL's generated
    matrices, benchmarks) reads family_names(): still the 13 classic families; the 11 of the
    targets are search_bench's set; the application families come only when asked for."""
    assert family_names() == list(CLASSIC_FAMILIES) and len(CLASSIC_FAMILIES) == 13
    assert TARGET_FAMILIES == ("diagonal", "banded", "stencil2d", "stencil3d_7", "stencil3d_27", "block", "random",
                               "powerlaw", "skewed", "empty_rows", "rectangular")
    assert family_names(include_application=True) == list(CLASSIC_FAMILIES) + list(APPLICATION_FAMILIES)
    assert list(FAMILIES) == family_names(include_application=True)
    assert len(APPLICATION_FAMILIES) >= 6 and not set(APPLICATION_FAMILIES) & set(CLASSIC_FAMILIES)
    assert set(HELD_OUT_FAMILIES) < set(APPLICATION_FAMILIES), "some are held out, some may be trained on"
    assert is_held_out("circuit_1000000") and is_held_out("fem_mixed_003_52000") and is_held_out("road")
    assert not any(is_held_out(n) for n in ("lp_1000000", "banded_5000", "roadNet-CA", "circuits_2", "kkt2"))


def test_default_enumerations_exclude_the_application_families(tmp_path) -> None:
    from sparserl.data.sft_build import SFTDataConfig, make_matrices
    from sparserl.eval.compare import EvalConfig, matrix_set

    names = {f for _, f in matrix_set(EvalConfig(matrices="families", family_rows=50))}
    assert names == set(CLASSIC_FAMILIES)
    entries = make_matrices(SFTDataConfig(out=str(tmp_path / "a"), matrices_per_family=1, min_rows=40, max_rows=60))
    assert {e.family for e in entries} == set(CLASSIC_FAMILIES)
    named = make_matrices(SFTDataConfig(out=str(tmp_path / "b"), families=("circuit", "lp"), matrices_per_family=1,
                                        min_rows=40, max_rows=60))
    assert {e.family for e in named} == {"circuit", "lp"}, "an application family can be named"


@pytest.mark.parametrize("family", APPLICATION_FAMILIES)
def test_canonical_deterministic_and_seeded(family: str) -> None:
    for rows in SIZES:
        A = generate(family, rows, seed=7)
        assert_canonical(A)
        B = generate(family, rows, seed=7)
        for x, y in ((A.indptr, B.indptr), (A.indices, B.indices), (A.data, B.data)):
            np.testing.assert_array_equal(x, y)
        if rows >= 333:
            C = generate(family, rows, seed=8)
            assert not (same_pattern(A, C) and np.array_equal(A.data, C.data))


@pytest.mark.parametrize("family,rows,shape", [
    ("circuit", 5000, (5000, 5000)), ("lp", 5000, (5000, 10000)), ("kkt", 5000, (5000, 5000)),
    ("kronecker", 5000, (71 * 70, 71 * 70)), ("cartesian", 5000, (16 * 312, 16 * 312)),
    ("fem_mixed", 5000, (71 * 71, 71 * 71)), ("road", 5000, (71 * 71, 71 * 71)), ("arrow", 5000, (5000, 5000)),
])
def test_size_control(family: str, rows: int, shape: tuple[int, int]) -> None:
    A = generate(family, rows, seed=0)
    assert A.shape == shape
    assert abs(A.shape[0] - rows) <= 0.02 * rows


def test_size_errors_are_one_line() -> None:
    for family in APPLICATION_FAMILIES:
        if FAMILIES[family].takes_cols:
            continue
        with pytest.raises(MatrixError, match="square") as e:
            generate(family, 400, cols=123)
        assert "\n" not in str(e.value)
    with pytest.raises(MatrixError, match="rows >= 3"):
        generate("road", 2)
    with pytest.raises(MatrixError, match="net_fill"):
        generate("circuit", 100, net_fill=0.0)
    with pytest.raises(MatrixError, match="staircase"):
        generate("lp", 100, staircase=2)


def test_circuit_has_supply_nets_far_longer_than_the_median_row() -> None:
    A = generate("circuit", 20000, seed=1)
    lengths = rows_of(A)
    assert symmetric(A) and np.all(A.diagonal() != 0)
    assert lengths.max() >= 100 * np.median(lengths)
    assert (lengths > 1000).sum() == 3  # the three supply nets
    quiet = generate("circuit", 20000, seed=1, supply_nets=0, far_fraction=0.0)
    assert rows_of(quiet).max() < 10 * np.median(rows_of(quiet)), "no supply nets, no long rows"
    P = sp.coo_array(pattern(quiet))
    assert np.abs(P.row - P.col).max() <= 32, "without far wires every connection is within the locality"


def test_lp_is_rectangular_blocky_with_linking_rows() -> None:
    rows, block_rows, n_link = 6000, 1000, 4
    A = generate("lp", rows, seed=2)
    n = 2 * rows
    assert A.shape == (rows, n)
    body = rows - n_link
    K = -(-body // block_rows)
    bounds = np.arange(K + 1) * n // K
    for r in range(0, body, 97):
        b = r * K // body
        cols = A.indices[A.indptr[r]:A.indptr[r + 1]]
        assert bounds[b] <= cols.min() and cols.max() < bounds[min(b + 2, K)], "a row stays in its block's staircase"
    lengths = rows_of(A)
    blocks = np.arange(body) * K // body
    assert all(len(set(lengths[:body][blocks == b])) == 1 for b in range(K)), "one row length per block"
    assert np.all(lengths[body:] == round(0.2 * n)), "the linking rows span a fifth of the columns"


def test_kkt_is_a_symmetric_saddle_point_with_a_zero_block() -> None:
    rows = 3000
    A = generate("kkt", rows, seed=3)
    p = round(0.3 * rows)
    nh = rows - p
    assert symmetric(A)
    assert A[[nh], :].nnz > 0 and sp.csr_array(A)[nh:, nh:].nnz == 0, "the multipliers' block is zero"
    assert np.all(rows_of(A)[nh:] == 4), "each constraint touches nnz_per_constraint variables"
    H = sp.csr_array(A)[:nh, :nh]
    assert same_pattern(H, sp.csr_array(sp.diags([np.ones(nh - abs(d)) for d in range(-2, 3)], range(-2, 3))))


def test_kronecker_is_the_product_of_its_factors() -> None:
    A = generate("kronecker", 2500, seed=4)
    a = b = 50
    assert A.shape == (a * b, a * b)
    H = sp.csr_array(A)[:b, :b]  # G has self loops: its (0, 0) block is H
    coo = sp.coo_array(pattern(A))
    G = sp.csr_array((np.ones(coo.nnz), (coo.row // b, coo.col // b)), shape=(a, a))
    G = sp.csr_array((np.ones(G.nnz, np.int8), G.indices, G.indptr), shape=(a, a))
    assert same_pattern(A, sp.csr_array(sp.kron(G, pattern(H))))
    assert A.nnz == G.nnz * H.nnz, "a graph product has the product's nonzeros"


def test_cartesian_is_a_graph_times_a_path() -> None:
    L, g = 16, 200
    A = generate("cartesian", L * g, seed=5)
    Gd = sp.csr_array(A)[:g, :g]
    path = sp.diags([np.ones(L - 1), np.ones(L - 1)], [-1, 1])
    want = sp.kron(sp.eye(L), pattern(Gd)) + sp.kron(path, sp.eye(g))
    assert same_pattern(A, sp.csr_array(want))
    assert A.nnz == L * Gd.nnz + 2 * (L - 1) * g
    assert symmetric(A) and np.all(A.diagonal() != 0)


def test_fem_mixed_rows_come_in_patches_of_element_types() -> None:
    A = generate("fem_mixed", 64 * 64, seed=6, patch=8)
    lengths = rows_of(A)
    assert symmetric(A) and lengths.max() <= 25
    interior = lengths.reshape(64, 64)[2:-2, 2:-2]
    for want in (7, 9, 25):  # triangles, bilinear and biquadratic quads, all present in 64 patches
        assert (interior == want).sum() > 0, want
    patch_interior = interior[8:13, 8:13]  # rows 10..14 of patch (1, 1): away from its edges
    assert len(set(patch_interior.ravel().tolist())) == 1, "one element type per patch"
    two = generate("fem_mixed", 2 * 64 * 64, seed=6, patch=8, dofs=2)
    assert two.shape == (2 * 64 * 64,) * 2
    np.testing.assert_array_equal(rows_of(two)[::2], 2 * lengths)
    np.testing.assert_array_equal(rows_of(two)[::2], rows_of(two)[1::2])


def test_road_is_a_sparse_planar_street_grid() -> None:
    A = generate("road", 100 * 100, seed=7)
    deg = rows_of(A)
    assert symmetric(A) and np.all(A.diagonal() == 0)
    assert deg.min() >= 1 and deg.max() <= 6 and 2.0 < deg.mean() < 3.5
    # ids are local within a map tile only: most streets join nearby ids, some jump across tiles
    coo = sp.coo_array(pattern(A))
    gap = np.abs(coo.row - coo.col)
    assert np.median(gap) <= 32 and gap.max() > 1000


def test_arrow_is_banded_with_a_dense_border() -> None:
    N, b = 2000, 4
    A = generate("arrow", N, seed=8)
    lengths = rows_of(A)
    assert np.all(lengths[-b:] == N), "dense border rows"
    assert np.all(np.diff(sp.csr_array(A)[: N - b, N - b:].indptr) == b), "every body row reaches the border"
    assert sp.csr_array(A)[:, N - b:].nnz == N * b, "dense border columns"
    body = sp.csr_array(A)[: N - b, : N - b]
    assert same_pattern(body, sp.csr_array(sp.diags([np.ones(N - b - abs(d)) for d in range(-2, 3)], range(-2, 3))))
