"""CSR kernels: scalar (thread per row), vector (a group of lanes per row), merge-path.

* ``csr_scalar``: one thread per row. Best for very short, even rows.
* ``csr_vector``: ``tpr`` lanes per row (2..32), strided loads of the row, butterfly
  reduction with ``__shfl_xor_sync``. Pick ``tpr`` near the mean row length.
* ``csr_merge``: merge-path load balancing (Merrill & Garland, SC'16): the merge of row
  ends and nonzero indices is cut into equal tiles, so a row of a million nonzeros and
  a million empty rows cost the same per thread. Rows split between threads are
  combined with ``atomicAdd`` into a y zeroed by a first launch.
* ``csr_adaptive`` and ``csr_lanes`` (module :mod:`.csr_irregular`): rows binned by length
  with long rows split over blocks, and lane groups with several loads in flight.
* SpMM ``csr_rows``: a group of ``g`` lanes per row; the group loads ``g`` (col, val)
  pairs at once and broadcasts them with shuffles while each lane accumulates ``vec``
  columns of Y (float4 loads of X when ``vec`` = 4).
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library import csr_irregular
from sparserl.kernels.library.common import (
    FULL_MASK,
    VEC_HELPERS,
    Strategy,
    Variant,
    fill,
    group_mask,
    group_sum,
    make,
)

_SIG = signature("CSR", Op.SPMV, None, "BLOCK")

_scalar = Strategy(("grid=ceil_div(m, BLOCK), block=BLOCK",), fill(
    """
${SIG}
{
    const int row = blockIdx.x * BLOCK + threadIdx.x;
    if (row >= m) return;
    const int start = __ldg(row_ptr + row);
    const int end = __ldg(row_ptr + row + 1);
    float sum = 0.f;
    for (int j = start; j < end; ++j)
        sum = fmaf(__ldg(val + j), __ldg(x + __ldg(col_idx + j)), sum);
    y[row] = sum;
}
""", SIG=_SIG))

_vector = Strategy(("grid=ceil_div(m, BLOCK / TPR), block=BLOCK",), fill(
    """
${SIG}
{
    // TPR lanes per row; groups never straddle a warp, and every lane reaches the shuffles.
    const int lane = threadIdx.x & (TPR - 1);
    const int row = blockIdx.x * (BLOCK / TPR) + threadIdx.x / TPR;
    float sum = 0.f;
    if (row < m) {
        const int start = __ldg(row_ptr + row);
        const int end = __ldg(row_ptr + row + 1);
        for (int j = start + lane; j < end; j += TPR)
            sum = fmaf(__ldg(val + j), __ldg(x + __ldg(col_idx + j)), sum);
    }
${REDUCE}
    if (lane == 0 && row < m) y[row] = sum;
}
""", SIG=_SIG, REDUCE=group_sum("sum", "TPR", FULL_MASK)))

_merge = Strategy(("grid=ceil_div(m, 256), block=256, kernel=spmv_zero_y", "grid=ceil_div(m + nnz, BLOCK * IPT), block=BLOCK"), fill(
    """
constexpr int TILE = BLOCK * IPT;  // merge items (row ends and nonzeros) per block

${ZSIG}
{
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < m) y[i] = 0.f;
}

// Merge-path search: the split (row, nz) of diagonal `diag` of the merge of the row-end
// offsets `ends[0..num_rows)` with the nonzero indices `first_nz ..< first_nz + num_nz`.
static __device__ __forceinline__ int merge_search(int diag, const int* ends, int num_rows,
                                                   int first_nz, int num_nz)
{
    int lo = max(diag - num_nz, 0);
    int hi = min(diag, num_rows);
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (ends[mid] <= first_nz + diag - mid - 1) lo = mid + 1; else hi = mid;
    }
    return lo;  // rows consumed; nonzeros consumed = diag - lo
}

${SIG}
{
    __shared__ int s_coord[5];
    __shared__ int s_ends[TILE + 1];
    __shared__ float s_prod[TILE];
    const int total = m + nnz;
    const int tile_begin = blockIdx.x * TILE;
    const int tile_end = min(tile_begin + TILE, total);
    if (threadIdx.x < 2) {
        const int diag = threadIdx.x == 0 ? tile_begin : tile_end;
        const int r = merge_search(diag, row_ptr + 1, m, 0, nnz);
        s_coord[2 * threadIdx.x] = r;
        s_coord[2 * threadIdx.x + 1] = diag - r;
        if (threadIdx.x == 0) s_coord[4] = __ldg(row_ptr + r);
    }
    __syncthreads();
    const int row0 = s_coord[0], nz0 = s_coord[1];
    const int tile_rows = s_coord[2] - row0, tile_nnz = s_coord[3] - nz0;
    const int row0_begin = s_coord[4];
    // Stage the tile: products (coalesced loads) and the row ends it needs.
    for (int i = threadIdx.x; i < tile_nnz; i += BLOCK)
        s_prod[i] = __ldg(val + nz0 + i) * __ldg(x + __ldg(col_idx + nz0 + i));
    for (int i = threadIdx.x; i <= tile_rows; i += BLOCK)
        s_ends[i] = (row0 + i < m) ? __ldg(row_ptr + row0 + i + 1) : nnz;
    __syncthreads();

    const int items = tile_rows + tile_nnz;
    const int diag = min((int)threadIdx.x * IPT, items);
    const int diag_end = min(diag + IPT, items);
    int r = merge_search(diag, s_ends, tile_rows, nz0, tile_nnz);
    int z = diag - r;
    // Did the current row begin before this thread's first item?
    bool partial = (nz0 + z) > (r == 0 ? row0_begin : s_ends[r - 1]);
    bool carry = false;
    float sum = 0.f;
    for (int it = diag; it < diag_end; ++it) {
        if (nz0 + z < s_ends[r]) {
            sum += s_prod[z];
            ++z;
            carry = true;
        } else {
            if (partial) atomicAdd(y + row0 + r, sum); else y[row0 + r] = sum;
            sum = 0.f;
            partial = false;
            carry = false;
            ++r;
        }
    }
    if (carry) atomicAdd(y + row0 + r, sum);  // the row goes on in the next thread
}
""", ZSIG=signature("CSR", Op.SPMV, "spmv_zero_y"), SIG=_SIG))

_spmm_rows = Strategy(("grid=ceil_div(m, BLOCK / G), block=BLOCK",), VEC_HELPERS + fill(
    """
${SIG}
{
    // G lanes per row; each lane owns VEC consecutive columns of Y per column tile.
    const int lane = threadIdx.x & (G - 1);
    const int row = blockIdx.x * (BLOCK / G) + threadIdx.x / G;
    if (row >= m) return;  // whole groups leave together; shuffles use the group's mask
    const unsigned gmask = ${MASK};
    const int start = __ldg(row_ptr + row);
    const int end = __ldg(row_ptr + row + 1);
    for (int t0 = 0; t0 < k; t0 += G * VEC) {
        const int c0 = t0 + lane * VEC;
        const bool active = c0 < k;
        float acc[VEC] = {};
        for (int base = start; base < end; base += G) {
            const int j = base + lane;
            const int my_col = j < end ? __ldg(col_idx + j) : 0;
            const float my_val = j < end ? __ldg(val + j) : 0.f;
            const int cnt = min(G, end - base);
            for (int t = 0; t < cnt; ++t) {
                const int c = __shfl_sync(gmask, my_col, t, G);
                const float a = __shfl_sync(gmask, my_val, t, G);
                if (active) fma_x(acc, a, X + (size_t)c * k + c0);
            }
        }
        if (active) store_y(Y + (size_t)row * k + c0, acc);
    }
}
""", SIG=signature("CSR", Op.SPMM, None, "BLOCK"), MASK=group_mask("G")))


def variants() -> list[Variant]:
    out: list[Variant] = []
    for b in (128, 256):
        out.append(make(Op.SPMV, "CSR", "csr_scalar", _scalar, {"block": b},
                        doc="one thread per row; short even rows"))
    for tpr in (2, 4, 8, 16, 32):
        for b in (128, 256):
            out.append(make(Op.SPMV, "CSR", "csr_vector", _vector, {"tpr": tpr, "block": b},
                            doc="tpr lanes per row with a shuffle reduction; rows of ~tpr or more nonzeros"))
    for b, ipt in ((128, 7), (256, 7), (256, 3)):
        out.append(make(Op.SPMV, "CSR", "csr_merge", _merge, {"block": b, "ipt": ipt}, atomic=True,
                        doc="merge-path load balancing; skewed and power-law rows"))
    out += csr_irregular.variants()
    for g, vec in ((32, 4), (8, 4), (2, 4), (32, 1), (8, 1)):
        for b in (128, 256):
            out.append(make(Op.SPMM, "CSR", "csr_rows", _spmm_rows, {"g": g, "vec": vec, "block": b},
                            k_multiple=vec,
                            doc="g lanes per row, shuffle-broadcast (col, val), vec columns per lane"))
    return out
