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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparserl.errors import MatrixError
from sparserl.matrices.io import MAX_INT32, csr_from_sorted_parts

log = logging.getLogger(__name__)

__all__ = ["FAMILIES", "FamilySpec", "family_names", "generate", "random_values"]

_CHUNK_NNZ = 1 << 22
"""Nonzeros built per chunk of rows (bounds int64 temporaries to a few tens of MB)."""

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


FAMILIES: dict[str, FamilySpec] = {
    "diagonal": FamilySpec(_diagonal, "main diagonal only (min(rows, cols) nonzeros)"),
    "banded": FamilySpec(
        _banded, "`bands` adjacent diagonals, offsets -bands//2 .. , clipped at the edges", {"bands": 9}
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
    ),
    "random": FamilySpec(
        _random, "`nnz_per_row` distinct uniform random columns per row", {"nnz_per_row": 16}
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
}
"""Generator families by name, in a stable order (structured first, random last)."""


def family_names() -> list[str]:
    """Names of the generator families, in registry order."""
    return list(FAMILIES)


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
        MatrixError: unknown family, unknown or invalid parameter, or a size past the int32 limits.
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
