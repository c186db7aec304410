"""Seeded generators for the sparse structure families a kernel must handle.

Every generator returns a canonical ``csr_array`` (float32 values, int32 indices, sorted, no
duplicates) built directly from sorted arrays, never through COO. Values are float32 with
magnitude uniform in [0.5, 1.5) and a random sign, so no stored value is ever zero (the pattern
is exactly the structure). Everything is vectorised with numpy; the only Python loops run over
chunks of about 4M nonzeros (to bound temporaries at tens of millions of rows), over the points of
a stencil, and over the few top-up rounds of distinct-column sampling.

Use :func:`generate` (by family name, with parameter validation) rather than the family functions.
The same ``(family, rows, cols, seed, params)`` always gives the same matrix; a different seed
gives different values (and, for the random families, a different pattern).

Two families stress load balance from both sides: ``dense_lines`` (a random body with a few rows
and columns far denser than the rest, as in LP constraint matrices and circuit matrices with
supply nets) and ``rmat`` (an R-MAT graph: heavy-tailed degrees in rows and in columns at once).

Distinct columns per row (families random, powerlaw, skewed, empty_rows, rectangular, block,
dense_lines):
columns are drawn with replacement, rows sorted via one int64 sort of ``row * cols + col`` keys,
duplicates dropped, and each row that came out short is topped up with fresh draws (merged in
with ``searchsorted``) until it has exactly its target length. That is the same as taking the
first ``k`` distinct draws of an i.i.d. sequence: a uniform ``k``-subset for uniform columns, and
successive sampling without replacement for skewed ones (after 8 top-up rounds the remaining
shortfall is drawn uniformly, so a long row under a heavily skewed column law cannot stall). Rows
wanting more than half of the columns instead draw the (smaller) set of columns they leave out,
uniformly. Row lengths are therefore exact: ``min(target, cols)``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparserl.errors import MatrixError
from sparserl.matrices.io import MAX_INT32, csr_from_sorted_parts
from sparserl.parallel import parallel_map

log = logging.getLogger(__name__)

__all__ = ["APPLICATION_FAMILIES", "CLASSIC_FAMILIES", "FAMILIES", "HELD_OUT_FAMILIES", "TARGET_FAMILIES", "FamilySpec",
           "expected_nnz", "family_names", "generate", "is_held_out", "memory_estimate", "random_values"]

_CHUNK_NNZ = 1 << 22
"""Nonzeros built per chunk of rows (bounds int64 temporaries to a few tens of MB)."""

_BYTES_PER_NNZ = 24
_BYTES_PER_ROW = 16
"""Peak memory of a generator, measured at 8M-80M nonzeros (largest: stencil2d, 23 bytes per
nonzero; the matrix itself takes 8 per nonzero and 4 per row): what :func:`generate` checks
against the memory available before it builds anything."""

_SKEWED_TOPUP_ROUNDS = 8
"""Top-up rounds that use a family's skewed column sampler before falling back to uniform draws."""

Sampler = Callable[[np.random.Generator, int], np.ndarray]
"""``sampler(rng, k)`` draws ``k`` column ids (int64, with replacement) from some distribution."""


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def random_values(rng: np.random.Generator, k: int) -> np.ndarray:
    """``k`` float32 values with magnitude uniform in [0.5, 1.5) and a random sign (never zero).

    Built from one random uint32 per value: 23 mantissa bits give a float in [1, 2), minus 0.5 is
    exact in float32 (so the result never rounds up to 1.5), and the lowest bit is the sign.
    """
    out = np.empty(k, dtype=np.float32)
    for s in range(0, k, _CHUNK_NNZ):
        u = rng.integers(0, 2**32, size=min(_CHUNK_NNZ, k - s), dtype=np.uint32)
        mag = ((u >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(0.5)
        out[s : s + u.size] = (mag.view(np.uint32) | ((u & np.uint32(1)) << np.uint32(31))).view(np.float32)
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each (s, l), vectorised (int64)."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    first = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(starts.astype(np.int64) - first, lengths)


def _row_chunks(lengths_or_m: np.ndarray | int, per_row: float = 1.0) -> Iterator[tuple[int, int]]:
    """Split rows into ``[r0, r1)`` chunks of about ``_CHUNK_NNZ`` nonzeros.

    Given an array of row lengths, the split follows their running sum; given a row count, rows
    are assumed to hold ``per_row`` nonzeros each.
    """
    if isinstance(lengths_or_m, np.ndarray):
        m = lengths_or_m.size
        csum = np.cumsum(lengths_or_m, dtype=np.int64)
        r0 = 0
        while r0 < m:
            base = int(csum[r0 - 1]) if r0 else 0
            r1 = int(np.searchsorted(csum, base + _CHUNK_NNZ, side="right"))
            r1 = min(m, max(r1, r0 + 1))
            yield r0, r1
            r0 = r1
    else:
        step = max(1, int(_CHUNK_NNZ // max(per_row, 1.0)))
        for r0 in range(0, int(lengths_or_m), step):
            yield r0, min(int(lengths_or_m), r0 + step)


def _assemble(m: int, parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Join per-chunk (row lengths, int32 column indices) into (int64 indptr, int32 indices)."""
    lengths = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    assert lengths.size == m
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    indices = np.concatenate([p[1] for p in parts]).astype(np.int32, copy=False)
    return indptr, indices


def _finish(
    rng: np.random.Generator, family: str, indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int]
) -> sp.csr_array:
    """Attach random values and wrap as a canonical csr_array (pattern already sorted and distinct)."""
    nnz = int(indptr[-1])
    if nnz > MAX_INT32:
        raise MatrixError(
            f"{family}: {nnz} nonzeros exceed the 2**31-1 limit of int32 indices; use fewer rows"
        )
    if nnz == 0:
        raise MatrixError(
            f"{family}: parameters give a matrix with no nonzeros (shape {shape[0]} x {shape[1]})"
        )
    return csr_from_sorted_parts(random_values(rng, nnz), indices, indptr, shape)


def _check_size(family: str, rows: int, cols: int, per_row: float) -> None:
    estimate = rows * per_row
    if estimate > MAX_INT32:
        raise MatrixError(
            f"{family}: about {int(estimate)} nonzeros ({rows} rows x {per_row:g}) "
            "exceed the 2**31-1 limit of int32 indices"
        )
    if cols > MAX_INT32:
        raise MatrixError(f"{family}: {cols} columns exceed the 2**31-1 limit of int32 indices")


def _dedupe_sorted(keys: np.ndarray) -> np.ndarray:
    if keys.size < 2:
        return keys
    keep = np.empty(keys.size, dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _uniform_sampler(n: int) -> Sampler:
    return lambda rng, k: rng.integers(0, n, size=k, dtype=np.int64)


def _sample_sparse_keys(rng: np.random.Generator, target: np.ndarray, n: int, sampler: Sampler) -> np.ndarray:
    """Sorted keys ``row * n + col`` with exactly ``target[row]`` distinct columns per row.

    Requires ``2 * target <= n`` for every row (then a uniform draw hits a new column with
    probability >= 1/2, so the top-up rounds shrink the shortfall geometrically).
    """
    r = target.size
    rows = np.repeat(np.arange(r, dtype=np.int64), target)
    keys = rows * n + sampler(rng, rows.size)
    del rows
    keys.sort()
    keys = _dedupe_sorted(keys)
    have = np.bincount(keys // n, minlength=r)
    uniform = _uniform_sampler(n)
    for round_ in range(200):
        deficit = target - have
        short = np.flatnonzero(deficit)
        if short.size == 0:
            return keys
        draw = sampler if round_ < _SKEWED_TOPUP_ROUNDS else uniform
        new = np.repeat(short, deficit[short]) * n + draw(rng, int(deficit[short].sum()))
        new.sort()
        new = _dedupe_sorted(new)
        pos = np.searchsorted(keys, new)
        present = keys[np.minimum(pos, keys.size - 1)] == new if keys.size else np.zeros(new.size, bool)
        new, pos = new[~present], pos[~present]
        keys = np.insert(keys, pos, new)  # positions ascend and new is sorted: result stays sorted
        have += np.bincount(new // n, minlength=r)
    raise RuntimeError("distinct-column sampling did not converge")  # pragma: no cover - p < 2**-200


def _distinct_columns(
    rng: np.random.Generator, target: np.ndarray, n: int, sampler: Sampler | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For rows with ``target`` lengths (clipped to ``n``): (lengths int64, sorted distinct columns int32).

    Columns come from ``sampler`` (default uniform); rows wanting more than ``n / 2`` columns take
    all columns but a uniform random ``n - target`` of them.
    """
    target = np.minimum(target.astype(np.int64), n)
    sampler = sampler or _uniform_sampler(n)
    dense = 2 * target > n
    if not dense.any():
        keys = _sample_sparse_keys(rng, target, n, sampler)
    else:
        keys = _sample_sparse_keys(rng, np.where(dense, 0, target), n, sampler)
        drows = np.flatnonzero(dense)
        # columns each dense row leaves out: a sparse problem (at most n/2 per row), uniform
        excl = _sample_sparse_keys(rng, n - target[drows], n, _uniform_sampler(n))
        mask = np.ones((drows.size, n), dtype=bool)
        mask.ravel()[excl] = False  # key = local dense row * n + col = flat index into mask
        flat = np.flatnonzero(mask)
        dense_keys = drows[flat // n] * n + flat % n
        keys = np.concatenate((keys, dense_keys))
        keys.sort()
    cols = (keys % n).astype(np.int32)
    return target, cols


def _random_pattern(
    rng: np.random.Generator, lengths: np.ndarray, n: int, sampler: Sampler | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, indices int32) with distinct sorted columns, row ``i`` holding ``min(lengths[i], n)``."""
    lengths = np.minimum(lengths.astype(np.int64), n)
    parts = [_distinct_columns(rng, lengths[r0:r1], n, sampler) for r0, r1 in _row_chunks(lengths)]
    return _assemble(lengths.size, parts)


def _exact_subset(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """``k`` distinct row ids out of ``m``, uniformly (int64)."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    return rng.choice(m, size=k, replace=False, shuffle=False).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Families. Signature: fn(rng, rows, cols, **params) -> canonical csr_array.
# --------------------------------------------------------------------------------------------


def _need(cond: bool, family: str, msg: str) -> None:
    if not cond:
        raise MatrixError(f"{family}: {msg}")


def _diagonal(rng: np.random.Generator, rows: int, cols: int | None) -> sp.csr_array:
    n = rows if cols is None else cols
    _check_size("diagonal", rows, n, 1)
    k = min(rows, n)
    indptr = np.minimum(np.arange(rows + 1, dtype=np.int64), k)
    return _finish(rng, "diagonal", indptr, np.arange(k, dtype=np.int32), (rows, n))


def _banded(rng: np.random.Generator, rows: int, cols: int | None, *, bands: int) -> sp.csr_array:
    n = rows if cols is None else cols
    _need(bands >= 1, "banded", f"bands must be >= 1, got {bands}")
    _check_size("banded", rows, n, min(bands, n))
    lo = -(bands // 2)
    hi = lo + bands - 1
    parts = []
    for r0, r1 in _row_chunks(rows, min(bands, n)):
        i = np.arange(r0, r1, dtype=np.int64)
        start = np.maximum(i + lo, 0)
        stop = np.minimum(i + hi, n - 1)
        lengths = np.maximum(stop - start + 1, 0)
        parts.append((lengths, _ranges(start, lengths).astype(np.int32)))
    indptr, indices = _assemble(rows, parts)
    return _finish(rng, "banded", indptr, indices, (rows, n))


def _stencil(
    rng: np.random.Generator, family: str, dims: tuple[int, int, int], points: list[tuple[int, int, int]]
) -> sp.csr_array:
    """Stencil operator on an ``nz x ny x nx`` grid, row ``i = (z * ny + y) * nx + x`` (x fastest)."""
    nz, ny, nx = dims
    N = nz * ny * nx
    _check_size(family, N, N, len(points))
    flat = [dz * ny * nx + dy * nx + dx for dz, dy, dx in points]
    order = sorted(range(len(points)), key=lambda p: flat[p])  # column order within every row
    parts = []
    for r0, r1 in _row_chunks(N, len(points)):
        i = np.arange(r0, r1, dtype=np.int64)
        x, y, z = i % nx, (i // nx) % ny, i // (nx * ny)
        cols = np.empty((i.size, len(points)), dtype=np.int64)
        valid = np.empty((i.size, len(points)), dtype=bool)
        for slot, p in enumerate(order):
            dz, dy, dx = points[p]
            valid[:, slot] = (
                (x + dx >= 0) & (x + dx < nx) & (y + dy >= 0) & (y + dy < ny) & (z + dz >= 0) & (z + dz < nz)
            )
            cols[:, slot] = i + flat[p]
        parts.append((valid.sum(axis=1, dtype=np.int64), cols[valid].astype(np.int32)))
    indptr, indices = _assemble(N, parts)
    return _finish(rng, family, indptr, indices, (N, N))


def _grid_side(rows: int, dim: int) -> int:
    """``round(rows ** (1/dim))``, at least 1: the side of the ``dim``-D grid used for ``rows``."""
    return max(1, round(rows ** (1.0 / dim)))


def _stencil_cols(family: str, rows: int, cols: int | None, size: int, grid: str) -> None:
    if cols is not None and cols not in (rows, size):
        raise MatrixError(
            f"{family}: builds a square matrix on a {grid} grid ({size} x {size} for rows={rows}); "
            f"cols={cols} disagrees (leave cols out)"
        )


def _stencil2d(rng: np.random.Generator, rows: int, cols: int | None) -> sp.csr_array:
    s = _grid_side(rows, 2)
    _stencil_cols("stencil2d", rows, cols, s * s, f"{s}x{s}")
    pts = [(0, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)]
    return _stencil(rng, "stencil2d", (1, s, s), pts)


def _stencil3d_7(rng: np.random.Generator, rows: int, cols: int | None) -> sp.csr_array:
    s = _grid_side(rows, 3)
    _stencil_cols("stencil3d_7", rows, cols, s**3, f"{s}x{s}x{s}")
    pts = [(0, 0, 0), (-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)]
    return _stencil(rng, "stencil3d_7", (s, s, s), pts)


def _stencil3d_27(rng: np.random.Generator, rows: int, cols: int | None) -> sp.csr_array:
    s = _grid_side(rows, 3)
    _stencil_cols("stencil3d_27", rows, cols, s**3, f"{s}x{s}x{s}")
    pts = [(dz, dy, dx) for dz in (-1, 0, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    return _stencil(rng, "stencil3d_27", (s, s, s), pts)


def _block(
    rng: np.random.Generator, rows: int, cols: int | None, *, block: int, blocks_per_row: int
) -> sp.csr_array:
    n = rows if cols is None else cols
    b = block
    _need(b >= 1, "block", f"block must be >= 1, got {b}")
    _need(blocks_per_row >= 1, "block", f"blocks_per_row must be >= 1, got {blocks_per_row}")
    mb, nb = -(-rows // b), -(-n // b)
    k = min(blocks_per_row, nb)
    _check_size("block", rows, n, min(k * b, n))
    # block pattern: k distinct sorted block columns per block row
    bptr, bcols = _random_pattern(rng, np.full(mb, k, dtype=np.int64), nb)
    # element columns of each block row: J*b + 0..b-1, cut at n (only the last block column can be cut)
    ecols = (bcols.astype(np.int64)[:, None] * b + np.arange(b, dtype=np.int64)).ravel()
    keep = ecols < n
    pattern = ecols[keep].astype(np.int32)
    plen = keep.reshape(mb, k * b).sum(axis=1, dtype=np.int64)  # every block row has exactly k blocks
    pptr = np.zeros(mb + 1, dtype=np.int64)
    np.cumsum(plen, out=pptr[1:])
    parts = []
    for r0, r1 in _row_chunks(rows, k * b):
        brow = np.arange(r0, r1, dtype=np.int64) // b  # block row of each row
        lengths = plen[brow]
        parts.append((lengths, pattern[_ranges(pptr[brow], lengths)]))
    indptr, indices = _assemble(rows, parts)
    return _finish(rng, "block", indptr, indices, (rows, n))


def _random(rng: np.random.Generator, rows: int, cols: int | None, *, nnz_per_row: int) -> sp.csr_array:
    return _uniform_rows(rng, "random", rows, rows if cols is None else cols, nnz_per_row)


def _rectangular(rng: np.random.Generator, rows: int, cols: int | None, *, nnz_per_row: int) -> sp.csr_array:
    return _uniform_rows(rng, "rectangular", rows, 2 * rows if cols is None else cols, nnz_per_row)


def _uniform_rows(rng: np.random.Generator, family: str, rows: int, n: int, nnz_per_row: int) -> sp.csr_array:
    _need(nnz_per_row >= 1, family, f"nnz_per_row must be >= 1, got {nnz_per_row}")
    k = min(nnz_per_row, n)
    _check_size(family, rows, n, k)
    indptr, indices = _random_pattern(rng, np.full(rows, k, dtype=np.int64), n)
    return _finish(rng, family, indptr, indices, (rows, n))


def _powerlaw(
    rng: np.random.Generator, rows: int, cols: int | None, *, alpha: float, mean_degree: float
) -> sp.csr_array:
    n = rows if cols is None else cols
    _need(
        alpha > 1.0, "powerlaw", f"alpha must be > 1 (the mean row length is infinite otherwise), got {alpha}"
    )
    _need(mean_degree > 0, "powerlaw", f"mean_degree must be > 0, got {mean_degree}")
    _check_size("powerlaw", rows, n, min(n, 4 * mean_degree))  # rough: the tail is capped at n
    # row lengths: Pareto(shape alpha, scale xm), mean alpha*xm/(alpha-1) = mean_degree, rounded, <= n
    xm = mean_degree * (alpha - 1.0) / alpha
    u = 1.0 - rng.random(rows)  # (0, 1]
    lengths = np.minimum(np.rint(xm * u ** (-1.0 / alpha)), n).astype(np.int64)
    if int(lengths.sum()) > MAX_INT32:
        raise MatrixError(
            f"powerlaw: {int(lengths.sum())} nonzeros exceed the 2**31-1 limit of int32 indices"
        )
    # column popularity: rank r (0-based) has weight (r+1)**(-1/alpha), which makes column counts
    # follow the same tail exponent as row lengths; ranks are scattered over ids by a permutation.
    s = 1.0 / alpha
    top = (n + 1.0) ** (1.0 - s) - 1.0
    perm = rng.permutation(n).astype(np.int64)

    def sampler(g: np.random.Generator, k: int) -> np.ndarray:
        x = (1.0 + g.random(k) * top) ** (1.0 / (1.0 - s)) - 1.0  # inverse CDF of density (x+1)**-s on [0, n)
        return perm[np.minimum(x.astype(np.int64), n - 1)]

    indptr, indices = _random_pattern(rng, lengths, n, sampler)
    return _finish(rng, "powerlaw", indptr, indices, (rows, n))


def _skewed(
    rng: np.random.Generator,
    rows: int,
    cols: int | None,
    *,
    short_len: int,
    long_fraction: float,
    long_len: int | None,
) -> sp.csr_array:
    n = rows if cols is None else cols
    long_len = min(n, 4096) if long_len is None else long_len
    _need(short_len >= 0, "skewed", f"short_len must be >= 0, got {short_len}")
    _need(long_len >= 1, "skewed", f"long_len must be >= 1, got {long_len}")
    _need(0.0 <= long_fraction <= 1.0, "skewed", f"long_fraction must be in [0, 1], got {long_fraction}")
    n_long = 0 if long_fraction == 0 else min(rows, max(1, round(long_fraction * rows)))
    _check_size("skewed", rows, n, min(short_len, n) + n_long / rows * min(long_len, n))
    lengths = np.full(rows, short_len, dtype=np.int64)
    lengths[_exact_subset(rng, rows, n_long)] = long_len
    indptr, indices = _random_pattern(rng, lengths, n)
    return _finish(rng, "skewed", indptr, indices, (rows, n))


def _empty_rows(
    rng: np.random.Generator, rows: int, cols: int | None, *, empty_fraction: float, nnz_per_row: int
) -> sp.csr_array:
    n = rows if cols is None else cols
    _need(
        0.0 <= empty_fraction < 1.0, "empty_rows", f"empty_fraction must be in [0, 1), got {empty_fraction}"
    )
    _need(nnz_per_row >= 1, "empty_rows", f"nnz_per_row must be >= 1, got {nnz_per_row}")
    k = min(nnz_per_row, n)
    _check_size("empty_rows", rows, n, k)
    n_empty = min(rows - 1, round(empty_fraction * rows))  # keep at least one nonempty row
    lengths = np.full(rows, k, dtype=np.int64)
    lengths[_exact_subset(rng, rows, n_empty)] = 0
    indptr, indices = _random_pattern(rng, lengths, n)
    return _finish(rng, "empty_rows", indptr, indices, (rows, n))


def _dense_lines(
    rng: np.random.Generator,
    rows: int,
    cols: int | None,
    *,
    nnz_per_row: int,
    dense_rows: int,
    dense_cols: int,
    dense_fill: float,
) -> sp.csr_array:
    n = rows if cols is None else cols
    _need(nnz_per_row >= 0, "dense_lines", f"nnz_per_row must be >= 0, got {nnz_per_row}")
    _need(dense_rows >= 0 and dense_cols >= 0, "dense_lines",
          f"dense_rows and dense_cols must be >= 0, got {dense_rows} and {dense_cols}")
    _need(0.0 < dense_fill <= 1.0, "dense_lines", f"dense_fill must be in (0, 1], got {dense_fill}")
    k = min(nnz_per_row, n)
    d_rows, d_cols = min(dense_rows, rows), min(dense_cols, n)
    row_fill, col_fill = max(1, round(dense_fill * n)), max(1, round(dense_fill * rows))
    _check_size("dense_lines", rows, n, k + (d_rows * row_fill + d_cols * col_fill) / rows)
    lengths = np.full(rows, k, dtype=np.int64)
    lengths[_exact_subset(rng, rows, d_rows)] = row_fill
    indptr, indices = _random_pattern(rng, lengths, n)
    # dense columns: each in a uniform random col_fill of the rows, merged into the pattern row by row
    dcols = _exact_subset(rng, n, d_cols)
    extra = np.concatenate([_exact_subset(rng, rows, col_fill) * n + c for c in dcols]) if d_cols else np.zeros(0, np.int64)
    extra.sort()
    parts = []
    for r0, r1 in _row_chunks(np.diff(indptr)):
        a, b = int(indptr[r0]), int(indptr[r1])
        keys = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0 : r1 + 1])) * n + indices[a:b]
        lo, hi = np.searchsorted(extra, [r0 * n, r1 * n])
        keys = _dedupe_sorted(np.sort(np.concatenate((keys, extra[lo:hi]))))
        parts.append((np.bincount(keys // n - r0, minlength=r1 - r0).astype(np.int64), (keys % n).astype(np.int32)))
    indptr, indices = _assemble(rows, parts)
    return _finish(rng, "dense_lines", indptr, indices, (rows, n))


def _rmat(
    rng: np.random.Generator, rows: int, cols: int | None, *, edge_factor: float, a: float, b: float, c: float
) -> sp.csr_array:
    if cols is not None and cols != rows:
        raise MatrixError(f"rmat: builds a square graph matrix ({rows} x {rows}); cols={cols} disagrees (leave cols out)")
    _need(edge_factor > 0, "rmat", f"edge_factor must be > 0, got {edge_factor}")
    _need(min(a, b, c) > 0 and a + b + c < 1, "rmat", f"need a, b, c > 0 and a + b + c < 1, got {a}, {b}, {c}")
    _check_size("rmat", rows, rows, edge_factor)
    scale = max(1, math.ceil(math.log2(rows)))
    side = 1 << scale
    target = max(1, round(rows * edge_factor))
    keep_rate = (rows / side) ** 2
    perm = rng.permutation(side).astype(np.int64)  # vertex relabelling (as Graph500); ids >= rows are dropped
    batches, kept = [], 0
    while kept < target:
        draw = min(_CHUNK_NNZ, math.ceil((target - kept) / keep_rate * 1.05) + 16)
        src = np.zeros(draw, dtype=np.int64)
        dst = np.zeros(draw, dtype=np.int64)
        for _ in range(scale):  # one quadrant per level: a (0,0), b (0,1), c (1,0), d (1,1)
            u = rng.random(draw, dtype=np.float32)
            down = u >= a + b
            right = ((u >= a) & (u < a + b)) | (u >= a + b + c)
            src = (src << 1) | down
            dst = (dst << 1) | right
        src, dst = perm[src], perm[dst]
        ok = (src < rows) & (dst < rows)
        keys = (src[ok] * rows + dst[ok])[: target - kept]
        batches.append(keys)
        kept += keys.size
    keys = _dedupe_sorted(np.sort(np.concatenate(batches)))
    lengths = np.bincount(keys // rows, minlength=rows).astype(np.int64)
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return _finish(rng, "rmat", indptr, (keys % rows).astype(np.int32), (rows, rows))


# --------------------------------------------------------------------------------------------
# Application families: structures of real application classes the families above do not make.
# --------------------------------------------------------------------------------------------


def _distinct_sorted(rng: np.random.Generator, counts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """For each row ``i``, ``counts[i]`` distinct sorted integers in ``[0, widths[i])`` (requires
    ``counts <= widths``), rows concatenated (int64).

    Sorted draws with replacement from ``[0, width - count]`` spread apart by their rank
    (``y_k = x_(k) + k``): distinct and sorted by construction, one sort per chunk, no rejection
    rounds. (A random subset, though not a uniformly distributed one: good enough for a structure.)
    """
    counts, widths = counts.astype(np.int64), widths.astype(np.int64)
    out = []
    for r0, r1 in _row_chunks(counts):
        c = counts[r0:r1]
        total = int(c.sum())
        if total == 0:
            continue
        row = np.repeat(np.arange(r1 - r0, dtype=np.int64), c)
        span = (widths[r0:r1] - c + 1)[row]
        x = np.minimum((rng.random(total) * span).astype(np.int64), span - 1)
        big = int(span.max())
        keys = row * big + x
        keys.sort()
        first = np.zeros(c.size, dtype=np.int64)
        np.cumsum(c[:-1], out=first[1:])
        out.append(keys - row * big + np.arange(total, dtype=np.int64) - np.repeat(first, c))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _from_keys(keys: np.ndarray, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 indptr, int32 indices) of the pattern whose ``row * n + col`` keys are given (any
    order, duplicates allowed): sorted and deduplicated here."""
    keys.sort()
    keys = _dedupe_sorted(keys)
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // n, minlength=m), out=indptr[1:])
    return indptr, (keys % n).astype(np.int32)


def _symmetric_keys(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Keys of the edges ``src -> dst`` and of their reverses."""
    return np.concatenate((src * n + dst, dst * n + src))


def _random_graph(rng: np.random.Generator, n: int, degree: int, loops: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of an undirected random graph on ``n`` nodes: ``degree`` edges from each
    node to uniform random others (symmetrised; repeats merge), with every self loop when ``loops``."""
    src = np.repeat(np.arange(n, dtype=np.int64), degree)
    dst = rng.integers(0, n, size=src.size, dtype=np.int64)
    keep = dst != src
    keys = _symmetric_keys(src[keep], dst[keep], n)
    if loops:
        diag = np.arange(n, dtype=np.int64)
        keys = np.concatenate((keys, diag * n + diag))
    return _from_keys(keys, n, n)


def _square_family(family: str, rows: int, cols: int | None, size: int | None = None, how: str = "") -> None:
    """A square family: ``cols`` must be left out or agree (with ``rows``, or with ``size``, the
    rows the family makes from ``rows``: ``how``)."""
    size = rows if size is None else size
    if cols is not None and cols not in (rows, size):
        made = f"{size} x {size}{' (' + how + ')' if how else ''}"
        raise MatrixError(f"{family}: builds a square matrix, {made} for rows={rows}; cols={cols} disagrees "
                          "(leave cols out)")


def _band_nnz(m: int, n: int, offsets: range) -> int:
    """Nonzeros of the diagonals ``offsets`` of an ``m x n`` matrix."""
    d = np.arange(offsets.start, offsets.stop, dtype=np.int64)
    return int(np.maximum(np.minimum(m, n - d) - np.maximum(0, -d), 0).sum())


def _circuit(
    rng: np.random.Generator,
    rows: int,
    cols: int | None,
    *,
    local_degree: int,
    locality: int,
    far_fraction: float,
    supply_nets: int,
    net_fill: float,
) -> sp.csr_array:
    _square_family("circuit", rows, cols)
    m = rows
    _need(local_degree >= 0, "circuit", f"local_degree must be >= 0, got {local_degree}")
    _need(locality >= 1, "circuit", f"locality must be >= 1, got {locality}")
    _need(0.0 <= far_fraction <= 1.0, "circuit", f"far_fraction must be in [0, 1], got {far_fraction}")
    _need(supply_nets >= 0, "circuit", f"supply_nets must be >= 0, got {supply_nets}")
    _need(0.0 < net_fill <= 1.0, "circuit", f"net_fill must be in (0, 1], got {net_fill}")
    k = min(local_degree, locality)
    fill = max(1, round(net_fill * m))
    nets = min(supply_nets, m)
    _check_size("circuit", m, m, 1 + 2 * k + 2 * nets * fill / m)
    # device terminals: k distinct nodes among the next `locality` (netlist order is local), a
    # `far_fraction` of them rewired to any node; every connection both ways
    src = np.repeat(np.arange(m, dtype=np.int64), k)
    dst = src + 1 + _distinct_sorted(rng, np.full(m, k, dtype=np.int64), np.full(m, locality, dtype=np.int64))
    far = rng.random(src.size) < far_fraction
    dst[far] = rng.integers(0, m, size=int(far.sum()), dtype=np.int64)
    keep = (dst < m) & (dst != src)
    src, dst = src[keep], dst[keep]
    # supply nets (power, ground, clock): a few nodes wired to a `net_fill` share of all nodes
    hubs = _exact_subset(rng, m, nets)
    hsrc = np.repeat(hubs, fill)
    hdst = np.concatenate([_exact_subset(rng, m, fill) for _ in range(nets)]) if nets else np.zeros(0, np.int64)
    diag = np.arange(m, dtype=np.int64)
    keys = np.concatenate((_symmetric_keys(src, dst, m), _symmetric_keys(hsrc, hdst, m), diag * m + diag))
    del src, dst, hsrc, hdst, far, keep
    indptr, indices = _from_keys(keys, m, m)
    return _finish(rng, "circuit", indptr, indices, (m, m))


def _lp(
    rng: np.random.Generator,
    rows: int,
    cols: int | None,
    *,
    block_rows: int,
    nnz_per_row: int,
    linking_rows: int,
    linking_fill: float,
    staircase: int,
) -> sp.csr_array:
    n = 2 * rows if cols is None else cols
    _need(block_rows >= 1, "lp", f"block_rows must be >= 1, got {block_rows}")
    _need(nnz_per_row >= 1, "lp", f"nnz_per_row must be >= 1, got {nnz_per_row}")
    _need(linking_rows >= 0, "lp", f"linking_rows must be >= 0, got {linking_rows}")
    _need(0.0 < linking_fill <= 1.0, "lp", f"linking_fill must be in (0, 1], got {linking_fill}")
    _need(staircase in (0, 1), "lp", f"staircase must be 0 or 1, got {staircase}")
    n_link = min(linking_rows, rows - 1)
    body = rows - n_link
    link_len = min(n, max(1, round(linking_fill * n)))
    _check_size("lp", rows, n, min(2 * nnz_per_row, n) + n_link * link_len / rows)
    # diagonal blocks of about `block_rows` constraints over an equal share of the variables (a
    # stage, a period, a commodity); with `staircase`, a block's rows also reach the next block's
    # variables. Each block is one constraint type: all its rows have the same length.
    K = max(1, min(-(-body // block_rows), n))
    bounds = np.arange(K + 1, dtype=np.int64) * n // K
    block = np.arange(body, dtype=np.int64) * K // body
    start = bounds[block]
    width = bounds[np.minimum(block + 1 + staircase, K)] - start
    per_block = np.maximum(1, np.rint(nnz_per_row * 2.0 ** rng.uniform(-1.0, 1.0, size=K))).astype(np.int64)
    lengths = np.minimum(per_block[block], width)
    body_cols = np.repeat(start, lengths) + _distinct_sorted(rng, lengths, width)
    # linking rows at the bottom (budget, capacity): each over a `linking_fill` share of all variables
    link_lengths, link_cols = _distinct_columns(rng, np.full(n_link, link_len, dtype=np.int64), n)
    indptr, indices = _assemble(rows, [(lengths, body_cols.astype(np.int32)), (link_lengths, link_cols)])
    return _finish(rng, "lp", indptr, indices, (rows, n))


def _kkt(
    rng: np.random.Generator,
    rows: int,
    cols: int | None,
    *,
    constraint_fraction: float,
    half_bandwidth: int,
    nnz_per_constraint: int,
) -> sp.csr_array:
    _square_family("kkt", rows, cols)
    _need(0.0 <= constraint_fraction < 1.0, "kkt",
          f"constraint_fraction must be in [0, 1), got {constraint_fraction}")
    _need(half_bandwidth >= 0, "kkt", f"half_bandwidth must be >= 0, got {half_bandwidth}")
    _need(nnz_per_constraint >= 1, "kkt", f"nnz_per_constraint must be >= 1, got {nnz_per_constraint}")
    N = rows
    p = min(N - 1, round(constraint_fraction * N))
    nh = N - p
    k = min(nnz_per_constraint, nh)
    _check_size("kkt", N, N, (nh * (2 * half_bandwidth + 1) + 2 * p * k) / N)
    # [[H, A^T], [A, 0]]: H (nh x nh) a banded Hessian, A (p x nh) the constraints' Jacobian with
    # `nnz_per_constraint` variables each, and the zero block of the multipliers
    i = np.arange(nh, dtype=np.int64)
    lo = np.maximum(i - half_bandwidth, 0)
    hlen = np.minimum(i + half_bandwidth, nh - 1) - lo + 1
    h_keys = np.repeat(i, hlen) * N + _ranges(lo, hlen)
    keys = h_keys
    if p:
        aptr, acols = _random_pattern(rng, np.full(p, k, dtype=np.int64), nh)
        arow = np.repeat(np.arange(nh, N, dtype=np.int64), np.diff(aptr))
        keys = np.concatenate((h_keys, _symmetric_keys(arow, acols.astype(np.int64), N)))
        del h_keys, arow, acols
    indptr, indices = _from_keys(keys, N, N)
    return _finish(rng, "kkt", indptr, indices, (N, N))


def _kron_sides(rows: int) -> tuple[int, int]:
    a = max(1, round(math.sqrt(rows)))
    return a, max(1, rows // a)


def _kronecker(
    rng: np.random.Generator, rows: int, cols: int | None, *, outer_degree: int, inner_degree: int
) -> sp.csr_array:
    a, b = _kron_sides(rows)
    N = a * b
    _square_family("kronecker", rows, cols, N, f"a {a}-node graph times a {b}-node graph")
    _need(outer_degree >= 0 and inner_degree >= 0, "kronecker",
          f"outer_degree and inner_degree must be >= 0, got {outer_degree} and {inner_degree}")
    _check_size("kronecker", N, N, min(a, 1 + 2 * outer_degree) * min(b, 1 + 2 * inner_degree))
    # G (a nodes) x H (b nodes), both with self loops: row (i, j) = i * b + j holds g * b + h for
    # every g in G's row i and h in H's row j, already in order
    gptr, gcols = _random_graph(rng, a, outer_degree, loops=True)
    hptr, hcols = _random_graph(rng, b, inner_degree, loops=True)
    glen, hlen = np.diff(gptr), np.diff(hptr)
    parts = []
    for r0, r1 in _row_chunks(N, float((glen.mean() if a else 1) * (hlen.mean() if b else 1))):
        r = np.arange(r0, r1, dtype=np.int64)
        i, j = r // b, r % b
        lengths = glen[i] * hlen[j]
        at = _ranges(np.zeros(r.size, dtype=np.int64), lengths)  # position within the row
        ri, rj, rh = np.repeat(i, lengths), np.repeat(j, lengths), np.repeat(hlen[j], lengths)
        c = gcols[gptr[ri] + at // rh].astype(np.int64) * b + hcols[hptr[rj] + at % rh]
        parts.append((lengths, c.astype(np.int32)))
    indptr, indices = _assemble(N, parts)
    return _finish(rng, "kronecker", indptr, indices, (N, N))


def _cartesian(rng: np.random.Generator, rows: int, cols: int | None, *, layers: int, degree: int) -> sp.csr_array:
    _need(layers >= 1, "cartesian", f"layers must be >= 1, got {layers}")
    _need(degree >= 0, "cartesian", f"degree must be >= 0, got {degree}")
    L = min(layers, rows)
    g = max(1, rows // L)
    N = L * g
    _square_family("cartesian", rows, cols, N, f"{L} layers of a {g}-node graph")
    _check_size("cartesian", N, N, 3 + 2 * degree)
    # G (g nodes) times a path of L layers (a time-expanded network): node v of layer l is row
    # l * g + v, linked to its G neighbours in its layer and to itself in the layers before and after
    gptr, gcols = _random_graph(rng, g, degree, loops=True)  # the loop is the diagonal
    glen = np.diff(gptr)
    parts = []
    for r0, r1 in _row_chunks(N, float(glen.mean() + 2)):
        r = np.arange(r0, r1, dtype=np.int64)
        l, v = r // g, r % g
        up, down = (l > 0).astype(np.int64), (l < L - 1).astype(np.int64)
        lengths = up + glen[v] + down
        first = np.zeros(r.size, dtype=np.int64)
        np.cumsum(lengths[:-1], out=first[1:])
        c = np.empty(int(lengths.sum()), dtype=np.int64)
        c[first[up == 1]] = r[up == 1] - g
        c[(first + lengths - 1)[down == 1]] = r[down == 1] + g
        c[_ranges(first + up, glen[v])] = np.repeat(l * g, glen[v]) + gcols[_ranges(gptr[v], glen[v])]
        parts.append((lengths, c.astype(np.int32)))
    indptr, indices = _assemble(N, parts)
    return _finish(rng, "cartesian", indptr, indices, (N, N))


_FEM_OFFSETS = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
"""Every node coupling the mixed-element mesh can have, in column order (dy, then dx)."""
_FEM_TYPES = (
    {(0, 0), (0, -1), (0, 1), (-1, 0), (1, 0), (1, 1), (-1, -1)},  # linear triangles: 7 couplings
    {(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)},  # bilinear quadrilaterals: 9
    set(_FEM_OFFSETS),  # biquadratic quadrilaterals: 25
)
"""The node couplings of each element type (each set symmetric: o in it iff -o in it)."""


def _fem_mixed(rng: np.random.Generator, rows: int, cols: int | None, *, patch: int, dofs: int) -> sp.csr_array:
    _need(patch >= 1, "fem_mixed", f"patch must be >= 1, got {patch}")
    _need(1 <= dofs <= 8, "fem_mixed", f"dofs must be in 1..8, got {dofs}")
    s = _grid_side(max(1, rows // dofs), 2)
    nodes = s * s
    N = nodes * dofs
    _square_family("fem_mixed", rows, cols, N, f"an {s}x{s} node mesh, {dofs} unknowns per node")
    _check_size("fem_mixed", N, N, 25 * dofs)
    # an s x s node mesh cut into patch x patch patches, each meshed with one element type; two
    # nodes couple when an element of either one's patch joins them (so the pattern is symmetric)
    npatch = -(-s // patch)
    ptype = rng.integers(0, len(_FEM_TYPES), size=(npatch, npatch)).astype(np.int8)
    side = np.arange(s, dtype=np.int64) // patch
    ntype = ptype[side[:, None], side[None, :]].ravel()  # each node's element type
    has = np.array([[o in t for o in _FEM_OFFSETS] for t in _FEM_TYPES])  # (types, offsets)
    parts = []
    for r0, r1 in _row_chunks(nodes, 25):
        i = np.arange(r0, r1, dtype=np.int64)
        y, x = i // s, i % s
        ti = ntype[r0:r1]
        present = np.empty((len(_FEM_OFFSETS), i.size), dtype=bool)  # offset-major: contiguous writes
        nbr = np.empty((len(_FEM_OFFSETS), i.size), dtype=np.int64)
        for o, (dy, dx) in enumerate(_FEM_OFFSETS):
            j = i + dy * s + dx
            inside = (y + dy >= 0) & (y + dy < s) & (x + dx >= 0) & (x + dx < s)
            tj = ntype[np.clip(j, 0, nodes - 1)]
            h = has[:, o]
            present[o] = inside & (h[ti] | h[tj])
            nbr[o] = j
        nlen = present.sum(axis=0, dtype=np.int64)
        ncols = nbr.T[present.T]  # row by row, in column order
        if dofs == 1:
            parts.append((nlen, ncols.astype(np.int32)))
            continue
        # dofs unknowns per node: every coupling becomes a dense dofs x dofs block
        xcols = (ncols[:, None] * dofs + np.arange(dofs, dtype=np.int64)).ravel()
        xlen = nlen * dofs
        xfirst = np.zeros(i.size, dtype=np.int64)
        np.cumsum(xlen[:-1], out=xfirst[1:])
        lengths = np.repeat(xlen, dofs)
        parts.append((lengths, xcols[_ranges(np.repeat(xfirst, dofs), lengths)].astype(np.int32)))
    indptr, indices = _assemble(N, parts)
    return _finish(rng, "fem_mixed", indptr, indices, (N, N))


def _road(
    rng: np.random.Generator, rows: int, cols: int | None, *, keep: float, diagonal: float, tile: int
) -> sp.csr_array:
    s = _grid_side(rows, 2)
    N = s * s
    _square_family("road", rows, cols, N, f"an {s}x{s} street grid")
    _need(s >= 2, "road", f"needs rows >= 3 (a 2 x 2 grid at least), got {rows}")
    _need(0.0 < keep <= 1.0, "road", f"keep must be in (0, 1], got {keep}")
    _need(0.0 <= diagonal <= 1.0, "road", f"diagonal must be in [0, 1], got {diagonal}")
    _need(tile >= 1, "road", f"tile must be >= 1, got {tile}")
    _check_size("road", N, N, 6)
    # a planar street grid: each grid street kept with probability `keep`, one diagonal per block
    # with probability `diagonal` (never two crossing), every node on at least one street; the
    # node order is by map tile, the tiles in random order (ids local within a tile only)
    i = np.arange(N, dtype=np.int64)
    y, x = i // s, i % s
    right = i[(x < s - 1) & (rng.random(N) < keep)]
    down = i[(y < s - 1) & (rng.random(N) < keep)]
    diag = i[(x < s - 1) & (y < s - 1) & (rng.random(N) < diagonal)]
    src = np.concatenate((right, down, diag))
    dst = np.concatenate((right + 1, down + s, diag + s + 1))
    lonely = i[np.bincount(np.concatenate((src, dst)), minlength=N) == 0]
    lx = lonely % s
    src = np.concatenate((src, lonely))
    dst = np.concatenate((dst, np.where(lx < s - 1, lonely + 1, lonely - 1)))
    t = min(tile, s)
    nt = -(-s // t)
    tile_rank = rng.permutation(nt * nt).astype(np.int64)
    order = np.argsort(tile_rank[(y // t) * nt + x // t] * (t * t) + (y % t) * t + x % t, kind="stable")
    relabel = np.empty(N, dtype=np.int64)
    relabel[order] = i
    indptr, indices = _from_keys(_symmetric_keys(relabel[src], relabel[dst], N), N, N)
    return _finish(rng, "road", indptr, indices, (N, N))


def _arrow(rng: np.random.Generator, rows: int, cols: int | None, *, bands: int, border: int) -> sp.csr_array:
    _square_family("arrow", rows, cols)
    _need(bands >= 1, "arrow", f"bands must be >= 1, got {bands}")
    _need(border >= 0, "arrow", f"border must be >= 0, got {border}")
    N = rows
    b = min(border, N - 1)
    body = N - b
    _check_size("arrow", N, N, min(bands, body) + 2 * b)
    # a banded body (bands adjacent diagonals, as `banded`) bordered by `border` dense rows and
    # columns at the end: an arrowhead, the pattern of a banded matrix plus a low-rank update
    lo = -(bands // 2)
    parts = []
    for r0, r1 in _row_chunks(body, min(bands, body) + b):
        r = np.arange(r0, r1, dtype=np.int64)
        start = np.maximum(r + lo, 0)
        blen = np.maximum(np.minimum(r + lo + bands - 1, body - 1) - start + 1, 0)
        lengths = blen + b
        first = np.zeros(r.size, dtype=np.int64)
        np.cumsum(lengths[:-1], out=first[1:])
        c = np.empty(int(lengths.sum()), dtype=np.int64)
        c[_ranges(first, blen)] = _ranges(start, blen)
        c[_ranges(first + blen, np.full(r.size, b, dtype=np.int64))] = np.tile(np.arange(body, N, dtype=np.int64),
                                                                              r.size)
        parts.append((lengths, c.astype(np.int32)))
    full = np.arange(N, dtype=np.int32)
    parts.append((np.full(b, N, dtype=np.int64), np.tile(full, b)))
    indptr, indices = _assemble(N, parts)
    return _finish(rng, "arrow", indptr, indices, (N, N))


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilySpec:
    """One generator family: its function, what it builds, and its parameters' defaults."""

    fn: Callable[..., sp.csr_array]
    """``fn(rng, rows, cols, **params)``; call through :func:`generate`, which validates."""
    description: str
    """One line: the structure built and how ``rows``/``cols`` are used."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Every parameter the family accepts, with its default (``None`` = derived, see description)."""
    takes_cols: bool = True
    """Whether ``cols`` is free (False: square by construction; a disagreeing ``cols`` is an error)."""
    bytes_per_nnz: int = _BYTES_PER_NNZ
    """Peak memory per (expected) nonzero while generating (see :func:`memory_estimate`)."""
    fixed_bytes: int = 0
    """Peak memory besides that: temporaries of one chunk of rows, whatever the size."""
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Integer parameters a data set may draw matrix by matrix (inclusive ranges; :func:`draw_params`): those
    that change the facts a specialised kernel bakes in (bands, row lengths, blocks per block row). A teacher
    whose matrices all have the defaults shows one set of facts, which a policy then writes from memory."""


_APPLICATION_CHUNK_BYTES = 192 << 20
"""Temporaries of one chunk of rows of an application family (measured: at most 190 MB, kronecker)."""

FAMILIES: dict[str, FamilySpec] = {
    "diagonal": FamilySpec(_diagonal, "main diagonal only (min(rows, cols) nonzeros)"),
    "banded": FamilySpec(
        _banded, "`bands` adjacent diagonals, offsets -bands//2 .. , clipped at the edges", {"bands": 9},
        ranges={"bands": (3, 25)},
    ),
    "stencil2d": FamilySpec(
        _stencil2d,
        "5-point stencil on an s x s grid, s = round(sqrt(rows)); rows becomes s*s",
        takes_cols=False,
    ),
    "stencil3d_7": FamilySpec(
        _stencil3d_7,
        "7-point stencil on an s^3 grid, s = round(cbrt(rows)); rows becomes s^3",
        takes_cols=False,
    ),
    "stencil3d_27": FamilySpec(
        _stencil3d_27,
        "27-point stencil on an s^3 grid, s = round(cbrt(rows)); rows becomes s^3",
        takes_cols=False,
    ),
    "block": FamilySpec(
        _block,
        "dense `block` x `block` blocks at `blocks_per_row` distinct random block columns per block row "
        "(edge blocks cut)",
        {"block": 8, "blocks_per_row": 4},
        ranges={"blocks_per_row": (2, 8)},
    ),
    "random": FamilySpec(
        _random, "`nnz_per_row` distinct uniform random columns per row", {"nnz_per_row": 16},
        ranges={"nnz_per_row": (4, 32)},
    ),
    "powerlaw": FamilySpec(
        _powerlaw,
        "graph-like: Pareto(`alpha`) row lengths with mean `mean_degree` (capped at cols), power-law column popularity",
        {"alpha": 2.0, "mean_degree": 8.0},
    ),
    "skewed": FamilySpec(
        _skewed,
        "rows of `short_len` plus a `long_fraction` (at least one row) of `long_len` rows (default min(cols, 4096))",
        {"short_len": 4, "long_fraction": 0.001, "long_len": None},
    ),
    "empty_rows": FamilySpec(
        _empty_rows,
        "random rows of `nnz_per_row`, with round(`empty_fraction` * rows) of them empty",
        {"empty_fraction": 0.3, "nnz_per_row": 16},
    ),
    "rectangular": FamilySpec(
        _rectangular,
        "random rows of `nnz_per_row` columns; cols defaults to 2 * rows (cols < rows allowed)",
        {"nnz_per_row": 8},
        ranges={"nnz_per_row": (4, 16)},
    ),
    "dense_lines": FamilySpec(
        _dense_lines,
        "random rows of `nnz_per_row` plus `dense_rows` rows and `dense_cols` columns at random positions, each "
        "filled to `dense_fill` of its length (LP linking rows, circuit supply nets)",
        {"nnz_per_row": 8, "dense_rows": 4, "dense_cols": 4, "dense_fill": 0.5},
    ),
    "rmat": FamilySpec(
        _rmat,
        "R-MAT graph: recursive quadrants `a`, `b`, `c` (d = 1-a-b-c), about rows * `edge_factor` edges before "
        "duplicates merge, vertex ids permuted; heavy-tailed row and column degrees; square",
        {"edge_factor": 8.0, "a": 0.57, "b": 0.19, "c": 0.19},
        takes_cols=False,
    ),
    "circuit": FamilySpec(
        _circuit,
        "circuit simulation: each node wired to `local_degree` of the next `locality` nodes (a `far_fraction` "
        "rewired anywhere), plus `supply_nets` nets each touching `net_fill` of all nodes; diagonal; "
        "structurally symmetric; square",
        {"local_degree": 2, "locality": 32, "far_fraction": 0.05, "supply_nets": 3, "net_fill": 0.1},
        takes_cols=False,
        bytes_per_nnz=32,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "lp": FamilySpec(
        _lp,
        "LP constraints: diagonal blocks of `block_rows` rows over equal shares of the columns (`staircase` 1: "
        "also the next block's), each block one row length around `nnz_per_row` (x0.5-x2), plus `linking_rows` "
        "rows at the bottom over `linking_fill` of all columns; cols defaults to 2 * rows",
        {"block_rows": 1000, "nnz_per_row": 6, "linking_rows": 4, "linking_fill": 0.2, "staircase": 1},
        bytes_per_nnz=32,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "kkt": FamilySpec(
        _kkt,
        "optimisation KKT saddle point [[H, A^T], [A, 0]]: H banded (`half_bandwidth`), A a "
        "`constraint_fraction` of the rows with `nnz_per_constraint` random variables each, a zero block; "
        "symmetric; square",
        {"constraint_fraction": 0.3, "half_bandwidth": 2, "nnz_per_constraint": 4},
        takes_cols=False,
        bytes_per_nnz=32,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "kronecker": FamilySpec(
        _kronecker,
        "Kronecker product G x H of two random graphs with self loops (`outer_degree`, `inner_degree` edges "
        "per node), a = round(sqrt(rows)) and b = rows // a nodes; rows becomes a * b",
        {"outer_degree": 1, "inner_degree": 2},
        takes_cols=False,
        bytes_per_nnz=32,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "cartesian": FamilySpec(
        _cartesian,
        "Cartesian product of a random graph (`degree` edges per node) and a path of `layers` nodes (a "
        "time-expanded network): block tridiagonal, identity off-diagonal blocks; rows becomes a multiple of layers",
        {"layers": 16, "degree": 2},
        takes_cols=False,
        bytes_per_nnz=40,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "fem_mixed": FamilySpec(
        _fem_mixed,
        "FEM with mixed element types: an s x s node mesh in `patch` x `patch` patches of linear triangles, "
        "bilinear or biquadratic quads (7, 9 or 25 couplings), `dofs` unknowns per node; symmetric; "
        "rows becomes s*s*dofs",
        {"patch": 16, "dofs": 1},
        takes_cols=False,
        bytes_per_nnz=24,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "road": FamilySpec(
        _road,
        "road network: a planar s x s street grid, each street kept with probability `keep`, a diagonal per "
        "block with probability `diagonal`, no isolated node, ids by map `tile` in random tile order; symmetric, "
        "no diagonal; rows becomes s*s",
        {"keep": 0.6, "diagonal": 0.1, "tile": 32},
        takes_cols=False,
        bytes_per_nnz=24,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
    "arrow": FamilySpec(
        _arrow,
        "banded plus low rank: `bands` adjacent diagonals bordered by `border` dense rows and columns at the end "
        "(an arrowhead); square",
        {"bands": 5, "border": 4},
        takes_cols=False,
        bytes_per_nnz=32,
        fixed_bytes=_APPLICATION_CHUNK_BYTES,
    ),
}
"""Generator families by name, in a stable order: the classic families (:data:`CLASSIC_FAMILIES`)
first, then the application families (:data:`APPLICATION_FAMILIES`)."""

CLASSIC_FAMILIES: tuple[str, ...] = (
    "diagonal", "banded", "stencil2d", "stencil3d_7", "stencil3d_27", "block",
    "random", "powerlaw", "skewed", "empty_rows", "rectangular", "dense_lines", "rmat",
)  # fmt: skip
"""The 13 families every enumeration of "the families" means by default (:func:`family_names`:
``data build``'s default families, ``evaluate --matrices families``, RL's generated training
matrices, the benchmarks that list all families), kept fixed so that earlier figures stay
reproducible."""

TARGET_FAMILIES: tuple[str, ...] = CLASSIC_FAMILIES[:11]
"""The 11 families the project's targets quote ("the 11 families at 1M rows"): the classic ones
less dense_lines and rmat (``benchmarks/search_bench.py``'s default set)."""

APPLICATION_FAMILIES: tuple[str, ...] = ("circuit", "lp", "kkt", "kronecker", "cartesian", "fem_mixed", "road",
                                         "arrow")
"""Structures of real application classes that the classic families do not make (circuit
simulation, LP constraints, KKT saddle points, graph products, mixed-element FEM, road networks,
banded plus low rank). Only named explicitly (or with ``family_names(include_application=True)``):
no default set includes them, so the classic sets stay as they were."""

HELD_OUT_FAMILIES: tuple[str, ...] = ("circuit", "kkt", "fem_mixed", "road")
"""Application families no learned component is fitted on: the cost model's training leaves out
every matrix of these families (and SFT/RL data builds should too), so that the search and the
cost model are judged on them as on structures they have never seen (:func:`is_held_out` tells
by a matrix's name). The other application families (lp, kronecker, cartesian, arrow) may be
trained on."""


def is_held_out(name: str) -> bool:
    """Whether a generated matrix's name (``FAMILY_...``, as data build, evaluate, the benchmarks
    and the best-known store name them) is of a held-out family: what a learned component's
    training data leaves out."""
    return any(name == f or name.startswith(f + "_") for f in HELD_OUT_FAMILIES)


def draw_params(family: str, rng: np.random.Generator) -> dict[str, int]:
    """One draw of ``family``'s :attr:`FamilySpec.ranges` parameters from ``rng`` (uniform integers in each
    inclusive range, in the order listed; {} for a family without ranges: no draw is taken from ``rng``)."""
    if family not in FAMILIES:
        raise MatrixError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    return {k: int(rng.integers(lo, hi + 1)) for k, (lo, hi) in FAMILIES[family].ranges.items()}


def generated_name(family: str, index: int, rows: int) -> str:
    """The name data build gives the ``index``-th matrix it generates of ``family`` (``stencil3d_7_003_366971``)."""
    return f"{family}_{index:03d}_{rows}"


def family_of_generated(name: str) -> str | None:
    """The family of a name made by :func:`generated_name`, or None for any other name (a real matrix's, such
    as SuiteSparse's ``lp_ship04l``, even where it starts with a family's name)."""
    family, sep, rest = name.rpartition("_")
    family, sep2, index = family.rpartition("_")
    if sep and sep2 and family in FAMILIES and len(index) == 3 and index.isdigit() and rest.isdigit():
        return family
    return None


def family_names(include_application: bool = False) -> list[str]:
    """Names of the classic generator families (:data:`CLASSIC_FAMILIES`), in registry order;
    with ``include_application`` every family, the application ones after them."""
    return list(FAMILIES) if include_application else list(CLASSIC_FAMILIES)


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _coerce_params(family: str, spec: FamilySpec, params: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - set(spec.defaults))
    if unknown:
        valid = ", ".join(f"{k}={v}" for k, v in spec.defaults.items()) or "none"
        raise MatrixError(
            f"{family}: unknown parameter(s) {', '.join(unknown)}; valid (with defaults): {valid}"
        )
    out = dict(spec.defaults)
    for key, value in params.items():
        default = spec.defaults[key]
        if isinstance(default, float):
            ok = (_is_int(value) or isinstance(value, (float, np.floating))) and math.isfinite(float(value))
            want = "a finite number"
            value = float(value) if ok else value
        else:  # int or None (an int that defaults to a derived value)
            ok = _is_int(value) or (value is None and default is None)
            want = "an integer"
            value = int(value) if _is_int(value) else value
        if not ok:
            raise MatrixError(f"{family}: parameter {key} must be {want}, got {value!r}")
        out[key] = value
    return out


def expected_nnz(family: str, rows: int, cols: int | None, params: dict[str, Any]) -> int:
    """The number of nonzeros ``generate(family, rows, cols=cols, **params)`` builds, from the
    arguments alone (``params`` complete): exact, except block, dense_lines, rmat and banded past
    65536 bands (upper bounds: an edge block cut by the last column counts whole, crossing dense
    lines and duplicate edges count twice) and powerlaw (its mean: row lengths are drawn)."""
    n = cols if cols is not None else (2 * rows if family in ("rectangular", "lp") else rows)
    p = params
    if family == "diagonal":
        return min(rows, n)
    if family == "banded":  # per diagonal offset d: the rows i with 0 <= i + d < n
        if p["bands"] > 1 << 16:  # more offsets than is worth counting: the upper bound
            return rows * min(p["bands"], n)
        lo = -(max(p["bands"], 0) // 2)
        d = np.arange(lo, lo + max(p["bands"], 0), dtype=np.int64)
        return int(np.maximum(np.minimum(rows, n - d) - np.maximum(0, -d), 0).sum())
    if family in ("stencil2d", "stencil3d_7", "stencil3d_27"):  # per point: the cells whose neighbour is inside
        dim = 2 if family == "stencil2d" else 3
        s = _grid_side(rows, dim)
        pts = ([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)] if family == "stencil2d" else
               [(0, 0, 0), (-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)]
               if family == "stencil3d_7" else
               [(a, b, c) for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1)])
        return sum(math.prod(max(s - abs(x), 0) for x in pt) for pt in pts)
    if family == "block":
        return rows * min(max(p["blocks_per_row"], 0) * max(p["block"], 0), n)
    if family in ("random", "rectangular"):
        return rows * min(max(p["nnz_per_row"], 0), n)
    if family == "powerlaw":
        return int(rows * min(max(p["mean_degree"], 0.0), n))
    if family == "skewed":
        long_len = min(n, 4096) if p["long_len"] is None else p["long_len"]
        n_long = 0 if p["long_fraction"] <= 0 else min(rows, max(1, round(p["long_fraction"] * rows)))
        return (rows - n_long) * min(max(p["short_len"], 0), n) + n_long * min(max(long_len, 0), n)
    if family == "empty_rows":
        return (rows - min(rows - 1, round(p["empty_fraction"] * rows))) * min(max(p["nnz_per_row"], 0), n)
    if family == "dense_lines":  # an upper bound: a dense row and a dense column can meet
        d_rows, d_cols = min(max(p["dense_rows"], 0), rows), min(max(p["dense_cols"], 0), n)
        row_fill, col_fill = max(1, round(p["dense_fill"] * n)), max(1, round(p["dense_fill"] * rows))
        return (rows - d_rows) * min(max(p["nnz_per_row"], 0), n) + d_rows * row_fill + d_cols * col_fill
    if family == "rmat":  # an upper bound: the edges drawn, before duplicates merge
        return max(1, round(rows * max(p["edge_factor"], 0.0)))
    return _application_nnz(family, rows, n, p)


def _application_nnz(family: str, rows: int, n: int, p: dict[str, Any]) -> int:
    """:func:`expected_nnz` of the application families: exact for kkt and arrow; upper bounds
    for the others (their random edges may repeat, and lp's, fem_mixed's and road's drawn choices
    are counted at their largest)."""
    if family == "circuit":
        k = min(max(p["local_degree"], 0), max(p["locality"], 1))
        fill = max(1, round(p["net_fill"] * rows))
        return rows + 2 * rows * k + 2 * min(max(p["supply_nets"], 0), rows) * fill
    if family == "lp":
        n_link = min(max(p["linking_rows"], 0), rows - 1)
        link_len = min(n, max(1, round(p["linking_fill"] * n)))
        return (rows - n_link) * min(2 * max(p["nnz_per_row"], 1), n) + n_link * link_len
    if family == "kkt":
        cp = min(rows - 1, round(p["constraint_fraction"] * rows))
        nh, h = rows - cp, max(p["half_bandwidth"], 0)
        return _band_nnz(nh, nh, range(-h, h + 1)) + 2 * cp * min(max(p["nnz_per_constraint"], 1), nh)
    if family == "kronecker":
        a, b = _kron_sides(rows)
        return a * min(a, 1 + 2 * max(p["outer_degree"], 0)) * b * min(b, 1 + 2 * max(p["inner_degree"], 0))
    if family == "cartesian":
        L = min(max(p["layers"], 1), rows)
        g = max(1, rows // L)
        return L * g * min(g, 1 + 2 * max(p["degree"], 0)) + 2 * (L - 1) * g
    if family == "fem_mixed":
        d = max(p["dofs"], 1)
        s = _grid_side(max(1, rows // d), 2)
        return sum(max(s - abs(dy), 0) * max(s - abs(dx), 0) for dy, dx in _FEM_OFFSETS) * d * d
    if family == "road":
        s = _grid_side(rows, 2)
        return 2 * (2 * s * (s - 1) + (s - 1) ** 2)
    if family == "arrow":
        b = min(max(p["border"], 0), rows - 1)
        body = rows - b
        lo = -(max(p["bands"], 1) // 2)
        return _band_nnz(body, body, range(lo, lo + max(p["bands"], 1))) + body * b + b * rows
    raise MatrixError(f"unknown matrix family {family!r}")


def memory_estimate(family: str, rows: int, cols: int | None = None, **params: Any) -> int:
    """Bytes ``generate`` needs at its peak for these arguments (an upper bound, measured)."""
    spec = FAMILIES.get(family)
    if spec is None:
        raise MatrixError(f"unknown matrix family {family!r}; valid: {', '.join(FAMILIES)}")
    nnz = expected_nnz(family, rows, cols, _coerce_params(family, spec, params))
    return spec.bytes_per_nnz * nnz + _BYTES_PER_ROW * rows + spec.fixed_bytes


def available_memory() -> int | None:
    """Bytes of memory this process can still use: the system's available memory, or the
    container's (cgroup) limit less its usage when that is lower; None when unknown."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            with open(limit) as f, open(usage) as g:
                text = f.read().strip()
                if text != "max" and int(text) < 1 << 60:
                    found.append(int(text) - int(g.read().strip()))
        except (OSError, ValueError):
            pass
    return max(0, min(found)) if found else None


def generation_bytes(family: str, rows: int, cols: int | None = None, **params: Any) -> int:
    """About how many bytes ``generate(family, rows, cols=cols, **params)`` needs at its peak (0 when
    its nonzeros pass int32 indices: the family's own check refuses it before it allocates)."""
    kwargs = _coerce_params(family, FAMILIES[family], params)
    return _bytes(family, rows, expected_nnz(family, rows, cols, kwargs))


def _bytes(family: str, rows: int, nnz: int) -> int:
    if nnz > MAX_INT32:
        return 0
    spec = FAMILIES[family]
    return spec.bytes_per_nnz * nnz + _BYTES_PER_ROW * rows + spec.fixed_bytes


def _check_memory(family: str, rows: int, cols: int | None, kwargs: dict[str, Any]) -> None:
    nnz = expected_nnz(family, rows, cols, kwargs)
    need = _bytes(family, rows, nnz)
    have = available_memory()
    if need and have is not None and need > have:
        raise MatrixError(
            f"{family}: {rows} rows make about {nnz} nonzeros, which need about {need / 2**30:.1f} GiB of memory "
            f"to generate; {have / 2**30:.1f} GiB is available: use fewer rows"
        )


def generate(
    family: str, rows: int, *, cols: int | None = None, seed: int = 0, **params: Any
) -> sp.csr_array:
    """Build a canonical ``rows x cols`` matrix of structure ``family`` from ``seed``.

    Args:
        family: a name in :data:`FAMILIES` (see :func:`family_names`).
        rows: number of rows, >= 1 (stencils round it to a grid: ``s*s`` or ``s**3``).
        cols: number of columns, >= 1; default depends on the family (``rows``, or ``2*rows`` for
            ``rectangular``). Stencils are square and reject a ``cols`` other than ``rows``/the grid size.
        seed: seed for ``numpy.random.default_rng``; same inputs + seed = same matrix.
        **params: the family's parameters (see ``FAMILIES[family].defaults``).

    Raises:
        MatrixError: unknown family, unknown or invalid parameter, a size past the int32 limits, or
            more memory than is available (checked before anything is built).
    """
    spec = FAMILIES.get(family)
    if spec is None:
        raise MatrixError(f"unknown matrix family {family!r}; valid: {', '.join(FAMILIES)}")
    if not _is_int(rows) or rows < 1:
        raise MatrixError(f"{family}: rows must be an integer >= 1, got {rows!r}")
    if rows > MAX_INT32:
        raise MatrixError(f"{family}: rows={rows} exceeds the 2**31-1 limit of int32 indices")
    if cols is not None and (not _is_int(cols) or cols < 1):
        raise MatrixError(f"{family}: cols must be an integer >= 1, got {cols!r}")
    if not _is_int(seed) or seed < 0:
        raise MatrixError(f"{family}: seed must be an integer >= 0, got {seed!r}")
    kwargs = _coerce_params(family, spec, params)
    _check_memory(family, int(rows), None if cols is None else int(cols), kwargs)
    rng = np.random.default_rng(int(seed))
    t0 = time.perf_counter()
    A = spec.fn(rng, int(rows), None if cols is None else int(cols), **kwargs)
    log.debug(
        "generated %s %d x %d, nnz %d in %.3fs (seed %d, %s)",
        family,
        A.shape[0],
        A.shape[1],
        A.nnz,
        time.perf_counter() - t0,
        seed,
        kwargs,
    )
    return A


def generate_many(families: Sequence[str], rows: int, *, seed: int = 0,
                  workers: int | None = None) -> list[sp.csr_array]:
    """``generate(f, rows, seed=seed)`` of each family, in order: in threads
    (:func:`sparserl.parallel.parallel_map`, ``workers``) when their memory needs together fit in
    the free memory, else one by one. Each generation checks its own need, but threads would make
    them all at once."""
    have = available_memory()
    together = have is None or sum(generation_bytes(f, rows) for f in families) <= have
    return parallel_map(lambda f: generate(f, rows, seed=seed), list(families), workers if together else 1,
                        name="generate")
