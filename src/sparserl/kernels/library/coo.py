"""COO kernels (y is zeroed by the harness before the launch; every kernel accumulates).

* ``coo_atomic``: one thread per nonzero, one ``atomicAdd`` each. The simplest correct
  COO kernel; fine when rows are very short.
* ``coo_segmented``: a warp walks ``batches`` x 32 consecutive nonzeros; a segmented
  shuffle scan sums runs of equal rows, so there is one atomic per row segment per
  batch, and the run crossing a batch boundary is carried in registers.
* SpMM ``coo_runs``: a group of ``g`` lanes takes ``nzpg`` consecutive nonzeros, sums
  runs of the same row into registers (``vec`` columns per lane) and adds each run
  into Y with atomics when the row changes.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import FULL_MASK, Strategy, Variant, fill, make, vec_helpers

_atomic = Strategy(("grid=ceil_div(nnz, BLOCK), block=BLOCK",), fill(
    """
${SIG}
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < nnz)
        atomicAdd(y + __ldg(row_idx + i), __ldg(val + i) * __ldg(x + __ldg(col_idx + i)));
}
""", SIG=signature("COO", Op.SPMV, None, "BLOCK")))


def segmented_launch(block: str, count: str = "nnz") -> str:
    """The LAUNCH line of :func:`segmented_function` for ``block`` threads (a constant's name or a number)."""
    return f"grid=ceil_div({count}, {block} * BATCHES), block={block}"


def segmented_function(sig: str, block: str, row: str = "row_idx", col: str = "col_idx",
                       val: str = "val", count: str = "nnz") -> str:
    """Warp segmented-scan SpMV over COO arrays (rows sorted), BATCHES batches of 32 entries per warp,
    ``block`` threads per block; y must start zeroed."""
    return fill(
        """
${SIG}
{
    const int lane = threadIdx.x & 31;
    const long long base = ((long long)blockIdx.x * (${BLOCK} / 32) + (threadIdx.x >> 5)) * (32 * BATCHES);
    if (base >= ${COUNT}) return;  // uniform per warp
    float carry = 0.f;
    int carry_row = -1;  // row of the run that reached lane 31 of the previous batch
    for (int t = 0; t < BATCHES; ++t) {
        const long long j = base + t * 32 + lane;
        const bool valid = j < ${COUNT};
        const int r = valid ? __ldg(${ROW} + j) : -1;
        float v = valid ? __ldg(${VAL} + j) * __ldg(x + __ldg(${COL} + j)) : 0.f;
        // Segmented inclusive scan over runs of equal rows (rows are sorted).
        #pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float vu = __shfl_up_sync(${FULL}, v, off);
            const int ru = __shfl_up_sync(${FULL}, r, off);
            if (lane >= off && ru == r) v += vu;
        }
        const int first_r = __shfl_sync(${FULL}, r, 0);
        if (carry_row >= 0 && carry_row != first_r) {  // the carried run ended at the batch edge
            if (lane == 0) atomicAdd(y + carry_row, carry);
            carry_row = -1;
        }
        if (carry_row >= 0 && r == carry_row) v += carry;
        const int r_next = __shfl_down_sync(${FULL}, r, 1);
        if (valid && lane != 31 && r_next != r) atomicAdd(y + r, v);
        carry = __shfl_sync(${FULL}, v, 31);
        carry_row = __shfl_sync(${FULL}, r, 31);
    }
    if (lane == 0 && carry_row >= 0) atomicAdd(y + carry_row, carry);
}
""",
        SIG=sig, BLOCK=block, FULL=FULL_MASK, ROW=row, COL=col, VAL=val, COUNT=count,
    )


_segmented = Strategy((segmented_launch("BLOCK"),),
                      segmented_function(signature("COO", Op.SPMV, None, "BLOCK"), "BLOCK"))


def runs_launch(count: str = "nnz") -> str:
    return f"grid=ceil_div({count}, NZPG * (BLOCK / G)), block=BLOCK"


def runs_function(sig: str, row: str = "row_idx", col: str = "col_idx", val: str = "val", count: str = "nnz") -> str:
    """SpMM over COO arrays: G lanes per run of NZPG entries, VEC columns of Y per lane, atomics into
    Y (zeroed). Needs ``vec_helpers("fma_x", "add_y")`` before it."""
    return fill(
        """
${SIG}
{
    const int lane = threadIdx.x & (G - 1);
    const long long j0 = ((long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G) * NZPG;
    if (j0 >= ${COUNT}) return;
    const int j1 = (int)min(j0 + NZPG, (long long)${COUNT});
    for (int t0 = 0; t0 < k; t0 += G * VEC) {
        const int c0 = t0 + lane * VEC;
        if (c0 >= k) break;
        float acc[VEC] = {};
        int cur = __ldg(${ROW} + j0);
        for (int j = (int)j0; j < j1; ++j) {
            const int r = __ldg(${ROW} + j);
            if (r != cur) {
                add_y(Y + (size_t)cur * k + c0, acc);
                #pragma unroll
                for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
                cur = r;
            }
            const float a = __ldg(${VAL} + j);
            const int c = __ldg(${COL} + j);
            fma_x(acc, a, X + (size_t)c * k + c0);
        }
        add_y(Y + (size_t)cur * k + c0, acc);
    }
}
""",
        SIG=sig, ROW=row, COL=col, VAL=val, COUNT=count,
    )


_spmm_runs = Strategy((runs_launch(),), vec_helpers("fma_x", "add_y") + runs_function(signature("COO", Op.SPMM, None, "BLOCK")))


def variants() -> list[Variant]:
    out = [
        make(Op.SPMV, "COO", "coo_atomic", _atomic, {"block": 256}, atomic=True,
             doc="one atomicAdd per nonzero"),
    ]
    for batches in (4, 16):
        out.append(make(Op.SPMV, "COO", "coo_segmented", _segmented, {"batches": batches, "block": 256},
                        atomic=True, doc="warp segmented scan over sorted rows, one atomic per row run"))
    for g, vec in ((32, 4), (8, 1), (2, 4)):
        for nzpg in (1, 16):
            out.append(make(Op.SPMM, "COO", "coo_runs", _spmm_runs,
                            {"g": g, "vec": vec, "nzpg": nzpg, "block": 256},
                            k_multiple=vec, atomic=True,
                            doc="g lanes per run of nzpg nonzeros, atomics when the row changes"))
    return out
