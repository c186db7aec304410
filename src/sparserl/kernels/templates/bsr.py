"""BSR templates: ``bsr_stream`` (generic) and ``bsr_stream_spec`` (block shape and grid baked in).

The values of one block row are one contiguous run of ``nblocks * R * C`` floats (blocks are
stored one after another, each row-major). ``g`` lanes stream that run with 16-byte loads:
lane ``l`` reads floats ``4*l, 4*l + 4*g, ...``. Since ``4*g`` is a multiple of ``R*C``, a lane
always lands on the same position inside a block: the same block row ``r`` and the same four
columns (``C >= 4``; two rows of two columns when ``C == 2``), so it keeps one or two sums and
reads ``x`` with one 16-byte (or 8-byte) load per block. Lanes of the same rows are summed with
xor-shuffles at the end.

* ``bsr_stream``: block rows from ``block_row_ptr``; ``x`` loads guarded at the right edge.
* ``bsr_stream_spec``: every block row holds the same number ``K`` of blocks (the card's
  ``block_row_len``), so block row ``I`` is blocks ``I*K .. I*K+K-1``: ``block_row_ptr`` is not
  read, the loop over the run has a fixed trip count and is unrolled (all loads in flight), and
  when ``n`` is a multiple of ``C`` no ``x`` load needs a guard. Wins on block matrices.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import FULL_MASK, fill
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


def _x_and_fma(C: int, guarded: bool) -> str:
    """CUDA: add a (float4 of block values at column ``col``) times x into the lane's sums."""
    if C >= 4:
        fast = ("const float4 xv = __ldg(reinterpret_cast<const float4*>(x + col));\n"
                "                sum0 = fmaf(a.x, xv.x, fmaf(a.y, xv.y, fmaf(a.z, xv.z, fmaf(a.w, xv.w, sum0))));")
        if not guarded:
            return "{ " + fast + " }"
        return ("if (col + 3 < n) {\n                " + fast + "\n            } else {\n"
                "                if (col < n) sum0 = fmaf(a.x, __ldg(x + col), sum0);\n"
                "                if (col + 1 < n) sum0 = fmaf(a.y, __ldg(x + col + 1), sum0);\n"
                "                if (col + 2 < n) sum0 = fmaf(a.z, __ldg(x + col + 2), sum0);\n"
                "                if (col + 3 < n) sum0 = fmaf(a.w, __ldg(x + col + 3), sum0);\n"
                "            }")
    fast = ("const float2 xv = __ldg(reinterpret_cast<const float2*>(x + col));\n"
            "                sum0 = fmaf(a.x, xv.x, fmaf(a.y, xv.y, sum0));\n"
            "                sum1 = fmaf(a.z, xv.x, fmaf(a.w, xv.y, sum1));")
    if not guarded:
        return "{ " + fast + " }"
    return ("if (col + 1 < n) {\n                " + fast + "\n            } else if (col < n) {\n"
            "                const float x0 = __ldg(x + col);\n"
            "                sum0 = fmaf(a.x, x0, sum0);\n"
            "                sum1 = fmaf(a.z, x0, sum1);\n"
            "            }")


def _render(p: Params, card: MatrixCard | None, K: int | None) -> str:
    R, C, g, b = p["R"], p["C"], p["g"], p["block"]
    RC = R * C
    bpb = b // g
    # lane l holds floats 4l .. 4l+3 of a block (mod RC): block row r0 = 4l/C (C >= 4), else rows r0, r0+1
    lane_rows = "one row, four columns" if C >= 4 else "two rows, two columns"
    col_lanes = max(C // 4, 1)  # lanes that share a block row within one block (C >= 4)
    reduce_lines = []
    for off in (1 << i for i in range(8)):
        if off < col_lanes or RC // 4 <= off < g:
            reduce_lines.append(off)
    sums = ["sum0"] if C >= 4 else ["sum0", "sum1"]
    red = "\n".join(
        f"    {s} += __shfl_xor_sync({FULL_MASK}, {s}, {off});" for off in reduce_lines for s in sums)
    if C >= 4:
        write = fill("""    if (brow < mb && lane < ${RC4} && (lane & ${CL1}) == 0) {
        const int row = brow * ${R} + lane * 4 / ${C};
        if (row < m) y[row] = sum0;
    }""", RC4=RC // 4, CL1=col_lanes - 1, R=R, C=C)
    else:
        write = fill("""    if (brow < mb && lane < ${RC4}) {
        const int row = brow * ${R} + lane * 2;
        if (row < m) y[row] = sum0;
        if (row + 1 < m) y[row + 1] = sum1;
    }""", RC4=RC // 4, R=R)
    pos = f"const int cc = (lane * 4) % {C};" if C >= 4 else "const int cc = 0;"
    head = (f"FORMAT: BSR R={R} C={C}\nLAUNCH: grid=ceil_div(mb, {bpb}), block={b}\n")
    if K is None:
        loop = fill("""    if (brow < mb) {
        const int b0 = __ldg(block_row_ptr + brow);
        const int total = (__ldg(block_row_ptr + brow + 1) - b0) * ${RC};  // floats in this block row
        const float* bv = block_val + (size_t)b0 * ${RC};
        for (int e = lane * 4; e < total; e += ${STEP}) {
            const float4 a = __ldcs(reinterpret_cast<const float4*>(bv + e));
            const int col = __ldg(block_col_idx + b0 + e / ${RC}) * ${C} + cc;
            ${FMA}
        }
    }""", RC=RC, STEP=4 * g, C=C, FMA=_x_and_fma(C, True))
        intro = f"    // {g} lanes per block row stream its values; a lane holds {lane_rows} of every block it reads."
    else:
        steps = -(-K * RC // (4 * g))
        guard = "" if (K * RC) % (4 * g) == 0 else f"if (e < {K * RC}) "
        x_guard = card is not None and card.cols % C != 0
        loop = fill("""    if (brow < mb) {
        const int b0 = brow * ${K};
        const float* bv = block_val + (size_t)b0 * ${RC};
        float4 av[${STEPS}];
        int cols[${STEPS}];
        #pragma unroll
        for (int i = 0; i < ${STEPS}; ++i) {
            const int e = lane * 4 + i * ${STEP};
            av[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            cols[i] = 0;
            ${GUARD}{
                av[i] = __ldcs(reinterpret_cast<const float4*>(bv + e));
                cols[i] = __ldg(block_col_idx + b0 + e / ${RC}) * ${C} + cc;
            }
        }
        #pragma unroll
        for (int i = 0; i < ${STEPS}; ++i) {
            const int e = lane * 4 + i * ${STEP};
            const float4 a = av[i];
            const int col = cols[i];
            ${GUARD}${FMA}
        }
    }""", K=K, RC=RC, STEPS=steps, STEP=4 * g, C=C, GUARD=guard, FMA=_x_and_fma(C, x_guard))
        intro = (f"    // Specialised to this matrix: every block row holds {K} blocks of {R}x{C}, so block row I is\n"
                 f"    // blocks I*{K} .. I*{K}+{K - 1} and block_row_ptr is not read; {g} lanes stream its"
                 f" {K * RC} values,\n    // a lane holds {lane_rows} of every block it reads.")
    return head + fill(
        """
${SIG}
{
${INTRO}
    const int lane = threadIdx.x & ${GM1};
    const int brow = blockIdx.x * ${BPB} + threadIdx.x / ${G};
    ${POS}
    float sum0 = 0.f${SUM1};
${LOOP}
${RED}
${WRITE}
}
""",
        SIG=signature("BSR", Op.SPMV, None, b), INTRO=intro, GM1=g - 1, BPB=bpb, G=g, POS=pos,
        SUM1=", sum1 = 0.f" if C == 2 else "", LOOP=loop, RED=red, WRITE=write,
    )


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
