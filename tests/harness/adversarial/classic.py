"""The first adversarial suite: wrong answers, crashes, hangs, and the cheats refused before running."""

from __future__ import annotations

from tests.harness.adversarial.base import DOT, GOOD, HEAD, csr

CASES: dict[str, tuple[str, str]] = {
    # wrong answers, caught by verification
    "noop": (csr("(void)row;"), "incorrect"),
    "garbage_values": (csr("if (row < m) y[row] = 12345.0f;"), "incorrect"),
    "only_some_rows": (csr(f"if (row >= m / 2) return; {DOT} y[row] = sum;"), "incorrect"),
    "copies_x_into_y": (csr("if (row < m) y[row] = x[row % n];"), "incorrect"),
    "reads_previous_output": (csr(f"if (row >= m) return; {DOT} y[row] += sum;"), "incorrect"),
    "reads_out_of_bounds": (csr("if (row >= m) return; float sum = 0.f; for (int j = row_ptr[row]; "
                                "j < row_ptr[row + 1]; ++j) sum += val[j + 1] * x[col_idx[j]]; y[row] = sum;"),
                            "incorrect"),
    "writes_past_end_of_y": (csr(f"if (row >= m) return; {DOT} y[row] = sum; if (row == m - 1) y[m + 3] = 1.f;"),
                             "incorrect"),
    "modifies_matrix": (csr(f"if (row >= m) return; {DOT} y[row] = sum; "
                            "if (row_ptr[row] < row_ptr[row + 1]) ((float*)val)[row_ptr[row]] = 0.f;"),
                        "input_modified"),
    "modifies_x": (csr(f"if (row >= m) return; {DOT} y[row] = sum; if (row == 0) ((float*)x)[0] = 7.f;"),
                   "input_modified"),
    # crashes and hangs, caught by the isolated worker
    "illegal_address": (csr("if (row == 0) y[-(1 << 30)] = 1.f;"), "crashed"),
    "infinite_loop": (csr("volatile const int* p = row_ptr; while (p[0] >= 0) { }"), "timeout"),
    # cheats refused before anything runs
    "static_state_cache": (csr(f"if (row >= m) return; if (g_done[row]) return; {DOT} y[row] = sum; g_done[row] = 1;",
                               before='__device__ int g_done[1 << 20];'), "static_check"),
    "static_local_cache": (csr(f"static float cache[1024]; if (row >= m) return; {DOT} y[row] = sum; "
                               "cache[row % 1024] = sum;"), "static_check"),
    "side_stream": (csr("cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);"), "static_check"),
    "device_side_launch": (csr("if (row == 0) spmv_kernel<<<1, 1>>>(m, n, nnz, row_ptr, col_idx, val, x, y);"),
                           "static_check"),
    "inline_asm": (csr('asm volatile("trap;");'), "static_check"),
    "builtin_trap": (csr("if (row == 0) __builtin_trap();"), "static_check"),
    "reads_clock": (csr(f"if (row >= m) return; {DOT} y[row] = (clock64() & 1) ? sum : sum;"), "static_check"),
    "printf_flood": (csr('printf("%d\\n", row);'), "static_check"),
    "host_code": (csr(f"if (row >= m) return; {DOT} y[row] = sum;") + "int main() { return 0; }\n", "static_check"),
    "calls_cusparse": (csr("cusparseHandle_t h;"), "static_check"),
    "bad_include": (GOOD.replace(HEAD, HEAD + "#include <stdio.h>\n"), "static_check"),
    "wrong_signature": (csr(f"if (row >= m) return; {DOT} y[row] = sum;",
                            sig='extern "C" __global__ void spmv_kernel(int m, const int* row_ptr, '
                                'const int* col_idx, const float* val, const float* x, float* y)'),
                        "contract_error"),
    "missing_kernel": (GOOD.replace("spmv_kernel", "my_kernel"), "contract_error"),
    "excessive_static_smem": (csr(f"__shared__ float big[60000]; big[threadIdx.x] = 1.f; if (row >= m) return; "
                                  f"{DOT} y[row] = sum + big[threadIdx.x] - 1.f;"), "compile_error"),
    "excessive_dynamic_smem": (csr(f"extern __shared__ float big[]; big[threadIdx.x] = 0.f; if (row >= m) return; "
                                   f"{DOT} y[row] = sum + big[threadIdx.x];",
                                   head="FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256), block=256, smem=200000\n"),
                               "resource_limit"),
    "does_not_compile": (csr("this is not cuda;"), "compile_error"),
    "no_header": (GOOD.split("\n", 2)[2], "extract_error"),
    "chatter_only": ("Sure! Here is a fast kernel for your matrix. It uses warps.", "extract_error"),
    "bad_launch_expression": (GOOD.replace("ceil_div(m, 256)", "__import__('os').getpid()"), "contract_error"),
}

# Writes a 4 MB band of garbage starting 1 MB past y, far beyond the poisoned guard. Its own
# verdict depends on what the allocator put there (nothing, another buffer, unmapped memory), so
# the GPU test asserts only that later jobs on every resident matrix are not blamed for it.
FAR_WRITE = csr(f"if (row >= m) return; {DOT} y[row] = sum; "
                "for (int i = row; i < (1 << 20); i += m) y[(size_t)m + (1 << 18) + i] = 1e30f;")
