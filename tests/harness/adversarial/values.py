"""Specialising to the values: run on a unit-valued matrix, where ignoring val used to pass.

Verification also runs every kernel on the same pattern with fresh random values, so these fail.
"""

from __future__ import annotations

from tests.harness.adversarial.base import csr

CASES: dict[str, tuple[str, str]] = {
    # every value assumed to be 1
    "assumes_unit_values": (csr("if (row >= m) return; float sum = 0.f; for (int j = row_ptr[row]; "
                                "j < row_ptr[row + 1]; ++j) sum += x[col_idx[j]]; y[row] = sum;"), "incorrect"),
    # reads one value and assumes the others equal it
    "one_value_for_all": (csr("if (row >= m) return; const float v = val[0]; float sum = 0.f; "
                              "for (int j = row_ptr[row]; j < row_ptr[row + 1]; ++j) sum += v * x[col_idx[j]]; "
                              "y[row] = v == v ? sum : 0.f;"), "incorrect"),
    # a constant table of the first values, used for the first rows
    "table_of_values": (csr("if (row >= m) return; float sum = 0.f; for (int j = row_ptr[row]; "
                            "j < row_ptr[row + 1]; ++j) sum += (j < 4 ? tab[j] : val[j]) * x[col_idx[j]]; y[row] = sum;",
                            before="__constant__ float tab[4] = {1.f, 1.f, 1.f, 1.f};"), "incorrect"),
}
