"""The matrix encoding: sampling keeps structure, shapes, determinism, distinct structures differ,
normalised positions do not alias where the paper's raw sinusoid does."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparserl.encoding import (  # noqa: E402
    SUMMARY_DIM,
    EncodingConfig,
    MatrixEncoder,
    MatrixInput,
    fourier_features,
    raw_sinusoid,
    sample_nonzeros,
    summary_vector,
)
from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.matrices import generate  # noqa: E402


def test_small_matrices_keep_every_nonzero() -> None:
    A = generate("banded", 20, seed=0, bands=3)
    r, c = sample_nonzeros(A, 128)
    assert r.size == A.nnz and np.array_equal(A[r, c] != 0, np.ones(A.nnz, bool))


def test_sampling_is_deterministic_bounded_and_stratified() -> None:
    A = generate("stencil2d", 10_000, seed=0)
    r1, c1 = sample_nonzeros(A, 128, seed=3)
    r2, c2 = sample_nonzeros(A, 128, seed=3)
    r3, _ = sample_nonzeros(A, 128, seed=4)
    assert np.array_equal(r1, r2) and np.array_equal(c1, c2) and not np.array_equal(r1, r3)
    assert 100 <= r1.size <= 128
    assert np.all(np.asarray(A[r1, c1]) != 0), "only real nonzeros are sampled"
    # row strata: the samples span the rows, not one corner
    assert r1.min() < 1000 and r1.max() > 9000
    # diagonal strata: all five stencil diagonals appear
    assert set(np.unique(c1 - r1)) == {-100, -1, 0, 1, 100}


def test_summary_vector() -> None:
    v = summary_vector(generate("powerlaw", 5000, seed=0))
    assert v.shape == (SUMMARY_DIM,) and v.dtype == np.float32 and np.all(np.isfinite(v))
    assert np.all(np.abs(v) <= 2.0), "features are scaled to O(1)"


@pytest.mark.parametrize("cfg", [
    EncodingConfig(), EncodingConfig(normalized=False), EncodingConfig(summary=False),
    EncodingConfig(pe="learned"), EncodingConfig(pe="learned", normalized=False, summary=False),
])
def test_shapes_and_mask(cfg: EncodingConfig) -> None:
    torch.manual_seed(0)
    enc = MatrixEncoder(48, cfg)
    mats = [generate("diagonal", 7, seed=0), generate("random", 3000, seed=1, nnz_per_row=8)]
    inputs = [MatrixInput.from_matrix(A, cfg) for A in mats]
    tokens, mask = enc(inputs)
    lengths = [i.rows.size + enc.num_summary_tokens for i in inputs]
    assert tokens.shape == (2, max(lengths), 48) and mask.shape == (2, max(lengths))
    assert mask.sum(1).tolist() == lengths
    assert mask[0, : max(lengths) - lengths[0]].sum() == 0, "left padding"
    assert torch.all(tokens[mask == 0] == 0) and torch.isfinite(tokens).all()


def test_encoding_is_deterministic_and_distinguishes_structures() -> None:
    cfg = EncodingConfig(max_nnz=64)
    torch.manual_seed(0)
    enc = MatrixEncoder(32, cfg)
    band = MatrixInput.from_matrix(generate("banded", 4000, seed=0, bands=5), cfg)
    rand = MatrixInput.from_matrix(generate("random", 4000, seed=0, nnz_per_row=5), cfg)
    a1, a2, b = enc.encode_one(band), enc.encode_one(band), enc.encode_one(rand)
    assert torch.equal(a1, a2)
    assert (a1.mean(0) - b.mean(0)).norm() > 1e-3 * a1.mean(0).norm()


def test_raw_sinusoid_aliases_but_normalised_features_do_not() -> None:
    """Rows far apart in a huge matrix: raw low-frequency features barely move, normalised ones do."""
    d = 32
    a, b = torch.tensor([3_000_000]), torch.tensor([3_000_001])
    raw = (raw_sinusoid(a, d) - raw_sinusoid(b, d)).abs()
    # the slowest raw frequencies cannot tell neighbouring rows of a 4M-row matrix apart
    assert raw[0, d // 2 - 1] < 1e-3
    p = torch.tensor([0.1, 0.9])
    f = fourier_features(p, d)
    assert (f[0] - f[1]).norm() > 1.0
    # distinct positions on a fine grid keep distinct features
    grid = torch.linspace(0, 1, 1000)
    feats = fourier_features(grid, d)
    dmin = torch.cdist(feats, feats).masked_fill(torch.eye(1000, dtype=torch.bool), 1e9).min()
    assert dmin > 1e-4


def test_gradients_flow_to_the_projection() -> None:
    enc = MatrixEncoder(16, EncodingConfig(max_nnz=32))
    tokens, mask = enc([MatrixInput.from_matrix(generate("block", 256, seed=0), enc.config)])
    tokens.sum().backward()
    assert enc.coord_proj.weight.grad is not None and enc.coord_proj.weight.grad.abs().sum() > 0
    assert enc.summary_proj[0].weight.grad.abs().sum() > 0


def test_config_validation() -> None:
    for bad in (dict(max_nnz=0), dict(d_pe=7), dict(pe="rope"), dict(summary_tokens=0)):
        with pytest.raises(SparseRLError):
            EncodingConfig(**bad)
