"""The matrix card: the exact structure facts a matrix-specialised kernel needs, and the
structure fingerprint that names a sparsity pattern.

The card is what a kernel writer (a template, a search, or the model through its prompt) may
bake into code: shape, nnz, the exact diagonal offsets when there are few, a dense block shape
(and the blocks per block row when every block row has the same number), the row-length bins
with their boundaries, the longest rows, and every long row (with its length) when there are
few enough to list, which is where a kernel's split points for long rows come from. Values never
appear on it: a kernel may be specialised to the structure, never to the values
(docs/contract.md).

:func:`structure_fingerprint` hashes the pattern only (shape, row pointers, column indices), so
one structure with new values keeps its fingerprint: the key of the best-known store.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparserl.matrices.features import MatrixFeatures, compute_features
from sparserl.matrices.io import canonicalize

MAX_CARD_DIAGONALS = 64
"""Diagonal offsets are listed exactly when the matrix has at most this many."""
LONGEST_ROWS = 8
"""How many of the longest rows the card names."""
BLOCK_DENSITY_MIN = 0.6
"""A dense block shape is named when BSR storage of that shape is at least this full."""
LONG_ROW_MIN = 256
"""Rows at least this long are listed exactly (``MatrixCard.long_rows``) when there are few."""
LONG_ROWS_MAX = 4096
"""At most this many long rows are listed; with more, the listing threshold rises until they fit."""
PROMPT_OFFSET_ITEMS = 32
"""The prompt's card lists the diagonal offsets when they take at most this many items (a run of
three or more consecutive offsets is one item, ``a..b``); else only their count."""


def structure_fingerprint(A: Any) -> str:
    """Hex digest of the sparsity pattern (shape, row pointers, column indices); values excluded."""
    C = canonicalize(A)
    h = hashlib.sha256()
    h.update(np.asarray(C.shape, np.int64).tobytes())
    h.update(np.ascontiguousarray(C.indptr, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(C.indices, dtype=np.int32).tobytes())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class RowBin:
    """Rows whose length lies in ``[lo, hi]`` (a log2 bin: 0, 1, 2-3, 4-7, ...)."""

    lo: int
    hi: int
    rows: int
    nnz: int


@dataclass(frozen=True)
class MatrixCard:
    """Exact structure facts of one matrix (no values)."""

    rows: int
    cols: int
    nnz: int
    fingerprint: str
    """:func:`structure_fingerprint` of the pattern."""
    row_len_mean: float
    row_len_max: int
    empty_rows: int
    bins: tuple[RowBin, ...]
    """Non-empty log2 row-length bins, shortest first, with their exact boundaries."""
    longest_rows: tuple[tuple[int, int], ...]
    """(row, length) of the longest rows, longest first."""
    num_diagonals: int
    diag_fill: float
    dia_offsets: tuple[int, ...] | None
    """Every diagonal offset (column - row), ascending, when there are at most MAX_CARD_DIAGONALS."""
    block_shape: tuple[int, int] | None
    """The largest square block (8, 4 or 2) whose BSR storage is at least BLOCK_DENSITY_MIN full."""
    block_density: float
    """BSR storage efficiency of ``block_shape`` (0 when there is none)."""
    row_len_min: int = 0
    """Length of the shortest row."""
    long_rows: tuple[tuple[int, int], ...] = ()
    """(row, length) of every row of length >= ``long_rows_min``, longest first (ties by row)."""
    long_rows_min: int = LONG_ROW_MIN
    """The listing threshold: LONG_ROW_MIN, raised when more than LONG_ROWS_MAX rows reach it
    (then the smallest length that at most LONG_ROWS_MAX rows reach). Every row at least this
    long is in ``long_rows``; no shorter row is."""
    block_row_len: int | None = None
    """Blocks per block row of ``block_shape`` when every block row has the same number, else None."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MatrixCard":
        d = dict(d)
        d["bins"] = tuple(RowBin(**b) for b in d["bins"])
        d["longest_rows"] = tuple(tuple(r) for r in d["longest_rows"])
        d["dia_offsets"] = tuple(d["dia_offsets"]) if d["dia_offsets"] is not None else None
        d["block_shape"] = tuple(d["block_shape"]) if d["block_shape"] is not None else None
        d["long_rows"] = tuple(tuple(r) for r in d.get("long_rows", ()))
        return cls(**d)

    def rows_longer_than(self, length: int) -> tuple[tuple[int, int], ...] | None:
        """Every (row, length) with length > ``length``, longest first; None when the card does not
        list them all (``length + 1 < long_rows_min``)."""
        if length + 1 < self.long_rows_min:
            return None
        return tuple(r for r in self.long_rows if r[1] > length)

    def render(self) -> str:
        """The card as plain text, one fact per line (what the prompt carries)."""
        lines = [f"shape: {self.rows} x {self.cols}, nnz: {self.nnz}",
                 f"rows: mean length {self.row_len_mean:.2f}, longest {self.row_len_max}, empty {self.empty_rows}"]
        lines.append("row-length bins: " + ", ".join(
            f"[{b.lo},{b.hi}]:{b.rows} rows" for b in self.bins))
        lines.append("longest rows: " + ", ".join(f"{r}:{n}" for r, n in self.longest_rows))
        if self.long_rows:
            listed = ", ".join(f"{r}:{n}" for r, n in self.long_rows) if len(self.long_rows) <= 16 else "not shown"
            lines.append(f"rows of length >= {self.long_rows_min}: {len(self.long_rows)} ({listed})")
        if self.dia_offsets is not None:
            lines.append(f"diagonals: {self.num_diagonals} (fill {self.diag_fill:.2f}), offsets "
                         + " ".join(str(o) for o in self.dia_offsets))
        else:
            lines.append(f"diagonals: {self.num_diagonals} (fill {self.diag_fill:.2f})")
        if self.block_shape is not None:
            r, c = self.block_shape
            per_row = f", {self.block_row_len} per block row" if self.block_row_len is not None else ""
            lines.append(f"dense blocks: {r}x{c} (fill {self.block_density:.2f}{per_row})")
        return "\n".join(lines)

    def prompt_longest_rows(self) -> tuple[tuple[int, int], ...]:
        """(row, length) of the longest rows the prompt lists: those over twice the mean length or
        at least ``long_rows_min`` long, up to LONGEST_ROWS, longest first."""
        return tuple((r, n) for r, n in self.longest_rows if n > 2 * self.row_len_mean or n >= self.long_rows_min)

    def prompt_offsets(self) -> tuple[int, ...] | None:
        """The diagonal offsets when the prompt lists them (at most PROMPT_OFFSET_ITEMS runs), else None."""
        if self.dia_offsets is None or len(_offset_runs(self.dia_offsets)) > PROMPT_OFFSET_ITEMS:
            return None
        return self.dia_offsets

    def prompt(self) -> str:
        """The card as the policy's prompt carries it: :meth:`render`'s facts, compact and bounded
        (60-250 tokens of the project's 8k BPE tokenizer on the generator families at 20k and 1M
        rows). Offsets are exact, in runs (``-2..2``), when there are few. The longest rows (those over
        twice the mean length, or at least ``long_rows_min``; up to LONGEST_ROWS) are listed longest
        first, so ``rows of length >= L: n`` with ``n <= LONGEST_ROWS`` means the first ``n`` listed
        are every such row. A line ``every row has L entries`` appears exactly when all rows have one
        length ``L > 0``: the one fact a uniform-length kernel (``csr_lanes_spec``) may assume, said
        in words rather than left to a comparison of ``min`` and ``max``. A pure function of the structure:
        no values."""
        lines = [f"shape {self.rows} x {self.cols}, nnz {self.nnz}",
                 (f"row lengths: min {self.row_len_min}, mean {self.row_len_mean:.2f}, max {self.row_len_max}, "
                  f"empty rows {self.empty_rows}"),
                 "row-length bins lo-hi:rows: " + " ".join(
                     f"{b.lo}:{b.rows}" if b.lo == b.hi else f"{b.lo}-{b.hi}:{b.rows}" for b in self.bins)]
        if self.row_len_min == self.row_len_max > 0:
            lines.append(f"every row has {self.row_len_max} entries")
        top = self.prompt_longest_rows()
        if top:
            lines.append("longest rows row:length: " + " ".join(f"{r}:{n}" for r, n in top))
        if self.long_rows:
            lines.append(f"rows of length >= {self.long_rows_min}: {len(self.long_rows)}")
        lines.append(f"diagonals: {self.num_diagonals}, fill {self.diag_fill:.2f}")
        if self.prompt_offsets() is not None:
            lines.append("diagonal offsets: " + " ".join(_offset_runs(self.dia_offsets)))
        if self.block_shape is not None:
            r, c = self.block_shape
            per_row = f", {self.block_row_len} per block row" if self.block_row_len is not None else ""
            lines.append(f"dense blocks: {r}x{c}, fill {self.block_density:.2f}{per_row}")
        return "\n".join(lines)


def offset_runs(offsets: tuple[int, ...]) -> list[tuple[int, int]]:
    """Ascending offsets as the prompt lists them, each item ``(first, last)``: three or more
    consecutive offsets are one run, any other offset an item of its own (``first == last``)."""
    items: list[tuple[int, int]] = []
    i = 0
    while i < len(offsets):
        j = i
        while j + 1 < len(offsets) and offsets[j + 1] == offsets[j] + 1:
            j += 1
        if j - i >= 2:
            items.append((offsets[i], offsets[j]))
        else:
            items += [(o, o) for o in offsets[i:j + 1]]
        i = j + 1
    return items


def _offset_runs(offsets: tuple[int, ...]) -> list[str]:
    """Ascending offsets as the prompt's items: a run of three or more consecutive ones is ``a..b``."""
    return [f"{a}..{b}" if b > a else str(a) for a, b in offset_runs(offsets)]


def prompt_card(A: Any) -> str:
    """The prompt's card of ``A`` (:meth:`MatrixCard.prompt`): the one function every prompt uses
    (SFT, RL rollouts, ``generate``, ``search``, ``evaluate``)."""
    return matrix_card(A).prompt()


def _bins(lengths: np.ndarray) -> tuple[RowBin, ...]:
    out = []
    for lo, hi in [(0, 0), (1, 1)] + [(1 << b, (1 << (b + 1)) - 1) for b in range(1, 31)]:
        sel = (lengths >= lo) & (lengths <= hi)
        n = int(sel.sum())
        if n:
            out.append(RowBin(lo, hi, n, int(lengths[sel].sum())))
        if hi >= lengths.max():
            break
    return tuple(out)


def _long_rows(lengths: np.ndarray) -> tuple[tuple[tuple[int, int], ...], int]:
    """(the listed long rows, the listing threshold): see ``MatrixCard.long_rows_min``."""
    threshold = LONG_ROW_MIN
    if int((lengths >= threshold).sum()) > LONG_ROWS_MAX:
        threshold = int(np.partition(lengths, lengths.size - LONG_ROWS_MAX - 1)[lengths.size - LONG_ROWS_MAX - 1]) + 1
    rows = np.flatnonzero(lengths >= threshold)
    rows = rows[np.lexsort((rows, -lengths[rows]))]
    return tuple((int(r), int(lengths[r])) for r in rows), threshold


def _uniform_block_row_len(C: sp.csr_array, b: int) -> int | None:
    """Nonzero ``b x b`` blocks per block row when every block row has the same count, else None."""
    m, n = C.shape
    lengths = np.diff(C.indptr)
    brow = np.repeat(np.arange(m, dtype=np.int64) // b, lengths)
    keys = np.unique(brow * (-(-n // b)) + C.indices.astype(np.int64) // b)
    counts = np.bincount(keys // (-(-n // b)), minlength=-(-m // b))
    return int(counts[0]) if counts.size and np.all(counts == counts[0]) else None


def matrix_card(A: Any) -> MatrixCard:
    """The card of ``A`` (anything :func:`~sparserl.matrices.io.canonicalize` accepts)."""
    return card_and_features(A)[0]


def card_and_features(A: Any) -> tuple[MatrixCard, MatrixFeatures]:
    """The card of ``A`` and the :class:`~sparserl.matrices.features.MatrixFeatures` it is built
    from, computed once (the search needs both: the card for its templates, the features for the
    selector and the cost model)."""
    C: sp.csr_array = canonicalize(A)
    f = compute_features(C)
    lengths = np.diff(C.indptr).astype(np.int64)
    top = np.argsort(-lengths, kind="stable")[:LONGEST_ROWS]
    offsets = None
    if f.num_diagonals <= MAX_CARD_DIAGONALS and C.nnz:
        rows = np.repeat(np.arange(C.shape[0], dtype=np.int64), lengths)
        offsets = tuple(int(o) for o in np.unique(C.indices.astype(np.int64) - rows))
    block, density = None, 0.0
    for b, d in ((8, f.block_density_8), (4, f.block_density_4), (2, f.block_density_2)):
        if d >= BLOCK_DENSITY_MIN:
            block, density = (b, b), float(d)
            break
    long_rows, long_min = _long_rows(lengths)
    card = MatrixCard(
        rows=f.rows, cols=f.cols, nnz=f.nnz, fingerprint=structure_fingerprint(C),
        row_len_mean=float(f.row_len_mean), row_len_max=f.row_len_max, empty_rows=f.empty_rows,
        bins=_bins(lengths), longest_rows=tuple((int(r), int(lengths[r])) for r in top if lengths[r] > 0),
        num_diagonals=f.num_diagonals, diag_fill=float(f.diag_fill), dia_offsets=offsets,
        block_shape=block, block_density=density,
        row_len_min=int(lengths.min()) if lengths.size else 0, long_rows=long_rows, long_rows_min=long_min,
        block_row_len=_uniform_block_row_len(C, block[0]) if block is not None else None,
    )
    return card, f
