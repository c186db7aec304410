"""The kernel contract: what a completion must look like, and what it is called with.

This module is the one place where the contract is written in code. The harness
(extraction, signature checks, launches) and the data builder (rendering the
library) both read it; ``docs/contract.md`` is the same contract in prose.

A completion is::

    FORMAT: NAME [key=value ...]
    [PARAMS: NAME=INT, ...]             # optional: named integers, one constexpr each
    LAUNCH: grid=EXPR, block=EXPR[, smem=EXPR][, kernel=IDENT]
    [LAUNCH: ...]                       # several LAUNCH lines run in order
    <CUDA device code only>

A ``PARAMS:`` line names a kernel's tunable numbers once (``PARAMS: BLOCK=256, BATCHES=4``): the
harness puts one ``constexpr int NAME = value;`` line per name before the code, after one per
FORMAT parameter (``constexpr int C = 32;`` for ``FORMAT: SELL C=32``) (:meth:`Header.prelude`),
and LAUNCH expressions may use the names.

Kernels are ``extern "C" __global__`` functions. Every kernel a completion
launches takes the same argument list: the common prefix ``int m, int n, int nnz``
(SpMM adds ``int k``), then the format's integer sizes, then the format's arrays,
then ``x, y`` (SpMV) or ``X, Y`` (SpMM, row-major ``n x k`` and ``m x k``).
Values are ``float`` (fp32), indices ``int`` (int32).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache

from sparserl.errors import ContractError
from sparserl.kernels.launch import Expr, parse_expr


RULES: tuple[str, ...] = (
    "**Structure may be specialised, values may not.** A kernel may bake this matrix's structure into "
    "its code (diagonal offsets, block shape, row-length bins, split points, launch geometry, constant "
    "tables). It must read every value from `val` (and `x`): users reuse one structure with new values, "
    "and the harness verifies every kernel on the same pattern with fresh random values too.",
    "**Device code only.** Every function is `__device__` or `__global__`; no host functions or host "
    "variables, no `__host__`, no runtime API calls, no device-side launches.",
    "**No state survives a launch** except in y: no writable variable at namespace scope in any namespace "
    "or storage class, no writable `static` local or member; initialised `__constant__` and `static const` "
    "tables are fine.",
    "**No clocks, timers, SM or warp ids, inline assembly, traps, printf, heap or vendor libraries**, and "
    "no call that leaves the module.",
    "**No files.** `#include` only the allowed headers, written literally; no `#include_next`, `#embed`, "
    "`#line`, `#pragma` other than `unroll`/`nounroll`, `_Pragma`, `__has_include`, token pasting (`##`) "
    "or stringizing (`#`) in macros.",
)
"""The contract's rules in prose: docs/contract.md and the model's prompt carry them."""

ALLOWED_INCLUDES = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cooperative_groups.h", "cooperative_groups/reduce.h",
    "math_constants.h", "cuda/std/cstdint", "cuda/std/limits", "cuda/std/type_traits",
    "cuda_pipeline.h", "cuda/barrier",
})
"""Headers a completion may include, written literally; each is CUDA's own and compiles with NVRTC
given only the toolkit's include folders (so no verdict depends on the backend)."""

VALUES_RULE = "Structure may be baked into the code; every value must be read from val."
"""The values rule in one line (the text prompt's suffix)."""


class Op(str, Enum):
    """The sparse operation a kernel computes."""

    SPMV = "spmv"  # y = A x
    SPMM = "spmm"  # Y = A X, X is n x k row-major, Y is m x k row-major

    @property
    def kernel_name(self) -> str:
        """Default name of the launched kernel (``spmv_kernel`` / ``spmm_kernel``)."""
        return f"{self.value}_kernel"


@dataclass(frozen=True)
class ArrayArg:
    """One device array argument of a format."""

    name: str
    ctype: str  # "int" or "float"
    length: str  # length as a formula over the sizes, for the docs
    doc: str


@dataclass(frozen=True)
class ParamSpec:
    """One ``key=value`` parameter of a ``FORMAT:`` line (always an integer)."""

    name: str
    doc: str
    default: int | None  # None = required, or chosen by the converter when optional
    lo: int
    hi: int
    optional: bool = False  # may be left out; the converter then chooses

    def check(self, value: int, fmt: str) -> None:
        if not (self.lo <= value <= self.hi):
            raise ContractError(f"{fmt} parameter {self.name}={value} is out of range [{self.lo}, {self.hi}]")


@dataclass(frozen=True)
class FormatSpec:
    """A storage format as the contract fixes it: parameters, sizes, arrays, y policy."""

    name: str
    summary: str
    params: tuple[ParamSpec, ...]
    sizes: tuple[str, ...]  # int scalar arguments after the common prefix, in order
    arrays: tuple[ArrayArg, ...]  # device arrays after the sizes, in order
    zero_fill_y: bool  # True: y is zeroed before the first launch (formats that accumulate; COO's zero_y=0 opts out)
    layout: str  # how entries are laid out, for the docs and the model

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise ContractError(
            f"{self.name} has no parameter {name!r}; its parameters are: "
            f"{', '.join(p.name for p in self.params) or 'none'}"
        )

    def resolve_params(self, given: Mapping[str, int]) -> dict[str, int]:
        """Check ``given`` and fill defaults; optional parameters left out stay absent."""
        out: dict[str, int] = {}
        for key, value in given.items():
            self.param(key).check(int(value), self.name)
            out[key] = int(value)
        for p in self.params:
            if p.name not in out and p.default is not None:
                out[p.name] = p.default
            elif p.name not in out and not p.optional:
                raise ContractError(f"{self.name} needs parameter {p.name} ({p.doc})")
        _check_cross(self.name, out)
        return out


def _check_cross(fmt: str, params: Mapping[str, int]) -> None:
    if fmt == "SELL":
        c, sigma = params["C"], params["sigma"]
        if sigma != 1 and sigma % c != 0:
            raise ContractError(f"SELL sigma={sigma} must be 1 (no sorting) or a multiple of C={c}")
    if fmt == "BSR" and params["R"] * params["C"] > 1024:
        raise ContractError("BSR block R*C must be at most 1024 entries")


_I = "int"
_F = "float"

FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(
            name="CSR",
            summary="compressed sparse rows",
            params=(),
            sizes=(),
            arrays=(
                ArrayArg("row_ptr", _I, "m + 1", "offset of each row's first entry; row_ptr[m] = nnz"),
                ArrayArg("col_idx", _I, "nnz", "column of each entry, sorted within a row"),
                ArrayArg("val", _F, "nnz", "value of each entry"),
            ),
            zero_fill_y=False,
            layout="Entries of row i are row_ptr[i] .. row_ptr[i+1]-1, columns ascending. Rows may be empty.",
        ),
        FormatSpec(
            name="COO",
            summary="coordinate list, sorted by row then column",
            params=(
                ParamSpec(
                    "zero_y",
                    "1 (left out): y is zeroed before the first launch; 0: it is not, and the kernel writes "
                    "every entry of y itself",
                    None,
                    0,
                    1,
                    optional=True,
                ),
            ),
            sizes=(),
            arrays=(
                ArrayArg("row_idx", _I, "nnz", "row of each entry (non-decreasing)"),
                ArrayArg("col_idx", _I, "nnz", "column of each entry (ascending within a row)"),
                ArrayArg("val", _F, "nnz", "value of each entry"),
            ),
            zero_fill_y=True,
            layout=(
                "Entries sorted by (row, column). y is zeroed before the first launch: accumulate with atomicAdd. "
                "With zero_y=0 it is not (it holds garbage): the kernel must write every entry of y, empty rows "
                "too, and may add only into entries it wrote first."
            ),
        ),
        FormatSpec(
            name="ELL",
            summary="ELLPACK, column-major, padded to the longest row",
            params=(),
            sizes=("width",),
            arrays=(
                ArrayArg("col_idx", _I, "width * m", "slot j of row i at [j*m + i]; -1 in padding slots"),
                ArrayArg("val", _F, "width * m", "slot j of row i at [j*m + i]; 0 in padding slots"),
            ),
            zero_fill_y=False,
            layout=(
                "width = longest row. Slot j of row i is at index j*m + i (column-major, so consecutive "
                "threads reading consecutive rows coalesce). A row's entries come first in column order, "
                "then padding with col_idx = -1 and val = 0; a kernel may stop at the first -1."
            ),
        ),
        FormatSpec(
            name="SELL",
            summary="SELL-C-sigma: slices of C rows, rows sorted by length within windows of sigma rows",
            params=(
                ParamSpec("C", "rows per slice", 32, 1, 1024),
                ParamSpec("sigma", "sorting window in rows (1 = no sorting; else a multiple of C)", 1, 1, 1 << 20),
            ),
            sizes=("num_slices",),
            arrays=(
                ArrayArg("slice_ptr", _I, "num_slices + 1", "offset of each slice's first slot"),
                ArrayArg("row_perm", _I, "num_slices * C", "original row of lane r of slice s at [s*C + r]; -1 for padding lanes"),
                ArrayArg("col_idx", _I, "slice_ptr[num_slices]", "slot j of lane r of slice s at [slice_ptr[s] + j*C + r]; -1 in padding"),
                ArrayArg("val", _F, "slice_ptr[num_slices]", "same layout as col_idx; 0 in padding"),
            ),
            zero_fill_y=False,
            layout=(
                "num_slices = ceil(m / C). Rows are permuted (stable sort by decreasing length inside each "
                "window of sigma rows; sigma = 1 keeps the natural order) and cut into slices of C rows. "
                "Slice s has width w_s = (slice_ptr[s+1] - slice_ptr[s]) / C, its longest row; slot j of "
                "lane r is at slice_ptr[s] + j*C + r. Padding slots have col_idx = -1, val = 0; padding "
                "lanes (beyond m) have row_perm = -1 and must not write y. A kernel writes y[row_perm[s*C+r]]."
            ),
        ),
        FormatSpec(
            name="DIA",
            summary="diagonals, stored per row",
            params=(),
            sizes=("num_diags",),
            arrays=(
                ArrayArg("offsets", _I, "num_diags", "column - row of each stored diagonal, ascending"),
                ArrayArg("val", _F, "num_diags * m", "A[i, i + offsets[d]] at [d*m + i]; 0 where not stored or outside the matrix"),
            ),
            zero_fill_y=False,
            layout=(
                "Diagonal d holds A[i, i + offsets[d]] at val[d*m + i] for every row i in [0, m); where "
                "i + offsets[d] falls outside [0, n) or the entry is not stored the value is 0, and the "
                "kernel must not read x outside [0, n)."
            ),
        ),
        FormatSpec(
            name="BSR",
            summary="block sparse rows with dense R x C blocks",
            params=(
                ParamSpec("R", "rows per block", 4, 1, 64),
                ParamSpec("C", "columns per block", 4, 1, 64),
            ),
            sizes=("mb", "nb", "nnzb"),
            arrays=(
                ArrayArg("block_row_ptr", _I, "mb + 1", "offset of each block row's first block"),
                ArrayArg("block_col_idx", _I, "nnzb", "block column of each block, ascending within a block row"),
                ArrayArg("block_val", _F, "nnzb * R * C", "block b, entry (r, c) at [b*R*C + r*C + c] (row-major blocks)"),
            ),
            zero_fill_y=False,
            layout=(
                "mb = ceil(m / R), nb = ceil(n / C). Block b of block row I covers rows I*R .. I*R+R-1 and "
                "columns block_col_idx[b]*C .. +C-1, stored row-major. Entries of edge blocks outside the "
                "matrix are 0; a kernel must not write y[i] for i >= m nor read x[j] for j >= n. Block rows "
                "may be empty (their rows of y must still be written)."
            ),
        ),
        FormatSpec(
            name="HYB",
            summary="hybrid: an ELL part of fixed width plus a COO part for the rest",
            params=(
                ParamSpec(
                    "width",
                    "ELL width; left out, the converter picks the widest that at least a third of rows fill",
                    None,
                    0,
                    1 << 16,
                    optional=True,
                ),
            ),
            sizes=("width", "coo_nnz"),
            arrays=(
                ArrayArg("ell_col_idx", _I, "width * m", "as ELL: slot j of row i at [j*m + i]; -1 in padding"),
                ArrayArg("ell_val", _F, "width * m", "as ELL; 0 in padding"),
                ArrayArg("coo_row_idx", _I, "coo_nnz", "rows of the overflow entries (non-decreasing)"),
                ArrayArg("coo_col_idx", _I, "coo_nnz", "columns of the overflow entries"),
                ArrayArg("coo_val", _F, "coo_nnz", "values of the overflow entries"),
            ),
            zero_fill_y=True,
            layout=(
                "Each row's first `width` entries (column order) go to the ELL part, laid out as ELL; the "
                "rest go to the COO part, sorted by (row, column). y is zeroed before the first launch. "
                "coo_nnz may be 0: a LAUNCH whose grid is 0 is skipped."
            ),
        ),
    )
}

FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)


def format_spec(name: str) -> FormatSpec:
    """The :class:`FormatSpec` for ``name`` (case-insensitive)."""
    spec = FORMATS.get(name.upper())
    if spec is None:
        raise ContractError(f"unknown format {name!r}; formats are: {', '.join(FORMAT_NAMES)}")
    return spec


# ---------------------------------------------------------------------------------------------
# Signatures


@dataclass(frozen=True)
class Param:
    """One C parameter of a kernel: its C type (``int``, ``const int*``, ``float*`` ...) and name."""

    ctype: str
    name: str

    @property
    def base(self) -> str:
        """The type with qualifiers dropped: ``int``, ``int*``, ``float*``."""
        t = self.ctype.replace("const", "").replace("__restrict__", "").replace(" ", "")
        return t


def kernel_params(fmt: str, op: Op) -> tuple[Param, ...]:
    """The kernel's parameters in order, for ``fmt`` and ``op``."""
    spec = format_spec(fmt)
    params = [Param("int", "m"), Param("int", "n"), Param("int", "nnz")]
    if op is Op.SPMM:
        params.append(Param("int", "k"))
    params += [Param("int", s) for s in spec.sizes]
    params += [Param(f"const {a.ctype}* __restrict__", a.name) for a in spec.arrays]
    if op is Op.SPMV:
        params += [Param("const float* __restrict__", "x"), Param("float* __restrict__", "y")]
    else:
        params += [Param("const float* __restrict__", "X"), Param("float* __restrict__", "Y")]
    return tuple(params)


def signature(fmt: str, op: Op, name: str | None = None, launch_bounds: int | str | None = None) -> str:
    """The kernel's C declaration line(s), e.g. for rendering a completion; ``launch_bounds`` is a
    number or a constant's name (``BLOCK``)."""
    ps = kernel_params(fmt, op)
    name = name or op.kernel_name
    lb = f"__launch_bounds__({launch_bounds}) " if launch_bounds else ""
    args = ",\n    ".join(f"{p.ctype} {p.name}" for p in ps)
    return f'extern "C" __global__ void {lb}{name}(\n    {args})'


def launch_variables(fmt: str, op: Op) -> tuple[str, ...]:
    """Names a LAUNCH expression may use for ``fmt`` and ``op``."""
    spec = format_spec(fmt)
    names = ["m", "n", "nnz"] + (["k"] if op is Op.SPMM else []) + list(spec.sizes)
    names += [p.name for p in spec.params if p.name not in names] + ["num_sms"]
    return tuple(names)


# ---------------------------------------------------------------------------------------------
# Header grammar

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_LINE = re.compile(r"^\s*+(?:[*#>`-]++\s*+)?+\**+\s*+(FORMAT|PARAMS|LAUNCH)\s*+\**+\s*+:\s*+\**+\s*+(.*)$",
                          re.IGNORECASE)
"""Possessive throughout: a long run of decoration or white space that is not a header line is
refused in one pass (with plain quantifiers it backtracked, quadratic in the run's length)."""


_LINE_BREAKS = frozenset("\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
"""Where ``str.splitlines`` breaks a line besides a newline: the worker reads a header again with it,
so a header line holding one would be read there as two."""


def header_line(line: str) -> tuple[str, str] | None:
    """``("FORMAT", "PARAMS" or "LAUNCH", body)`` for a header line, or None for any other line.

    The one recogniser of header lines: markdown decoration a model may add is dropped
    (``**FORMAT:** CSR``, ``- LAUNCH: ...``, a line in backticks), so extraction from model
    output and parsing of clean completions read headers the same way."""
    m = _HEADER_LINE.match(line)
    if m is None:
        return None
    return m.group(1).upper(), m.group(2).strip().strip("`").strip()

# ---------------------------------------------------------------------------------------------
# PARAMS: named integers

MAX_PARAMS = 8
"""Most names one PARAMS line may give."""
PARAM_MIN, PARAM_MAX = -(2**31), 2**31 - 1
"""A PARAMS value is an ``int`` in C."""

_CPP_KEYWORDS = (
    "alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t "
    "class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield "
    "decltype default delete do double dynamic_cast else enum explicit export extern false float for friend "
    "goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private "
    "protected public register reinterpret_cast requires return short signed sizeof static static_assert "
    "static_cast struct switch template this thread_local throw true try typedef typeid typename union "
    "unsigned using virtual void volatile wchar_t while xor xor_eq restrict"
).split()
_VECTOR_TYPES = [f"{t}{n}" for t in ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong",
                                     "longlong", "ulonglong", "float", "double") for n in (1, 2, 3, 4)]
_CUDA_BUILTINS = (
    "threadIdx blockIdx blockDim gridDim warpSize dim3 size_t ptrdiff_t uint NULL main printf malloc free "
    "assert half nv_bfloat16 cooperative_groups std cuda"
).split()
RESERVED_NAMES: frozenset[str] = frozenset(_CPP_KEYWORDS + _VECTOR_TYPES + _CUDA_BUILTINS)
"""Names a PARAMS line may not give: C++ keywords, CUDA's built-in variables and vector types, and
a few library names kernels call (names starting with an underscore are reserved in C++ too)."""


MATRIX_FACT_NAMES = ("MATRIX_DIA_RUNS", "MATRIX_ROW_LEN", "MATRIX_BLOCK_ROW_LEN", "MATRIX_LONG_ROWS",
                     "MATRIX_LONG_ROW_COUNT")
"""The facts of its matrix a kernel may name and the harness defines (:mod:`sparserl.harness.matrix_facts`)."""

LAUNCH_FACT_NAMES = ("MATRIX_ROW_LEN", "MATRIX_BLOCK_ROW_LEN", "MATRIX_LONG_ROW_COUNT")
"""The facts (single integers) a LAUNCH expression may read too: the harness writes their values into the LAUNCH
line from the matrix it verifies on, as it writes their definitions into the code; a header that reads one is
launched only so materialised (evaluated as written, the name is unknown: a contract error)."""


@lru_cache(maxsize=1)
def contract_names() -> frozenset[str]:
    """Every name the contract gives a meaning: each format's kernel arguments and LAUNCH variables,
    for both ops, the default kernel names, the LAUNCH functions and the matrix's facts. A PARAMS name
    may be none of them (a constexpr ``m`` would hide the kernel's argument)."""
    names = {"ceil_div", "min", "max", *MATRIX_FACT_NAMES}
    for fmt in FORMATS:
        for op in Op:
            names |= {p.name for p in kernel_params(fmt, op)} | set(launch_variables(fmt, op)) | {op.kernel_name}
    return frozenset(names)


_PARAM_ITEM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\S+)")
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")


def parse_params_line(text: str) -> dict[str, int]:
    """Parse the body of a ``PARAMS:`` line (``NAME=INT, NAME=INT, ...``), in the order written.

    Refused, each with a one-line :class:`ContractError`: an item that is not ``NAME=integer``
    (decimal, no leading zeros, within C's ``int``), a name given twice, more than
    :data:`MAX_PARAMS` names, a name that starts with an underscore, is a C++/CUDA keyword or
    built-in (:data:`RESERVED_NAMES`) or has a meaning in the contract (:func:`contract_names`)."""
    if not text.strip():
        raise ContractError("PARAMS line names nothing; write PARAMS: NAME=integer, ... or leave the line out")
    out: dict[str, int] = {}
    reserved = contract_names()
    for item in (part.strip() for part in text.split(",")):
        m = _PARAM_ITEM.fullmatch(item)
        if m is None:
            raise ContractError(f"PARAMS item {item!r} is not NAME=integer (items are separated by commas)")
        name, value = m.groups()
        if not _INTEGER.fullmatch(value):
            raise ContractError(f"PARAMS {name}={value!r} is not a decimal integer")
        if len(value) > 11 or not PARAM_MIN <= int(value) <= PARAM_MAX:  # the length first: int() refuses 4300 digits
            raise ContractError(f"PARAMS {name}={value[:20]}{'...' if len(value) > 20 else ''} does not fit a C int")
        if name in out:
            raise ContractError(f"PARAMS names {name} twice")
        if name.startswith("_"):
            raise ContractError(f"PARAMS name {name} starts with an underscore (reserved in C++)")
        if name in RESERVED_NAMES:
            raise ContractError(f"PARAMS name {name} is a C++/CUDA keyword or built-in")
        if name in reserved:
            raise ContractError(f"PARAMS name {name} is a contract variable "
                                "(kernel argument, LAUNCH name or matrix fact)")
        out[name] = int(value)
    if len(out) > MAX_PARAMS:
        raise ContractError(f"PARAMS gives {len(out)} names; at most {MAX_PARAMS} are allowed")
    return out


def render_params_line(constants: Mapping[str, int]) -> str:
    """The ``PARAMS:`` line for ``constants`` (empty string when there are none)."""
    return "PARAMS: " + ", ".join(f"{k}={v}" for k, v in constants.items()) if constants else ""


# ---------------------------------------------------------------------------------------------
# LAUNCH

MAX_LAUNCHES = 4
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_SMEM_BYTES = 227 * 1024  # Hopper's opt-in limit per block; the harness may lower it


@dataclass(frozen=True)
class LaunchSpec:
    """One ``LAUNCH:`` line: grid and block as 1-3 expressions each, dynamic smem, kernel name."""

    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    smem: Expr | None = None
    kernel: str | None = None  # None: the op's default name

    @property
    def expressions(self) -> tuple[Expr, ...]:
        """Every expression of the line: grid, block, then smem when given."""
        return (*self.grid, *self.block, *((self.smem,) if self.smem is not None else ()))

    @property
    def names(self) -> frozenset[str]:
        """Every variable name the line's expressions read."""
        return frozenset(n for e in self.expressions for n in e.names)

    def render(self) -> str:
        parts = [f"grid={_dims(self.grid)}", f"block={_dims(self.block)}"]
        if self.smem is not None:
            parts.append(f"smem={self.smem}")
        if self.kernel is not None:
            parts.append(f"kernel={self.kernel}")
        return "LAUNCH: " + ", ".join(parts)


def _dims(d: tuple[Expr, ...]) -> str:
    return str(d[0]) if len(d) == 1 else "(" + ", ".join(map(str, d)) + ")"


@dataclass(frozen=True)
class Header:
    """The parsed header of a completion."""

    format: str  # upper-case name in FORMATS
    params: dict[str, int] = field(default_factory=dict)  # as written (resolved against defaults)
    launches: tuple[LaunchSpec, ...] = ()
    constants: dict[str, int] = field(default_factory=dict)
    """The PARAMS line's names and values, in the order written (empty: no PARAMS line)."""

    @property
    def spec(self) -> FormatSpec:
        return FORMATS[self.format]

    def kernel_names(self, op: Op) -> tuple[str, ...]:
        """Names of the kernels launched, in order (duplicates kept)."""
        return tuple(l.kernel or op.kernel_name for l in self.launches)

    def render(self) -> str:
        fmt = " ".join([self.format] + [f"{k}={v}" for k, v in self.params.items()])
        params = [render_params_line(self.constants)] if self.constants else []
        return "\n".join([f"FORMAT: {fmt}"] + params + [l.render() for l in self.launches])

    def prelude(self) -> str:
        """The lines the harness puts before the code of a completion with a PARAMS line:
        ``constexpr int NAME = value;`` for each FORMAT parameter (``R``, ``C``, ``sigma``,
        ``width`` as the FORMAT line gives them, defaults filled), then for each PARAMS name.
        Without a PARAMS line there are none: the code is compiled as written."""
        if not self.constants:
            return ""
        return "".join(f"constexpr int {k} = {v};\n" for k, v in {**self.params, **self.constants}.items())

    def source(self, code: str) -> str:
        """The source the compiler sees for ``code`` under this header: the PARAMS prelude, then the code."""
        return self.prelude() + code


@dataclass(frozen=True)
class LaunchConfig:
    """One concrete launch: kernel name, grid, block, dynamic shared memory bytes."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int

    @property
    def empty(self) -> bool:
        """A launch with a zero grid dimension does nothing and is skipped."""
        return 0 in self.grid


def parse_format_line(text: str) -> tuple[str, dict[str, int]]:
    """Parse the body of a ``FORMAT:`` line (``NAME [key=value ...]``)."""
    tokens = text.replace(",", " ").split()
    if not tokens:
        raise ContractError("FORMAT: line names no format")
    spec = format_spec(tokens[0])
    given: dict[str, int] = {}
    for tok in tokens[1:]:
        key, eq, value = tok.partition("=")
        if not eq or not key:
            raise ContractError(f"FORMAT parameter {tok!r} is not key=value")
        canonical = next((p.name for p in spec.params if p.name.lower() == key.lower()), key)
        if canonical in given:
            raise ContractError(f"FORMAT parameter {canonical} given twice")
        try:
            given[canonical] = int(value)
        except ValueError:
            raise ContractError(f"FORMAT parameter {key}={value!r} is not an integer") from None
    return spec.name, spec.resolve_params(given)


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ContractError(f"unbalanced parentheses in LAUNCH line {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ContractError(f"unbalanced parentheses in LAUNCH line {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _parse_dims(text: str, what: str) -> tuple[Expr, ...]:
    t = text.strip()
    if t.startswith("(") and t.endswith(")"):
        inner = _split_top_level(t[1:-1])
        # "(m + 1)" is one expression in parentheses, "(a, b)" is a tuple
        if len(inner) > 1:
            if len(inner) > 3:
                raise ContractError(f"{what} has more than 3 dimensions: {text!r}")
            return tuple(parse_expr(p) for p in inner)
    return (parse_expr(t),)


def parse_launch_line(text: str) -> LaunchSpec:
    """Parse the body of a ``LAUNCH:`` line."""
    fields: dict[str, str] = {}
    for part in _split_top_level(text):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq:
            raise ContractError(f"LAUNCH field {part!r} is not key=value")
        if key not in ("grid", "block", "smem", "kernel"):
            raise ContractError(f"unknown LAUNCH field {key!r} (fields: grid, block, smem, kernel)")
        if key in fields:
            raise ContractError(f"LAUNCH field {key} given twice")
        fields[key] = value.strip()
    for req in ("grid", "block"):
        if req not in fields:
            raise ContractError(f"LAUNCH line needs {req}=...")
    kernel = fields.get("kernel")
    if kernel is not None and not _IDENT.match(kernel):
        raise ContractError(f"LAUNCH kernel={kernel!r} is not a C identifier")
    return LaunchSpec(
        grid=_parse_dims(fields["grid"], "grid"),
        block=_parse_dims(fields["block"], "block"),
        smem=parse_expr(fields["smem"]) if "smem" in fields else None,
        kernel=kernel,
    )


def parse_header(lines: list[str], op: Op) -> Header:
    """Parse header lines (``FORMAT:`` first, an optional ``PARAMS:`` line, then ``LAUNCH:`` lines)
    and check their names.

    Every name a LAUNCH expression reads must be one of :func:`launch_variables`, a PARAMS name or one of
    :data:`LAUNCH_FACT_NAMES` (whose values the harness writes in before it launches). Whatever the
    parsing raises on the text (a ValueError, OverflowError or RecursionError too) is a
    :class:`ContractError`: the text's fault, never the machine's.
    """
    try:
        return _parse_header(lines, op)
    except ContractError:
        raise
    except (ValueError, OverflowError, RecursionError) as exc:
        raise ContractError(f"the header could not be read ({type(exc).__name__}: {exc})"[:300]) from None


def _parse_header(lines: list[str], op: Op) -> Header:
    if not lines:
        raise ContractError("completion has no FORMAT: line")
    for line in lines:
        if (bad := next((ch for ch in line if ch in _LINE_BREAKS or (ch != "\t" and unicodedata.category(ch) == "Cc")),
                        None)) is not None:
            raise ContractError(f"header line {line.strip()[:40]!r} holds the control character {bad!r}: "
                                "header lines are text on one line")
    first = header_line(lines[0])
    if first is None or first[0] != "FORMAT":
        raise ContractError(f"first header line must be 'FORMAT: ...', got {lines[0].strip()[:60]!r}")
    fmt, params = parse_format_line(first[1])
    rest = [(line, header_line(line)) for line in lines[1:]]
    constants: dict[str, int] = {}
    if rest and rest[0][1] is not None and rest[0][1][0] == "PARAMS":
        constants = parse_params_line(rest.pop(0)[1][1])
    launches = []
    for line, got in rest:
        if got is not None and got[0] == "PARAMS":
            raise ContractError("a completion has at most one PARAMS line, right after the FORMAT line")
        if got is None or got[0] != "LAUNCH":
            raise ContractError(f"expected a 'LAUNCH: ...' line, got {line.strip()[:60]!r}")
        launches.append(parse_launch_line(got[1]))
    if not launches:
        raise ContractError("completion has no LAUNCH: line")
    if len(launches) > MAX_LAUNCHES:
        raise ContractError(f"at most {MAX_LAUNCHES} LAUNCH lines are allowed, got {len(launches)}")
    allowed = set(launch_variables(fmt, op)) | set(constants) | set(LAUNCH_FACT_NAMES)
    for l in launches:
        for e in l.expressions:
            bad = e.names - allowed
            if bad:
                own = sorted(allowed - set(LAUNCH_FACT_NAMES))
                raise ContractError(
                    f"LAUNCH expression {e.text!r} uses {', '.join(sorted(bad))}; "
                    f"for {op.value} {fmt} the names are: {', '.join(own)}, and the matrix's facts "
                    f"{', '.join(LAUNCH_FACT_NAMES)}"
                )
    return Header(fmt, params, tuple(launches), constants)


def split_completion(text: str, op: Op) -> tuple[Header, str]:
    """Split a clean completion into its parsed header and the source the compiler sees (its CUDA
    code after the PARAMS prelude, :meth:`Header.source`).

    Header lines are the leading non-blank lines that start with ``FORMAT:``, ``PARAMS:`` or
    ``LAUNCH:``. Tolerant extraction (markdown fences, chatter) is the harness's job.
    """
    lines = text.splitlines()
    header: list[str] = []
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if not s and not header:
            i += 1
            continue
        if header_line(s) is not None:
            header.append(s)
            i += 1
            continue
        break
    parsed = parse_header(header, op)
    return parsed, parsed.source("\n".join(lines[i:]).strip("\n") + "\n")


def evaluate_launches(header: Header, op: Op, env: Mapping[str, int]) -> list[LaunchConfig]:
    """Evaluate every LAUNCH line against ``env`` and the header's PARAMS, and check CUDA's limits."""
    env = {**env, **header.constants}
    out = []
    for l in header.launches:
        facts = (l.names & set(LAUNCH_FACT_NAMES)) - set(env)
        if facts:
            raise ContractError(f"LAUNCH reads {', '.join(sorted(facts))}, a matrix's fact: the harness writes its "
                                "value in from the matrix it verifies on (sparserl.harness.matrix_facts), and this "
                                "launch was not given one")
        grid = [e.evaluate(env) for e in l.grid] + [1] * (3 - len(l.grid))
        block = [e.evaluate(env) for e in l.block] + [1] * (3 - len(l.block))
        smem = l.smem.evaluate(env) if l.smem is not None else 0
        if any(g < 0 for g in grid):
            raise ContractError(f"LAUNCH grid evaluates to {tuple(grid)}: negative")
        for g, lim in zip(grid, MAX_GRID):
            if g > lim:
                raise ContractError(f"LAUNCH grid {tuple(grid)} exceeds CUDA's limit {MAX_GRID}")
        if any(b < 1 for b in block) or block[0] * block[1] * block[2] > MAX_BLOCK_THREADS or block[2] > 64:
            raise ContractError(f"LAUNCH block {tuple(block)} is not a valid CUDA block (1..1024 threads)")
        if not (0 <= smem <= MAX_SMEM_BYTES):
            raise ContractError(f"LAUNCH smem={smem} bytes is outside [0, {MAX_SMEM_BYTES}]")
        out.append(LaunchConfig(l.kernel or op.kernel_name, tuple(grid), tuple(block), smem))  # type: ignore[arg-type]
    return out
