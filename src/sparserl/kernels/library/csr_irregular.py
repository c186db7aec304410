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

  The specialised form (:class:`AdaptivePlan`) bakes in the row-length bins of the matrix, as a
  block of facts (``SHORT_MAX``, ``LONG_ROWS``, ``LONG_PIECES``, the tables) above one body that
  every plan shares, selecting its code with ``if constexpr``:
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

* ``csr_split`` (specialised only): one launch, no atomics and nothing zeroed. Its first blocks
  each sum one row longer than ``long_len`` (the rows the card lists, in a constant table): the
  block's threads share the row's entries, ``unroll`` loads in flight each, then a block-wide sum
  and one store. The other blocks take every other row with ``tpr`` lanes as ``csr_lanes`` does,
  leaving the long rows to their blocks. Meant for small skewed graphs, where ``csr_lanes`` waits
  on its longest rows and the COO kernels pay y's zeroing (a second node of the timed run).

Both read every value from ``val`` and ``x``: only the structure is specialised.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from sparserl.kernels.contract import Op, render_params_line, signature
from sparserl.kernels.library.common import FULL_MASK, Variant, completion, fill, group_sum, make

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


_SIG = signature("CSR", Op.SPMV, None, "BLOCK")
_LONG_SIG = signature("CSR", Op.SPMV, "spmv_long", LONG_BLOCK)

_LOAD_PRODUCTS = """
        #pragma unroll
        for (int v = 0; v < ITEMS; v += 4) {  // prod[v .. v+3] = val*x of entries q+v .. q+v+3 in [p_begin, p_end)
            const int j = q + v;
            if (j + 4 <= p_begin || j >= p_end) {
                prod[v] = prod[v + 1] = prod[v + 2] = prod[v + 3] = 0.f;
            } else if (j + 3 < nnz) {  // j is a multiple of 4: 16-byte loads
                const int4 c4 = __ldcs(reinterpret_cast<const int4*>(col_idx + j));
                const float4 a4 = __ldcs(reinterpret_cast<const float4*>(val + j));
                prod[v] = (j >= p_begin && j < p_end) ? a4.x * __ldg(x + c4.x) : 0.f;
                prod[v + 1] = (j + 1 >= p_begin && j + 1 < p_end) ? a4.y * __ldg(x + c4.y) : 0.f;
                prod[v + 2] = (j + 2 >= p_begin && j + 2 < p_end) ? a4.z * __ldg(x + c4.z) : 0.f;
                prod[v + 3] = (j + 3 >= p_begin && j + 3 < p_end) ? a4.w * __ldg(x + c4.w) : 0.f;
            } else {
                #pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const int jt = j + t;
                    prod[v + t] = (jt >= p_begin && jt < p_end) ? __ldg(val + jt) * __ldg(x + __ldg(col_idx + jt)) : 0.f;
                }
            }
        }"""

_ROW_AT = """
// The row of entry j among this warp's rows: the last r < RPW with ptr[r] <= j (ptr[0] <= j < ptr[RPW]).
static __device__ __forceinline__ int row_at(const int* ptr, int j)
{
    int r = 0;
    #pragma unroll
    for (int s = RPW / 2; s > 0; s >>= 1)
        if (ptr[r + s] <= j) r += s;
    return r;
}
"""


def _stream_body(has_long: str | None) -> str:
    """The statements of the warp-streaming row kernel. ``has_long``: None when rows longer than
    LONG_LEN are skipped unconditionally (the generic form), else the C condition under which
    they are (a fact of the specialised form)."""
    cond = "" if has_long is None else f"{has_long} && "
    skip_chunk = fill("""
        if (${HAS_LONG}) {  // a chunk that lies inside one long row is skipped whole (spmv_long does that row)
            const int r = row_at(ptr, max(c0, p_begin));
            if (ptr[r + 1] - ptr[r] > LONG_LEN && ptr[r + 1] - c0 >= 32 * ITEMS) {
                c0 = ptr[r + 1] & ~3;
                continue;
            }
        }""", HAS_LONG=has_long) if has_long is not None else """
        {   // a chunk that lies inside one long row is skipped whole (spmv_long does that row)
            const int r = row_at(ptr, max(c0, p_begin));
            if (ptr[r + 1] - ptr[r] > LONG_LEN && ptr[r + 1] - c0 >= 32 * ITEMS) {
                c0 = ptr[r + 1] & ~3;
                continue;
            }
        }"""
    return fill(
        """
    // A warp per RPW consecutive rows. It streams their nonzeros in chunks of 32 * ITEMS: lane l takes
    // ITEMS consecutive entries (16-byte loads), and each run of one row is added to that row's slot.
    __shared__ int s_ptr[BLOCK / 32][RPW + 1];
    __shared__ float s_acc[BLOCK / 32][RPW];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r0 = (blockIdx.x * (BLOCK / 32) + warp) * RPW;
    if (r0 >= m) return;  // whole warps leave together
    int* ptr = s_ptr[warp];
    float* acc = s_acc[warp];
    for (int i = lane; i <= RPW; i += 32) ptr[i] = __ldg(row_ptr + min(r0 + i, m));
    for (int i = lane; i < RPW; i += 32) acc[i] = 0.f;
    __syncwarp();
    const int p_begin = ptr[0];
    const int p_end = ptr[RPW];
    int c0 = p_begin & ~3;
    while (c0 < p_end) {${SKIP_CHUNK}
        const int q = c0 + lane * ITEMS;
        float prod[ITEMS];
${LOADS}
        if (q + ITEMS > p_begin && q < p_end) {
            const int first = max(q, p_begin);
            int r = row_at(ptr, first);
            int r_end = ptr[r + 1];
            bool skip = ${COND}r_end - ptr[r] > LONG_LEN;  // a long row: spmv_long adds it
            float run = 0.f;
            #pragma unroll
            for (int t = 0; t < ITEMS; ++t) {
                const int j = q + t;
                if (j >= first && j < p_end) {
                    if (j >= r_end) {  // row r ends before j: add its run, move to j's row
                        if (!skip) atomicAdd(acc + r, run);
                        run = 0.f;
                        do { ++r; } while (ptr[r + 1] <= j);  // over empty rows
                        r_end = ptr[r + 1];
                        skip = ${COND}r_end - ptr[r] > LONG_LEN;
                    }
                    run += prod[t];
                }
            }
            if (!skip) atomicAdd(acc + r, run);
        }
        c0 += 32 * ITEMS;
    }
    __syncwarp();
    for (int i = lane; i < RPW && r0 + i < m; i += 32) y[r0 + i] = acc[i];  // rows longer than LONG_LEN get 0 here""",
        SKIP_CHUNK=skip_chunk, LOADS=_LOAD_PRODUCTS, COND=cond)


_ADD_PIECE = """
constexpr int PIECE_LOADS = SEG / 256 < 16 ? SEG / 256 : 16;  // loads in flight per thread

// Adds entries [lo, hi) of row r (at most SEG) into y[r]: the block's 256 threads share them
// (coalesced, PIECE_LOADS loads in flight per thread), then one atomicAdd. Every thread of the block calls it.
static __device__ __forceinline__ void add_piece(int r, int lo, int hi, const int* __restrict__ col_idx,
                                                 const float* __restrict__ val, const float* __restrict__ x,
                                                 float* __restrict__ y, float* s_part)
{
    float sum = 0.f;
    for (int i0 = 0; i0 < SEG / 256; i0 += PIECE_LOADS) {
        #pragma unroll
        for (int i = 0; i < PIECE_LOADS; ++i) {
            const int j = lo + (i0 + i) * 256 + (int)threadIdx.x;
            if (j < hi) sum = fmaf(__ldcs(val + j), __ldg(x + __ldcs(col_idx + j)), sum);
        }
    }
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < 8 ? s_part[threadIdx.x] : 0.f;
        #pragma unroll
        for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
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

_SEARCH = """
    // Rows longer than LONG_LEN, in pieces: block b takes entries [b*SEG, b*SEG + SEG). A row that lies
    // strictly inside them has fewer than SEG <= LONG_LEN entries, so only the rows holding the first
    // and the last of them can be long; each that is adds its part.
    __shared__ int s_row[2];
    __shared__ float s_part[8];
    const int z0 = blockIdx.x * SEG;
    const int z1 = z0 + min(SEG, nnz - z0);
    if (threadIdx.x < 64) {
        const int r = row_of(row_ptr, m, threadIdx.x < 32 ? z0 : z1 - 1);
        if ((threadIdx.x & 31) == 0) s_row[threadIdx.x >> 5] = r;
    }
    __syncthreads();
    const int ra = s_row[0], rb = s_row[1];
    const bool long_a = __ldg(row_ptr + ra + 1) - __ldg(row_ptr + ra) > LONG_LEN;
    const bool long_b = rb != ra && __ldg(row_ptr + rb + 1) - __ldg(row_ptr + rb) > LONG_LEN;
    for (int e = long_a ? 0 : 1; e < (long_b ? 2 : 1); ++e) {  // e = 0: row ra, e = 1: row rb
        const int r = e == 0 ? ra : rb;
        add_piece(r, max(__ldg(row_ptr + r), z0), min(__ldg(row_ptr + r + 1), z1), col_idx, val, x, y, s_part);
    }"""

_ADAPTIVE = fill(_ADD_PIECE + _ROW_AT + """
${SIG}
{""" + _stream_body(None) + """
}
""" + _ROW_OF + """
${LONG_SIG}
{""" + _SEARCH + """
}
""", SIG=_SIG, LONG_SIG=_LONG_SIG, FULL=FULL_MASK)
"""The generic csr_adaptive: rows binned at run time, long rows found by search."""

_ADAPTIVE_SPEC = fill(_ADD_PIECE + _ROW_AT + _ROW_OF + """
constexpr bool HAS_LONG = LONG_ROWS != 0;

${SIG}
{
    if constexpr (SHORT_MAX <= ${THREAD_MAX}) {
        // Every row of at most LONG_LEN entries has at most SHORT_MAX: a lane per row, loop fully unrolled.
        const int r0 = (blockIdx.x * (BLOCK / 32) + (threadIdx.x >> 5)) * RPW;
        for (int i = threadIdx.x & 31; i < RPW; i += 32) {
            const int row = r0 + i;
            if (row >= m) break;
            const int a = __ldg(row_ptr + row);
            const int b = __ldg(row_ptr + row + 1);
            float sum = 0.f;
            if (!HAS_LONG || b - a <= LONG_LEN) {  // longer rows: 0 here, spmv_long adds them
                #pragma unroll
                for (int t = 0; t < SHORT_MAX; ++t)
                    if (a + t < b) sum = fmaf(__ldcs(val + a + t), __ldg(x + __ldcs(col_idx + a + t)), sum);
            }
            y[row] = sum;
        }
    } else {""" + _stream_body("HAS_LONG").replace("\n", "\n    ") + """
    }
}

${LONG_SIG}
{
    if constexpr (LONG_ROWS < 0) {""" + _SEARCH.replace("\n", "\n    ") + """
    } else if constexpr (LONG_PIECES > 0) {  // block b does piece b % LONG_PIECES of row c_long_row[b / LONG_PIECES]
        __shared__ float s_part[8];
        const int r = c_long_row[blockIdx.x / LONG_PIECES];
        const int end = __ldg(row_ptr + r + 1);
        const int lo = __ldg(row_ptr + r) + (blockIdx.x % LONG_PIECES) * SEG;
        add_piece(r, lo, lo + min(SEG, end - lo), col_idx, val, x, y, s_part);
    } else {  // row i has pieces c_long_first[i] .. c_long_first[i + 1] - 1; block b does piece b
        __shared__ float s_part[8];
        int lo_i = 0, hi_i = LONG_ROWS;  // the row whose pieces hold block b: binary search of c_long_first
        while (hi_i - lo_i > 1) {
            const int mid = (lo_i + hi_i) >> 1;
            if (c_long_first[mid] <= (int)blockIdx.x) lo_i = mid; else hi_i = mid;
        }
        const int r = c_long_row[lo_i];
        const int end = __ldg(row_ptr + r + 1);
        const int lo = __ldg(row_ptr + r) + ((int)blockIdx.x - c_long_first[lo_i]) * SEG;
        add_piece(r, lo, lo + min(SEG, end - lo), col_idx, val, x, y, s_part);
    }
}
""", SIG=_SIG, LONG_SIG=_LONG_SIG, FULL=FULL_MASK, THREAD_MAX=THREAD_MAX)
"""The specialised csr_adaptive: one text for every plan; the facts block above it decides which
code is compiled (``if constexpr``)."""


def _table(name: str, values: list[int]) -> str:
    rows = [", ".join(str(v) for v in values[i:i + 16]) for i in range(0, len(values), 16)]
    return f"__constant__ int {name}[{len(values)}] = {{\n    " + ",\n    ".join(rows) + "\n};"


def _adaptive_facts(plan: AdaptivePlan, seg: int) -> str:
    """The facts block of a specialised csr_adaptive (every name its code reads, tables included)."""
    rows = plan.long_rows or ()
    counts = [-(-n // seg) for _, n in rows]
    long_rows = len(rows) if plan.long_rows is not None or not plan.has_long else -1
    pieces = counts[0] if counts and len(set(counts)) == 1 else 0
    first = [0]
    for c in counts:
        first.append(first[-1] + c)
    lines = [f"// Specialised to this matrix: {plan.note}",
             f"constexpr int SHORT_MAX = {plan.short_max};  // no row of at most LONG_LEN entries is longer",
             f"constexpr int LONG_ROWS = {long_rows};  // rows longer than LONG_LEN in c_long_row (0: none; -1: not listed, searched)",
             f"constexpr int LONG_PIECES = {pieces};  // pieces of SEG entries per long row when all have as many (0: see c_long_first)",
             _table("c_long_row", [r for r, _ in rows] or [0]),
             _table("c_long_first", first if rows and not pieces else [0])]
    return "\n".join(lines)


def _header(constants: dict[str, int], launches: list[str]) -> str:
    return "\n".join(["FORMAT: CSR", render_params_line(constants)] + [f"LAUNCH: {l}" for l in launches])


def render_adaptive(rpw: int, items: int, long_len: int, seg: int, block: int,
                    plan: AdaptivePlan | None = None) -> str:
    """The csr_adaptive completion; ``plan`` None is the generic form (see the module docstring)."""
    has_long = plan is None or plan.has_long
    searching = has_long and (plan is None or plan.long_rows is None)
    assert rpw in (32, 64, 128) and items % 4 == 0 and seg % LONG_BLOCK == 0 and (seg <= long_len or not searching)
    launches = ["grid=ceil_div(m, BLOCK / 32 * RPW), block=BLOCK"]
    if has_long and plan is not None and plan.long_rows is not None:
        launches.append(f"grid={sum(-(-n // seg) for _, n in plan.long_rows)}, block={LONG_BLOCK}, kernel=spmv_long")
    elif has_long:
        launches.append(f"grid=ceil_div(nnz, SEG), block={LONG_BLOCK}, kernel=spmv_long")
    head = _header({"RPW": rpw, "ITEMS": items, "LONG_LEN": long_len, "SEG": seg, "BLOCK": block}, launches)
    if plan is None:
        return completion(head, _ADAPTIVE)
    return completion(head, _adaptive_facts(plan, seg), _ADAPTIVE_SPEC)


def _strided_sum(start: str, step: str, depth: int) -> str:
    """A loop adding val * x of entries ``start``, ``start + step``, ... below ``end`` into ``sum``,
    UNROLL of them in flight (every load issued before the first multiply), ``depth`` levels of four
    spaces in (no newline at the end)."""
    return textwrap.indent(fill("""for (int j = ${START}; j < end; j += ${STEP} * UNROLL) {
    int c[UNROLL];
    float a[UNROLL];
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int jj = j + u * ${STEP};
        c[u] = jj < end ? __ldcs(col_idx + jj) : 0;
        a[u] = jj < end ? __ldcs(val + jj) : 0.f;
    }
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (j + u * ${STEP} < end) sum = fmaf(a[u], __ldg(x + c[u]), sum);
}""", START=start, STEP=step), "    " * depth)


_LANES = fill(
    """
${SIG}
{
    // TPR lanes per row, UNROLL entries per lane in flight: every load of a batch is issued before
    // the first multiply. val and col_idx stream (__ldcs: read once) so the L2 keeps x.
    const int lane = threadIdx.x & (TPR - 1);
    const int row = blockIdx.x * (BLOCK / TPR) + threadIdx.x / TPR;
    float sum = 0.f;
    if (row < m) {
        const int end = __ldg(row_ptr + row + 1);
${LOOP}
    }
${REDUCE}
    if (lane == 0 && row < m) y[row] = sum;
}
""", SIG=_SIG, REDUCE=group_sum("sum", "TPR", FULL_MASK), LOOP=_strided_sum("__ldg(row_ptr + row) + lane", "TPR", 2))
"""The generic csr_lanes."""

_LANES_SPEC = fill(
    """
${SIG}
{
    // Row i holds entries i*L .. i*L+L-1, so row_ptr is not read.
    const int lane = threadIdx.x & (TPR - 1);
    const int row = blockIdx.x * (BLOCK / TPR) + threadIdx.x / TPR;
    float sum = 0.f;
    if (row < m) {
        const int base = row * L;
        if constexpr (L % 4 == 0) {
            // L / 4 16-byte chunks per row; lane l takes chunks l, l + TPR, ...: all loads first.
            constexpr int KC = L >= 4 ? (L / 4 + TPR - 1) / TPR : 1;  // L < 4 never comes here, but its arrays need a size
            int4 c[KC];
            float4 a[KC];
            #pragma unroll
            for (int k = 0; k < KC; ++k) {
                c[k] = make_int4(0, 0, 0, 0);
                a[k] = make_float4(0.f, 0.f, 0.f, 0.f);
                if ((L / 4) % TPR == 0 || lane + k * TPR < L / 4) {
                    const int j = base + 4 * (lane + k * TPR);
                    c[k] = __ldcs(reinterpret_cast<const int4*>(col_idx + j));
                    a[k] = __ldcs(reinterpret_cast<const float4*>(val + j));
                }
            }
            #pragma unroll
            for (int k = 0; k < KC; ++k) {
                if ((L / 4) % TPR == 0 || lane + k * TPR < L / 4) {
                    sum = fmaf(a[k].x, __ldg(x + c[k].x), sum);
                    sum = fmaf(a[k].y, __ldg(x + c[k].y), sum);
                    sum = fmaf(a[k].z, __ldg(x + c[k].z), sum);
                    sum = fmaf(a[k].w, __ldg(x + c[k].w), sum);
                }
            }
        } else {
            // lane l takes entries l, l + TPR, ... of the row: all loads first.
            constexpr int KS = (L + TPR - 1) / TPR;
            int c[KS];
            float a[KS];
            #pragma unroll
            for (int k = 0; k < KS; ++k) {
                c[k] = 0;
                a[k] = 0.f;
                if (L % TPR == 0 || lane + k * TPR < L) {
                    c[k] = __ldcs(col_idx + base + lane + k * TPR);
                    a[k] = __ldcs(val + base + lane + k * TPR);
                }
            }
            #pragma unroll
            for (int k = 0; k < KS; ++k)
                if (L % TPR == 0 || lane + k * TPR < L) sum = fmaf(a[k], __ldg(x + c[k]), sum);
        }
    }
${REDUCE}
    if (lane == 0 && row < m) y[row] = sum;
}
""", SIG=_SIG, REDUCE=group_sum("sum", "TPR", FULL_MASK))
"""The specialised csr_lanes: a uniform row length L from the facts block."""


def render_lanes(tpr: int, unroll: int, block: int, uniform_len: int | None = None) -> str:
    """The csr_lanes completion; ``uniform_len`` (every row's length) gives the specialised form
    (``unroll`` unused there)."""
    assert tpr in (1, 2, 4, 8, 16, 32) and block % tpr == 0
    launch = ["grid=ceil_div(m, BLOCK / TPR), block=BLOCK"]
    if uniform_len is None:
        return completion(_header({"TPR": tpr, "UNROLL": unroll, "BLOCK": block}, launch), _LANES)
    facts = ("// Specialised to the matrix: every row has the same number of entries.\n"
             "constexpr int L = MATRIX_ROW_LEN;  // entries per row, defined by the harness from the matrix")
    return completion(_header({"TPR": tpr, "BLOCK": block}, launch), facts, _LANES_SPEC)


_SPLIT_SPEC = fill(
    """
${SIG}
{
    if (blockIdx.x < LONG_ROWS) {
        // Block b sums row MATRIX_LONG_ROWS[b] alone: its BLOCK threads share the entries, UNROLL loads
        // in flight each, then a block-wide sum and one store (no other thread writes this row).
        __shared__ float s_part[BLOCK / 32];
        const int r = MATRIX_LONG_ROWS[blockIdx.x];
        const int end = __ldg(row_ptr + r + 1);
        float sum = 0.f;
${LONG_LOOP}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
        if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = sum;
        __syncthreads();
        if (threadIdx.x < 32) {
            sum = threadIdx.x < BLOCK / 32 ? s_part[threadIdx.x] : 0.f;
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(${FULL}, sum, off);
            if (threadIdx.x == 0) y[r] = sum;
        }
        return;  // the whole block: the branch is uniform
    }
    // Every other row: TPR lanes per row, UNROLL entries per lane in flight (as csr_lanes); a row
    // longer than LONG_LEN is its block's, and is not written here.
    const int lane = threadIdx.x & (TPR - 1);
    const int row = ((int)blockIdx.x - LONG_ROWS) * (BLOCK / TPR) + (int)threadIdx.x / TPR;
    float sum = 0.f;
    bool mine = false;
    if (row < m) {
        const int begin = __ldg(row_ptr + row);
        const int end = __ldg(row_ptr + row + 1);
        mine = end - begin <= LONG_LEN;
        if (mine) {
${SHORT_LOOP}
        }
    }
${REDUCE}
    if (lane == 0 && mine) y[row] = sum;
}
""", SIG=_SIG, FULL=FULL_MASK, REDUCE=group_sum("sum", "TPR", FULL_MASK),
    LONG_LOOP=_strided_sum("__ldg(row_ptr + r) + (int)threadIdx.x", "BLOCK", 2),
    SHORT_LOOP=_strided_sum("begin + lane", "TPR", 3))
"""The specialised csr_split: the long rows named (``MATRIX_LONG_ROWS``, ``MATRIX_LONG_ROW_COUNT``), so one text
for every matrix; the harness writes the table and its count from the matrix it verifies on."""


def render_split(tpr: int, unroll: int, long_len: int, block: int) -> str:
    """The csr_split completion: a block for each row longer than ``long_len`` (the matrix's ``MATRIX_LONG_ROWS``,
    at least one), then the other rows with ``tpr`` lanes each, in one launch."""
    assert tpr in (1, 2, 4, 8, 16, 32) and block % 32 == 0 and block % tpr == 0
    head = _header({"TPR": tpr, "UNROLL": unroll, "LONG_LEN": long_len, "BLOCK": block},
                   ["grid=MATRIX_LONG_ROW_COUNT + ceil_div(m, BLOCK / TPR), block=BLOCK"])
    facts = "\n".join(["// Specialised to the matrix: a block for each row longer than LONG_LEN.",
                       "constexpr int LONG_ROWS = MATRIX_LONG_ROW_COUNT;  // rows in MATRIX_LONG_ROWS, defined by "
                       "the harness from the matrix"])
    return completion(head, facts, _SPLIT_SPEC)


SPLIT_DOC = "a block per long row (a table), tpr lanes per other row, one launch; skewed rows"


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
