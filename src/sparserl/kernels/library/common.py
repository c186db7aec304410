"""What every library kernel shares: the :class:`Variant` record and CUDA snippets.

A variant is one strategy with one choice of tunables (block size, threads per row,
vector width, ...). :meth:`Variant.render` gives the completion text exactly as a
model is asked to write it: ``FORMAT:``, ``PARAMS:`` and ``LAUNCH:`` lines, then device code.

A strategy's code is one text shared by all its variants: the tunables are named once on the
``PARAMS:`` line (``block`` is ``BLOCK``, ``tpr`` is ``TPR``: :func:`param_name`), the harness
makes each a ``constexpr int`` before the code, and every number derived from them
(``BLOCK / TPR`` rows per block, ``TPR - 1`` as a lane mask, ``32 * BATCHES`` entries per warp)
is the compiler's arithmetic in the code and in the ``LAUNCH:`` expressions. The FORMAT
parameters (SELL's ``C``, BSR's ``R`` and ``C``) are constants of the code under their own names.
Two variants of a strategy differ only in their ``FORMAT:`` and ``PARAMS:`` lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from string import Template

from sparserl.kernels.contract import FORMATS, Op, render_params_line, signature

FULL_MASK = "0xffffffffu"


def param_name(tunable: str) -> str:
    """The PARAMS name of a tunable: its name in capitals (``block`` -> ``BLOCK``)."""
    return tunable.upper()


@dataclass(frozen=True)
class Variant:
    """One library kernel: op, format, strategy, FORMAT parameters and tunables."""

    op: Op
    format: str
    strategy: str
    """Short name of the algorithm, e.g. ``csr_vector``."""
    format_params: tuple[tuple[str, int], ...]
    """FORMAT parameters written in the header (e.g. SELL's C and sigma)."""
    tunables: tuple[tuple[str, int], ...]
    """Code-generation choices (block size, threads per row, vector width ...): the PARAMS line."""
    body: Callable[["Variant"], str] = field(compare=False, repr=False)
    """Renders the header and device code."""
    k_multiple: int = 1
    """SpMM only: the kernel needs k to be a multiple of this (vector loads of X and Y)."""
    atomic: bool = False
    """Accumulates with atomics: results are reproducible only up to rounding order."""
    doc: str = ""
    """One line on what the strategy does and when it wins."""

    @property
    def id(self) -> str:
        """Stable identifier, e.g. ``spmv/sell/C=32,sigma=256/block=128``."""
        fp = ",".join(f"{k}={v}" for k, v in self.format_params) or "-"
        tu = ",".join(f"{k}={v}" for k, v in self.tunables) or "-"
        return f"{self.op.value}/{self.strategy}/{fp}/{tu}"

    @property
    def params(self) -> dict[str, int]:
        """Tunables and format parameters together, for templates."""
        return dict(self.format_params) | dict(self.tunables)

    @property
    def constants(self) -> dict[str, int]:
        """The PARAMS line: each tunable under its :func:`param_name`."""
        return {param_name(k): v for k, v in self.tunables}

    def t(self, name: str) -> int:
        return dict(self.tunables)[name]

    def applicable(self, k: int | None = None) -> bool:
        """Whether the kernel can run with ``k`` columns (always true for SpMV)."""
        return self.op is Op.SPMV or (k is not None and k % self.k_multiple == 0)

    def header(self, launches: list[str] | tuple[str, ...]) -> str:
        fmt = " ".join([self.format] + [f"{k}={v}" for k, v in self.format_params])
        params = [render_params_line(self.constants)] if self.tunables else []
        return "\n".join([f"FORMAT: {fmt}"] + params + [f"LAUNCH: {l}" for l in launches])

    def sig(self, name: str | None = None, launch_bounds: int | str | None = None) -> str:
        return signature(self.format, self.op, name, launch_bounds)

    def render(self) -> str:
        """The completion text: header lines then device code, ending with a newline."""
        return self.body(self).strip("\n") + "\n"


@dataclass(frozen=True)
class Strategy:
    """The text every variant of one strategy shares: its LAUNCH lines and its code."""

    launches: tuple[str, ...]
    """LAUNCH bodies, over the contract's names and the PARAMS names."""
    code: str
    """The device code."""

    def __call__(self, v: Variant) -> str:
        return completion(v.header(self.launches), self.code)


def completion(header: str, *code: str) -> str:
    """A completion's text: the header, then each part of the code (a block of facts, the body),
    each after a blank line."""
    return "\n\n".join([header.strip("\n")] + [c.strip("\n") for c in code]) + "\n"


def make(
    op: Op,
    fmt: str,
    strategy: str,
    body: Callable[[Variant], str],
    tunables: Mapping[str, int],
    format_params: Mapping[str, int] | None = None,
    **kw: object,
) -> Variant:
    assert fmt in FORMATS
    return Variant(
        op=op,
        format=fmt,
        strategy=strategy,
        format_params=tuple((format_params or {}).items()),
        tunables=tuple(tunables.items()),
        body=body,
        **kw,  # type: ignore[arg-type]
    )


def fill(template: str, **values: object) -> str:
    """Substitute ``${NAME}`` placeholders (CUDA braces stay untouched)."""
    return Template(template).substitute({k: str(v) for k, v in values.items()})


# ---------------------------------------------------------------------------------------------
# CUDA snippets


def group_mask(g: str) -> str:
    """Expression for the shuffle mask of the aligned group of ``g`` lanes this thread is in
    (``g`` a constant's name; all 32 lanes when it is 32)."""
    return f"((0xffffffffu >> (32 - {g})) << ((threadIdx.x & 31u) & ~(unsigned)({g} - 1)))"


def group_sum(var: str, g: str, mask: str = FULL_MASK) -> str:
    """Butterfly sum of ``var`` across an aligned group of ``g`` lanes (a constant's name; all lanes
    get the sum; no shuffle when it is 1)."""
    return "\n".join(["    #pragma unroll", f"    for (int off = {g} / 2; off > 0; off >>= 1)",
                      f"        {var} += __shfl_xor_sync({mask}, {var}, off, {g});"])


_VEC_NOTE = """
// VEC consecutive columns of X and Y per lane: 16-byte loads and stores when VEC is a multiple of 4.
"""
_FMA_X = """static __device__ __forceinline__ void fma_x(float* acc, float a, const float* xp)
{
    if constexpr (VEC % 4 == 0) {
        #pragma unroll
        for (int q = 0; q < VEC; q += 4) {
            const float4 xv = __ldg(reinterpret_cast<const float4*>(xp + q));
            acc[q] = fmaf(a, xv.x, acc[q]); acc[q + 1] = fmaf(a, xv.y, acc[q + 1]);
            acc[q + 2] = fmaf(a, xv.z, acc[q + 2]); acc[q + 3] = fmaf(a, xv.w, acc[q + 3]);
        }
    } else {
        #pragma unroll
        for (int q = 0; q < VEC; ++q) acc[q] = fmaf(a, __ldg(xp + q), acc[q]);
    }
}
"""
_LOAD_X = """static __device__ __forceinline__ void load_x(float* xv, const float* xp)
{
    if constexpr (VEC % 4 == 0) {
        #pragma unroll
        for (int q = 0; q < VEC; q += 4) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(xp + q));
            xv[q] = v.x; xv[q + 1] = v.y; xv[q + 2] = v.z; xv[q + 3] = v.w;
        }
    } else {
        #pragma unroll
        for (int q = 0; q < VEC; ++q) xv[q] = __ldg(xp + q);
    }
}
"""
_STORE_Y = """static __device__ __forceinline__ void store_y(float* yp, const float* acc)
{
    if constexpr (VEC % 4 == 0) {
        #pragma unroll
        for (int q = 0; q < VEC; q += 4)
            *reinterpret_cast<float4*>(yp + q) = make_float4(acc[q], acc[q + 1], acc[q + 2], acc[q + 3]);
    } else {
        #pragma unroll
        for (int q = 0; q < VEC; ++q) yp[q] = acc[q];
    }
}
"""
_ADD_Y = """static __device__ __forceinline__ void add_y(float* yp, const float* acc)
{
#if __CUDA_ARCH__ >= 900
    if constexpr (VEC % 4 == 0) {  // 16-byte atomic adds (sm_90)
        #pragma unroll
        for (int q = 0; q < VEC; q += 4)
            atomicAdd(reinterpret_cast<float4*>(yp + q), make_float4(acc[q], acc[q + 1], acc[q + 2], acc[q + 3]));
    } else
#endif
    {
        #pragma unroll
        for (int q = 0; q < VEC; ++q) atomicAdd(yp + q, acc[q]);
    }
}
"""


def vec_helpers(*names: str) -> str:
    """SpMM helpers over a lane's VEC columns, defined in this order: ``fma_x(acc, a, X + ...)``
    adds ``a`` times VEC columns of a row of X to ``float acc[VEC]``; ``load_x(xv, X + ...)`` loads
    them; ``store_y(Y + ..., acc)`` writes VEC columns of a row of Y; ``add_y`` adds them with atomics."""
    parts = {"fma_x": _FMA_X, "load_x": _LOAD_X, "store_y": _STORE_Y, "add_y": _ADD_Y}
    return _VEC_NOTE + "\n".join(parts[n] for n in names)


VEC_HELPERS = vec_helpers("fma_x", "store_y")
"""The helpers of a SpMM kernel that writes Y (:func:`vec_helpers`)."""


def spmm_row_group(sig: str, prologue: str, entries: str) -> str:
    """A SpMM kernel where ``G`` lanes share one output row and each owns ``VEC`` columns.

    ``prologue`` (CUDA statements) must define ``int row`` from the group index ``grp``
    and return when the group has no row; ``entries`` loops over the row's nonzeros and
    calls ``fma_x(acc, a, X + (size_t)c * k + c0)`` with ``float a`` (the value) and ``int c``
    (the column). Columns of X are visited in tiles of ``G * VEC``; Y's row is written once per tile.
    The code needs :data:`VEC_HELPERS` before it.
    """
    return fill(
        """
${SIG}
{
    const int lane = threadIdx.x & (G - 1);
    const int grp = blockIdx.x * (BLOCK / G) + threadIdx.x / G;  // G lanes per row
${PROLOGUE}
    for (int t0 = 0; t0 < k; t0 += G * VEC) {
        const int c0 = t0 + lane * VEC;
        if (c0 >= k) break;
        float acc[VEC] = {};
${BODY}
        store_y(Y + (size_t)row * k + c0, acc);
    }
}
""",
        SIG=sig, PROLOGUE=prologue, BODY=entries,
    )
