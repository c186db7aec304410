"""The PARAMS line and the facts block: bad PARAMS lines, writable state smuggled in beside the
read-only ``__constant__`` tables a specialised kernel may declare (sized by a PARAMS name), and a matrix's
fact named where the matrix has no value for it (the suites' random matrices have neither a listed set of
diagonals nor, for BSR, this block shape: ``sparserl.harness.matrix_facts``)."""

from __future__ import annotations

from tests.harness.adversarial.base import DOT, HONEST, csr

HEAD = "FORMAT: CSR\nPARAMS: BLOCK=256, TABLE=4\nLAUNCH: grid=ceil_div(m, BLOCK), block=BLOCK\n"
TABLE = "__constant__ int c_tab[TABLE] = {1, 2, 3, 4};"


def params(body: str, before: str = "", head: str = HEAD) -> str:
    return csr(body, head=head, before=before)


def bad_line(line: str) -> str:
    return params(HONEST).replace("PARAMS: BLOCK=256, TABLE=4", line)


CASES: dict[str, tuple[str, str]] = {
    # honest: a PARAMS line, a LAUNCH line over its names and a constant table read by the kernel
    "params_honest_with_constant_table": (params(f"if (row >= m) return; {DOT} y[row] = sum * (c_tab[row & 3] > 0);",
                                                 before=TABLE), "none"),
    # writable state beside the tables
    "params_device_array": (params(f"{HONEST} if (row < TABLE) hist[row] += 1;",
                                   before="__device__ int hist[TABLE];"), "static_check"),
    "params_constant_without_initialiser": (params(f"{HONEST} if (row == 0) y[0] += c_tab[1];",
                                                   before="__constant__ int c_tab[TABLE];"), "static_check"),
    "params_constant_second_declarator_uninitialised": (
        params(f"{HONEST} if (row == 0) y[0] += c_more[1];",
               before="__constant__ int c_tab[TABLE] = {1, 2, 3, 4}, c_more[TABLE];"), "static_check"),
    "params_static_local_table": (params(f"static int seen[TABLE]; {HONEST} if (row < TABLE) seen[row] = 1;"),
                                  "static_check"),
    # legal C++ whose writes only the compiled code shows (tests/harness/test_ptx_check.py)
    "params_constant_table_written": (params(f"{HONEST} if (row == 0) c_tab[0] = (int)sum;", before=TABLE),
                                      "static_check"),
    "params_constant_table_const_cast": (
        params(f"{HONEST} if (row == 0) const_cast<int*>(c_tab)[row & 3] = 5;",
               before="__constant__ const int c_tab[TABLE] = {1, 2, 3, 4};"), "static_check"),
    "params_constant_table_atomic": (params(f"{HONEST} if (row == 0) atomicAdd(&c_tab[0], 1);", before=TABLE),
                                     "static_check"),
    "params_device_constexpr_table_cast": (
        params(f"{HONEST} if (row == 0) const_cast<int*>(c_off)[1] = 3;",
               before="__device__ constexpr int c_off[TABLE] = {-1, 0, 1, 2};"), "static_check"),
    # PARAMS lines the contract refuses
    "params_unknown_syntax": (bad_line("PARAMS: BLOCK 256, TABLE=4"), "contract_error"),
    "params_duplicate_name": (bad_line("PARAMS: BLOCK=256, TABLE=4, BLOCK=128"), "contract_error"),
    "params_not_an_integer": (bad_line("PARAMS: BLOCK=256.0, TABLE=4"), "contract_error"),
    "params_hex_value": (bad_line("PARAMS: BLOCK=0x100, TABLE=4"), "contract_error"),
    "params_too_many_names": (bad_line("PARAMS: BLOCK=256, TABLE=4, " + ", ".join(f"P{i}={i}" for i in range(7))),
                              "contract_error"),
    "params_contract_variable": (bad_line("PARAMS: BLOCK=256, TABLE=4, nnz=5"), "contract_error"),
    "params_format_variable": (bad_line("PARAMS: BLOCK=256, TABLE=4, num_slices=5"), "contract_error"),
    "params_cuda_builtin": (bad_line("PARAMS: BLOCK=256, TABLE=4, warpSize=16"), "contract_error"),
    "params_keyword": (bad_line("PARAMS: BLOCK=256, TABLE=4, asm=1"), "contract_error"),
    "params_reserved_name": (bad_line("PARAMS: BLOCK=256, TABLE=4, __trap=1"), "contract_error"),
    "params_second_line": (params(HONEST).replace("LAUNCH:", "PARAMS: OTHER=1\nLAUNCH:"), "contract_error"),
    "params_launch_uses_an_unnamed_name": (params(HONEST).replace("ceil_div(m, BLOCK)", "ceil_div(m, BLOK)"),
                                           "contract_error"),
    "params_matrix_fact_name": (bad_line("PARAMS: BLOCK=256, TABLE=4, MATRIX_ROW_LEN=9"), "contract_error"),
    # headers that once reached an internal_error (left out of every update): a value int() refuses to
    # read, and a line break only the worker's reading of the header saw
    "params_value_past_int_reading": (bad_line("PARAMS: BLOCK=256, TABLE=" + "4" * 5000), "contract_error"),
    "params_carriage_return_between_items": (bad_line("PARAMS: BLOCK=256,\rTABLE=4"), "contract_error"),
    "launch_form_feed_in_an_expression": (params(HONEST).replace("ceil_div(m, BLOCK)", "ceil_div(m,\x0cBLOCK)"),
                                          "contract_error"),
    # a matrix's fact the matrix has no value for: the harness would have to invent it
    "facts_diagonals_of_a_scattered_matrix": (params(f"{HONEST} if (row == 0) y[0] += MATRIX_DIA_RUNS[0] * 0.f;"),
                                              "contract_error"),
    "facts_block_count_under_csr": (params(f"{HONEST} if (row == 0) y[0] += MATRIX_BLOCK_ROW_LEN * 0.f;"),
                                    "contract_error"),
}
MATRIX_FACT_CASES = {"facts_diagonals_of_a_scattered_matrix", "facts_block_count_under_csr"}
"""Refused for the matrix they are judged on: the source alone (the static check) cannot tell."""
HEADER_CASES = {name for name, (_, kind) in CASES.items() if kind == "contract_error"} - MATRIX_FACT_CASES
"""Cases whose header the contract refuses (there is no code to check)."""
COMPILED_CODE_CASES = {"params_constant_table_written", "params_constant_table_const_cast",
                       "params_constant_table_atomic", "params_device_constexpr_table_cast"}
"""Legal C++ that only the compiled code shows to write module data."""
