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
LONG_GROUP_WARPS = 8192
"""Warps of work that 1024 entries a group should leave (about a wave and a half): on the 1M-node GCN
graph (8.9M nonzeros, k = 128, 8692 warps) such groups took 1143 us in blocks of 128 (about 1163 in blocks
of 256, one reading) against 1156 us with 256 entries, and 4096 entries (2174 warps, under half a wave)
took 1531 us (benchmarks/results/2026-12-04/spmm-groups)."""


def spmm_lanes(k: int | None) -> int:
    """The lanes of a skewed SpMM's lane group at ``k`` columns: 4 columns a lane, 16 lanes when
    k <= 64, else 32 (one pass over k <= 128)."""
    return 16 if k is not None and k <= 64 else 32


def _skewed_spmm(f: MatrixFeatures, k: int | None) -> Variant:
    """COO runs, 16 lanes of 4 columns when k <= 64, else 32, with the most entries a group that still
    leaves enough warps of work: Y not zeroed (each row stored once) with 1024 entries in blocks of 128
    where :data:`LONG_GROUP_WARPS` remain (32 lanes only), else with 128 where :data:`SKEWED_SPMM_WARPS`
    do, else Y zeroed by a memset with 64 (the same bound), else 16. 1024 takes the size from which 256
    entries were this rule's pick (256 x 32768 = 1024 x 8192 warps). With more than 1% of the rows empty, Y is zeroed
    whatever the size (the unzeroed walk stores each empty row's zeros from one lane).

    Measured on one H200 (warm): on a 1M-node power-law graph (8.9M nonzeros) 658 us at k = 64 (g 16, 128
    entries; 698 us for coo_runs, 64 entries) and 1155 us at k = 128 (g 32, 256 entries; 1189 us with 128,
    1262 us for coo_runs); on soc-brightkite's GCN adjacency (0.48M nonzeros, every library variant timed by
    ``benchmarks/library_speed.py --gcn``) coo_runs with 16 entries was the fastest at both k: 30.1 us at
    k = 64 (38.3 us with 64 entries, 41.3 us Y unzeroed) and 45.7 us at k = 128 (48.8 us with 64 entries,
    51.6 us Y unzeroed)."""
    g = spmm_lanes(k)
    warps = f.nnz / (32 // g)  # divided by the entries a group: the warps of work
    if f.empty_rows <= 0.01 * f.rows:
        tiers = ((1024, 128, LONG_GROUP_WARPS),) if g == 32 else ()  # the library has 1024 at 32 lanes only
        for nzpg, block, least in (*tiers, (128, 256, SKEWED_SPMM_WARPS)):
            if warps / nzpg >= least:
                return get_variant(f"spmm/coo_runs_stored/zero_y=0/g={g},vec=4,nzpg={nzpg},block={block}")
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
