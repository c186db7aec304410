"""The rule-based selector picks the expected format per structure family, and every pick exists."""

from __future__ import annotations

import dataclasses

import pytest

from sparserl.request.library import select_variant
from sparserl.kernels.contract import Op
from sparserl.matrices import compute_features, family_names, generate
from sparserl.matrices.features import MatrixFeatures


@pytest.mark.parametrize("family, fmt", [("diagonal", "DIA"), ("banded", "DIA"), ("stencil2d", "DIA"),
                                         ("block", "BSR"), ("random", "ELL"), ("skewed", "CSR"),
                                         ("empty_rows", "CSR"), ("powerlaw", "CSR")])
def test_family_choices(family: str, fmt: str) -> None:
    v = select_variant(compute_features(generate(family, 4096, seed=0)))
    assert v.format == fmt and v.op is Op.SPMV


@pytest.mark.parametrize("family", family_names())
def test_every_family_gets_a_variant_for_both_ops(family: str) -> None:
    f = compute_features(generate(family, 1000, seed=1))
    assert select_variant(f, Op.SPMV).op is Op.SPMV
    assert select_variant(f, Op.SPMM).op is Op.SPMM


def features(**kw) -> MatrixFeatures:
    """Features of a plain matrix (no diagonal, block or skew structure, uneven rows: 4096 rows of
    30 +- 12 entries, at most 40), with the fields a case is about replaced."""
    base = dict(num_diagonals=5000, diag_fill=0.01, block_density_8=0.05, block_density_4=0.1, row_len_mean=30.0,
                row_len_max=40, row_len_std=12.0, empty_rows=0, rows=4096)
    f = compute_features(generate("random", 64, seed=0))
    return dataclasses.replace(f, **(base | kw))


@pytest.mark.parametrize("kw, spmv, spmm", [
    # DIA: at most 64 diagonals, at least half filled (both bounds inclusive)
    ({"num_diagonals": 64, "diag_fill": 0.5}, "spmv/dia_vec4/-/block=128", "spmm/dia_rows/-/g=8,vec=4,block=256"),
    ({"num_diagonals": 65, "diag_fill": 0.9}, "spmv/csr_vector/-/tpr=16,block=128", "spmm/csr_rows/-/g=32,vec=4,block=256"),
    ({"num_diagonals": 10, "diag_fill": 0.49}, "spmv/csr_vector/-/tpr=16,block=128", "spmm/csr_rows/-/g=32,vec=4,block=256"),
    # BSR 8x8 from a block density of 0.6, then 4x4 (SpMM has no 4x4 rule)
    ({"block_density_8": 0.6}, "spmv/bsr_group/R=8,C=8/g=16,block=128", "spmm/bsr_group/R=8,C=8/g=32,vec=4,block=256"),
    ({"block_density_8": 0.59, "block_density_4": 0.6}, "spmv/bsr_group/R=4,C=4/g=16,block=128",
     "spmm/csr_rows/-/g=32,vec=4,block=256"),
    # merge-path CSR: a row longer than 16x the mean, or more than 30% empty rows
    # (SpMM: COO runs there, 32 lanes when k is not known; 16 entries a group on this size)
    ({"row_len_max": 481}, "spmv/csr_merge/-/block=256,ipt=7", "spmm/coo_runs/-/g=32,vec=4,nzpg=16,block=256"),
    ({"row_len_max": 480, "row_len_std": 20.0}, "spmv/csr_vector/-/tpr=16,block=128", "spmm/csr_rows/-/g=32,vec=4,block=256"),
    ({"empty_rows": 1229}, "spmv/csr_merge/-/block=256,ipt=7", "spmm/coo_runs/-/g=32,vec=4,nzpg=16,block=256"),
    ({"empty_rows": 1228}, "spmv/csr_vector/-/tpr=16,block=128", "spmm/csr_rows/-/g=32,vec=4,block=256"),
    # ELL: even rows (std at most 0.3 x the mean) of at most 64 entries
    ({"row_len_std": 9.0}, "spmv/ell_rows/-/block=128,rpt=1", None),
    ({"row_len_std": 9.1}, "spmv/csr_vector/-/tpr=16,block=128", None),
    ({"row_len_std": 1.0, "row_len_max": 65, "row_len_mean": 60.0}, "spmv/csr_vector/-/tpr=32,block=128", None),
    # CSR vector: lanes per row the largest power of two <= the mean row length, between 2 and 32
    ({"row_len_mean": 1.0, "row_len_max": 12}, "spmv/csr_vector/-/tpr=2,block=128", None),
    ({"row_len_mean": 7.9, "row_len_max": 60}, "spmv/csr_vector/-/tpr=4,block=128", None),
    ({"row_len_mean": 8.0, "row_len_max": 60}, "spmv/csr_vector/-/tpr=8,block=128", None),
    ({"row_len_mean": 500.0, "row_len_max": 900, "row_len_std": 300.0}, "spmv/csr_vector/-/tpr=32,block=128", None),
])
def test_the_rules_at_their_edges(kw: dict, spmv: str, spmm: str | None) -> None:
    """Each documented rule on both sides of its threshold, on features set by hand, and the exact
    variant it picks (the earlier test checked only the op of the pick).

    Mutations killed: any threshold moved or made strict (64 diagonals, fill 0.5, block density 0.6,
    16x the mean, 30% empty rows, std 0.3x the mean, 64 entries), the rules' order changed, the lanes
    per row not a power of two <= the mean."""
    f = features(**kw)
    assert select_variant(f, Op.SPMV).id == spmv
    if spmm is not None:
        assert select_variant(f, Op.SPMM).id == spmm


@pytest.mark.parametrize("k, nnz, want", [
    (None, 10_000, "coo_runs/-/g=32,vec=4,nzpg=16"),
    (32, 10_000, "coo_runs/-/g=16,vec=4,nzpg=16"),
    (64, 10_000, "coo_runs/-/g=16,vec=4,nzpg=16"),
    (65, 10_000, "coo_runs/-/g=32,vec=4,nzpg=16"),
    # 8192 warps of work for 1024 entries a group (from 1024 x 8192 nonzeros at 32 lanes, in blocks of 128),
    # 32768 for 128, 64 and 16
    (128, 1024 * 8192, "coo_runs_stored/zero_y=0/g=32,vec=4,nzpg=1024,block=128"),
    (128, 1024 * 8192 - 1, "coo_runs_stored/zero_y=0/g=32,vec=4,nzpg=128"),
    (128, 128 * 32768, "coo_runs_stored/zero_y=0/g=32,vec=4,nzpg=128"),
    (128, 128 * 32768 - 1, "coo_runs/-/g=32,vec=4,nzpg=64"),
    (128, 64 * 32768, "coo_runs/-/g=32,vec=4,nzpg=64"),
    (128, 64 * 32768 - 1, "coo_runs/-/g=32,vec=4,nzpg=16"),
    # 16 lanes: two groups a warp, so twice the nonzeros for the same entries a group
    (64, 2 * 128 * 32768, "coo_runs_stored/zero_y=0/g=16,vec=4,nzpg=128"),
    (64, 2 * 128 * 32768 - 1, "coo_runs/-/g=16,vec=4,nzpg=64"),
    (64, 4 * 1024 * 8192, "coo_runs_stored/zero_y=0/g=16,vec=4,nzpg=128"),  # 1024 entries: 32 lanes only
    (64, 2 * 64 * 32768, "coo_runs/-/g=16,vec=4,nzpg=64"),
    (64, 2 * 64 * 32768 - 1, "coo_runs/-/g=16,vec=4,nzpg=16"),
])
@pytest.mark.parametrize("empty", [0, 40])
def test_skewed_spmm_lanes_by_k_entries_a_group_by_size(k, nnz, want, empty) -> None:
    """Skewed rows in SpMM: COO runs, 16 lanes of 4 columns when k <= 64 (one pass over Y's row, no idle
    lanes), 32 beyond; the most entries a group that leaves enough warps of work: Y not zeroed with 1024
    (8192 warps, 32 lanes only) or 128 (32768), else Y zeroed first with 64 (32768), else 16; with more than 1% of the rows empty (41 of 4096), Y zeroed
    whatever the size (64 or 16 entries by the same count). Kills: the k bound moved or dropped, the skew
    rule not applied to SpMM, the size thresholds moved or made strict, the lanes' share of a warp left
    out of them, the empty-row bound moved or made loose, the unzeroed walk kept below 128 entries."""
    f = features(row_len_max=481, nnz=nnz, empty_rows=empty)
    assert select_variant(f, Op.SPMM, k).id == f"spmm/{want}" + ("" if "block=" in want else ",block=256")
    wide = dataclasses.replace(f, empty_rows=41)
    g = 16 if k is not None and k <= 64 else 32
    nzpg = 64 if nnz * g / 32 / 64 >= 32768 else 16
    assert select_variant(wide, Op.SPMM, k).id == f"spmm/coo_runs/-/g={g},vec=4,nzpg={nzpg},block=256"
    assert select_variant(features(nnz=nnz), Op.SPMM, k).id == "spmm/csr_rows/-/g=32,vec=4,block=256"
