"""CSR kernels for irregular matrices: row-binned adaptive CSR, and lane groups with loads in flight.

* ``csr_adaptive``: rows are binned by length at run time (the contract passes no bin arrays).
  Rows up to ``long_len`` entries are handled by the first kernel, a warp per ``rpw``
  consecutive rows: the warp streams the nonzeros of its rows in chunks of ``32 x items``
  (each lane reads ``items`` consecutive entries with 16-byte loads, so the loads are
  coalesced whatever the row lengths), multiplies them with ``x`` and adds each run of one
  row into that row's slot in shared memory; then the warp writes its rows of ``y`` with one
  coalesced store. Work per warp is the nonzeros of its rows, not its longest row, so short,
  empty and medium rows mix freely. Rows longer than ``long_len`` (written 0 there) are split
  into pieces of ``seg`` entries by a second kernel, a block per piece, each adding its
  piece into ``y`` with one ``atomicAdd``: a row of a million entries is spread over the
  whole GPU. In the generic form the second kernel cuts all the nonzeros into pieces of
  ``seg`` (``seg <= long_len``) and each block finds the rows at the ends of its piece with a
  32-way search of ``row_ptr`` by one warp (five rounds of loads for two million rows); most
  blocks find no long row there and stop, so a large ``seg`` keeps that pass short. Wins on power-law, skewed and empty-row matrices and on LP-like
  matrices with a few dense rows, where one row per thread or warp leaves most lanes idle.

  The specialised form (:class:`AdaptivePlan`) bakes in the row-length bins of the matrix:
  with no row longer than ``long_len`` the second kernel and every long-row test are gone;
  when every other row is at most ``THREAD_MAX`` long the first kernel is a lane per row with
  a fully unrolled loop; and the long rows themselves, with their split points, become a
  constant table (``__constant__`` row numbers, and the first piece of each row when rows need
  different numbers of pieces), so the second kernel launches one block per piece and searches
  nothing.

* ``csr_lanes``: ``tpr`` lanes per row, each lane with ``unroll`` entries in flight (every load
  of a batch is issued before the first multiply), ``val`` and ``col_idx`` streamed with
  ``__ldcs`` (read once, evicted first, so the L2 keeps ``x``), a butterfly sum, and a
  deterministic result. Wins on matrices whose rows are similar in length (random,
  rectangular, empty rows), where the x gathers, not the balance, set the time. Its
  specialised form bakes in a uniform row length ``L``: row ``i`` holds entries
  ``i*L .. i*L+L-1``, so ``row_ptr`` is never read, the loop has a fixed trip count, and when
  ``L`` is a multiple of 4 every lane reads 16-byte chunks.

Both read every value from ``val`` and ``x``: only the structure is specialised.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import FULL_MASK, Variant, fill, group_sum, make

THREAD_MAX = 8
"""A specialised csr_adaptive uses a lane per row when no row up to long_len is longer than this."""
LONG_BLOCK = 256
"""Threads per block of the long-row kernel."""


@dataclass(frozen=True)
class AdaptivePlan:
    """The structure facts a specialised ``csr_adaptive`` bakes in (see the module docstring)."""

    has_long: bool
    """Whether any row is longer than long_len (False: no second kernel, no long-row tests)."""
    short_max: int
    """An upper bound on the length of every row of at most long_len entries."""
    long_rows: tuple[tuple[int, int], ...] | None
    """(row, length) of every row longer than long_len, ascending by row, or None: the long-row
    kernel searches for them instead of reading a constant table."""
    note: str
    """One comment line naming what was baked in."""


def _sig(name: str | None, block: int) -> str:
    return signature("CSR", Op.SPMV, name, block)


def _load_products(items: int) -> str:
    """CUDA: ``prod[0..items)`` = val*x of entries q..q+items-1 inside [p_begin, p_end), else 0."""
    lines = []
    for v in range(0, items, 4):
        lines.append(fill(
            """
        {
            const int j = q + ${V};
            if (j + 4 <= p_begin || j >= p_end) {
                prod[${V}] = prod[${V1}] = prod[${V2}] = prod[${V3}] = 0.f;
            } else if (j + 3 < nnz) {  // j is a multiple of 4: 16-byte loads
                const int4 c4 = __ldcs(reinterpret_cast<const int4*>(col_idx + j));
                const float4 a4 = __ldcs(reinterpret_cast<const float4*>(val + j));
                prod[${V}] = (j >= p_begin && j < p_end) ? a4.x * __ldg(x + c4.x) : 0.f;
                prod[${V1}] = (j + 1 >= p_begin && j + 1 < p_end) ? a4.y * __ldg(x + c4.y) : 0.f;
                prod[${V2}] = (j + 2 >= p_begin && j + 2 < p_end) ? a4.z * __ldg(x + c4.z) : 0.f;
                prod[${V3}] = (j + 3 >= p_begin && j + 3 < p_end) ? a4.w * __ldg(x + c4.w) : 0.f;
            } else {
                #pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const int jt = j + t;
                    prod[${V} + t] = (jt >= p_begin && jt < p_end) ? __ldg(val + jt) * __ldg(x + __ldg(col_idx + jt)) : 0.f;
                }
            }
        }""", V=v, V1=v + 1, V2=v + 2, V3=v + 3))
    return "\n".join(lines)


def _stream_kernel(rpw: int, items: int, long_len: int, block: int, has_long: bool) -> str:
    chunk = 32 * items
    long_skip = fill(
        """
        {   // a chunk that lies inside one long row is skipped whole (spmv_long does that row)
            const int r = row_at(ptr, max(c0, p_begin));
            if (ptr[r + 1] - ptr[r] > ${LONG} && ptr[r + 1] - c0 >= ${CHUNK}) {
                c0 = ptr[r + 1] & ~3;
                continue;
            }
        }""", LONG=long_len, CHUNK=chunk) if has_long else ""
    return fill(
        """
// The row of entry j among this warp's rows: the last r < ${RPW} with ptr[r] <= j (ptr[0] <= j < ptr[${RPW}]).
static __device__ __forceinline__ int row_at(const int* ptr, int j)
{
    int r = 0;
    #pragma unroll
    for (int s = ${HALF}; s > 0; s >>= 1)
        if (ptr[r + s] <= j) r += s;
    return r;
}

${SIG}
{
    // A warp per ${RPW} consecutive rows. It streams their nonzeros in chunks of ${CHUNK}: lane l takes
    // ${ITEMS} consecutive entries (16-byte loads), and each run of one row is added to that row's slot.
    __shared__ int s_ptr[${WPB}][${RPW1}];
    __shared__ float s_acc[${WPB}][${RPW}];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r0 = (blockIdx.x * ${WPB} + warp) * ${RPW};
    if (r0 >= m) return;  // whole warps leave together
    int* ptr = s_ptr[warp];
    float* acc = s_acc[warp];
    for (int i = lane; i <= ${RPW}; i += 32) ptr[i] = __ldg(row_ptr + min(r0 + i, m));
    for (int i = lane; i < ${RPW}; i += 32) acc[i] = 0.f;
    __syncwarp();
    const int p_begin = ptr[0];
    const int p_end = ptr[${RPW}];
    int c0 = p_begin & ~3;
    while (c0 < p_end) {${LONG_SKIP}
        const int q = c0 + lane * ${ITEMS};
        float prod[${ITEMS}];
${LOADS}
        if (q + ${ITEMS} > p_begin && q < p_end) {
            const int first = max(q, p_begin);
            int r = row_at(ptr, first);
            int r_end = ptr[r + 1];${SKIP_DECL}
            float run = 0.f;
            #pragma unroll
            for (int t = 0; t < ${ITEMS}; ++t) {
                const int j = q + t;
                if (j >= first && j < p_end) {
                    if (j >= r_end) {  // row r ends before j: add its run, move to j's row
                        ${ADD}
                        run = 0.f;
                        do { ++r; } while (ptr[r + 1] <= j);  // over empty rows
                        r_end = ptr[r + 1];${SKIP_SET}
                    }
                    run += prod[t];
                }
            }
            ${ADD}
        }
        c0 += ${CHUNK};
    }
    __syncwarp();
    for (int i = lane; i < ${RPW} && r0 + i < m; i += 32) y[r0 + i] = acc[i];${LONG_NOTE}
}
""",
        RPW=rpw, RPW1=rpw + 1, HALF=rpw // 2, CHUNK=chunk, ITEMS=items, WPB=block // 32,
        SIG=_sig(None, block), LONG_SKIP=long_skip, LOADS=_load_products(items),
        SKIP_DECL=f"\n            bool skip = r_end - ptr[r] > {long_len};" if has_long else "",
        SKIP_SET=f"\n                        skip = r_end - ptr[r] > {long_len};" if has_long else "",
        ADD="if (!skip) atomicAdd(acc + r, run);" if has_long else "atomicAdd(acc + r, run);",
        LONG_NOTE=f"  // rows longer than {long_len} get 0 here" if has_long else "",
    )


def _thread_kernel(rpw: int, long_len: int, block: int, short_max: int, has_long: bool) -> str:
    body = fill(
        """
        #pragma unroll
        for (int t = 0; t < ${SHORT}; ++t)
            if (a + t < b) sum = fmaf(__ldcs(val + a + t), __ldg(x + __ldcs(col_idx + a + t)), sum);""",
        SHORT=short_max)
    if has_long:
        body = f"\n        if (b - a <= {long_len}) {{  // longer rows: 0 here, spmv_long adds them" + body.replace(
            "\n", "\n    ") + "\n        }"
    return fill(
        """
${SIG}
{
    // Every row of at most ${LONG} entries has at most ${SHORT}: a lane per row, loop fully unrolled.
    const int r0 = (blockIdx.x * ${WPB} + (threadIdx.x >> 5)) * ${RPW};
    for (int i = threadIdx.x & 31; i < ${RPW}; i += 32) {
        const int row = r0 + i;
        if (row >= m) break;
        const int a = __ldg(row_ptr + row);
        const int b = __ldg(row_ptr + row + 1);
        float sum = 0.f;${BODY}
        y[row] = sum;
    }
}
""",
        SIG=_sig(None, block), LONG=long_len, SHORT=short_max, WPB=block // 32, RPW=rpw, BODY=body,
    )


_ADD_PIECE = """
// Adds entries [lo, hi) of row r (at most ${SEG}) into y[r]: the block's threads share them
// (coalesced, ${U} loads in flight per thread), then one atomicAdd. Every thread of the block calls it.
static __device__ __forceinline__ void add_piece(int r, int lo, int hi, const int* __restrict__ col_idx,
                                                 const float* __restrict__ val, const float* __restrict__ x,
                                                 float* __restrict__ y, float* s_part)
{
    float sum = 0.f;
    for (int i0 = 0; i0 < ${PER_THREAD}; i0 += ${U}) {
        #pragma unroll
        for (int i = 0; i < ${U}; ++i) {
            const int j = lo + (i0 + i) * ${LB} + (int)threadIdx.x;
            if (j < hi) sum = fmaf(__ldcs(val + j), __ldg(x + __ldcs(col_idx + j)), sum);
        }
    }
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < ${WARPS} ? s_part[threadIdx.x] : 0.f;
        #pragma unroll
        for (int off = ${WARPS_HALF}; off > 0; off >>= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
        if (threadIdx.x == 0) atomicAdd(y + r, sum);
    }
    __syncthreads();  // s_part is reused
}
"""

_ROW_OF = """
// The row holding entry z (the last r with row_ptr[r] <= z, for 0 <= z < nnz): a 32-way search by
// the whole warp, one round of 32 loads per factor of 32 in m.
static __device__ __forceinline__ int row_of(const int* __restrict__ row_ptr, int m, int z)
{
    const int lane = threadIdx.x & 31;
    int lo = 0, hi = m;  // the row is in [lo, hi) and row_ptr[lo] <= z
    while (hi - lo > 32) {
        const int step = (hi - lo + 31) >> 5;
        const int p = lo + lane * step;
        const unsigned ok = __ballot_sync(${FULL}, p < hi && __ldg(row_ptr + p) <= z);
        lo += (31 - __clz(ok)) * step;
        hi = min(lo + step, hi);
    }
    const int p = lo + lane;
    const unsigned ok = __ballot_sync(${FULL}, p < hi && __ldg(row_ptr + p) <= z);
    return lo + 31 - __clz(ok);
}
"""


def _long_kernel_search(long_len: int, seg: int) -> str:
    return fill(_ROW_OF, FULL=FULL_MASK) + fill(
        """
${SIG}
{
    // Rows longer than ${LONG}, in pieces: block b takes entries [b*${SEG}, b*${SEG} + ${SEG}). A row that lies
    // strictly inside them has fewer than ${SEG} <= ${LONG} entries, so only the rows holding the first
    // and the last of them can be long; each that is adds its part.
    __shared__ int s_row[2];
    __shared__ float s_part[${WARPS}];
    const int z0 = blockIdx.x * ${SEG};
    const int z1 = z0 + min(${SEG}, nnz - z0);
    if (threadIdx.x < 64) {
        const int r = row_of(row_ptr, m, threadIdx.x < 32 ? z0 : z1 - 1);
        if ((threadIdx.x & 31) == 0) s_row[threadIdx.x >> 5] = r;
    }
    __syncthreads();
    const int ra = s_row[0], rb = s_row[1];
    const bool long_a = __ldg(row_ptr + ra + 1) - __ldg(row_ptr + ra) > ${LONG};
    const bool long_b = rb != ra && __ldg(row_ptr + rb + 1) - __ldg(row_ptr + rb) > ${LONG};
    for (int e = long_a ? 0 : 1; e < (long_b ? 2 : 1); ++e) {  // e = 0: row ra, e = 1: row rb
        const int r = e == 0 ? ra : rb;
        add_piece(r, max(__ldg(row_ptr + r), z0), min(__ldg(row_ptr + r + 1), z1), col_idx, val, x, y, s_part);
    }
}
""",
        SIG=_sig("spmv_long", LONG_BLOCK), LONG=long_len, SEG=seg, WARPS=LONG_BLOCK // 32,
    )


def _table(name: str, values: list[int]) -> str:
    rows = [", ".join(str(v) for v in values[i:i + 16]) for i in range(0, len(values), 16)]
    return f"__constant__ int {name}[{len(values)}] = {{\n    " + ",\n    ".join(rows) + "\n};"


def _long_kernel_table(long_len: int, seg: int, long_rows: tuple[tuple[int, int], ...]) -> str:
    counts = [-(-n // seg) for _, n in long_rows]
    rows = _table("c_long_row", [r for r, _ in long_rows])
    sig = _sig("spmv_long", LONG_BLOCK)
    if len(set(counts)) == 1:
        per = counts[0]
        return (f"\n// The {len(long_rows)} rows longer than {long_len}, {per} piece(s) of up to {seg} entries each:"
                f"\n// block b does piece b % {per} of row c_long_row[b / {per}].\n" + rows + fill(
            """

${SIG}
{
    __shared__ float s_part[${WARPS}];
    const int r = c_long_row[blockIdx.x / ${PER}];
    const int end = __ldg(row_ptr + r + 1);
    const int lo = __ldg(row_ptr + r) + (blockIdx.x % ${PER}) * ${SEG};
    add_piece(r, lo, lo + min(${SEG}, end - lo), col_idx, val, x, y, s_part);
}
""", SIG=sig, WARPS=LONG_BLOCK // 32, PER=per, SEG=seg))
    first = [0]
    for c in counts:
        first.append(first[-1] + c)
    return (f"\n// The {len(long_rows)} rows longer than {long_len} in pieces of up to {seg} entries: row i has pieces"
            f"\n// c_long_first[i] .. c_long_first[i + 1] - 1 (block b does piece b).\n" + rows + "\n"
            + _table("c_long_first", first) + fill(
        """

${SIG}
{
    __shared__ float s_part[${WARPS}];
    int lo_i = 0, hi_i = ${NROWS};  // the row whose pieces hold block b: binary search of c_long_first
    while (hi_i - lo_i > 1) {
        const int mid = (lo_i + hi_i) >> 1;
        if (c_long_first[mid] <= (int)blockIdx.x) lo_i = mid; else hi_i = mid;
    }
    const int r = c_long_row[lo_i];
    const int end = __ldg(row_ptr + r + 1);
    const int lo = __ldg(row_ptr + r) + ((int)blockIdx.x - c_long_first[lo_i]) * ${SEG};
    add_piece(r, lo, lo + min(${SEG}, end - lo), col_idx, val, x, y, s_part);
}
""", SIG=sig, WARPS=LONG_BLOCK // 32, NROWS=len(long_rows), SEG=seg))


def render_adaptive(rpw: int, items: int, long_len: int, seg: int, block: int,
                    plan: AdaptivePlan | None = None) -> str:
    """The csr_adaptive completion; ``plan`` None is the generic form (see the module docstring)."""
    has_long = plan is None or plan.has_long
    searching = has_long and (plan is None or plan.long_rows is None)
    assert rpw in (32, 64, 128) and items % 4 == 0 and seg % LONG_BLOCK == 0 and (seg <= long_len or not searching)
    launches = [f"grid=ceil_div(m, {block // 32 * rpw}), block={block}"]
    if has_long and plan is not None and plan.long_rows is not None:
        launches.append(f"grid={sum(-(-n // seg) for _, n in plan.long_rows)}, block={LONG_BLOCK}, kernel=spmv_long")
    elif has_long:
        launches.append(f"grid=ceil_div(nnz, {seg}), block={LONG_BLOCK}, kernel=spmv_long")
    header = "\n".join(["FORMAT: CSR"] + [f"LAUNCH: {l}" for l in launches])
    parts = [header]
    if plan is not None:
        parts.append(f"// Specialised to this matrix: {plan.note}")
    if has_long:
        parts.append(fill(_ADD_PIECE, SEG=seg, PER_THREAD=seg // LONG_BLOCK, U=min(16, seg // LONG_BLOCK), LB=LONG_BLOCK,
                          WARPS=LONG_BLOCK // 32, WARPS_HALF=LONG_BLOCK // 64, FULL=FULL_MASK))
    if plan is not None and plan.short_max <= THREAD_MAX:
        parts.append(_thread_kernel(rpw, long_len, block, plan.short_max, has_long))
    else:
        parts.append(_stream_kernel(rpw, items, long_len, block, has_long))
    if has_long:
        if plan is not None and plan.long_rows is not None:
            parts.append(_long_kernel_table(long_len, seg, plan.long_rows))
        else:
            parts.append(_long_kernel_search(long_len, seg))
    return "\n".join(p.strip("\n") + "\n" for p in parts)


def render_lanes(tpr: int, unroll: int, block: int, uniform_len: int | None = None) -> str:
    """The csr_lanes completion; ``uniform_len`` (every row's length) gives the specialised form."""
    assert tpr in (1, 2, 4, 8, 16, 32) and block % tpr == 0
    rpb = block // tpr
    head = f"FORMAT: CSR\nLAUNCH: grid=ceil_div(m, {rpb}), block={block}\n"
    common = {"SIG": _sig(None, block), "TPR": tpr, "TPRM1": tpr - 1, "RPB": rpb, "REDUCE": group_sum("sum", tpr, FULL_MASK)}
    if uniform_len is None:
        return head + fill(
            """
${SIG}
{
    // ${TPR} lanes per row, ${U} entries per lane in flight: every load of a batch is issued before
    // the first multiply. val and col_idx stream (__ldcs: read once) so the L2 keeps x.
    const int lane = threadIdx.x & ${TPRM1};
    const int row = blockIdx.x * ${RPB} + threadIdx.x / ${TPR};
    float sum = 0.f;
    if (row < m) {
        const int end = __ldg(row_ptr + row + 1);
        for (int j = __ldg(row_ptr + row) + lane; j < end; j += ${STEP}) {
            int c[${U}];
            float a[${U}];
            #pragma unroll
            for (int u = 0; u < ${U}; ++u) {
                const int jj = j + u * ${TPR};
                c[u] = jj < end ? __ldcs(col_idx + jj) : 0;
                a[u] = jj < end ? __ldcs(val + jj) : 0.f;
            }
            #pragma unroll
            for (int u = 0; u < ${U}; ++u)
                if (j + u * ${TPR} < end) sum = fmaf(a[u], __ldg(x + c[u]), sum);
        }
    }
${REDUCE}
    if (lane == 0 && row < m) y[row] = sum;
}
""",
            U=unroll, STEP=tpr * unroll, **common,
        )
    L = uniform_len
    if L % 4 == 0:
        chunks = L // 4
        kc = -(-chunks // tpr)
        guard = "" if chunks % tpr == 0 else f"if (lane + k * {tpr} < {chunks}) "
        body = fill(
            """
        // ${CHUNKS} 16-byte chunks per row; lane l takes chunks l, l + ${TPR}, ...: all loads first.
        int4 c[${KC}];
        float4 a[${KC}];
        #pragma unroll
        for (int k = 0; k < ${KC}; ++k) {
            c[k] = make_int4(0, 0, 0, 0);
            a[k] = make_float4(0.f, 0.f, 0.f, 0.f);
            ${GUARD}{
                const int j = base + 4 * (lane + k * ${TPR});
                c[k] = __ldcs(reinterpret_cast<const int4*>(col_idx + j));
                a[k] = __ldcs(reinterpret_cast<const float4*>(val + j));
            }
        }
        #pragma unroll
        for (int k = 0; k < ${KC}; ++k) {
            ${GUARD}{
                sum = fmaf(a[k].x, __ldg(x + c[k].x), sum);
                sum = fmaf(a[k].y, __ldg(x + c[k].y), sum);
                sum = fmaf(a[k].z, __ldg(x + c[k].z), sum);
                sum = fmaf(a[k].w, __ldg(x + c[k].w), sum);
            }
        }""", CHUNKS=chunks, TPR=tpr, KC=kc, GUARD=guard)
    else:
        ks = -(-L // tpr)
        guard = "" if L % tpr == 0 else f"if (lane + k * {tpr} < {L}) "
        body = fill(
            """
        // lane l takes entries l, l + ${TPR}, ... of the row: all loads first.
        int c[${KS}];
        float a[${KS}];
        #pragma unroll
        for (int k = 0; k < ${KS}; ++k) {
            c[k] = 0;
            a[k] = 0.f;
            ${GUARD}{
                c[k] = __ldcs(col_idx + base + lane + k * ${TPR});
                a[k] = __ldcs(val + base + lane + k * ${TPR});
            }
        }
        #pragma unroll
        for (int k = 0; k < ${KS}; ++k)
            ${GUARD}sum = fmaf(a[k], __ldg(x + c[k]), sum);""", TPR=tpr, KS=ks, GUARD=guard)
    return head + fill(
        """
${SIG}
{
    // Specialised to this matrix: every row has exactly ${L} entries, so row i holds entries
    // i*${L} .. i*${L}+${LM1} and row_ptr is not read.
    const int lane = threadIdx.x & ${TPRM1};
    const int row = blockIdx.x * ${RPB} + threadIdx.x / ${TPR};
    float sum = 0.f;
    if (row < m) {
        const int base = row * ${L};${BODY}
    }
${REDUCE}
    if (lane == 0 && row < m) y[row] = sum;
}
""",
        L=L, LM1=L - 1, BODY=body, **common,
    )


def _adaptive_body(v: Variant) -> str:
    return render_adaptive(v.t("rpw"), v.t("items"), v.t("long_len"), v.t("seg"), v.t("block"))


def _lanes_body(v: Variant) -> str:
    return render_lanes(v.t("tpr"), v.t("unroll"), v.t("block"))


ADAPTIVE_DOC = "rows binned at run time: a warp streams short rows, long rows split over blocks"
LANES_DOC = "tpr lanes per row with unroll loads in flight, streamed val/col_idx; similar row lengths"


def variants() -> list[Variant]:
    """The generic points the library (and so the SFT data) carries; the rest are template points."""
    out = []
    for rpw, items, long_len, seg, block in ((32, 8, 16384, 16384, 256), (64, 4, 4096, 4096, 256)):
        out.append(make(Op.SPMV, "CSR", "csr_adaptive", _adaptive_body,
                        {"rpw": rpw, "items": items, "long_len": long_len, "seg": seg, "block": block},
                        atomic=True, doc=ADAPTIVE_DOC))
    for tpr, unroll in ((4, 4), (8, 2)):
        out.append(make(Op.SPMV, "CSR", "csr_lanes", _lanes_body, {"tpr": tpr, "unroll": unroll, "block": 256},
                        doc=LANES_DOC))
    return out
