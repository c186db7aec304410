"""The matrix card: exact structure facts, no values; the fingerprint ignores values."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparserl.matrices import generate
from sparserl.matrices.card import MatrixCard, matrix_card, structure_fingerprint


def test_banded_card_lists_exact_offsets_and_bins() -> None:
    A = generate("banded", 2000, seed=1, bands=5)
    c = matrix_card(A)
    assert c.dia_offsets == (-2, -1, 0, 1, 2)
    assert (c.rows, c.cols, c.nnz) == (2000, 2000, A.nnz)
    assert sum(b.rows for b in c.bins) == 2000 and sum(b.nnz for b in c.bins) == A.nnz
    assert all(b.lo <= b.hi for b in c.bins)
    assert c.longest_rows[0][1] == 5
    text = c.render()
    assert "offsets -2 -1 0 1 2" in text and "2000 x 2000" in text


def test_card_has_no_values_and_fingerprint_ignores_them() -> None:
    A = generate("powerlaw", 3000, seed=2)
    B = sp.csr_array((np.random.default_rng(0).standard_normal(A.nnz).astype(np.float32), A.indices, A.indptr),
                     shape=A.shape)
    assert structure_fingerprint(A) == structure_fingerprint(B)
    assert matrix_card(A) == matrix_card(B)
    C = A.copy()
    C.indices = C.indices.copy()
    C.indices[0] = (C.indices[0] + 1) % A.shape[1] if A.indptr[1] == 1 else C.indices[0]
    if not np.array_equal(C.indices, A.indices):
        assert structure_fingerprint(C) != structure_fingerprint(A)


def test_many_diagonals_are_not_listed_and_card_round_trips() -> None:
    A = generate("random", 3000, seed=3, nnz_per_row=8)
    c = matrix_card(A)
    assert c.dia_offsets is None and c.num_diagonals > 64
    assert MatrixCard.from_dict(c.to_dict()) == c


def test_empty_rows_bin() -> None:
    A = sp.csr_array(np.array([[0, 0, 0], [1, 0, 2], [0, 0, 0]], dtype=np.float32))
    c = matrix_card(A)
    assert c.empty_rows == 2 and c.bins[0].lo == 0 and c.bins[0].rows == 2
    assert c.longest_rows == ((1, 2),)


def test_long_rows_are_listed_in_full_or_the_threshold_rises() -> None:
    A = generate("skewed", 8000, seed=1, long_len=700, long_fraction=0.01)  # 80 rows of 700, the rest 4
    c = matrix_card(A)
    lengths = np.diff(A.indptr)
    assert c.row_len_min == 4 and c.long_rows_min == 256
    assert sorted(r for r, _ in c.long_rows) == list(np.flatnonzero(lengths >= 256))
    assert all(n == 700 for _, n in c.long_rows)
    assert "rows of length >= 256: 80" in c.render()
    many = matrix_card(generate("skewed", 20000, seed=1, long_len=300, long_fraction=0.25))  # 5000 rows of 300
    assert many.long_rows == () and many.long_rows_min == 301  # more than LONG_ROWS_MAX reach 256
    assert many.rows_longer_than(299) is None and many.rows_longer_than(300) == ()
    assert MatrixCard.from_dict(c.to_dict()) == c


def test_block_rows_of_uniform_blocks() -> None:
    c = matrix_card(generate("block", 4000, seed=1, block=8, blocks_per_row=4))
    assert c.block_shape == (8, 8) and c.block_row_len == 4
    assert "4 per block row" in c.render()
    assert matrix_card(generate("random", 3000, seed=1)).block_row_len is None
