"""The index arithmetic of the new kernels, emulated on the CPU (no GPU here).

Each emulator follows its CUDA kernel statement by statement (warps and lanes as Python loops;
atomics as plain adds, which only reorders sums), on matrices built to hit the edges: empty rows
and runs of them, rows longer than the split threshold at the start, the end and across warp
groups, rows of every length around the chunk size, a row count that is not a multiple of
anything, and nnz not a multiple of 4. They check that every entry is added exactly once to the
right row, which is what the kernels' indexing must get right; the GPU tests check the CUDA itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.kernels.library.csr_irregular import THREAD_MAX, AdaptivePlan
from sparserl.kernels.templates import dia as dia_t
from sparserl.kernels.templates.csr import adaptive_plan
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card


def _csr_from_lengths(lengths: list[int], n: int, seed: int = 0) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    cols = np.concatenate([np.sort(rng.choice(n, size=k, replace=False)) for k in lengths if k] or [np.zeros(0, int)])
    vals = rng.uniform(0.5, 1.5, indptr[-1]) * rng.choice([-1, 1], indptr[-1])
    return sp.csr_array((vals, cols.astype(np.int32), indptr.astype(np.int32)), shape=(len(lengths), n))


def _tricky(long_len: int) -> list[sp.csr_array]:
    rng = np.random.default_rng(5)
    out = []
    big = 3 * long_len + 7
    # long rows first, last, back to back, between empty runs; every length near the chunk sizes
    lens = [big, 0, 0, 1, 2, 3, 31, 32, 33, 255, 256, 257, 0] + [0] * 70 + [big, big, 5, long_len, long_len + 1]
    lens += list(rng.integers(0, 40, 101)) + [big]
    out.append(_csr_from_lengths(lens, 4 * big + 11, seed=1))
    out.append(_csr_from_lengths([7], 50))  # one row
    out.append(_csr_from_lengths([0] * 40 + [3] + [0] * 40, 9))  # almost empty
    out.append(_csr_from_lengths(list(rng.integers(0, 6, 333)), 20))  # short rows only, m = 333
    out.append(_csr_from_lengths([long_len + 1] * 3 + [1] * 65, long_len + 40))  # nnz = 3*(L+1) + 65
    return out


def _row_at(ptr: list[int], j: int, rpw: int) -> int:
    r, s = 0, rpw // 2
    while s > 0:
        if ptr[r + s] <= j:
            r += s
        s >>= 1
    return r


def _l1_stream(A, x, y, rpw, items, long_len, has_long):
    m, nnz = A.shape[0], A.nnz
    ip, ci, va = A.indptr, A.indices, A.data
    chunk = 32 * items
    for r0 in range(0, m, rpw):
        ptr = [int(ip[min(r0 + i, m)]) for i in range(rpw + 1)]
        acc = [0.0] * rpw
        p_begin, p_end = ptr[0], ptr[rpw]
        c0 = p_begin & ~3
        while c0 < p_end:
            if has_long:
                r = _row_at(ptr, max(c0, p_begin), rpw)
                if ptr[r + 1] - ptr[r] > long_len and ptr[r + 1] - c0 >= chunk:
                    c0 = ptr[r + 1] & ~3
                    continue
            for lane in range(32):
                q = c0 + lane * items
                prod = [0.0] * items
                for v in range(0, items, 4):
                    j = q + v
                    if j + 4 <= p_begin or j >= p_end:
                        continue
                    assert j % 4 == 0  # the 16-byte loads
                    for t in range(4):
                        jt = j + t
                        if p_begin <= jt < p_end:
                            assert jt < nnz
                            prod[v + t] = va[jt] * x[ci[jt]]
                if q + items > p_begin and q < p_end:
                    first = max(q, p_begin)
                    r = _row_at(ptr, first, rpw)
                    r_end = ptr[r + 1]
                    skip = has_long and r_end - ptr[r] > long_len
                    run = 0.0
                    for t in range(items):
                        j = q + t
                        if first <= j < p_end:
                            if j >= r_end:
                                if not skip:
                                    acc[r] += run
                                run = 0.0
                                r += 1
                                while ptr[r + 1] <= j:
                                    r += 1
                                r_end = ptr[r + 1]
                                skip = has_long and r_end - ptr[r] > long_len
                            run += prod[t]
                    if not skip:
                        acc[r] += run
            c0 += chunk
        for i in range(rpw):
            if r0 + i < m:
                y[r0 + i] = acc[i]


def _l1_thread(A, x, y, rpw, long_len, short_max, has_long):
    ip, ci, va = A.indptr, A.indices, A.data
    for row in range(A.shape[0]):
        a, b = ip[row], ip[row + 1]
        s = 0.0
        if not has_long or b - a <= long_len:
            assert b - a <= short_max  # the unrolled loop must cover every row it is given
            for t in range(short_max):
                if a + t < b:
                    s += va[a + t] * x[ci[a + t]]
        y[row] = s


def _row_of(ip, m: int, z: int) -> int:
    lo, hi = 0, m
    while hi - lo > 32:
        step = (hi - lo + 31) >> 5
        ok = [lane for lane in range(32) if lo + lane * step < hi and ip[lo + lane * step] <= z]
        assert 0 in ok
        lo += max(ok) * step
        hi = min(lo + step, hi)
    ok = [lane for lane in range(32) if lo + lane < hi and ip[lo + lane] <= z]
    return lo + max(ok)


def _add_piece(A, x, y, r, lo, hi, seg):
    assert 0 <= hi - lo <= seg and A.indptr[r] <= lo and hi <= A.indptr[r + 1]
    y[r] += sum(A.data[j] * x[A.indices[j]] for j in range(lo, hi))


def _l2_search(A, x, y, long_len, seg):
    ip, m, nnz = A.indptr, A.shape[0], A.nnz
    for b in range((nnz + seg - 1) // seg):
        z0 = b * seg
        z1 = z0 + min(seg, nnz - z0)
        ra, rb = _row_of(ip, m, z0), _row_of(ip, m, z1 - 1)
        assert ip[ra] <= z0 < ip[ra + 1] and ip[rb] <= z1 - 1 < ip[rb + 1]
        for r in ([ra] if ra == rb else [ra, rb]):
            a, e = ip[r], ip[r + 1]
            if e - a > long_len:
                _add_piece(A, x, y, r, max(a, z0), min(e, z1), seg)


def _l2_table(A, x, y, seg, long_rows):
    counts = [-(-n // seg) for _, n in long_rows]
    first = np.concatenate(([0], np.cumsum(counts)))
    for b in range(int(first[-1])):
        lo_i, hi_i = 0, len(long_rows)
        while hi_i - lo_i > 1:
            mid = (lo_i + hi_i) >> 1
            if first[mid] <= b:
                lo_i = mid
            else:
                hi_i = mid
        r = long_rows[lo_i][0]
        lo = A.indptr[r] + (b - first[lo_i]) * seg
        _add_piece(A, x, y, r, lo, lo + min(seg, A.indptr[r + 1] - lo), seg)


def emulate_adaptive(A, x, rpw, items, long_len, seg, plan: AdaptivePlan | None):
    y = np.full(A.shape[0], np.nan)
    has_long = plan is None or plan.has_long
    if plan is not None and plan.short_max <= THREAD_MAX:
        _l1_thread(A, x, y, rpw, long_len, plan.short_max, has_long)
    else:
        _l1_stream(A, x, y, rpw, items, long_len, has_long)
    if has_long:
        if plan is not None and plan.long_rows is not None:
            _l2_table(A, x, y, seg, plan.long_rows)
        else:
            _l2_search(A, x, y, long_len, seg)
    return y


@pytest.mark.parametrize("rpw,items", [(32, 4), (32, 8), (64, 8), (128, 4)])
def test_csr_adaptive_generic_adds_every_entry_once(rpw: int, items: int) -> None:
    long_len = 64  # small, so the tests reach the long-row paths on small matrices
    for A in _tricky(long_len) + [generate("powerlaw", 3000, seed=2), generate("rmat", 2000, seed=1)]:
        x = np.random.default_rng(0).standard_normal(A.shape[1])
        for seg in (32, 64):
            y = emulate_adaptive(A, x, rpw, items, long_len, seg, None)
            np.testing.assert_allclose(y, A @ x, rtol=1e-9, atol=1e-9)


def test_csr_adaptive_specialised_plans_add_every_entry_once() -> None:
    mats = _tricky(256) + [generate("skewed", 3000, seed=3, long_len=900), generate("dense_lines", 1500, seed=2),
                           generate("random", 700, seed=1, nnz_per_row=5)]
    seen = set()
    for A in mats:
        card = matrix_card(A)
        x = np.random.default_rng(1).standard_normal(A.shape[1])
        for long_len in (256, 1024, 16384):
            for seg in (1024, 4096):
                p = {"rpw": 32, "items": 8, "long_len": long_len, "seg": seg, "block": 256}
                plan = adaptive_plan(p, card)
                seen.add((plan.has_long, plan.long_rows is not None, plan.short_max <= THREAD_MAX))
                y = emulate_adaptive(A, x, 32, 8, long_len, seg, plan)
                np.testing.assert_allclose(y, A @ x, rtol=1e-9, atol=1e-9)
    # the matrices reach every kind of plan: long rows from a table, no long rows, a lane per row
    assert (True, True, False) in seen and (False, False, False) in seen and (False, False, True) in seen
    assert (True, True, True) in seen


def test_rows_longer_than_lists_every_long_row() -> None:
    A = generate("skewed", 20000, seed=1, long_len=600, long_fraction=0.05)  # 1000 rows of 600
    card = matrix_card(A)
    lengths = np.diff(A.indptr)
    rows = card.rows_longer_than(500)
    assert rows is not None and sorted(r for r, _ in rows) == list(np.flatnonzero(lengths > 500))
    assert all(lengths[r] == n for r, n in rows)
    assert card.rows_longer_than(card.long_rows_min - 2) is None  # below the listing threshold: unknown


def emulate_split(A, x, tpr: int, unroll: int, long_len: int, block: int, long_rows) -> tuple[np.ndarray, np.ndarray]:
    """csr_split_spec's launch on the host: blocks 0 .. len(long_rows) - 1 each sum one row of the
    table (BLOCK threads striding by BLOCK * UNROLL, then a block-wide sum and one store), the rest
    give TPR lanes to each row and store only rows of at most LONG_LEN entries. Returns y (NaN where
    nothing was stored) and how many times each row was stored."""
    m = A.shape[0]
    y, stores = np.full(m, np.nan), np.zeros(m, dtype=int)
    ip, col, val = A.indptr, A.indices, A.data

    def strided(begin: int, end: int, threads: int) -> float:  # each thread's loop, then their sum
        part = np.zeros(threads)
        for t in range(threads):
            for j in range(begin + t, end, threads * unroll):
                for u in range(unroll):
                    if j + u * threads < end:
                        part[t] += val[j + u * threads] * x[col[j + u * threads]]
        return part.sum()

    for r in long_rows:  # the long-row blocks
        y[r] = strided(ip[r], ip[r + 1], block)
        stores[r] += 1
    rows_per_block = block // tpr
    n_blocks = len(long_rows) + -(-m // rows_per_block)
    for b in range(len(long_rows), n_blocks):  # the other blocks: TPR lanes per row
        for g in range(rows_per_block):
            row = (b - len(long_rows)) * rows_per_block + g
            if row >= m or ip[row + 1] - ip[row] > long_len:
                continue
            y[row] = strided(ip[row], ip[row + 1], tpr)
            stores[row] += 1
    return y, stores


def test_csr_split_stores_every_row_once() -> None:
    """Every row is stored exactly once and y = A x, on the tricky structures (rows of exactly
    long_len and long_len + 1, long rows first and last, empty runs) and a power-law graph, for
    the tables the template bakes. Kills a table built with >= or from another threshold (a row of
    long_len stored twice, or one of long_len + 1 never), a short path that also stores long rows,
    a long-row block that strides by BLOCK alone (entries summed UNROLL times) and a grid without
    the long rows' blocks (the last rows never stored)."""
    import re

    from sparserl.harness.matrix_facts import materialise
    from sparserl.kernels.contract import Op
    from sparserl.kernels.templates import get_template

    t = get_template("spmv", "csr_split_spec")
    for long_len in (256, 512):
        for A in _tricky(long_len) + [generate("powerlaw", 3000, seed=2)]:
            card = matrix_card(A)
            x = np.random.default_rng(1).standard_normal(A.shape[1])
            for tpr, unroll, block in ((4, 4, 256), (32, 1, 128), (1, 8, 128)):
                p = {"tpr": tpr, "unroll": unroll, "long_len": long_len, "block": block}
                refused = t.check(p, card)
                if refused is not None:  # no long row: the template refuses, the launch is csr_lanes' (no table)
                    assert "that is csr_lanes" in refused, refused
                    rows = []
                else:  # the table the harness writes for this matrix
                    text = materialise(t.render(p, card), Op.SPMV, card)
                    rows = [int(r) for r in re.search(r"MATRIX_LONG_ROWS\[\d+\] = \{([^}]*)\}", text)[1].split(",")]
                y, stores = emulate_split(A, x, tpr, unroll, long_len, block, rows)
                assert (stores == 1).all(), np.flatnonzero(stores != 1)[:5]
                np.testing.assert_allclose(y, A @ x, rtol=1e-9, atol=1e-9)


def _emulate_bsr(A, R: int, C: int, g: int, K: int | None) -> np.ndarray:
    """bsr_stream's lanes, sums and xor-shuffle reduction for one x; returns y."""
    m, n = A.shape
    mb, nb = -(-m // R), -(-n // C)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n)
    # BSR arrays as the converter builds them
    coo = A.tocoo()
    key = (coo.row // R) * nb + coo.col // C
    blocks, which = np.unique(key, return_inverse=True)
    val = np.zeros(blocks.size * R * C)
    val[which * R * C + (coo.row % R) * C + coo.col % C] = coo.data
    brp = np.zeros(mb + 1, dtype=np.int64)
    np.cumsum(np.bincount(blocks // nb, minlength=mb), out=brp[1:])
    bci = blocks % nb
    RC = R * C
    y = np.full(m, np.nan)
    for brow in range(mb):
        sums = np.zeros((g, 2))
        b0 = brp[brow] if K is None else brow * K
        if K is not None:
            assert brp[brow] == brow * K
        total = (brp[brow + 1] - b0) * RC
        for lane in range(g):
            cc = (lane * 4) % C if C >= 4 else 0
            for e in range(lane * 4, total, 4 * g):
                a = val[b0 * RC + e: b0 * RC + e + 4]
                col = bci[b0 + e // RC] * C + cc
                p = e % RC
                assert p == (lane * 4) % RC  # a lane stays on one position of the blocks
                if C >= 4:
                    assert col % 4 == 0
                    sums[lane, 0] += sum(a[t] * x[col + t] for t in range(4) if col + t < n)
                else:
                    sums[lane, 0] += sum(a[t] * x[col + t] for t in range(2) if col + t < n)
                    sums[lane, 1] += sum(a[2 + t] * x[col + t] for t in range(2) if col + t < n)
        col_lanes = max(C // 4, 1)
        for off in (1 << i for i in range(6)):
            if off < col_lanes or RC // 4 <= off < g:
                sums = sums + sums[np.arange(g) ^ off]
        for lane in range(g):
            if C >= 4 and lane < RC // 4 and lane & (col_lanes - 1) == 0:
                row = brow * R + lane * 4 // C
                if row < m:
                    y[row] = sums[lane, 0]
            elif C == 2 and lane < RC // 4:
                row = brow * R + lane * 2
                if row < m:
                    y[row] = sums[lane, 0]
                if row + 1 < m:
                    y[row + 1] = sums[lane, 1]
    np.testing.assert_allclose(y, A @ x, rtol=1e-9, atol=1e-9)
    return y


@pytest.mark.parametrize("R,C,g", [(4, 4, 4), (4, 4, 32), (8, 8, 16), (8, 8, 32), (2, 2, 2), (4, 2, 8), (8, 4, 8),
                                   (2, 4, 2)])
def test_bsr_stream_lanes_and_reduction(R: int, C: int, g: int) -> None:
    A = generate("block", 203, cols=93, seed=4, block=4, blocks_per_row=3)  # edge blocks cut on both sides
    _emulate_bsr(A, R, C, g, None)
    B = generate("block", 96, cols=96, seed=4, block=R, blocks_per_row=3)
    card = matrix_card(B)
    K = card.block_row_len if card.block_shape == (R, R) else None
    _emulate_bsr(B, R, C, g, K if C == R else None)


def test_dia_window_covers_each_diagonal() -> None:
    for offs in [(-4, -3, -2, -1, 0, 1, 2, 3, 4), (-70, -1, 0, 1, 70), (-111, -110, -109, -101, -100, -99, -1, 0, 1),
                 tuple(range(-40, 41, 3)), (5,), (-3, 6)]:
        groups = dia_t.clusters(offs)
        assert [o for cl in groups for o in cl] == list(offs)
        for cl in groups:
            start, loads = dia_t._window(cl[0], cl[-1])
            assert start % 4 == 0 and loads <= dia_t.MAX_WINDOW
            for o in cl:
                for t in range(4):  # x[r0 + o + t] is element o - start + t of the window
                    assert 0 <= o - start + t < 4 * loads
