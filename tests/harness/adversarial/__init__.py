"""Kernels that try to fool the harness, one module per attack class, each with the verdict it must get.

Shared by the CPU tests (static and compile-time cases are refused without a GPU; runtime cheats
are *not* refused early for the wrong reason) and the GPU tests (the exact verdict at run time,
and the pool keeps serving afterwards). All are SpMV, on CSR except the output policy's (COO).

* :mod:`.classic` - wrong answers, crashes, hangs, the first static rules;
* :mod:`.timed` - telling a timed run from a verification run;
* :mod:`.state` - hidden state across launches (namespaces, macros, const casts, calls out);
* :mod:`.preprocessor` - banned names and files through the preprocessor;
* :mod:`.host` - host functions and variables;
* :mod:`.values` - kernels specialised to the values (run on a unit-valued matrix);
* :mod:`.guards` - writes just outside x and y;
* :mod:`.early` - the batched path's shortcuts: early stopping, conversions shared between kernels;
* :mod:`.params` - bad PARAMS lines, and writable state beside the constant tables of a facts block;
* :mod:`.output` - COO's ``zero_y=0`` (y not zeroed) with a kernel that accumulates anyway; kernels
  that read what y held;
* :mod:`.tolerance` - errors hidden in the tolerance (run on a matrix with a row of 10^6 entries).

A verdict of ``none`` means the kernel is correct and timed honestly (it gains nothing).
"""

from __future__ import annotations

from tests.harness.adversarial import (
    classic,
    early,
    guards,
    host,
    output,
    params,
    preprocessor,
    state,
    timed,
    tolerance,
    values,
)
from tests.harness.adversarial.base import DOT, GOOD, HEAD, HONEST, SIG, csr

CLASSES = {"classic": classic.CASES, "timed": timed.CASES, "state": state.CASES,
           "preprocessor": preprocessor.CASES, "host": host.CASES, "values": values.CASES, "guards": guards.CASES,
           "early": early.CASES, "params": params.CASES, "output": output.CASES, "tolerance": tolerance.CASES}
ADVERSARIAL: dict[str, tuple[str, str]] = {}
for _cases in CLASSES.values():
    assert not set(_cases) & set(ADVERSARIAL), "duplicate case names"
    ADVERSARIAL.update(_cases)
VALUE_CASES = set(values.CASES)
"""Cases that must run on a unit-valued matrix to show their cheat."""
LONG_ROW_CASES = set(tolerance.LONG_ROW_CASES)
"""Cases that must run on :func:`.tolerance.long_row_matrix` (a row of 10^6 entries) to show their cheat."""
long_row_matrix = tolerance.long_row_matrix
FAR_WRITE = classic.FAR_WRITE
MATRIX_FACT_CASES = params.MATRIX_FACT_CASES
"""Cases refused for the matrix they are judged on (a fact of it the code names, without a value)."""
HEADER_CASES = {"no_header", "bad_launch_expression", "zero_y_on_csr", "zero_y_out_of_range"} | params.HEADER_CASES
"""Cases refused at the header: extraction or the contract, before any code is looked at."""
COMPILED_CODE_CASES = {"writes_through_const_table", "writes_through_constant_memory",
                       "writes_device_const_by_address", "calls_outside_the_module",
                       "address_rebuilt_under_branches", "address_laundered_through_a_table",
                       "address_taken_apart_by_half_moves", "address_bits_through_the_carry_flag",
                       "address_rebuilt_from_barrier_counts", "address_returned_from_barrier_counts",
                       "address_kept_in_an_mbarrier_s_expected_count", "address_kept_in_an_mbarrier_arrival_s_count",
                       "address_bits_in_a_call_under_a_branch", "address_bits_voted_at_another_lane_s_ballot",
                       "address_bytes_counted_at_another_warp_s_barrier",
                       "flag_set_in_a_block_out_of_line",
                       "mutable_member_of_a_const_instance"} | params.COMPILED_CODE_CASES | tolerance.COMPILED_CODE
"""Static-check cases only the compiled code shows (the source is legal C++)."""
RUNTIME_KINDS = {"incorrect", "input_modified", "crashed", "timeout", "resource_limit", "nondeterministic", "none",
                 "slow"}
"""Verdicts only a GPU run can give."""
OWN_SPEED = set(output.CASES)
"""Cases whose honest kernels are not the CSR scalar kernel's computation: their speed is their own."""
SEQUENTIAL_VERDICTS = early.SEQUENTIAL
"""Cases whose verdict differs on the sequential path (``SpeedConfig.classic()``), which never stops early."""

__all__ = ["ADVERSARIAL", "CLASSES", "COMPILED_CODE_CASES", "DOT", "FAR_WRITE", "GOOD", "HEAD", "HEADER_CASES",
           "HONEST", "LONG_ROW_CASES", "MATRIX_FACT_CASES", "OWN_SPEED", "RUNTIME_KINDS", "SEQUENTIAL_VERDICTS", "SIG",
           "VALUE_CASES", "csr", "long_row_matrix"]
