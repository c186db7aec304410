"""BSR templates: ``bsr_stream`` (generic) and ``bsr_stream_spec`` (block shape and grid baked in).

The values of one block row are one contiguous run of ``nblocks * R * C`` floats (blocks are
stored one after another, each row-major). ``g`` lanes stream that run with 16-byte loads:
lane ``l`` reads floats ``4*l, 4*l + 4*g, ...``. Since ``4*g`` is a multiple of ``R*C`` (the body's
``static_assert``: other numbers are a compile error that says so, not wrong sums), a lane always
lands on the same position inside a block: the same block row ``r`` and the same four columns
(``C >= 4``; two rows of two columns when ``C == 2``), so it keeps one or two sums and reads ``x``
with one 16-byte (or 8-byte) load per block. Lanes of the same rows are summed with
xor-shuffles at the end.

* ``bsr_stream``: block rows from ``block_row_ptr``; ``x`` loads guarded at the right edge.
* ``bsr_stream_spec``: every block row holds the same number ``K`` of blocks (the card's
  ``block_row_len``; the code names it ``MATRIX_BLOCK_ROW_LEN``, defined by the harness from the
  matrix: :mod:`sparserl.harness.matrix_facts`), so block row ``I`` is blocks ``I*K .. I*K+K-1``:
  ``block_row_ptr`` is not read, and the loop over the run has a fixed trip count and is unrolled
  (all loads in flight). The shape is read at run time: when ``n`` is a multiple of ``C`` (a test the whole grid takes
  the same way) no ``x`` load is guarded. Wins on block matrices.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, render_params_line, signature
from sparserl.kernels.library.common import FULL_MASK, completion, fill
from sparserl.kernels.templates.base import Param, Params, Template
from sparserl.matrices.card import MatrixCard

MAX_STEPS = 16
"""Most 16-byte loads of block values one lane of bsr_stream_spec holds in flight."""

SPACE = (
    Param("R", (2, 4, 8), "rows per block", format_param=True),
    Param("C", (2, 4, 8), "columns per block", format_param=True),
    Param("g", (2, 4, 8, 16, 32), "lanes per block row"),
    Param("block", (128, 256), "threads per block"),
)


def _check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    R, C, g = p["R"], p["C"], p["g"]
    if (4 * g) % (R * C):
        return f"4*g={4 * g} must be a multiple of R*C={R * C} (a lane stays on one position of the blocks)"
    return None


def _spec_check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    if (why := _check(p, card, k)) is not None:
        return why
    assert card is not None
    if card.block_shape != (p["R"], p["C"]) or card.block_row_len is None:
        return (f"the card names no {p['R']}x{p['C']} blocks with the same count in every block row "
                f"(block shape {card.block_shape}, per block row {card.block_row_len})")
    steps = -(-card.block_row_len * p["R"] * p["C"] // (4 * p["g"]))
    if steps > MAX_STEPS:
        return f"{steps} loads per lane with g={p['g']}; use more lanes"
    return None


_ADD_X = """
static_assert(4 * G % (R * C) == 0, "4*G must be a multiple of R*C: each lane stays on one position of the blocks");

// Adds a (four values of one block row at columns col .. col+3 when C >= 4; two rows of two columns
// when C == 2) times x into the lane's sums; a guarded call checks the right edge of x.
static __device__ __forceinline__ void add_x(float& sum0, float& sum1, float4 a, const float* __restrict__ x,
                                             int col, int n, bool guarded)
{
    if constexpr (C >= 4) {
        if (!guarded || col + 3 < n) {
            const float4 xv = __ldg(reinterpret_cast<const float4*>(x + col));
            sum0 = fmaf(a.x, xv.x, fmaf(a.y, xv.y, fmaf(a.z, xv.z, fmaf(a.w, xv.w, sum0))));
        } else {
            if (col < n) sum0 = fmaf(a.x, __ldg(x + col), sum0);
            if (col + 1 < n) sum0 = fmaf(a.y, __ldg(x + col + 1), sum0);
            if (col + 2 < n) sum0 = fmaf(a.z, __ldg(x + col + 2), sum0);
            if (col + 3 < n) sum0 = fmaf(a.w, __ldg(x + col + 3), sum0);
        }
    } else {
        if (!guarded || col + 1 < n) {
            const float2 xv = __ldg(reinterpret_cast<const float2*>(x + col));
            sum0 = fmaf(a.x, xv.x, fmaf(a.y, xv.y, sum0));
            sum1 = fmaf(a.z, xv.x, fmaf(a.w, xv.y, sum1));
        } else if (col < n) {
            const float x0 = __ldg(x + col);
            sum0 = fmaf(a.x, x0, sum0);
            sum1 = fmaf(a.z, x0, sum1);
        }
    }
}
"""

_GENERIC_LOOP = """
    if (brow < mb) {
        const int b0 = __ldg(block_row_ptr + brow);
        const int total = (__ldg(block_row_ptr + brow + 1) - b0) * (R * C);  // floats in this block row
        const float* bv = block_val + (size_t)b0 * (R * C);
        for (int e = lane * 4; e < total; e += 4 * G) {
            const float4 a = __ldcs(reinterpret_cast<const float4*>(bv + e));
            const int col = __ldg(block_col_idx + b0 + e / (R * C)) * C + cc;
            add_x(sum0, sum1, a, x, col, n, true);
        }
    }"""

_SPEC_LOOP = """
    if (brow < mb) {
        // Block row I is blocks I*K .. I*K+K-1: block_row_ptr is not read, and each lane loads its
        // STEPS 16-byte pieces of the K*R*C values before the first multiply.
        constexpr int STEPS = (K * R * C + 4 * G - 1) / (4 * G);
        const bool edge = n % C != 0;  // x's last block column is cut: guard the loads
        const int b0 = brow * K;
        const float* bv = block_val + (size_t)b0 * (R * C);
        float4 av[STEPS];
        int cols[STEPS];
        #pragma unroll
        for (int i = 0; i < STEPS; ++i) {
            const int e = lane * 4 + i * (4 * G);
            av[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            cols[i] = 0;
            if ((K * R * C) % (4 * G) == 0 || e < K * R * C) {
                av[i] = __ldcs(reinterpret_cast<const float4*>(bv + e));
                cols[i] = __ldg(block_col_idx + b0 + e / (R * C)) * C + cc;
            }
        }
        #pragma unroll
        for (int i = 0; i < STEPS; ++i) {
            const int e = lane * 4 + i * (4 * G);
            if ((K * R * C) % (4 * G) == 0 || e < K * R * C) add_x(sum0, sum1, av[i], x, cols[i], n, edge);
        }
    }"""


def _code(loop: str) -> str:
    return _ADD_X + fill(
        """
${SIG}
{
    // G lanes per block row stream its values; a lane holds one row and four columns (C >= 4), or two
    // rows and two columns (C == 2), of every block it reads.
    constexpr int COL_LANES = C >= 4 ? C / 4 : 1;  // lanes that share a block row within one block
    const int lane = threadIdx.x & (G - 1);
    const int brow = blockIdx.x * (BLOCK / G) + threadIdx.x / G;
    const int cc = C >= 4 ? (lane * 4) % C : 0;
    float sum0 = 0.f, sum1 = 0.f;${LOOP}
    // Sum the lanes of the same rows: those of one block, then those R*C/4 apart (other blocks).
    #pragma unroll
    for (int off = 1; off < COL_LANES; off <<= 1) sum0 += __shfl_xor_sync(${FULL}, sum0, off);
    #pragma unroll
    for (int off = R * C / 4; off < G; off <<= 1) {
        sum0 += __shfl_xor_sync(${FULL}, sum0, off);
        if (C == 2) sum1 += __shfl_xor_sync(${FULL}, sum1, off);
    }
    if constexpr (C >= 4) {
        if (brow < mb && lane < R * C / 4 && (lane & (COL_LANES - 1)) == 0) {
            const int row = brow * R + lane * 4 / C;
            if (row < m) y[row] = sum0;
        }
    } else {
        if (brow < mb && lane < R * C / 4) {
            const int row = brow * R + lane * 2;
            if (row < m) y[row] = sum0;
            if (row + 1 < m) y[row + 1] = sum1;
        }
    }
}
""", SIG=signature("BSR", Op.SPMV, None, "BLOCK"), LOOP=loop, FULL=FULL_MASK)


_GENERIC = _code(_GENERIC_LOOP)
_SPEC = _code(_SPEC_LOOP)


def _render(p: Params, card: MatrixCard | None, K: int | None) -> str:
    head = "\n".join([f"FORMAT: BSR R={p['R']} C={p['C']}", render_params_line({"G": p["g"], "BLOCK": p["block"]}),
                      "LAUNCH: grid=ceil_div(mb, BLOCK / G), block=BLOCK"])
    if K is None:
        return completion(head, _GENERIC)
    assert card is not None
    facts = (f"// Specialised to the matrix: every block row holds the same number of {p['R']}x{p['C']} blocks.\n"
             "constexpr int K = MATRIX_BLOCK_ROW_LEN;  // blocks per block row, defined by the harness")
    return completion(head, facts, _SPEC)


def _seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    shapes = [(4, 4), (8, 8)]
    if card is not None and card.block_shape is not None:
        shapes = [card.block_shape]
    out = []
    for R, C in shapes:
        for g in (8, 16, 32):
            if (4 * g) % (R * C) == 0:
                out.append({"R": R, "C": C, "g": g, "block": 256})
    return out


def bsr_templates() -> list[Template]:
    doc = "g lanes stream a block row's values with 16-byte loads, x loaded once per block"
    common = {"op": Op.SPMV, "format": "BSR", "space": SPACE, "seed_points": _seeds}
    return [
        Template(name="bsr_stream", renderer=lambda p, c: _render(p, c, None), checker=_check,
                 doc=doc + "; block rows from block_row_ptr", **common),
        Template(name="bsr_stream_spec", renderer=lambda p, c: _render(p, c, c.block_row_len),
                 checker=_spec_check, specialised=True, generic="bsr_stream",
                 doc=doc + "; blocks per block row baked in, loop unrolled", **common),
    ]
