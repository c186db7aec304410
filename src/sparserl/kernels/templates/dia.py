"""DIA templates: ``dia_window`` (generic) and ``dia_window_spec`` (offsets baked in).

Both give each thread ``v`` groups of four consecutive rows, the groups strided by the block so
every 16-byte access is coalesced; ``val`` streams (``__ldcs``) and ``y`` is written with
streaming stores, so the L2 keeps ``x``.

* ``dia_window``: offsets read from ``offsets`` at run time, one diagonal at a time; ``x`` read
  with a 16-byte load when the diagonal's offset is a multiple of 4, else four single loads.
* ``dia_window_spec``: the diagonal offsets, their count, ``m`` and ``n`` are compile-time
  constants and the loop over diagonals is unrolled. Nearby offsets are grouped into clusters;
  each cluster loads the aligned window of ``x`` that all its diagonals need (for a 9-band
  matrix, three 16-byte loads serve all nine diagonals of four rows), whatever the offsets'
  alignment. ``val`` of diagonal ``d`` is read with 16-, 8- or 4-byte loads as ``d*m`` mod 4
  allows (known here). Rows whose every window lies inside ``x`` take this path with no bounds
  tests; the few edge rows take a guarded path. Wins on banded and stencil matrices, whose
  off-by-one diagonals defeat the generic 16-byte path.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, signature
from sparserl.kernels.library.common import fill
from sparserl.kernels.templates.base import Param, Params, Template
from sparserl.matrices.card import MatrixCard

CLUSTER_GAP = 8
"""Offsets at most this far apart share a window of x (when the window stays small)."""
MAX_WINDOW = 8
"""Most 16-byte loads in one cluster's window of x (32 floats of registers)."""

SPACE = (
    Param("block", (64, 128, 256), "threads per block"),
    Param("v", (1, 2, 4), "groups of four rows per thread"),
)


def _floor4(v: int) -> int:
    return (v // 4) * 4


def _window(lo: int, hi: int) -> tuple[int, int]:
    """(start relative to r0, number of 16-byte loads) of the x window for offsets lo..hi."""
    start = _floor4(lo)
    return start, (_floor4(hi + 3) - start) // 4 + 1


def clusters(offsets: tuple[int, ...]) -> list[list[int]]:
    """Ascending offsets grouped so that each group's x window is at most MAX_WINDOW loads."""
    out: list[list[int]] = []
    for o in offsets:
        if out and o - out[-1][-1] <= CLUSTER_GAP and _window(out[-1][0], o)[1] <= MAX_WINDOW:
            out[-1].append(o)
        else:
            out.append([o])
    return out


def _sig(block: int) -> str:
    return signature("DIA", Op.SPMV, None, block)


def _header(block: int, v: int) -> str:
    return f"FORMAT: DIA\nLAUNCH: grid=ceil_div(m, {block * v * 4}), block={block}\n"


def _render_generic(p: Params, card: MatrixCard | None) -> str:
    b, v = p["block"], p["v"]
    return _header(b, v) + fill(
        """
${SIG}
{
    // ${V} groups of four consecutive rows per thread, strided by the block.
    const bool aligned = (m & 3) == 0;
    #pragma unroll
    for (int g = 0; g < ${V}; ++g) {
        const int r0 = (blockIdx.x * ${TILE} + g * ${B} + threadIdx.x) * 4;
        if (r0 >= m) break;
        const bool full = aligned && r0 + 3 < m;
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        for (int d = 0; d < num_diags; ++d) {
            const int off = __ldg(offsets + d);
            const float* vd = val + (size_t)d * m;
            const int c = r0 + off;
            float a[4];
            if (full) {
                const float4 av = __ldcs(reinterpret_cast<const float4*>(vd + r0));
                a[0] = av.x; a[1] = av.y; a[2] = av.z; a[3] = av.w;
            } else {
                #pragma unroll
                for (int t = 0; t < 4; ++t) a[t] = r0 + t < m ? __ldcs(vd + r0 + t) : 0.f;
            }
            if ((off & 3) == 0 && c >= 0 && c + 3 < n) {
                const float4 xv = __ldg(reinterpret_cast<const float4*>(x + c));
                s[0] = fmaf(a[0], xv.x, s[0]); s[1] = fmaf(a[1], xv.y, s[1]);
                s[2] = fmaf(a[2], xv.z, s[2]); s[3] = fmaf(a[3], xv.w, s[3]);
            } else {
                #pragma unroll
                for (int t = 0; t < 4; ++t)
                    if (r0 + t < m && c + t >= 0 && c + t < n) s[t] = fmaf(a[t], __ldg(x + c + t), s[t]);
            }
        }
        if (full) {
            __stcs(reinterpret_cast<float4*>(y + r0), make_float4(s[0], s[1], s[2], s[3]));
        } else {
            #pragma unroll
            for (int t = 0; t < 4; ++t)
                if (r0 + t < m) y[r0 + t] = s[t];
        }
    }
}
""",
        SIG=_sig(b), V=v, B=b, TILE=b * v,
    )


_XYZW = "xyzw"


def _val_load(d: int, m: int) -> str:
    """CUDA: ``a0..a3`` = val[d*m + r0 .. +3], with the widest loads the alignment of d*m allows."""
    base = f"val + {d * m} + r0" if d else "val + r0"
    mis = (d * m) % 4
    if mis == 0:
        return f"const float4 a = __ldcs(reinterpret_cast<const float4*>({base})); " \
               "const float a0 = a.x, a1 = a.y, a2 = a.z, a3 = a.w;"
    if mis == 2:
        return (f"const float2 a = __ldcs(reinterpret_cast<const float2*>({base})), "
                f"b = __ldcs(reinterpret_cast<const float2*>({base} + 2)); "
                "const float a0 = a.x, a1 = a.y, a2 = b.x, a3 = b.y;")
    return (f"const float* vd = {base}; "
            "const float a0 = __ldcs(vd), a1 = __ldcs(vd + 1), a2 = __ldcs(vd + 2), a3 = __ldcs(vd + 3);")


def _plus(v: int) -> str:
    return f"+ {v}" if v >= 0 else f"- {-v}"


def _interior(offsets: tuple[int, ...], m: int) -> str:
    lines = []
    index = {o: d for d, o in enumerate(offsets)}
    for k, cl in enumerate(clusters(offsets)):
        start, loads = _window(cl[0], cl[-1])
        lines.append(f"            // offsets {' '.join(str(o) for o in cl)}: x[r0 {_plus(start)} .. r0 {_plus(start + 4 * loads)})")
        lines.append("            {")
        for i in range(loads):
            lines.append(f"                const float4 w{i} = __ldg(reinterpret_cast<const float4*>(x + r0 {_plus(start + 4 * i)}));")
        for o in cl:
            e = o - start  # x[r0 + o + t] is window element e + t
            xs = [f"w{(e + t) // 4}.{_XYZW[(e + t) % 4]}" for t in range(4)]
            lines.append(f"                {{ {_val_load(index[o], m)}")
            lines.append(f"                  s0 = fmaf(a0, {xs[0]}, s0); s1 = fmaf(a1, {xs[1]}, s1); "
                         f"s2 = fmaf(a2, {xs[2]}, s2); s3 = fmaf(a3, {xs[3]}, s3); }}")
        lines.append("            }")
    return "\n".join(lines)


def _spec_check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    assert card is not None
    if card.dia_offsets is None:
        return f"the card lists no diagonal offsets ({card.num_diagonals} diagonals)"
    return None


def _spec_unseen(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    assert card is not None
    if card.prompt_offsets() is None:
        return f"its {card.num_diagonals} diagonal offsets are too many for the prompt's card to list"
    return None


def _render_spec(p: Params, card: MatrixCard | None) -> str:
    assert card is not None and card.dia_offsets is not None
    b, v = p["block"], p["v"]
    offs, m, n = card.dia_offsets, card.rows, card.cols
    nd = len(offs)
    lo = _floor4(offs[0])
    hi = _floor4(offs[-1] + 3) + 4
    first = max(0, -lo)  # first r0 whose windows start at or after x[0]
    last = min(n - hi, m - 4)  # last r0 whose windows end within x and whose four rows exist
    table = ", ".join(str(o) for o in offs)
    if m % 4 == 0:
        store = "__stcs(reinterpret_cast<float4*>(y + r0), make_float4(s0, s1, s2, s3));"
    else:
        store = "y[r0] = s0; if (r0 + 1 < m) y[r0 + 1] = s1; if (r0 + 2 < m) y[r0 + 2] = s2; if (r0 + 3 < m) y[r0 + 3] = s3;"
    return _header(b, v) + fill(
        """
// Specialised to this matrix: ${M} x ${N}, ${ND} diagonals at offsets ${TABLE}.
__constant__ int c_offsets[${ND}] = {${TABLE}};

${SIG}
{
    // ${V} groups of four consecutive rows per thread, strided by the block; diagonals unrolled.
    #pragma unroll
    for (int g = 0; g < ${V}; ++g) {
        const int r0 = (blockIdx.x * ${TILE} + g * ${B} + threadIdx.x) * 4;
        if (r0 >= ${M}) break;
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
        if (r0 >= ${FIRST} && r0 <= ${LAST}) {  // every x window inside x, all four rows inside y
${INTERIOR}
        } else {  // edge rows: guarded, one entry at a time
            float s[4] = {0.f, 0.f, 0.f, 0.f};
            #pragma unroll
            for (int d = 0; d < ${ND}; ++d) {
                const float* vd = val + d * ${M};
                const int c = r0 + c_offsets[d];
                #pragma unroll
                for (int t = 0; t < 4; ++t)
                    if (r0 + t < ${M} && c + t >= 0 && c + t < ${N}) s[t] = fmaf(__ldcs(vd + r0 + t), __ldg(x + c + t), s[t]);
            }
            s0 = s[0]; s1 = s[1]; s2 = s[2]; s3 = s[3];
        }
        ${STORE}
    }
}
""",
        SIG=_sig(b), M=m, N=n, ND=nd, TABLE=table, V=v, B=b, TILE=b * v, FIRST=first, LAST=last,
        INTERIOR=_interior(offs, m), STORE=store,
    )


def _seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    return [{"block": 256, "v": 1}, {"block": 256, "v": 2}, {"block": 128, "v": 2}]


def dia_templates() -> list[Template]:
    doc = "v groups of four rows per thread, streamed val and y"
    common = {"op": Op.SPMV, "format": "DIA", "space": SPACE, "seed_points": _seeds}
    return [
        Template(name="dia_window", renderer=_render_generic, doc=doc + "; offsets read at run time", **common),
        Template(name="dia_window_spec", renderer=_render_spec, checker=_spec_check, specialised=True,
                 unseen=_spec_unseen,
                 generic="dia_window", doc=doc + "; offsets baked in, unrolled, aligned windows of x", **common),
    ]
