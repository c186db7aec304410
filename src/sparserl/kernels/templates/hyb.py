"""HYB template ``hyb_vec``: the ELL-plus-remainder split with an explicit width and 16-byte loads.

The library's ``hyb_ell_coo`` lets the converter choose the ELL width. Here the width is a FORMAT
parameter that a search moves (seeded from the matrix's row-length bins: the lengths below which
half, three quarters and nine tenths of the rows lie, and the mean), so the split between the
regular ELL part and the COO remainder is chosen per matrix. The ELL kernel gives each thread four
consecutive rows: slot ``j`` of rows ``r0 .. r0+3`` is 16 contiguous bytes of the column-major
arrays, read with one 16-byte load of ``ell_col_idx`` and one of ``ell_val`` when ``m`` is a
multiple of 4 (four independent ``x`` gathers in flight per slot), and the thread stops at the
first slot where all four rows are padding. The remainder is the library's warp segmented-scan COO
kernel. Wins when most rows are near one length with a tail of longer rows (empty-row and
power-law matrices with a light tail).
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, render_params_line, signature
from sparserl.kernels.library import coo
from sparserl.kernels.library.common import completion, fill
from sparserl.kernels.templates.base import Param, Params, Template
from sparserl.matrices.card import MatrixCard

WIDTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
MAX_FILL = 10.0
"""The converter's limit on ELL slots per nonzero (formats.ConversionLimits.max_fill)."""

SPACE = (
    Param("width", WIDTHS, "ELL width: each row's first `width` entries; the rest go to COO", format_param=True),
    Param("block", (64, 128, 256), "threads per block of the ELL kernel (four rows each)"),
    Param("batches", (1, 4, 16), "32-entry batches per warp of the COO kernel"),
)


def _check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    if card is None:
        return None
    w = p["width"]
    if w > max(card.row_len_max, 1):
        return f"width={w} is wider than the longest row ({card.row_len_max})"
    if w * card.rows > MAX_FILL * max(card.nnz, 1):
        return f"width={w} stores {w * card.rows} ELL slots for {card.nnz} nonzeros (over {MAX_FILL:g}x)"
    return None


_COO = {"row": "coo_row_idx", "col": "coo_col_idx", "val": "coo_val", "count": "coo_nnz"}
_LAUNCHES = ("grid=ceil_div(m, 4 * BLOCK), block=BLOCK",
             coo.segmented_launch("256", "coo_nnz") + ", kernel=spmv_coo_part")
_CODE = fill(
    """
${SIG}
{
    // ELL part: four consecutive rows per thread. Slot j of rows r0 .. r0+3 is 16 contiguous bytes
    // (column-major): one 16-byte load of ell_col_idx and one of ell_val when m is a multiple of 4.
    const int r0 = (blockIdx.x * BLOCK + threadIdx.x) * 4;
    if (r0 >= m) return;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    if ((m & 3) == 0) {  // then r0 + 3 < m too
        for (int j = 0; j < width; ++j) {
            const size_t s = (size_t)j * m + r0;
            const int4 c = __ldcs(reinterpret_cast<const int4*>(ell_col_idx + s));
            if ((c.x & c.y & c.z & c.w) < 0) break;  // all four rows are padding from here on
            const float4 a = __ldcs(reinterpret_cast<const float4*>(ell_val + s));
            if (c.x >= 0) s0 = fmaf(a.x, __ldg(x + c.x), s0);
            if (c.y >= 0) s1 = fmaf(a.y, __ldg(x + c.y), s1);
            if (c.z >= 0) s2 = fmaf(a.z, __ldg(x + c.z), s2);
            if (c.w >= 0) s3 = fmaf(a.w, __ldg(x + c.w), s3);
        }
        *reinterpret_cast<float4*>(y + r0) = make_float4(s0, s1, s2, s3);
    } else {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        #pragma unroll
        for (int t = 0; t < 4; ++t) {
            if (r0 + t >= m) break;
            for (int j = 0; j < width; ++j) {
                const size_t i = (size_t)j * m + r0 + t;
                const int c = __ldg(ell_col_idx + i);
                if (c < 0) break;
                s[t] = fmaf(__ldg(ell_val + i), __ldg(x + c), s[t]);
            }
            y[r0 + t] = s[t];
        }
    }
}
""",
    SIG=signature("HYB", Op.SPMV, None, "BLOCK"),
) + coo.segmented_function(signature("HYB", Op.SPMV, "spmv_coo_part", 256), "256", **_COO)
"""The one body of hyb_vec: the width (a FORMAT parameter) is read from the kernel's argument."""


def _render(p: Params, card: MatrixCard | None) -> str:
    head = "\n".join([f"FORMAT: HYB width={p['width']}",
                      render_params_line({"BLOCK": p["block"], "BATCHES": p["batches"]})]
                     + [f"LAUNCH: {l}" for l in _LAUNCHES])
    return completion(head, _CODE)


def _seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    widths = [8, 16]
    if card is not None:
        widths = []
        total, seen = card.rows, 0
        marks = iter((0.5, 0.75, 0.9))
        mark = next(marks)
        for bin_ in card.bins:  # the bin's top length once half, three quarters, nine tenths of the rows are in
            seen += bin_.rows
            while mark is not None and seen >= mark * total:
                widths.append(bin_.hi)
                mark = next(marks, None)
        widths.append(round(card.row_len_mean))
    out: list[Params] = []
    for want in widths:
        w = max([v for v in WIDTHS if v <= max(want, 1)], default=WIDTHS[0])
        p = {"width": w, "block": 128, "batches": 4}
        if p not in out and _check(p, card, k) is None:
            out.append(p)
    return out


def hyb_templates() -> list[Template]:
    return [Template(name="hyb_vec", op=Op.SPMV, format="HYB", space=SPACE, renderer=_render, checker=_check,
                     seed_points=_seeds, atomic=True,
                     doc="ELL width chosen per matrix, four rows per thread with 16-byte loads, COO remainder")]
