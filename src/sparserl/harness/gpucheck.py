"""Every check of a launch as a GPU kernel writing into a board of counters: the batched path's judges.

The sequential path checks a launch on the host, one synchronisation per check (x unchanged, each
matrix array against its pristine copy, four guards, the fp64 comparison). The batched path
enqueues the same checks as kernels right behind the launch they judge, each writing its counts
into that launch's row of a :class:`Board`; the host reads the board once per batch and replays
the verdicts in the sequential order (:mod:`sparserl.harness.batched`). What each check compares is
unchanged:

* x against the input it was loaded from, as floats (``cp.array_equal``'s meaning: -0 equals +0,
  NaN equals nothing); the re-run's y against the first run's, the same way;
* each matrix array against its pristine copy, bit for bit (a -0 written over a +0 padding value is a change: its
  sign bit would carry state from launch to launch), and every differing word restored, as the sequential path
  restores the array;
* the four guards against the NaN bit pattern, word by word;
* the output against the fp64 product under the tolerance of :mod:`sparserl.harness.reference`.

The fp64 comparison (:class:`Fp64Check`) is balanced: a group of lanes per row (the group's size,
a power of two up to a warp, from the matrix's mean row length), rows longer than 32 lanes' worth
split into chunks of 1024 entries that whole warps sum into fp64 partials, which a warp per long
row then adds in a fixed order. The one-thread-per-row kernel of the sequential path takes as long
as the longest row, and every thread of it updates one counter (a million same-address atomics on
a 1M-row matrix); here the sums take a fixed order (so a verdict repeats exactly) and each block
updates the counters once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparserl.harness.buffers import GUARD
from sparserl.harness.reference import Comparison, decode_stats

LANES_MAX = 32
CHUNK = 1024
"""Entries per chunk of a long row (a warp, 32 entries per lane)."""
BLOCK = 256

FIELDS = 32
"""Counters per board row."""
BAD, NONFINITE, WORST, FIRST = 0, 1, 2, 3
"""The fp64 comparison: rows out of tolerance, non-finite entries, bits of the worst scaled error
(a non-negative double, so unsigned order is numeric order), first bad row."""
GUARDS = 4
"""Four counters from here: words not holding the NaN bit pattern before y, after y, before x, after x."""
X_CHANGED = 8
"""Entries of x that differ from the input loaded into it."""
RERUN = 9
"""Entries of the re-run's y that differ from the first run's."""
ARRAYS = 10
"""One counter per matrix array from here (in contract order): words that differ from the pristine copy."""
MAX_ARRAYS = FIELDS - ARRAYS
GUARD_WHERE = ("wrote before the start of y", "wrote past the end of y", "wrote before the start of x",
               "wrote past the end of x")

_SRC = r"""
#define FULL 0xffffffffu

__device__ __forceinline__ void reduce_stats(unsigned long long bad, unsigned long long nonfinite, double worst,
                                             unsigned long long first, unsigned long long* __restrict__ stats)
{
    // whole block: warp shuffles, then one atomic per counter per block (none when there is nothing to add)
    __shared__ unsigned long long s_bad[32], s_nf[32], s_first[32];
    __shared__ double s_worst[32];
    for (int off = 16; off > 0; off >>= 1) {
        bad += __shfl_xor_sync(FULL, bad, off);
        nonfinite += __shfl_xor_sync(FULL, nonfinite, off);
        worst = fmax(worst, __shfl_xor_sync(FULL, worst, off));
        const unsigned long long f = __shfl_xor_sync(FULL, first, off);
        first = f < first ? f : first;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { s_bad[warp] = bad; s_nf[warp] = nonfinite; s_worst[warp] = worst; s_first[warp] = first; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            bad += s_bad[w]; nonfinite += s_nf[w]; worst = fmax(worst, s_worst[w]);
            first = s_first[w] < first ? s_first[w] : first;
        }
        if (bad) atomicAdd(stats + 0, bad);
        if (nonfinite) atomicAdd(stats + 1, nonfinite);
        if (worst > 0.0) atomicMax(stats + 2, (unsigned long long)__double_as_longlong(worst));
        if (first != ~0ull) atomicMin(stats + 3, first);
    }
}

__device__ __forceinline__ double judge(double yv, double ref, double mag, double rt, bool* bad,
                                        unsigned long long* nonfinite)
{
    // the tolerance of sparserl.harness.reference: |y - ref| <= rtol * (|A| |x|) + 1e-30; NaN/Inf never pass
    double scaled = fabs(yv - ref) / (rt * mag + 1e-30);
    if (!isfinite(yv)) { ++*nonfinite; scaled = __longlong_as_double(0x7ff0000000000000ll); }
    if (scaled != scaled) scaled = __longlong_as_double(0x7ff0000000000000ll);
    if (!(scaled <= 1.0)) *bad = true;
    return scaled;
}

extern "C" __global__ void check_rows(int m, int k, int lanes, int long_len, const int* __restrict__ indptr,
                                      const int* __restrict__ indices, const float* __restrict__ val,
                                      const float* __restrict__ x, const float* __restrict__ y,
                                      const double* __restrict__ rtol, unsigned long long* __restrict__ stats)
{
    // a group of `lanes` lanes per row (rows longer than long_len: check_long_rows); loop bounds are
    // uniform across each warp, so every shuffle has all 32 lanes
    const int lane = threadIdx.x & (lanes - 1);
    const long long groups = (long long)gridDim.x * (blockDim.x / lanes);
    unsigned long long bad_rows = 0, nonfinite = 0, first = ~0ull;
    double worst = 0.0;
    for (long long row = (long long)blockIdx.x * (blockDim.x / lanes) + threadIdx.x / lanes;
         __any_sync(FULL, row < m); row += groups) {
        int s = 0, e = 0;
        const bool live = row < m;
        bool own = false;
        if (live) {
            s = indptr[row]; e = indptr[row + 1];
            own = e - s <= long_len;
            if (!own) e = s;
        }
        bool bad = false;
        for (int c = 0; c < k; ++c) {
            double ref = 0.0, mag = 0.0;
            for (int j = s + lane; j < e; j += lanes) {
                const double a = (double)val[j], xv = (double)x[(size_t)indices[j] * k + c];
                ref = fma(a, xv, ref);
                mag = fma(fabs(a), fabs(xv), mag);
            }
            for (int off = lanes >> 1; off > 0; off >>= 1) {
                ref += __shfl_xor_sync(FULL, ref, off, lanes);
                mag += __shfl_xor_sync(FULL, mag, off, lanes);
            }
            if (lane == 0 && own)
                worst = fmax(worst, judge((double)y[(size_t)row * k + c], ref, mag, rtol[row], &bad, &nonfinite));
        }
        if (bad) { ++bad_rows; first = (unsigned long long)row < first ? (unsigned long long)row : first; }
    }
    reduce_stats(bad_rows, nonfinite, worst, first, stats);
}

extern "C" __global__ void check_chunks(int n_chunks, int k, const int* __restrict__ chunk_start,
                                        const int* __restrict__ chunk_end, const int* __restrict__ indices,
                                        const float* __restrict__ val, const float* __restrict__ x,
                                        double* __restrict__ partial)
{
    // a warp per chunk of a long row: partial[(chunk * k + c) * 2 + {0, 1}] = (sum a x, sum |a| |x|)
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_chunks; w += warps) {
        const int s = chunk_start[w], e = chunk_end[w];
        for (int c = 0; c < k; ++c) {
            double ref = 0.0, mag = 0.0;
            for (int j = s + lane; j < e; j += 32) {
                const double a = (double)val[j], xv = (double)x[(size_t)indices[j] * k + c];
                ref = fma(a, xv, ref);
                mag = fma(fabs(a), fabs(xv), mag);
            }
            for (int off = 16; off > 0; off >>= 1) {
                ref += __shfl_xor_sync(FULL, ref, off);
                mag += __shfl_xor_sync(FULL, mag, off);
            }
            if (lane == 0) { partial[(w * k + c) * 2] = ref; partial[(w * k + c) * 2 + 1] = mag; }
        }
    }
}

extern "C" __global__ void check_long_rows(int n_long, int k, const int* __restrict__ long_rows,
                                           const int* __restrict__ chunk_ptr, const double* __restrict__ partial,
                                           const float* __restrict__ y, const double* __restrict__ rtol,
                                           unsigned long long* __restrict__ stats)
{
    // a warp per long row: its chunks' partials added in a fixed order, then judged like any row
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    unsigned long long bad_rows = 0, nonfinite = 0, first = ~0ull;
    double worst = 0.0;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; __any_sync(FULL, w < n_long);
         w += warps) {
        const bool live = w < n_long;
        const int row = live ? long_rows[w] : 0;
        const int c0 = live ? chunk_ptr[w] : 0, c1 = live ? chunk_ptr[w + 1] : 0;
        bool bad = false;
        for (int c = 0; c < k; ++c) {
            double ref = 0.0, mag = 0.0;
            for (int i = c0 + lane; i < c1; i += 32) {
                ref += partial[((size_t)i * k + c) * 2];
                mag += partial[((size_t)i * k + c) * 2 + 1];
            }
            for (int off = 16; off > 0; off >>= 1) {
                ref += __shfl_xor_sync(FULL, ref, off);
                mag += __shfl_xor_sync(FULL, mag, off);
            }
            if (lane == 0 && live)
                worst = fmax(worst, judge((double)y[(size_t)row * k + c], ref, mag, rtol[row], &bad, &nonfinite));
        }
        if (bad) { ++bad_rows; first = (unsigned long long)row < first ? (unsigned long long)row : first; }
    }
    reduce_stats(bad_rows, nonfinite, worst, first, stats);
}

extern "C" __global__ void check_guards(const unsigned int* __restrict__ yfull, long long ny,
                                        const unsigned int* __restrict__ xfull, long long nx, int guard,
                                        unsigned long long* __restrict__ out)
{
    // out[0..3]: words before y, after y, before x, after x that do not hold the NaN bit pattern
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 4 * guard; i += gridDim.x * blockDim.x) {
        const int region = i / guard, o = i - region * guard;
        const unsigned int w = region == 0 ? yfull[o] : region == 1 ? yfull[guard + ny + o]
                             : region == 2 ? xfull[o] : xfull[guard + nx + o];
        if (w != 0x7fc00000u) atomicAdd(out + region, 1ull);
    }
}

extern "C" __global__ void reset_row(unsigned long long* __restrict__ row, int fields, int first)
{
    // a board row back to its initial state: zeros, and the first-bad-row counter at its maximum
    for (int i = threadIdx.x; i < fields; i += blockDim.x) row[i] = i == first ? ~0ull : 0ull;
}

__device__ __forceinline__ void add_count(unsigned long long n, unsigned long long* __restrict__ out)
{
    for (int off = 16; off > 0; off >>= 1) n += __shfl_xor_sync(FULL, n, off);
    if ((threadIdx.x & 31) == 0 && n) atomicAdd(out, n);
}

extern "C" __global__ void diff_f32(float* __restrict__ cur, const float* __restrict__ want, long long n,
                                    int restore, unsigned long long* __restrict__ out)
{
    // entries where cur != want as floats (NaN differs from everything, -0 equals +0); restored if asked
    unsigned long long differ = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n_round = (n + 31) / 32 * 32;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_round; i += stride) {
        if (i < n && !(cur[i] == want[i])) { ++differ; if (restore) cur[i] = want[i]; }
    }
    add_count(differ, out);
}

extern "C" __global__ void word_sums(const unsigned long long* __restrict__ table, int n_arrays,
                                     unsigned long long* __restrict__ out)
{
    // table[2a]: the address of array a, table[2a + 1]: its length in 32-bit words. Adds to out[2a]
    // the sum of its words w_i and to out[2a + 1] the sum of w_i * (2 i + 1), both wrapping (mod 2^64,
    // so the order of the additions does not matter); out starts at zero
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int a = blockIdx.y; a < n_arrays; a += gridDim.y) {
        const unsigned int* __restrict__ p = (const unsigned int*)table[2 * a];
        const long long n = (long long)table[2 * a + 1];
        unsigned long long plain = 0, mixed = 0;
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            const unsigned long long w = p[i];
            plain += w;
            mixed += w * (2ull * (unsigned long long)i + 1ull);
        }
        for (int off = 16; off > 0; off >>= 1) {
            plain += __shfl_xor_sync(FULL, plain, off);
            mixed += __shfl_xor_sync(FULL, mixed, off);
        }
        if ((threadIdx.x & 31) == 0 && (plain | mixed)) {
            atomicAdd(out + 2 * a, plain);
            atomicAdd(out + 2 * a + 1, mixed);
        }
    }
}

extern "C" __global__ void place_count(const int* __restrict__ where, long long n, int nnz,
                                       unsigned int* __restrict__ placed, unsigned long long* __restrict__ out)
{
    // where[i]: which nonzero (1-based) slot i holds, 0 for padding. placed[j - 1] += 1 for each slot
    // naming nonzero j; out[0] += slots naming none of 1..nnz (negative, or past the last)
    unsigned long long bad = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n_round = (n + 31) / 32 * 32;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_round; i += stride) {
        if (i < n) {
            const int v = where[i];
            if (v < 0 || v > nnz) ++bad;
            else if (v > 0) atomicAdd(placed + (v - 1), 1u);
        }
    }
    add_count(bad, out);
}

extern "C" __global__ void count_not_one(const unsigned int* __restrict__ placed, long long n,
                                         unsigned long long* __restrict__ out)
{
    // out[0] += entries of placed that are not exactly 1
    unsigned long long bad = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n_round = (n + 31) / 32 * 32;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_round; i += stride)
        if (i < n && placed[i] != 1u) ++bad;
    add_count(bad, out);
}

extern "C" __global__ void gather_values(const int* __restrict__ where, long long n,
                                         const unsigned int* __restrict__ values, unsigned int* __restrict__ out)
{
    // out[i] = the bits of nonzero where[i] (1-based), or zero bits for padding: moved, never computed on
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int v = where[i];
        out[i] = v > 0 ? values[v - 1] : 0u;
    }
}

extern "C" __global__ void diff_u32(unsigned int* __restrict__ cur, const unsigned int* __restrict__ want,
                                    long long n, int restore, unsigned long long* __restrict__ out)
{
    // words that differ bit for bit; restored if asked
    unsigned long long differ = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n_round = (n + 31) / 32 * 32;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_round; i += stride) {
        if (i < n && cur[i] != want[i]) { ++differ; if (restore) cur[i] = want[i]; }
    }
    add_count(differ, out);
}
"""

KERNELS = ("check_rows", "check_chunks", "check_long_rows", "check_guards", "diff_f32", "diff_u32", "reset_row",
           "word_sums", "place_count", "count_not_one", "gather_values")
"""Every kernel of the module (compiled together at a worker's start-up)."""

_module = None


def _kernels():
    """The check kernels, compiled once per process (by the worker's warm-up, before any job)."""
    global _module
    if _module is None:
        import cupy as cp

        _module = cp.RawModule(code=_SRC)
    return _module


def compile_kernels() -> None:
    """Compile every check kernel now (a worker's start-up), so no job's time limit pays for it."""
    mod = _kernels()
    for name in KERNELS:
        mod.get_function(name)


def _grid(items: int, per_block: int, sms: int) -> int:
    """Blocks for ``items`` work items, ``per_block`` per block, at most 16 blocks per SM (grid-stride loops)."""
    return max(1, min((items + per_block - 1) // per_block, 16 * sms))


# -- the board -------------------------------------------------------------------------------------


class Board:
    """``rows`` x :data:`FIELDS` counters on the GPU (one row per checked launch), read with one copy."""

    def __init__(self, rows: int):
        import cupy as cp

        host = np.zeros((rows, FIELDS), dtype=np.uint64)
        host[:, FIRST] = np.iinfo(np.uint64).max
        self.cp = cp
        self.dev = cp.asarray(host)
        self.rows = rows

    def row(self, i: int, field: int = 0):
        """The device counters of row ``i`` from ``field`` on (a kernel argument)."""
        return self.dev[i, field:]

    def enqueue_reset(self, i: int) -> None:
        """Reset row ``i`` on the current stream. Enqueued right after the launch the row judges and
        before its checks: a kernel that wrote into a later launch's row (a far write) is undone."""
        _kernels().get_function("reset_row")((1,), (FIELDS,), (self.dev[i], np.int32(FIELDS), np.int32(FIRST)))

    def read(self) -> np.ndarray:
        """Every counter (waits for the work enqueued before it on the current stream)."""
        return self.cp.asnumpy(self.dev)


def comparison(row: np.ndarray) -> Comparison:
    """The fp64 comparison a board row holds, decoded as the sequential path decodes its check's slots."""
    return decode_stats((row[BAD], row[NONFINITE], row[WORST], row[FIRST]))


def guard_problem(row: np.ndarray) -> str | None:
    """The first guard written into, in the sequential path's order (y before x, start before end)."""
    for i, where in enumerate(GUARD_WHERE):
        if row[GUARDS + i]:
            return where
    return None


# -- the checks ------------------------------------------------------------------------------------


def enqueue_guards(io, out) -> None:
    """Count the words of ``io``'s four guards (``buffers.IOBuffers``) that lost the NaN bit pattern."""
    _kernels().get_function("check_guards")((4,), (BLOCK,), (io.yfull, np.int64(io.ny), io.xfull, np.int64(io.nx),
                                                            np.int32(GUARD), out))


def enqueue_diff(cur, want, out, restore: bool, sms: int, bitwise: bool = False) -> None:
    """Count the entries of ``cur`` that differ from ``want`` (same shape and dtype, 4-byte words):
    float arrays as floats unless ``bitwise`` (a matrix array: -0 written over +0 is a change, a sign bit that
    would carry state from launch to launch), integer arrays bit for bit; write ``want`` back over them if
    ``restore``."""
    import cupy as cp

    if cur.dtype.itemsize != 4 or cur.shape != want.shape or cur.dtype != want.dtype:
        raise ValueError(f"diff needs two arrays of the same 4-byte dtype and shape, got {cur.dtype}{cur.shape} "
                         f"and {want.dtype}{want.shape}")
    if not (cur.flags.c_contiguous and want.flags.c_contiguous):
        raise ValueError("diff needs contiguous arrays")
    n = int(cur.size)
    if n == 0:
        return
    fn = "diff_f32" if cur.dtype == cp.float32 and not bitwise else "diff_u32"
    _kernels().get_function(fn)((_grid(n, BLOCK, sms),), (BLOCK,), (cur, want, np.int64(n), np.int32(restore), out))


@dataclass(frozen=True)
class RowPlan:
    """How :class:`Fp64Check` splits one sparsity pattern's rows (host arrays, computed once)."""

    lanes: int
    """Lanes per row (a power of two, at most a warp): the mean row length rounded up."""
    long_len: int
    """Rows longer than this (32 entries per lane) go to the chunked path."""
    long_rows: np.ndarray
    """Ids of the long rows (int32, increasing)."""
    chunk_ptr: np.ndarray
    """Long row i owns chunks chunk_ptr[i] .. chunk_ptr[i + 1] (int32)."""
    chunk_start: np.ndarray
    """First entry of each chunk (int32)."""
    chunk_end: np.ndarray
    """One past the last entry of each chunk (int32)."""

    @classmethod
    def of(cls, indptr: np.ndarray) -> "RowPlan":
        indptr = np.asarray(indptr, dtype=np.int64)
        lengths = np.diff(indptr)
        mean = float(lengths.mean()) if lengths.size else 0.0
        lanes = 1
        while lanes < LANES_MAX and lanes < mean:
            lanes *= 2
        long_len = lanes * 32
        long_rows = np.flatnonzero(lengths > long_len)
        n_chunks = (lengths[long_rows] + CHUNK - 1) // CHUNK
        chunk_ptr = np.zeros(long_rows.size + 1, dtype=np.int64)
        np.cumsum(n_chunks, out=chunk_ptr[1:])
        owner = np.repeat(np.arange(long_rows.size), n_chunks)
        within = np.arange(int(chunk_ptr[-1])) - chunk_ptr[:-1][owner]
        start = indptr[long_rows][owner] + within * CHUNK
        end = np.minimum(start + CHUNK, indptr[long_rows + 1][owner])
        i32 = np.int32
        return cls(lanes, long_len, long_rows.astype(i32), chunk_ptr.astype(i32), start.astype(i32), end.astype(i32))

    def sums(self, indptr: np.ndarray, indices: np.ndarray, val: np.ndarray, x: np.ndarray) -> tuple:
        """``(A x, |A| |x|)`` in fp64 summed as the GPU does (lane strides, then a pairwise tree; chunk
        partials added in order for long rows): the host mirror the CPU tests check the plan with.
        ``x`` of shape (n,) or (n, k)."""
        x2 = np.asarray(x, np.float64).reshape(x.shape[0], -1)
        k = x2.shape[1]
        m = indptr.size - 1
        ref, mag = np.zeros((m, k)), np.zeros((m, k))
        a = np.asarray(val, np.float64)

        def lane_sums(s: int, e: int, lanes: int) -> tuple:
            r, g = np.zeros((lanes, k)), np.zeros((lanes, k))
            for lane in range(lanes):
                for j in range(s + lane, e, lanes):
                    xv = x2[indices[j]]
                    r[lane] = a[j] * xv + r[lane]
                    g[lane] = abs(a[j]) * np.abs(xv) + g[lane]
            return _xor_tree(r), _xor_tree(g)

        long_set = set(self.long_rows.tolist())
        for row in range(m):
            if row in long_set:
                continue
            ref[row], mag[row] = lane_sums(int(indptr[row]), int(indptr[row + 1]), self.lanes)
        for i, row in enumerate(self.long_rows):
            parts = [lane_sums(int(self.chunk_start[c]), int(self.chunk_end[c]), 32)
                     for c in range(int(self.chunk_ptr[i]), int(self.chunk_ptr[i + 1]))]
            per_lane_r, per_lane_g = np.zeros((32, k)), np.zeros((32, k))
            for j, (pr, pg) in enumerate(parts):
                per_lane_r[j % 32] += pr
                per_lane_g[j % 32] += pg
            ref[row], mag[row] = _xor_tree(per_lane_r), _xor_tree(per_lane_g)
        return (ref[:, 0], mag[:, 0]) if np.asarray(x).ndim == 1 else (ref, mag)


def _xor_tree(v: np.ndarray) -> np.ndarray:
    """What lane 0 holds after the butterfly ``v[l] += v[l ^ off]`` for off = L/2 .. 1."""
    v = v.copy()
    off = v.shape[0] // 2
    while off > 0:
        v = v + v[np.arange(v.shape[0]) ^ off]
        off //= 2
    return v[0]


class Fp64Check:
    """The balanced fp64 comparison for one reference (module docstring); same verdict as
    :meth:`~sparserl.harness.reference.Fp64Reference.compare`, into a board row."""

    def __init__(self, reference, plan: RowPlan, sms: int):
        """``reference``: an :class:`~sparserl.harness.reference.Fp64Reference` on the GPU. ``plan``:
        its pattern's :class:`RowPlan` (one plan serves a matrix and its fresh-valued twin)."""
        import cupy as cp

        self.cp = cp
        self.ref = reference
        self.plan = plan
        self.sms = sms
        self.m, self.n = reference.shape
        self.long_rows = cp.asarray(plan.long_rows)
        self.chunk_ptr = cp.asarray(plan.chunk_ptr)
        self.chunk_start = cp.asarray(plan.chunk_start)
        self.chunk_end = cp.asarray(plan.chunk_end)
        self._partial: dict[int, object] = {}

    @property
    def n_chunks(self) -> int:
        return int(self.plan.chunk_start.size)

    def device_arrays(self) -> list:
        """The plan's arrays on the GPU (fingerprinted by the worker like the references)."""
        return [self.long_rows, self.chunk_ptr, self.chunk_start, self.chunk_end]

    def enqueue(self, x, y, out) -> None:
        """Compare ``y`` with the product of the reference's matrix and ``x`` (shapes (n,)/(m,) or
        (n, k)/(m, k), contiguous float32); counts into ``out`` (a board row from :data:`BAD`)."""
        cp = self.cp
        k = 1 if x.ndim == 1 else int(x.shape[1])
        if x.shape[0] != self.n or y.size != self.m * k:
            raise ValueError(f"x {x.shape} and y {y.shape} do not fit a {self.m} x {self.n} matrix")
        if x.dtype != cp.float32 or y.dtype != cp.float32 or not (x.flags.c_contiguous and y.flags.c_contiguous):
            raise ValueError("x and y must be contiguous float32 arrays")
        p, r = self.plan, self.ref
        mod = _kernels()
        per_block = BLOCK // p.lanes
        mod.get_function("check_rows")((_grid(self.m, per_block, self.sms),), (BLOCK,), (
            np.int32(self.m), np.int32(k), np.int32(p.lanes), np.int32(p.long_len), r.indptr, r.indices, r.val,
            x, y, r.rtol, out))
        if not p.long_rows.size:
            return
        partial = self._partial.get(k)
        if partial is None:
            partial = self._partial[k] = cp.empty(self.n_chunks * k * 2, dtype=cp.float64)
        warps = BLOCK // 32
        mod.get_function("check_chunks")((_grid(self.n_chunks, warps, self.sms),), (BLOCK,), (
            np.int32(self.n_chunks), np.int32(k), self.chunk_start, self.chunk_end, r.indices, r.val, x, partial))
        mod.get_function("check_long_rows")((_grid(int(p.long_rows.size), warps, self.sms),), (BLOCK,), (
            np.int32(p.long_rows.size), np.int32(k), self.long_rows, self.chunk_ptr, partial, y, r.rtol, out))


# -- fingerprints ----------------------------------------------------------------------------------


class WordSums:
    """Fingerprints of a fixed list of device arrays, all computed by one launch of ``word_sums``.

    Per array, two wrapping (mod 2^64) sums over its 32-bit words ``w_i``: ``sum w_i`` and
    ``sum w_i (2 i + 1)``. A change of any one word changes both (the factor is odd, so no change
    of a word vanishes mod 2^64); words exchanged change the second. The worker keeps the sums of
    what it uploaded (pristine copies, references, verification inputs) and compares them before
    each job: damage done by an earlier job's far write is found without a copy back.

    CuPy's own ``sum`` would compile a CUB kernel for every new power of two of an array's length
    under 2048 words (the block size is a compile-time constant), seconds each inside a job; this
    kernel is compiled once, at the worker's start-up, for arrays of any length."""

    def __init__(self, arrays, sms: int):
        """``arrays``: contiguous device arrays whose sizes in bytes are multiples of 4 (every array
        the contract knows is int32 or float32; references also hold float64)."""
        import cupy as cp

        self.cp = cp
        self.arrays = list(arrays)  # held: the table holds their addresses
        table = np.zeros(2 * len(self.arrays), dtype=np.uint64)
        for i, a in enumerate(self.arrays):
            if not a.flags.c_contiguous or a.nbytes % 4:
                raise ValueError(f"a fingerprint needs contiguous arrays of 4-byte words, got {a.dtype}{a.shape}")
            table[2 * i], table[2 * i + 1] = a.data.ptr, a.nbytes // 4
        self.table = cp.asarray(table)
        self.words = int(table[1::2].max()) if len(self.arrays) else 0
        self.sms = sms

    @property
    def size(self) -> int:
        """Counters this fingerprint writes (two per array)."""
        return 2 * len(self.arrays)

    def enqueue(self, out) -> None:
        """Add the sums into ``out`` (a zeroed device uint64 array of :attr:`size` counters, or a view)."""
        if not self.arrays:
            return
        grid = (min(_grid(self.words, BLOCK, self.sms), 4 * self.sms), min(len(self.arrays), 65535))
        _kernels().get_function("word_sums")(grid, (BLOCK,), (self.table, np.int32(len(self.arrays)), out))

    def compute(self) -> tuple[int, ...]:
        """The sums now (one launch, one copy back)."""
        out = self.cp.zeros(self.size, dtype=self.cp.uint64)
        self.enqueue(out)
        return tuple(int(v) for v in self.cp.asnumpy(out))


def word_sums_host(arrays) -> tuple[int, ...]:
    """What :class:`WordSums` computes, for host arrays (the CPU tests' mirror of the kernel)."""
    out: list[int] = []
    for a in arrays:
        w = np.ascontiguousarray(a).reshape(-1).view(np.uint32).astype(np.uint64)
        i = np.arange(w.size, dtype=np.uint64)
        with np.errstate(over="ignore"):
            out += [int(np.sum(w, dtype=np.uint64)), int(np.sum(w * (np.uint64(2) * i + np.uint64(1)), dtype=np.uint64))]
    return tuple(out)


# -- one conversion for a matrix and its fresh-valued twin ----------------------------------------


def placed_once(wheres, nnz: int, sms: int) -> bool:
    """Whether the slots of ``wheres`` (device int32 arrays: the 1-based nonzero each slot holds, 0 for
    padding) name every nonzero 1..nnz exactly once and nothing else (two launches per array and one
    for the count, one copy back)."""
    import cupy as cp

    placed = cp.zeros(max(nnz, 1), dtype=cp.uint32)
    out = cp.zeros(2, dtype=cp.uint64)
    fns = _kernels()
    for w in wheres:
        if w.size:
            fns.get_function("place_count")((_grid(int(w.size), BLOCK, sms),), (BLOCK,), (
                w, np.int64(w.size), np.int32(nnz), placed, out[0:]))
    if nnz:
        fns.get_function("count_not_one")((_grid(nnz, BLOCK, sms),), (BLOCK,), (placed, np.int64(nnz), out[1:]))
    bad = cp.asnumpy(out)
    return int(bad[0]) == 0 and int(bad[1]) == 0


def gather_values(where, values, sms: int):
    """A new float32 device array: slot i holds ``values[where[i] - 1]`` bit for bit, or 0.0 where
    ``where[i]`` is 0 (padding)."""
    import cupy as cp

    out = cp.empty(where.shape, dtype=cp.float32)
    if where.size:
        _kernels().get_function("gather_values")((_grid(int(where.size), BLOCK, sms),), (BLOCK,), (
            where, np.int64(where.size), values, out))
    return out

