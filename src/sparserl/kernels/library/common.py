"""What every library kernel shares: the :class:`Variant` record and CUDA snippets.

A variant is one strategy with one choice of tunables (block size, threads per row,
vector width, ...). :meth:`Variant.render` gives the completion text exactly as a
model is asked to write it: ``FORMAT:`` and ``LAUNCH:`` lines, then device code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from string import Template

from sparserl.kernels.contract import FORMATS, Op, signature

FULL_MASK = "0xffffffffu"


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
    """Code-generation choices (block size, threads per row, vector width ...)."""
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

    def t(self, name: str) -> int:
        return dict(self.tunables)[name]

    def applicable(self, k: int | None = None) -> bool:
        """Whether the kernel can run with ``k`` columns (always true for SpMV)."""
        return self.op is Op.SPMV or (k is not None and k % self.k_multiple == 0)

    def header(self, launches: list[str]) -> str:
        fmt = " ".join([self.format] + [f"{k}={v}" for k, v in self.format_params])
        return "\n".join([f"FORMAT: {fmt}"] + [f"LAUNCH: {l}" for l in launches])

    def sig(self, name: str | None = None, launch_bounds: int | None = None) -> str:
        return signature(self.format, self.op, name, launch_bounds)

    def render(self) -> str:
        """The completion text: header lines then device code, ending with a newline."""
        return self.body(self).strip("\n") + "\n"


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


def group_mask(g: int) -> str:
    """Expression for the shuffle mask of the aligned group of ``g`` lanes this thread is in."""
    if g == 32:
        return FULL_MASK
    return f"((0x{(1 << g) - 1:x}u) << ((threadIdx.x & 31u) & ~{g - 1}u))"


def group_sum(var: str, g: int, mask: str = FULL_MASK) -> str:
    """Butterfly sum of ``var`` across an aligned group of ``g`` lanes (all lanes get the sum)."""
    if g == 1:
        return ""
    lines = ["    #pragma unroll", f"    for (int off = {g // 2}; off > 0; off >>= 1)",
             f"        {var} += __shfl_xor_sync({mask}, {var}, off, {g});"]
    return "\n".join(lines)


# SpMM helpers: a lane owns VEC consecutive columns of Y (float4 when VEC == 4).


def acc_decl(vec: int, name: str = "acc") -> str:
    if vec == 4:
        return f"float4 {name} = make_float4(0.f, 0.f, 0.f, 0.f);"
    return f"float {name} = 0.f;"


def acc_fma(vec: int, v: str, xrow: str, name: str = "acc") -> str:
    """``name += v * X[xrow .. xrow+VEC)`` where ``xrow`` is a pointer expression into X."""
    if vec == 4:
        return (
            f"{{ const float4 xv = __ldg(reinterpret_cast<const float4*>({xrow})); "
            f"{name}.x = fmaf({v}, xv.x, {name}.x); {name}.y = fmaf({v}, xv.y, {name}.y); "
            f"{name}.z = fmaf({v}, xv.z, {name}.z); {name}.w = fmaf({v}, xv.w, {name}.w); }}"
        )
    return f"{name} = fmaf({v}, __ldg({xrow}), {name});"


def acc_store(vec: int, yptr: str, atomic: bool = False, name: str = "acc") -> str:
    """Write (or atomically add) the accumulator to ``Y[yptr .. yptr+VEC)``."""
    if atomic:
        if vec == 4:
            return (
                f"{{ float* yp = {yptr}; atomicAdd(yp, {name}.x); atomicAdd(yp + 1, {name}.y); "
                f"atomicAdd(yp + 2, {name}.z); atomicAdd(yp + 3, {name}.w); }}"
            )
        return f"atomicAdd({yptr}, {name});"
    if vec == 4:
        return f"*reinterpret_cast<float4*>({yptr}) = {name};"
    return f"*({yptr}) = {name};"


def acc_zero(vec: int, name: str = "acc") -> str:
    if vec == 4:
        return f"{name} = make_float4(0.f, 0.f, 0.f, 0.f);"
    return f"{name} = 0.f;"


def spmm_row_group(sig: str, block: int, g: int, vec: int, prologue: str, entries: str) -> str:
    """A SpMM kernel where ``g`` lanes share one output row and each owns ``vec`` columns.

    ``prologue`` (CUDA statements) must define ``int row`` from the group index ``grp``
    and return when the group has no row; ``entries`` loops over the row's nonzeros and
    runs ``${FMA}`` with ``float a`` (the value) and ``int c`` (the column) in scope.
    Columns of X are visited in tiles of ``g * vec``; Y's row is written once per tile.
    """
    body = fill(entries, FMA=acc_fma(vec, "a", "X + (size_t)c * k + c0"))
    return fill(
        """
${SIG}
{
    const int lane = threadIdx.x & ${GM1};
    const int grp = blockIdx.x * ${RPB} + threadIdx.x / ${G};  // ${G} lanes per row
${PROLOGUE}
    for (int t0 = 0; t0 < k; t0 += ${G} * ${VEC}) {
        const int c0 = t0 + lane * ${VEC};
        if (c0 >= k) break;
        ${ACC_DECL}
${BODY}
        ${STORE}
    }
}
""",
        SIG=sig, G=g, GM1=g - 1, RPB=block // g, VEC=vec, PROLOGUE=prologue, BODY=body,
        ACC_DECL=acc_decl(vec), STORE=acc_store(vec, "Y + (size_t)row * k + c0"),
    )
