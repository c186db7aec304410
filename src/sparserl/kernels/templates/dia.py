"""DIA templates: ``dia_window`` (generic) and ``dia_window_spec`` (offsets baked in).

Both give each thread ``v`` groups of four consecutive rows, the groups strided by the block so
every 16-byte access is coalesced; ``val`` streams (``__ldcs``) and ``y`` is written with
streaming stores, so the L2 keeps ``x``.

* ``dia_window``: offsets read from ``offsets`` at run time, one diagonal at a time; ``x`` read
  with a 16-byte load when the diagonal's offset is a multiple of 4, else four single loads.
* ``dia_window_spec``: the diagonal offsets are compile-time constants and the loop over diagonals
  is unrolled; the shape is read at run time, so one body serves every size with the same offsets.
  Its one fact is the offsets as the card lists them (first and last of each run), which the code names
  ``MATRIX_DIA_RUNS`` and the harness defines from the matrix it judges on
  (:mod:`sparserl.harness.matrix_facts`): the kernel is one text for every matrix, a policy writing it
  copies no number, and the compiler expands the runs and works out their count and clusters. Nearby
  offsets are grouped into clusters; each cluster loads the aligned window of ``x`` that all its
  diagonals need (for a 9-band matrix, three 16-byte loads serve all nine diagonals of four rows),
  whatever the offsets' alignment. ``val`` of diagonal ``d`` is read
  with 16-, 8- or 4-byte loads as ``d*m`` mod 4 allows (a test every thread takes the same way).
  Rows whose every window lies inside ``x`` take this path with no bounds tests; the few edge rows
  take a guarded path. Wins on banded and stencil matrices, whose off-by-one diagonals defeat the
  generic 16-byte path.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op, render_params_line, signature
from sparserl.kernels.library.common import completion, fill
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
    """Ascending offsets grouped so that each group's x window is at most MAX_WINDOW loads.

    The reference rule: ``dia_window_spec``'s body applies it at compile time from its facts (``clusters_into``);
    the tests hold the compiled layout equal to this function's, and check its windows here."""
    out: list[list[int]] = []
    for o in offsets:
        if out and o - out[-1][-1] <= CLUSTER_GAP and _window(out[-1][0], o)[1] <= MAX_WINDOW:
            out[-1].append(o)
        else:
            out.append([o])
    return out


_SIG = signature("DIA", Op.SPMV, None, "BLOCK")
_LAUNCH = "grid=ceil_div(m, BLOCK * V * 4), block=BLOCK"


def _header(p: Params) -> str:
    return "\n".join(["FORMAT: DIA", render_params_line({"BLOCK": p["block"], "V": p["v"]}), f"LAUNCH: {_LAUNCH}"])


_GENERIC = fill(
    """
${SIG}
{
    // V groups of four consecutive rows per thread, strided by the block.
    const bool aligned = (m & 3) == 0;
    #pragma unroll
    for (int g = 0; g < V; ++g) {
        const int r0 = (blockIdx.x * (BLOCK * V) + g * BLOCK + threadIdx.x) * 4;
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
""", SIG=_SIG)


def _render_generic(p: Params, card: MatrixCard | None) -> str:
    return completion(_header(p), _GENERIC)


_SPEC = fill(
    """
#define FLOOR4(v) (((v) >= 0 ? (v) / 4 : -((3 - (v)) / 4)) * 4)  // the multiple of 4 at or below v
// Worked out by the compiler from MATRIX_DIA_RUNS: the offsets one by one (OFFSETS.v), and the clusters of
// diagonals that share a window of x: runs at most ${GAP} apart whose aligned window takes at most ${MAX_WINDOW}
// 16-byte loads (cluster c: diagonals CLUSTER_END.v[c - 1] .. CLUSTER_END.v[c] - 1).
__device__ constexpr int count_diagonals()
{
    int n = 0;
    for (int i = 0; i + 1 < int(sizeof(MATRIX_DIA_RUNS) / sizeof(MATRIX_DIA_RUNS[0])); i += 2)
        n += MATRIX_DIA_RUNS[i + 1] - MATRIX_DIA_RUNS[i] + 1;
    return n;
}
constexpr int DIAGS = count_diagonals();
struct Offsets { int v[DIAGS]; };
__device__ constexpr Offsets offsets_of()
{
    Offsets o{};
    int d = 0;
    for (int i = 0; i + 1 < int(sizeof(MATRIX_DIA_RUNS) / sizeof(MATRIX_DIA_RUNS[0])); i += 2)
        for (int off = MATRIX_DIA_RUNS[i]; off <= MATRIX_DIA_RUNS[i + 1]; ++off) o.v[d++] = off;
    return o;
}
__device__ constexpr Offsets OFFSETS = offsets_of();
__device__ constexpr int clusters_into(int* end)  // the clusters' ends into end[]; returns their number
{
    int count = 0, first = 0;
    for (int d = 0; d < DIAGS; ++d) {
        const int o = OFFSETS.v[d];
        if (d > 0 && o - OFFSETS.v[d - 1] <= ${GAP} && (FLOOR4(o + 3) - FLOOR4(OFFSETS.v[first])) / 4 + 1 <= ${MAX_WINDOW}) {
            end[count - 1] = d + 1;
        } else {
            first = d;
            end[count++] = d + 1;
        }
    }
    return count;
}
__device__ constexpr int count_clusters() { int end[DIAGS] = {}; return clusters_into(end); }
constexpr int CLUSTERS = count_clusters();
struct Ends { int v[CLUSTERS]; };
__device__ constexpr Ends cluster_ends()
{
    int end[DIAGS] = {};
    clusters_into(end);
    Ends e{};
    for (int c = 0; c < CLUSTERS; ++c) e.v[c] = end[c];
    return e;
}
__device__ constexpr Ends CLUSTER_END = cluster_ends();
constexpr int FIRST_ROW = OFFSETS.v[0] < 0 ? -FLOOR4(OFFSETS.v[0]) : 0;

${SIG}
{
    // Rows r0 .. r0+3 with FIRST_ROW <= r0 <= last_row have every window of x inside x and lie inside y.
    const int last_row = min(n - FLOOR4(OFFSETS.v[DIAGS - 1] + 3) - 4, m - 4);
    // V groups of four consecutive rows per thread, strided by the block; diagonals unrolled.
    #pragma unroll
    for (int g = 0; g < V; ++g) {
        const int r0 = (blockIdx.x * (BLOCK * V) + g * BLOCK + threadIdx.x) * 4;
        if (r0 >= m) break;
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        if (r0 >= FIRST_ROW && r0 <= last_row) {  // every x window inside x, all four rows inside y
            #pragma unroll
            for (int c = 0; c < CLUSTERS; ++c) {
                // The diagonals of cluster c share one aligned window of x: x[r0 + start .. r0 + start + 4 * loads).
                const int d0 = c == 0 ? 0 : CLUSTER_END.v[c - 1];
                const int start = FLOOR4(OFFSETS.v[d0]);
                const int loads = (FLOOR4(OFFSETS.v[CLUSTER_END.v[c] - 1] + 3) - start) / 4 + 1;
                float w[4 * ${MAX_WINDOW}];
                #pragma unroll
                for (int i = 0; i < ${MAX_WINDOW}; ++i) {
                    if (i < loads) {
                        const float4 v = __ldg(reinterpret_cast<const float4*>(x + r0 + start + 4 * i));
                        w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
                    }
                }
                #pragma unroll
                for (int d = d0; d < CLUSTER_END.v[c]; ++d) {
                    const int e = OFFSETS.v[d] - start;  // x[r0 + OFFSETS.v[d] + t] is w[e + t]
                    const float* vd = val + (size_t)d * m + r0;  // 16-, 8- or 4-byte loads as d * m allows
                    const int align = (d * (m & 3)) & 3;  // (d * m) mod 4, the same for every thread
                    float a[4];
                    if (align == 0) {
                        const float4 v = __ldcs(reinterpret_cast<const float4*>(vd));
                        a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
                    } else if (align == 2) {
                        const float2 u = __ldcs(reinterpret_cast<const float2*>(vd)), v = __ldcs(reinterpret_cast<const float2*>(vd + 2));
                        a[0] = u.x; a[1] = u.y; a[2] = v.x; a[3] = v.y;
                    } else {
                        a[0] = __ldcs(vd); a[1] = __ldcs(vd + 1); a[2] = __ldcs(vd + 2); a[3] = __ldcs(vd + 3);
                    }
                    s[0] = fmaf(a[0], w[e], s[0]); s[1] = fmaf(a[1], w[e + 1], s[1]);
                    s[2] = fmaf(a[2], w[e + 2], s[2]); s[3] = fmaf(a[3], w[e + 3], s[3]);
                }
            }
        } else {  // edge rows: guarded, one entry at a time
            #pragma unroll
            for (int d = 0; d < DIAGS; ++d) {
                const float* vd = val + (size_t)d * m;
                const int c = r0 + OFFSETS.v[d];
                #pragma unroll
                for (int t = 0; t < 4; ++t)
                    if (r0 + t < m && c + t >= 0 && c + t < n) s[t] = fmaf(__ldcs(vd + r0 + t), __ldg(x + c + t), s[t]);
            }
        }
        if ((m & 3) == 0) {
            __stcs(reinterpret_cast<float4*>(y + r0), make_float4(s[0], s[1], s[2], s[3]));
        } else {
            y[r0] = s[0]; if (r0 + 1 < m) y[r0 + 1] = s[1]; if (r0 + 2 < m) y[r0 + 2] = s[2]; if (r0 + 3 < m) y[r0 + 3] = s[3];
        }
    }
}
""", SIG=_SIG, MAX_WINDOW=MAX_WINDOW, GAP=CLUSTER_GAP)
"""The one body of dia_window_spec: the facts block above it names the offsets, as the card lists them
(the shape is read at run time); the compiler counts the diagonals, groups them into clusters (the rule
of :func:`clusters`), unrolls them and folds every offset into the loads' addresses."""


SPEC_FACTS = ("// Specialised to the matrix: MATRIX_DIA_RUNS, its diagonal offsets (column - row) as the card lists\n"
              "// them, first and last of each run, is defined by the harness from the matrix.")
"""The comment that stands where dia_window_spec once spelt the offsets: the one fact the body needs, named
(:mod:`sparserl.harness.matrix_facts`); everything derived from it is the compiler's work."""


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
    return completion(_header(p), SPEC_FACTS, _SPEC)


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
