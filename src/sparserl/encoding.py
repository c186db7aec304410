"""The matrix encoding: a sparse matrix as a short sequence of soft tokens for the policy LM.

Two kinds of tokens, prepended to the text through ``inputs_embeds``:

* **coordinate tokens**: up to ``max_nnz`` nonzeros sampled with the structure kept (half
  evenly spaced in row order, half evenly spaced in diagonal order, each with a seeded
  jitter inside its stratum), each token ``Linear([PE(r) | PE(c) | PE(r/m) | PE(c/n)])``.
  ``PE`` of a raw index is the paper's sinusoid (``sin/cos(pos / 10000^(2i/d))``), which
  aliases past ~60k rows; the normalised positions use Fourier features
  ``sin/cos(pi * 2^i * p)`` so that matrices with millions of rows stay distinguishable.
* **summary tokens**: a projection of the structure features (sizes, row-length
  histogram, bandwidth, diagonals and their fill, block density, symmetry).

Ablations (``EncodingConfig``): raw-only PE (the paper), no summary, learned instead of
sinusoidal position features. Sampling is pure NumPy and deterministic per seed;
``MatrixInput`` holds its result so a matrix is sampled once and encoded many times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from sparserl.errors import SparseRLError
from sparserl.matrices.features import MatrixFeatures, compute_features

PE_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class EncodingConfig:
    """How a matrix becomes soft tokens."""

    max_nnz: int = 128
    """Coordinate tokens the model sees (sampled with the structure kept)."""
    d_pe: int = 32
    """Dimensions of each position feature (raw row, raw col, row/m, col/n); even."""
    pe: str = "sinusoidal"
    """'sinusoidal' (fixed features) or 'learned' (an MLP on scaled positions)."""
    normalized: bool = True
    """Add PE(r/m) and PE(c/n); False is the paper's raw-index-only encoding."""
    summary: bool = True
    """Add summary tokens from the structure features."""
    summary_tokens: int = 4
    """How many summary tokens."""
    seed: int = 0
    """Sampling seed (the same matrix and seed always give the same tokens)."""

    def __post_init__(self) -> None:
        if self.max_nnz < 1:
            raise SparseRLError("max_nnz must be at least 1")
        if self.d_pe < 2 or self.d_pe % 2:
            raise SparseRLError("d_pe must be an even number >= 2")
        if self.pe not in PE_KINDS:
            raise SparseRLError(f"pe must be one of {PE_KINDS}, got {self.pe!r}")
        if self.summary and self.summary_tokens < 1:
            raise SparseRLError("summary_tokens must be >= 1 when summary is on")


# ---------------------------------------------------------------------------------------------
# Sampling and features (NumPy, no torch)


def sample_nonzeros(A: sp.csr_array, max_nnz: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``max_nnz`` (row, col) pairs of ``A``, sorted by (row, col), structure kept.

    All nonzeros when there are few enough. Otherwise half are evenly spaced in row-major
    order (so every band of rows is represented in proportion to its nonzeros) and half
    evenly spaced in diagonal order (every populated diagonal in proportion), each pick
    jittered inside its stratum by ``seed``; duplicates between the halves are dropped.
    """
    nnz = int(A.nnz)
    rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    cols = A.indices.astype(np.int64)
    if nnz <= max_nnz:
        return rows, cols
    rng = np.random.default_rng(seed)

    def strata(order: np.ndarray, count: int) -> np.ndarray:
        edges = np.linspace(0, nnz, count + 1)
        picks = np.floor(edges[:-1] + rng.random(count) * (edges[1:] - edges[:-1])).astype(np.int64)
        return order[np.minimum(picks, nnz - 1)]

    half = max_nnz // 2
    by_row = strata(np.arange(nnz), max_nnz - half)
    diag_order = np.lexsort((rows, cols - rows))
    by_diag = strata(diag_order, half)
    chosen = np.unique(np.concatenate([by_row, by_diag]))
    return rows[chosen], cols[chosen]


def summary_vector(A: sp.csr_array, features: MatrixFeatures | None = None) -> np.ndarray:
    """Structure features scaled to O(1) values, as float32 (length ``SUMMARY_DIM``); ``features``:
    ``A``'s, when the caller has them already."""
    f = features if features is not None else compute_features(A)
    m, n = f.rows, f.cols
    hist = np.asarray(f.row_len_hist, dtype=np.float64) / max(m, 1)
    offs = np.zeros(8)
    top = np.asarray(f.diagonal_offsets_top[:8], dtype=np.float64)
    offs[: top.size] = np.sign(top) * np.log1p(np.abs(top)) / math.log1p(max(m, n))
    vec = np.concatenate([
        [math.log1p(m) / 20, math.log1p(n) / 20, math.log1p(f.nnz) / 25, f.nnz / (m * n) if m * n else 0.0,
         math.log1p(f.row_len_min) / 10, math.log1p(f.row_len_mean) / 10, math.log1p(f.row_len_max) / 10,
         math.log1p(f.row_len_std) / 10, f.empty_rows / max(m, 1),
         f.bandwidth / max(m, n), f.lower_bandwidth / max(m, 1), f.upper_bandwidth / max(n, 1),
         math.log1p(f.num_diagonals) / 15, f.diag_fill,
         f.block_density_2, f.block_density_4, f.block_density_8,
         float(f.pattern_symmetric), float(f.value_symmetric), float(m == n)],
        hist, offs,
    ])
    return vec.astype(np.float32)


SUMMARY_DIM = 20 + 16 + 8


@dataclass(frozen=True)
class MatrixInput:
    """A matrix prepared for encoding: sampled coordinates, shape and summary features."""

    rows: np.ndarray  # (T,) int64
    cols: np.ndarray  # (T,) int64
    shape: tuple[int, int]
    summary: np.ndarray  # (SUMMARY_DIM,) float32

    @classmethod
    def from_matrix(cls, A: sp.csr_array, config: EncodingConfig,
                    features: MatrixFeatures | None = None) -> "MatrixInput":
        """``A``'s sampled coordinates and summary (``features``: ``A``'s, when the caller has them)."""
        r, c = sample_nonzeros(A, config.max_nnz, config.seed)
        s = summary_vector(A, features) if config.summary else np.zeros(SUMMARY_DIM, np.float32)
        return cls(r, c, (int(A.shape[0]), int(A.shape[1])), s)


# ---------------------------------------------------------------------------------------------
# Position features (torch)


def raw_sinusoid(pos: torch.Tensor, d: int) -> torch.Tensor:
    """The paper's sinusoid of integer positions: (..., d) with sin/cos(pos / 10000^(2i/d))."""
    i = torch.arange(d // 2, dtype=torch.float64, device=pos.device)
    freq = torch.pow(10000.0, -2.0 * i / d)
    ang = pos.to(torch.float64)[..., None] * freq
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1).to(torch.float32)


def fourier_features(p: torch.Tensor, d: int) -> torch.Tensor:
    """Features of positions in [0, 1]: sin/cos(pi * 2^i * p) for i < d/2 (no aliasing in [0, 1))."""
    i = torch.arange(d // 2, dtype=torch.float64, device=p.device)
    ang = p.to(torch.float64)[..., None] * math.pi * torch.pow(2.0, i)
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1).to(torch.float32)


class MatrixEncoder(nn.Module):
    """Soft tokens for a batch of matrices: ``(B, T, d_model)`` plus a mask.

    Trained together with the policy; saved in the checkpoint (``state_dict``).
    """

    def __init__(self, d_model: int, config: EncodingConfig | None = None):
        super().__init__()
        self.config = config or EncodingConfig()
        self.d_model = d_model
        c = self.config
        n_feats = (4 if c.normalized else 2) * c.d_pe
        if c.pe == "learned":
            raw_in = 6 if c.normalized else 2
            self.learned = nn.Sequential(nn.Linear(raw_in, n_feats), nn.GELU(), nn.Linear(n_feats, n_feats))
        self.coord_proj = nn.Linear(n_feats, d_model)
        if c.summary:
            self.summary_proj = nn.Sequential(nn.Linear(SUMMARY_DIM, d_model), nn.GELU(),
                                              nn.Linear(d_model, c.summary_tokens * d_model))

    @property
    def num_summary_tokens(self) -> int:
        return self.config.summary_tokens if self.config.summary else 0

    def position_features(self, rows, cols, m: int, n: int):
        """(T, n_feats) features of one matrix's sampled coordinates."""
        c = self.config
        pr, pc = rows.to(torch.float64) / max(m, 1), cols.to(torch.float64) / max(n, 1)
        if c.pe == "learned":
            parts = [torch.log1p(rows.to(torch.float64)) / 20, torch.log1p(cols.to(torch.float64)) / 20]
            if c.normalized:
                parts += [pr, pc, pc - pr, torch.full_like(pr, math.log1p(m) / 20)]
            return self.learned(torch.stack(parts, dim=-1).to(self.coord_proj.weight.dtype))
        feats = [raw_sinusoid(rows, c.d_pe), raw_sinusoid(cols, c.d_pe)]
        if c.normalized:
            feats += [fourier_features(pr, c.d_pe), fourier_features(pc, c.d_pe)]
        return torch.cat(feats, dim=-1)

    def encode_one(self, inp: MatrixInput):
        """(T_i, d_model) tokens of one matrix: summary tokens first, then coordinates."""
        dev = self.coord_proj.weight.device
        dtype = self.coord_proj.weight.dtype
        rows = torch.as_tensor(inp.rows, device=dev)
        cols = torch.as_tensor(inp.cols, device=dev)
        coords = self.coord_proj(self.position_features(rows, cols, *inp.shape).to(device=dev, dtype=dtype))
        if not self.config.summary:
            return coords
        s = torch.as_tensor(inp.summary, device=dev, dtype=dtype)
        summ = self.summary_proj(s).view(self.config.summary_tokens, self.d_model)
        return torch.cat([summ, coords], dim=0)

    def forward(self, inputs: list[MatrixInput]):
        """Left-padded batch: returns (tokens (B, T, d_model), mask (B, T) of 1 for real tokens)."""
        seqs = [self.encode_one(i) for i in inputs]
        T = max(s.shape[0] for s in seqs)
        out = seqs[0].new_zeros(len(seqs), T, self.d_model)
        mask = torch.zeros(len(seqs), T, dtype=torch.long, device=out.device)
        for b, s in enumerate(seqs):
            out[b, T - s.shape[0]:] = s
            mask[b, T - s.shape[0]:] = 1
        return out, mask
