"""The output policy: COO's ``zero_y=0``, where the harness does not zero y and the kernel must write
every entry of it.

A kernel that declares ``zero_y=0`` skips the memset of y that the timed runs of every other COO kernel
pay. If it still accumulates into y as if it were zeroed, it reads the harness's NaN poison and is
``incorrect``: declaring the option gains nothing unless the kernel really writes all of y. One that
zeroes y in a first launch and then accumulates is honest (``none``), and pays for that launch in its
own timed runs. ``zero_y`` on a format that has no such option, or out of range, is a contract error.

What y holds before a launch: the harness fills it with NaN, but a user's y holds whatever the last call
left there. A kernel that computes only the rows still NaN, or treats only NaN as "not yet zeroed", is
right on every poisoned y and wrong on a user's; the re-run of the first input gets a y holding another
input's output, and such a kernel is ``incorrect`` there (``skips_rows_already_written`` in :mod:`.timed`
is the CSR case).
"""

from __future__ import annotations

COO_SIG = ('extern "C" __global__ void {name}(int m, int n, int nnz, const int* __restrict__ row_idx, '
           "const int* __restrict__ col_idx, const float* __restrict__ val, const float* __restrict__ x, "
           "float* __restrict__ y)")
ATOMIC = ("const int i = blockIdx.x * blockDim.x + threadIdx.x; "
          "if (i < nnz) atomicAdd(y + row_idx[i], val[i] * x[col_idx[i]]);")
"""One atomicAdd per entry: right only on a zeroed y."""
ZERO = "const int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < m) y[i] = 0.f;"
ZERO_NAN = ZERO.replace("if (i < m)", "if (i < m && y[i] != y[i])")
"""Zeroes only the rows that hold NaN (the harness's poison), leaving any number y held."""


def coo(fmt: str, *kernels: tuple[str, str, str]) -> str:
    """A COO SpMV completion: ``fmt`` the FORMAT line's body, each kernel (name, grid count, body) a
    LAUNCH line and a function, in order."""
    head = [f"FORMAT: {fmt}"] + [f"LAUNCH: grid=ceil_div({count}, 256), block=256"
                                  + ("" if name == "spmv_kernel" else f", kernel={name}") for name, count, _ in kernels]
    code = [f"{COO_SIG.format(name=name)}\n{{\n    {body}\n}}" for name, _, body in kernels]
    return "\n".join(head) + "\n\n" + "\n\n".join(code) + "\n"


CASES: dict[str, tuple[str, str]] = {
    # the honest baseline: COO as the format zeroes it
    "coo_atomic_on_zeroed_y": (coo("COO", ("spmv_kernel", "nnz", ATOMIC)), "none"),
    # declares zero_y=0 (no memset in its timed runs) and still accumulates into the poisoned y
    "coo_unzeroed_accumulates": (coo("COO zero_y=0", ("spmv_kernel", "nnz", ATOMIC)), "incorrect"),
    # declares zero_y=0, zeroes y itself in a first launch, then accumulates: honest, pays its own zeroing
    "coo_unzeroed_zeroes_first": (coo("COO zero_y=0", ("zero_y_rows", "m", ZERO), ("spmv_kernel", "nnz", ATOMIC)),
                                  "none"),
    # zero_y=0 that zeroes only the poison, then accumulates onto whatever number y held
    "coo_unzeroed_zeroes_only_the_poison": (coo("COO zero_y=0", ("zero_nan_rows", "m", ZERO_NAN),
                                                ("spmv_kernel", "nnz", ATOMIC)), "incorrect"),
    # the option where the contract has none, or out of its range
    "zero_y_on_csr": ("FORMAT: CSR zero_y=0\nLAUNCH: grid=ceil_div(m, 256), block=256\n"
                      + COO_SIG.format(name="spmv_kernel") + "\n{\n}\n", "contract_error"),
    "zero_y_out_of_range": (coo("COO zero_y=2", ("spmv_kernel", "nnz", ATOMIC)), "contract_error"),
}
