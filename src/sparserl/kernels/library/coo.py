"""COO kernels (y is zeroed by the harness before the launch; every kernel accumulates).

* ``coo_atomic``: one thread per nonzero, one ``atomicAdd`` each. The simplest correct
  COO kernel; fine when rows are very short.
* ``coo_segmented``: a warp walks ``batches`` x 32 consecutive nonzeros; a segmented
  shuffle scan sums runs of equal rows, so there is one atomic per row segment per
  batch, and the run crossing a batch boundary is carried in registers.
* SpMM ``coo_runs``: a group of ``g`` lanes takes ``nzpg`` consecutive nonzeros (an equal
  share of the work whatever the row lengths), ``g`` at a time in one coalesced load,
  and sums runs of the same row into registers (``vec`` columns per lane) with eight rows
  of X in flight per lane (four when a group spans 128 columns). A row wholly inside the group's nonzeros is stored; the first
  and last, which may be shared with a neighbouring group, are added with atomics.
* SpMM ``coo_runs_stored``: the same walk under ``FORMAT: COO zero_y=0``, where the harness does
  not zero Y (a memset of all of Y, as long as one write of it, saved): a small first launch zeroes
  the rows a boundary between two groups cuts (one thread per boundary) and the rows before the
  first entry and after the last; the walk stores every other row once, and the zeros of the empty
  rows between its entries, adding with atomics only into the cut rows.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import FULL_MASK, Strategy, Variant, fill, group_mask, make, vec_helpers

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


def runs_function(sig: str, row: str = "row_idx", col: str = "col_idx", val: str = "val", count: str = "nnz",
                  owns_rows: bool = True, stores_all: bool = False) -> str:
    """SpMM over COO arrays: G lanes take NZPG consecutive entries, VEC columns of Y per lane, Y zeroed.

    The group reads G entries at a time (one coalesced load each of rows, columns and values) and
    broadcasts them with shuffles; the rows of X of ``UNROLL`` entries are loaded before any is used,
    so a lane keeps that many loads in flight: 8, or 4 when a group spans 128 columns (G * VEC) and
    owns its rows, where each load is a whole 512-byte row and 48 registers instead of 70 keep more
    warps on an SM (on the GCN graphs at k = 128: 48.8 against 54.0 us on soc-brightkite, level on
    the 1M-node graph). A run of one row is summed in registers. A row wholly inside the group's
    entries is stored; the group's first and last rows, which may go on in a
    neighbouring group, are added with atomics. ``owns_rows`` False: every row is added (another
    kernel wrote Y's rows before, as HYB's ELL part does). ``stores_all``: Y is not zeroed; only the
    rows two groups share are, by :func:`zero_rows_function`'s launch before this one. A row is
    added when it is shared, stored otherwise; the walk stores the zeros of the empty rows between
    its entries (the first launch, those before the first entry and after the last). Needs
    ``vec_helpers("load_x", "store_y", "add_y")`` before it."""
    assert owns_rows or not stores_all
    return fill(
        """
${SIG}
{
    constexpr int UNROLL = ${UNROLL};  // rows of X in flight per lane
    const int lane = threadIdx.x & (G - 1);
    const long long j0 = ((long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G) * NZPG;
    if (j0 >= ${COUNT}) return;  // whole groups leave together; shuffles use the group's mask
    const int j1 = (int)min(j0 + NZPG, (long long)${COUNT});
    const unsigned gmask = ${MASK};
    const int first = __ldg(${ROW} + j0);
${SETUP}    for (int t0 = 0; t0 < k; t0 += G * VEC) {
        const int c0 = t0 + lane * VEC;
        const bool active = c0 < k;
        float acc[VEC] = {};
        int cur = first;
        for (int base = (int)j0; base < j1; base += G) {
            const int j = base + lane;
            const int my_row = j < j1 ? __ldg(${ROW} + j) : 0;
            const int my_col = j < j1 ? __ldg(${COL} + j) : 0;
            const float my_val = j < j1 ? __ldg(${VAL} + j) : 0.f;
            const int cnt = min(G, j1 - base);
            const int last_row = __shfl_sync(gmask, my_row, cnt - 1, G);  // where cur stands after the round
${GAPS}            for (int t = 0; t < cnt; t += UNROLL) {
                float xv[UNROLL][VEC];  // the rows of X first: UNROLL loads in flight
                #pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
                    const int c = __shfl_sync(gmask, my_col, (t + u) & (G - 1), G);
                    if (active && t + u < cnt) {
                        load_x(xv[u], X + (size_t)c * k + c0);
                    } else {
                        #pragma unroll
                        for (int q = 0; q < VEC; ++q) xv[u][q] = 0.f;
                    }
                }
                #pragma unroll
                for (int u = 0; u < UNROLL; ++u) {  // then the values and rows, shuffled again (fewer registers)
                    const bool real = t + u < cnt;  // past the group's entries: adds nothing, ends no run
                    const float a = real ? __shfl_sync(gmask, my_val, (t + u) & (G - 1), G) : 0.f;
                    const int r = real ? __shfl_sync(gmask, my_row, (t + u) & (G - 1), G) : last_row;
                    if (r != cur) {  // the run of row cur ends here
                        if (active) {
${FLUSH}
                        }
                        #pragma unroll
                        for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
                        cur = r;
                    }
                    #pragma unroll
                    for (int q = 0; q < VEC; ++q) acc[q] = fmaf(a, xv[u][q], acc[q]);
                }
            }
        }
${FINAL}
    }
}
""",
        SIG=sig, ROW=row, COL=col, VAL=val, COUNT=count, MASK=group_mask("G"),
        UNROLL="G * VEC >= 128 ? 4 : 8" if owns_rows else "8",  # HYB's part keeps 8 (with 4 it spills)
        FLUSH=_STORED_FLUSH if stores_all else (
            "                            if (cur == first) add_y(Y + (size_t)cur * k + c0, acc);\n"
            "                            else store_y(Y + (size_t)cur * k + c0, acc);  // the row is the group's alone"
            if owns_rows else "                            add_y(Y + (size_t)cur * k + c0, acc);"),
        SETUP=fill(_STORED_SETUP, ROW=row) if stores_all else "", GAPS=_STORED_GAPS if stores_all else "",
        FINAL=fill(_STORED_FINAL, ROW=row, COUNT=count) if stores_all else
        "        if (active) add_y(Y + (size_t)cur * k + c0, acc);  // the last row may go on in the next group",
    )


# coo_runs_stored: Y is not zeroed (FORMAT: COO zero_y=0); the pieces runs_function puts in its walk
_STORED_SETUP = """\
    // the group's first row is shared when the previous group's last entry is in it; the rows between
    // that entry's row and the first are empty, and this group stores their zeros
    const int before = j0 > 0 ? __ldg(${ROW} + j0 - 1) : first;
    const bool head_shared = j0 > 0 && before == first;
    const float zeros[VEC] = {};
"""
_STORED_GAPS = """\
            if (t0 == 0) {  // the empty rows before each of this round's entries are the group's alone
                const int up = __shfl_up_sync(gmask, my_row, 1, G);
                const int lo = (lane == 0 ? (base == (int)j0 ? before : cur) : up) + 1;
                if (j < j1)  // the lane that holds the entry stores their zeros, all k columns (rare: no shuffles)
                    for (int e = lo; e < my_row; ++e)
                        for (int c = 0; c < k; c += VEC) store_y(Y + (size_t)e * k + c, zeros);
            }
"""
_STORED_FLUSH = """\
                            if (cur == first && head_shared) add_y(Y + (size_t)cur * k + c0, acc);
                            else store_y(Y + (size_t)cur * k + c0, acc);  // the row is the group's alone"""
_STORED_FINAL = """\
        if (active) {  // the last row is shared when the next group's first entry is in it
            if ((cur == first && head_shared) || (j1 < ${COUNT} && __ldg(${ROW} + j1) == cur))
                add_y(Y + (size_t)cur * k + c0, acc);
            else
                store_y(Y + (size_t)cur * k + c0, acc);
        }"""


def zero_launch(count: str = "nnz") -> str:
    """One thread per group boundary, and at least one per 32 rows (for the rows before the first
    entry and after the last)."""
    return f"grid=ceil_div(max(ceil_div({count}, NZPG), m / 32), BLOCK), block=BLOCK, kernel=spmm_zero_rows"


def zero_rows_function(sig: str, row: str = "row_idx", count: str = "nnz") -> str:
    """The launch before ``runs_function(stores_all=True)`` (:func:`zero_launch`): it zeroes the rows
    the walk adds into and the rows no group reaches. Those are the row each boundary between two
    groups of ``NZPG`` entries cuts (the only rows the walk adds into; a row cut by several boundaries
    is zeroed by each), one thread per boundary, and the rows before the matrix's first entry and
    after its last, by all threads. It reads two entries' rows per boundary, not the whole row array.
    The empty rows between two entries the walk stores itself: the lane that holds the later entry,
    a row at a time (slow where such runs are long, which the timed runs show). All of it ends before
    the walk starts."""
    return fill(
        """
${SIG}
{
    const float zeros[VEC] = {};
    const long long threads = (long long)gridDim.x * BLOCK;
    const long long t = (long long)blockIdx.x * BLOCK + threadIdx.x;
    const int row_first = __ldg(${ROW}), row_last = __ldg(${ROW} + ${COUNT} - 1);
    const long long tiles = k / VEC;  // k is a multiple of VEC
    const long long lead = (long long)row_first * tiles, trail = (long long)(m - 1 - row_last) * tiles;
    for (long long i = t; i < lead + trail; i += threads) {
        const long long e = i < lead ? i / tiles : row_last + 1 + (i - lead) / tiles;
        store_y(Y + (size_t)e * k + (size_t)(i % tiles) * VEC, zeros);
    }
    const long long b = (t + 1) * NZPG;  // the boundary before group t + 1
    if (b < ${COUNT}) {
        const int r = __ldg(${ROW} + b);
        if (__ldg(${ROW} + b - 1) == r)  // it cuts row r: both groups add into it
            for (long long q = 0; q < tiles; ++q) store_y(Y + (size_t)r * k + q * VEC, zeros);
    }
}
""",
        SIG=sig, ROW=row, COUNT=count,
    )


_spmm_runs = Strategy((runs_launch(),), vec_helpers("load_x", "store_y", "add_y") + runs_function(signature("COO", Op.SPMM, None, "BLOCK")))

_spmm_runs_stored = Strategy(
    (zero_launch(), runs_launch()),
    vec_helpers("load_x", "store_y", "add_y")
    + zero_rows_function(signature("COO", Op.SPMM, "spmm_zero_rows", "BLOCK"))
    + runs_function(signature("COO", Op.SPMM, None, "BLOCK"), stores_all=True))


def variants() -> list[Variant]:
    out = [
        make(Op.SPMV, "COO", "coo_atomic", _atomic, {"block": 256}, atomic=True,
             doc="one atomicAdd per nonzero"),
    ]
    for batches in (4, 16):
        out.append(make(Op.SPMV, "COO", "coo_segmented", _segmented, {"batches": batches, "block": 256},
                        atomic=True, doc="warp segmented scan over sorted rows, one atomic per row run"))
    for g, vec in ((32, 4), (16, 4), (8, 1), (2, 4)):
        for nzpg in (1, 16, 64):
            out.append(make(Op.SPMM, "COO", "coo_runs", _spmm_runs,
                            {"g": g, "vec": vec, "nzpg": nzpg, "block": 256},
                            k_multiple=vec, atomic=True,
                            doc="g lanes per run of nzpg nonzeros, atomics when the row changes"))
    # 32 lanes, 1024 entries in blocks of 128: 1143 against 1156 us at 256 on the 1M-node GCN graph, k = 128
    # (16 lanes keep 8 rows of X in flight, and at 1024 entries in blocks of 128 they spill)
    for g, points in ((32, ((64, 256), (128, 256), (256, 256), (1024, 128))), (16, ((64, 256), (128, 256), (256, 256)))):
        for nzpg, block in points:
            out.append(make(Op.SPMM, "COO", "coo_runs_stored", _spmm_runs_stored,
                            {"g": g, "vec": 4, "nzpg": nzpg, "block": block}, format_params={"zero_y": 0},
                            k_multiple=4, atomic=True,
                            doc="COO runs with Y unzeroed: shared rows zeroed first, every other row stored once"))
    return out
