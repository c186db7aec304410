"""Render the kernel contract as Markdown (``docs/contract.md`` is this output).

``python -m sparserl.kernels.contract_doc > docs/contract.md`` regenerates the file; a test
checks that the committed file matches, so the prose cannot drift from the code.
"""

from __future__ import annotations

from sparserl.kernels.contract import (
    ALLOWED_INCLUDES,
    FORMATS,
    MAX_LAUNCHES,
    MAX_PARAMS,
    RULES,
    Op,
    launch_variables,
    signature,
)

INTRO = f"""# The kernel contract

This is what a model (or a person) writes for SparseRL, and what the harness calls it with.
The code of record is `src/sparserl/kernels/contract.py`; this page is generated from it
(`python -m sparserl.kernels.contract_doc > docs/contract.md`) and a test keeps the two equal.

## A completion

```
FORMAT: NAME [key=value ...]
[PARAMS: NAME=INT, NAME=INT, ...]
LAUNCH: grid=EXPR, block=EXPR[, smem=EXPR][, kernel=IDENT]
[LAUNCH: ... up to {MAX_LAUNCHES} lines, run in order on one stream]
<CUDA device code>
```

* `FORMAT:` names the storage format and its integer parameters. The harness converts the
  matrix on the host (the cost is measured and reported separately) and passes the arrays below.
* `PARAMS:` (optional, right after `FORMAT:`) names the kernel's tunable numbers once, e.g.
  `PARAMS: BLOCK=256, BATCHES=4`. The harness puts one `constexpr int NAME = value;` line per name
  before the code, in the order written, and LAUNCH expressions may use the names, so a launch and
  its kernel cannot disagree: `LAUNCH: grid=ceil_div(nnz, BLOCK * BATCHES), block=BLOCK` with
  `__launch_bounds__(BLOCK)` and `BLOCK / 32` warps in the code. With a PARAMS line the FORMAT
  parameters are constants of the code too, under their own names and before the PARAMS names
  (`FORMAT: BSR R=4 C=4` gives `constexpr int R = 4;` and `constexpr int C = 4;`), so a block
  shape is written once, on the FORMAT line. Without a PARAMS line nothing is added: the code is
  compiled as written. Values are decimal integers that
  fit a C `int` (no leading zeros, no `+`, hex or `_`); items are separated by commas; at most
  {MAX_PARAMS} names. A name may not start with an underscore, be a C++/CUDA keyword or built-in
  (`int`, `if`, `threadIdx`, `blockDim`, `warpSize`, `float4`, `printf` ...), nor be a name the
  contract already uses: any format's kernel arguments and LAUNCH names (`m`, `n`, `nnz`, `k`, `x`,
  `y`, `X`, `Y`, `val`, `row_ptr`, `width`, `C`, `R`, `num_sms` ...), `spmv_kernel`, `spmm_kernel`,
  `ceil_div`, `min`, `max` and the matrix's facts below (`MATRIX_ROW_LEN` ...). Any of these is a
  `contract_error` with a one-line message. The checks of the code (source and compiled) see the
  code with the `constexpr` lines in front.
* Facts a kernel bakes in about its matrix (diagonal offsets, row bins, long-row lists) go in one
  block at the top of the code: `constexpr` values, and `__constant__` tables initialised there
  (a `__constant__` without an initialiser is refused: nothing else fills it). Five facts may be
  named instead of spelt: where the code uses `MATRIX_DIA_RUNS` (`__device__ constexpr int[]`: the
  diagonal offsets, column - row, ascending, first and last of each run of consecutive ones, a single
  offset twice), `MATRIX_ROW_LEN` (`constexpr int`: the length of every row, when all rows have one),
  `MATRIX_BLOCK_ROW_LEN` (`constexpr int`: the blocks in every block row, under `FORMAT: BSR` at
  the matrix's block shape), `MATRIX_LONG_ROWS` (`__constant__ int[]`: the rows longer than the
  kernel's `LONG_LEN`, a PARAMS name, ascending; at least one) or `MATRIX_LONG_ROW_COUNT`
  (`constexpr int`: how many rows are longer than `LONG_LEN`), the harness writes its definition
  before the code from the matrix it verifies on, so one text serves every matrix; a name the matrix
  has no value for is a `contract_error`. A name the code declares itself (`constexpr int NAME`,
  `__constant__ int NAME`, `#define NAME`) is left to it. The three single integers may also be read
  by a LAUNCH expression (`grid=MATRIX_LONG_ROW_COUNT + ceil_div(m, 64)`): the harness writes their
  values into the LAUNCH line in the same step.
* `LAUNCH:` gives the grid and block (one expression, or `(x, y)` / `(x, y, z)`), optional dynamic
  shared memory in bytes and the kernel's name (default `spmv_kernel` / `spmm_kernel`). A launch
  whose grid has a 0 dimension is skipped (e.g. an empty COO part of HYB). Blocks have at most 1024
  threads; dynamic shared memory at most 227 KiB.
* Expressions are integers over the names listed per format below, the PARAMS names and the
  three integer facts above, with `+ - * / %`
  (C semantics: `/` truncates toward zero), `ceil_div(a, b)`, `min(...)`, `max(...)` and parentheses.
  They are parsed with an allow-list (ASCII only), never evaluated as Python. `num_sms` is the GPU's
  multiprocessor count.
* The code is device code only: `extern "C" __global__` kernels and `__device__` helpers; no host
  code. Every launched kernel takes the same argument list (below). Values are `float` (fp32),
  indices `int` (int32).
* SpMV computes `y = A x` (`x` has n entries, `y` has m). SpMM computes `Y = A X` with `X` n x k and
  `Y` m x k, both row-major; its kernels take `int k` after `nnz` and `X, Y` in place of `x, y`.
* Output policy: for formats marked *zeroed* the harness sets y (Y) to 0 before the first launch
  and kernels accumulate (atomics are fine); for all other formats y is filled with NaN before the
  first launch and the kernels must write every entry of it.

## The rules

{{RULES}}

How the harness holds a kernel to them (`docs/harness.md`): the source is checked as the
compiler's front end sees it (lines spliced, macros expanded, no token pasting or stringizing),
the compiled PTX is checked again (clocks, SM and warp ids, traps, calls out of the module, writes
to module-scope data, and arithmetic or conversions in half, bfloat16, TF32 or FP8 and quantised
integer products: the operator is fp32, so the fp16 and bf16 headers are of no use to a kernel), the
output must be within a tolerance of the fp64 product that stops growing at rows of 65536 entries (a
row of more than about 1.5 million entries summed by one fp32 accumulator drifts past it: split long
rows across threads), the kernel is verified on the matrix and on the same pattern with fresh
random values, with guards on both sides of x and y, and every timed run starts from fresh x and
a NaN-poisoned y and has its output checked. Allowed headers: {{HEADERS}}.
"""


def format_reference() -> str:
    """The per-format part of the contract."""
    out = ["## Formats\n"]
    for spec in FORMATS.values():
        out.append(f"### {spec.name}: {spec.summary}\n")
        if spec.params:
            out.append("Parameters (`FORMAT: " + spec.name + " " + " ".join(f"{p.name}=..." for p in spec.params) + "`):\n")
            for p in spec.params:
                default = "optional" if p.optional else f"default {p.default}"
                out.append(f"* `{p.name}` in [{p.lo}, {p.hi}], {default}: {p.doc}")
            out.append("")
        else:
            out.append(f"No parameters: `FORMAT: {spec.name}`.\n")
        poisoned = "NaN-poisoned; every row must be written"
        output = "**zeroed** before the first launch" if spec.zero_fill_y else poisoned
        if spec.zero_fill_y and any(p.name == "zero_y" for p in spec.params):
            output += f"; with `zero_y=0`, {poisoned}"
        out.append(f"Output: {output}.\n")
        out.append(f"Layout: {spec.layout}\n")
        if spec.sizes:
            out.append("Size arguments: " + ", ".join(f"`int {s}`" for s in spec.sizes) + ".\n")
        out.append("| array | type | length | meaning |\n| --- | --- | --- | --- |")
        for a in spec.arrays:
            out.append(f"| `{a.name}` | `{a.ctype}*` | {a.length} | {a.doc} |")
        out.append("")
        for op in Op:
            out.append(f"{op.value.upper()} signature (LAUNCH names: {', '.join(f'`{v}`' for v in launch_variables(spec.name, op))}):\n")
            out.append("```cuda\n" + signature(spec.name, op) + "\n```\n")
    return "\n".join(out)


def contract_markdown() -> str:
    intro = INTRO.replace("{RULES}", "\n".join(f"* {r}" for r in RULES)).replace(
        "{HEADERS}", ", ".join(f"`{h}`" for h in sorted(ALLOWED_INCLUDES)))
    return intro + "\n" + format_reference()


if __name__ == "__main__":
    print(contract_markdown(), end="")
