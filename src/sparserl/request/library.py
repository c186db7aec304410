"""The reference library's kernels for a request, and the rule-based selector's pick among them.

:func:`select_variant` is the baseline an expert's rule of thumb gives. From the structure
features alone it picks one library variant: DIA for a few well-filled diagonals, BSR 8x8 / 4x4
for dense blocks, ELL for even rows, merge-path CSR for skewed rows (SpMM: COO runs, an equal
share of nonzeros per lane group), otherwise CSR vector with about as many lanes per row as the
mean row length. The RL policy should beat it; the library
oracle (every variant, the fastest verified) bounds both. :func:`library_texts` is what a request
falls back to: the selector's pick first, then every other variant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparserl.kernels.contract import Op
from sparserl.kernels.library import Variant, get_variant, variants
from sparserl.matrices.features import MatrixFeatures

if TYPE_CHECKING:
    from sparserl.request.context import MatrixContext


SKEWED_SPMM_WARPS = 32768
"""Warps of work a skewed SpMM's lane groups should leave (about six waves of an H200 at the 40 warps an
SM these kernels' 48 registers allow): the most entries a group that still leaves this many is taken."""


def _skewed_spmm(f: MatrixFeatures, k: int | None) -> Variant:
    """COO runs, 16 lanes of 4 columns when k <= 64, else 32, with the most entries a group that still
    leaves :data:`SKEWED_SPMM_WARPS` warps of work: Y not zeroed (each row stored once) with 256 or 128
    entries, else Y zeroed by a memset with 64, else 16. With more than 1% of the rows empty, Y is zeroed
    whatever the size (the unzeroed walk stores each empty row's zeros from one lane).

    Measured on one H200 (warm): on a 1M-node power-law graph (8.9M nonzeros) 658 us at k = 64 (g 16, 128
    entries; 698 us for coo_runs, 64 entries) and 1155 us at k = 128 (g 32, 256 entries; 1189 us with 128,
    1262 us for coo_runs); on soc-brightkite's GCN adjacency (0.48M nonzeros, every library variant timed by
    ``benchmarks/library_speed.py --gcn``) coo_runs with 16 entries was the fastest at both k: 30.1 us at
    k = 64 (38.3 us with 64 entries, 41.3 us Y unzeroed) and 45.7 us at k = 128 (48.8 us with 64 entries,
    51.6 us Y unzeroed)."""
    g = 16 if k is not None and k <= 64 else 32
    warps = f.nnz / (32 // g)  # divided by the entries a group: the warps of work
    if f.empty_rows <= 0.01 * f.rows:
        for nzpg in (256, 128):
            if warps / nzpg >= SKEWED_SPMM_WARPS:
                return get_variant(f"spmm/coo_runs_stored/zero_y=0/g={g},vec=4,nzpg={nzpg},block=256")
    nzpg = 64 if warps / 64 >= SKEWED_SPMM_WARPS else 16
    return get_variant(f"spmm/coo_runs/-/g={g},vec=4,nzpg={nzpg},block=256")


def select_variant(f: MatrixFeatures, op: Op = Op.SPMV, k: int | None = None) -> Variant:
    """The rule-based choice for a matrix with features ``f`` (SpMM: ``k`` columns, when known)."""
    mean = max(f.row_len_mean, 1e-9)
    skewed = f.row_len_max > 16 * mean or f.empty_rows > 0.3 * f.rows
    if op is Op.SPMM:
        if f.num_diagonals <= 64 and f.diag_fill >= 0.5:
            return get_variant("spmm/dia_rows/-/g=8,vec=4,block=256")
        if f.block_density_8 >= 0.6:
            return get_variant("spmm/bsr_group/R=8,C=8/g=32,vec=4,block=256")
        if skewed:  # an equal share of nonzeros per lane group: COO runs
            return _skewed_spmm(f, k)
        return get_variant("spmm/csr_rows/-/g=32,vec=4,block=256")
    if f.num_diagonals <= 64 and f.diag_fill >= 0.5:
        return get_variant("spmv/dia_vec4/-/block=128")
    if f.block_density_8 >= 0.6:
        return get_variant("spmv/bsr_group/R=8,C=8/g=16,block=128")
    if f.block_density_4 >= 0.6:
        return get_variant("spmv/bsr_group/R=4,C=4/g=16,block=128")
    if skewed:
        return get_variant("spmv/csr_merge/-/block=256,ipt=7")
    if f.row_len_std <= 0.3 * mean and f.row_len_max <= 64:
        return get_variant("spmv/ell_rows/-/block=128,rpt=1")
    tpr = 2
    while tpr < 32 and tpr * 2 <= mean:
        tpr *= 2
    return get_variant(f"spmv/csr_vector/-/tpr={tpr},block=128")


def library_texts(ctx: MatrixContext) -> list[tuple[str, bool]]:
    """Every library variant of the request's op as (text, whether it is the selector's pick), the
    selector's pick first."""
    pick = select_variant(ctx.features, ctx.op, ctx.k)
    return [(pick.render(), True)] + [(v.render(), False) for v in variants(ctx.op, None, ctx.k) if v.id != pick.id]
