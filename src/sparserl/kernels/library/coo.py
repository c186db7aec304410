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

from sparserl.kernels.contract import Op
from sparserl.kernels.library.common import (
    FULL_MASK,
    Variant,
    acc_decl,
    acc_fma,
    acc_store,
    acc_zero,
    fill,
    make,
)


def atomic_function(sig: str, block: int, row: str = "row_idx", col: str = "col_idx",
                    val: str = "val", count: str = "nnz") -> str:
    """Thread-per-entry atomic SpMV over COO arrays named ``row``, ``col``, ``val``."""
    return fill(
        """
${SIG}
{
    const int i = blockIdx.x * ${B} + threadIdx.x;
    if (i < ${COUNT})
        atomicAdd(y + __ldg(${ROW} + i), __ldg(${VAL} + i) * __ldg(x + __ldg(${COL} + i)));
}
""",
        SIG=sig, B=block, ROW=row, COL=col, VAL=val, COUNT=count,
    )


def _atomic(v: Variant) -> str:
    b = v.t("block")
    return v.header([f"grid=ceil_div(nnz, {b}), block={b}"]) + "\n" + atomic_function(v.sig(launch_bounds=b), b)


def segmented_launch(block: int, batches: int, count: str = "nnz") -> str:
    return f"grid=ceil_div({count}, {32 * batches * (block // 32)}), block={block}"


def segmented_function(sig: str, block: int, batches: int, row: str = "row_idx", col: str = "col_idx",
                       val: str = "val", count: str = "nnz") -> str:
    """Warp segmented-scan SpMV over COO arrays (rows sorted); y must start zeroed."""
    return fill(
        """
${SIG}
{
    const int lane = threadIdx.x & 31;
    const long long base = ((long long)blockIdx.x * ${WPB} + (threadIdx.x >> 5)) * ${CHUNK};
    if (base >= ${COUNT}) return;  // uniform per warp
    float carry = 0.f;
    int carry_row = -1;  // row of the run that reached lane 31 of the previous batch
    for (int t = 0; t < ${BATCHES}; ++t) {
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
        SIG=sig, WPB=block // 32, CHUNK=32 * batches, BATCHES=batches, FULL=FULL_MASK,
        ROW=row, COL=col, VAL=val, COUNT=count,
    )


def _segmented(v: Variant) -> str:
    b, batches = v.t("block"), v.t("batches")
    return v.header([segmented_launch(b, batches)]) + "\n" + segmented_function(v.sig(launch_bounds=b), b, batches)


def runs_launch(block: int, g: int, nzpg: int, count: str = "nnz") -> str:
    return f"grid=ceil_div({count}, {nzpg * (block // g)}), block={block}"


def runs_function(sig: str, block: int, g: int, vec: int, nzpg: int, row: str = "row_idx",
                  col: str = "col_idx", val: str = "val", count: str = "nnz") -> str:
    """SpMM over COO arrays: g lanes per run of nzpg entries, atomics into Y (zeroed)."""
    return fill(
        """
${SIG}
{
    const int lane = threadIdx.x & ${GM1};
    const long long j0 = ((long long)blockIdx.x * ${GPB} + threadIdx.x / ${G}) * ${NZPG};
    if (j0 >= ${COUNT}) return;
    const int j1 = (int)min(j0 + ${NZPG}, (long long)${COUNT});
    for (int t0 = 0; t0 < k; t0 += ${G} * ${VEC}) {
        const int c0 = t0 + lane * ${VEC};
        if (c0 >= k) break;
        ${ACC_DECL}
        int cur = __ldg(${ROW} + j0);
        for (int j = (int)j0; j < j1; ++j) {
            const int r = __ldg(${ROW} + j);
            if (r != cur) {
                ${FLUSH}
                ${ZERO}
                cur = r;
            }
            const float a = __ldg(${VAL} + j);
            const int c = __ldg(${COL} + j);
            ${FMA}
        }
        ${FLUSH}
    }
}
""",
        SIG=sig,
        G=g,
        GM1=g - 1,
        GPB=block // g,
        NZPG=nzpg,
        ROW=row, COL=col, VAL=val, COUNT=count,
        VEC=vec,
        ACC_DECL=acc_decl(vec),
        ZERO=acc_zero(vec),
        FMA=acc_fma(vec, "a", "X + (size_t)c * k + c0"),
        FLUSH=acc_store(vec, "Y + (size_t)cur * k + c0", atomic=True),
    )


def _spmm_runs(v: Variant) -> str:
    b, g, vec, nzpg = v.t("block"), v.t("g"), v.t("vec"), v.t("nzpg")
    return v.header([runs_launch(b, g, nzpg)]) + "\n" + runs_function(v.sig(launch_bounds=b), b, g, vec, nzpg)


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
