"""Building blocks of the adversarial kernels: a CSR SpMV completion with a body to fill in."""

from __future__ import annotations

HEAD = "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256), block=256\n"
SIG = ('extern "C" __global__ void spmv_kernel(int m, int n, int nnz, const int* __restrict__ row_ptr, '
       "const int* __restrict__ col_idx, const float* __restrict__ val, const float* __restrict__ x, "
       "float* __restrict__ y)")
ROW = "const int row = blockIdx.x * blockDim.x + threadIdx.x;"
DOT = ("float sum = 0.f; for (int j = row_ptr[row]; j < row_ptr[row + 1]; ++j) "
       "sum += val[j] * x[col_idx[j]];")


def csr(body: str, head: str = HEAD, sig: str = SIG, before: str = "") -> str:
    """A completion: header, optional code before the kernel, the kernel with ``body``."""
    return f"{head}{before}\n{sig}\n{{\n    {ROW}\n    {body}\n}}\n"


GOOD = csr(f"if (row >= m) return; {DOT} y[row] = sum;")
"""An honest CSR scalar kernel (thread per row)."""
HONEST = f"if (row >= m) return; {DOT} y[row] = sum;"
"""Its body, for cases that add something before or after it."""
