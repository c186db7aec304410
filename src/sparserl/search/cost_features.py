"""The cost model's inputs: one row of numbers per (matrix, op, k, template point).

A row has three parts, named by :func:`feature_names` (the *layout*; a model file records the
names it was trained on and is refused when they differ, see :mod:`.cost_model`):

* the matrix: size, row lengths (mean, spread, longest, empty rows, the share of nonzeros in
  short, middle and long rows from the card's exact log2 bins), diagonals and their fill, the
  dense-block fill at 2, 4 and 8, bandwidth, symmetry. Everything comes from the
  :class:`~sparserl.matrices.card.MatrixCard` and, where given, the
  :class:`~sparserl.matrices.features.MatrixFeatures` (facts only the features hold are NaN
  without them, and the model treats NaN as missing);
* the candidate: op, k, the template (a category), its storage format (a category), whether it
  is specialised, and every template parameter by name (NaN where the template has none of that
  name);
* a few products of the two that a tree finds hard to learn from little data: the row length per
  lane (``tpr``), the block fill of BSR's R x C, the share of nonzeros a HYB width keeps in ELL,
  the share of nonzeros in rows a long-row split (``long_len``) takes.

Pure functions of their inputs: the same card, features and point give the same row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from sparserl.kernels.contract import Op
from sparserl.kernels.templates import templates
from sparserl.matrices.card import MatrixCard
from sparserl.matrices.features import MatrixFeatures

FEATURE_LAYOUT = 1
"""Version of the meaning of the rows below; raise it whenever a feature's definition changes
(a changed list of names is caught without it: new parameters or templates change the names)."""

MATRIX_FEATURES = (
    "log_rows", "log_cols", "log_nnz", "row_len_mean", "log_row_len_max", "max_over_mean", "row_len_min",
    "row_len_cv", "empty_frac", "nnz_frac_len_lt4", "nnz_frac_len_lt32", "nnz_frac_len_ge256", "log_long_rows",
    "ell_fill", "log_num_diagonals", "diag_fill", "block_density_2", "block_density_4", "block_density_8",
    "bandwidth_frac", "symmetric", "cols_over_rows",
)  # fmt: skip
"""Matrix features, in row order (see :func:`matrix_row`)."""

CANDIDATE_FEATURES = ("op", "log2_k", "template", "format", "specialised")
"""Candidate features before the parameters; ``template`` and ``format`` are categories."""

DERIVED_FEATURES = ("row_len_per_lane", "bsr_fill", "hyb_ell_share", "long_split_share", "items_per_row")
"""Products of the matrix and the point (see :func:`candidate_row`)."""

CATEGORICAL = ("template", "format")
"""Features that are categories (codes into the model's vocabularies), not quantities."""


@lru_cache(maxsize=1)
def param_names() -> tuple[str, ...]:
    """Every template parameter name of every op, sorted: one column each."""
    return tuple(sorted({p.name for t in templates() for p in t.space}))


def feature_names() -> tuple[str, ...]:
    """The layout: every column of a row, in order."""
    return MATRIX_FEATURES + CANDIDATE_FEATURES + tuple(f"p_{n}" for n in param_names()) + DERIVED_FEATURES


def _nnz_share_below(card: MatrixCard, length: int) -> float:
    """Share of the nonzeros in rows shorter than ``length`` (a power of two: exact on the log2 bins)."""
    if card.nnz == 0:
        return 0.0
    return sum(b.nnz for b in card.bins if b.hi < length) / card.nnz


def _bin_share_kept(card: MatrixCard, width: int) -> float:
    """Share of the nonzeros the first ``width`` entries of every row hold (each bin's rows taken
    at their mean length: exact for bins of one length, close otherwise)."""
    if card.nnz == 0:
        return 1.0
    kept = sum(b.rows * min(b.nnz / b.rows, width) for b in card.bins if b.rows)
    return kept / card.nnz


def matrix_row(card: MatrixCard, features: MatrixFeatures | None = None) -> np.ndarray:
    """The matrix part of a row (:data:`MATRIX_FEATURES`)."""
    f = features
    m, n, nnz = max(card.rows, 1), max(card.cols, 1), card.nnz
    mean = max(card.row_len_mean, 1e-9)
    nan = float("nan")
    long_rows = sum(b.rows for b in card.bins if b.lo >= 256)
    vals = {
        "log_rows": math.log(m), "log_cols": math.log(n), "log_nnz": math.log1p(nnz),
        "row_len_mean": card.row_len_mean, "log_row_len_max": math.log1p(card.row_len_max),
        "max_over_mean": card.row_len_max / mean, "row_len_min": card.row_len_min,
        "row_len_cv": f.row_len_std / mean if f is not None else nan,
        "empty_frac": card.empty_rows / m,
        "nnz_frac_len_lt4": _nnz_share_below(card, 4), "nnz_frac_len_lt32": _nnz_share_below(card, 32),
        "nnz_frac_len_ge256": 1.0 - _nnz_share_below(card, 256), "log_long_rows": math.log1p(long_rows),
        "ell_fill": nnz / (m * max(card.row_len_max, 1)),
        "log_num_diagonals": math.log1p(card.num_diagonals), "diag_fill": card.diag_fill,
        "block_density_2": f.block_density_2 if f is not None else nan,
        "block_density_4": f.block_density_4 if f is not None else nan,
        "block_density_8": f.block_density_8 if f is not None else nan,
        "bandwidth_frac": f.bandwidth / max(m, n) if f is not None else nan,
        "symmetric": float(f.pattern_symmetric) if f is not None else nan,
        "cols_over_rows": n / m,
    }
    if f is None and card.block_shape is not None:  # the card names one dense block shape and its fill
        vals[f"block_density_{card.block_shape[0]}"] = card.block_density
    return np.array([vals[k] for k in MATRIX_FEATURES], dtype=np.float64)


def candidate_row(card: MatrixCard, matrix: np.ndarray, op: Op | str, k: int | None, template: str,
                  params: Mapping[str, int], vocab: Mapping[str, Sequence[str]]) -> np.ndarray:
    """The candidate part of a row (:data:`CANDIDATE_FEATURES`, the parameters, :data:`DERIVED_FEATURES`).
    ``matrix``: the matrix part (:func:`matrix_row`). ``vocab``: the model's categories
    (``template`` and ``format`` names, in code order); a name not in it is NaN (missing)."""
    op = Op(op)
    t = _template(op.value, template)
    fmt = t.format if t is not None else None
    nan = float("nan")

    def code(kind: str, name: str | None) -> float:
        names = vocab.get(kind, ())
        return float(names.index(name)) if name in names else nan

    head = [float(op is Op.SPMM), math.log2(k) if op is Op.SPMM and k else 0.0, code("template", template),
            code("format", fmt), float(t.specialised) if t is not None else nan]
    prm = [float(params[n]) if n in params else nan for n in param_names()]
    mean = max(card.row_len_mean, 1e-9)
    tpr = params.get("tpr")
    per_lane = mean / tpr if tpr else nan
    bsr_fill = nan
    if fmt == "BSR" and "R" in params and "C" in params:
        dens = {b: float(matrix[MATRIX_FEATURES.index(f"block_density_{b}")]) for b in (2, 4, 8)}
        if params["R"] in dens and params["C"] in dens:
            bsr_fill = math.sqrt(dens[params["R"]] * dens[params["C"]])
    width = params.get("width")
    hyb_share = _bin_share_kept(card, width) if width else nan
    long_len = params.get("long_len")
    long_share = 1.0 - _nnz_share_below_exact(card, long_len) if long_len else nan
    items = params.get("items") or params.get("ipt")
    items_per_row = mean / items if items else nan
    return np.array(head + prm + [per_lane, bsr_fill, hyb_share, long_share, items_per_row], dtype=np.float64)


def _nnz_share_below_exact(card: MatrixCard, length: int) -> float:
    """Share of the nonzeros in rows of at most ``length`` entries (bins wholly below it; a bin
    that straddles it counts in proportion to its range)."""
    if card.nnz == 0:
        return 1.0
    below = 0.0
    for b in card.bins:
        if b.hi <= length:
            below += b.nnz
        elif b.lo <= length:
            below += b.nnz * (length - b.lo + 1) / (b.hi - b.lo + 1)
    return below / card.nnz


@lru_cache(maxsize=None)
def _template(op: str, name: str):
    return next((t for t in templates(op) if t.name == name), None)


def vocabulary() -> dict[str, list[str]]:
    """The categories of this version: every template name (all ops) and storage format, sorted."""
    ts = templates()
    return {"template": sorted({t.name for t in ts}), "format": sorted({t.format for t in ts})}


def rows(card: MatrixCard, features: MatrixFeatures | None, op: Op | str, k: int | None,
         points: Sequence[tuple[str, Mapping[str, int]]], vocab: Mapping[str, Sequence[str]]) -> np.ndarray:
    """The rows of several points of one matrix: ``(len(points), len(feature_names()))``."""
    head = matrix_row(card, features)
    out = np.empty((len(points), len(feature_names())), dtype=np.float64)
    for i, (name, params) in enumerate(points):
        out[i, :head.size] = head
        out[i, head.size:] = candidate_row(card, head, op, k, name, params, vocab)
    return out
