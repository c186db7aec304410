"""Static checks: each banned construct is named; legitimate code (the library) passes."""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.harness.static_check import static_check
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import all_variants
from tests.harness.adversarial import (ADVERSARIAL, COMPILED_CODE_CASES, GOOD, HEADER_CASES, HONEST, MATRIX_FACT_CASES,
                                       RUNTIME_KINDS, csr)


def check(text: str, op: Op = Op.SPMV):
    header, code = split_completion(text, op)
    return static_check(code, header, op)


@pytest.mark.parametrize("variant", all_variants(), ids=lambda v: v.id)
def test_library_passes(variant) -> None:
    assert check(variant.render(), variant.op) is None


def test_good_kernel_passes_and_comments_do_not_count() -> None:
    assert check(GOOD) is None
    assert check(GOOD.replace("y[row] = sum;", "y[row] = sum; // printf(\"x\"); asm  clock() #include <x>")) is None
    assert check(GOOD.replace("y[row] = sum;", "y[row] = sum; /* atomicAdd asm(\"trap;\") */")) is None


@pytest.mark.parametrize("name", sorted(n for n, (_, kind) in ADVERSARIAL.items() if kind in ("static_check", "contract_error")
                                        and n not in HEADER_CASES | COMPILED_CODE_CASES | MATRIX_FACT_CASES))
def test_adversarial_static_cases_are_refused(name: str) -> None:
    text, kind = ADVERSARIAL[name]
    v = check(text)
    assert v is not None and v.kind == kind, (name, v)
    assert "\n" not in v.message and len(v.message) < 300


@pytest.mark.parametrize("name", sorted(n for n, (_, kind) in ADVERSARIAL.items() if kind in RUNTIME_KINDS)
                         + sorted(COMPILED_CODE_CASES))
def test_runtime_and_compiled_cheats_pass_static_checks(name: str) -> None:
    """They must be caught by compiling or running them, so the source check must not claim them."""
    assert check(ADVERSARIAL[name][0]) is None


@pytest.mark.parametrize("before", [
    "__constant__ float tab[4] = {1.f, 2.f, 3.f, 4.f};",
    "__device__ const float tab[4] = {1.f, 2.f, 3.f, 4.f};",
    "constexpr int WARP = 32;",
    "static constexpr float SCALE = 0.5f;",
    "const int BINS[3] = {0, 8, 64};",
    "namespace { __constant__ int offsets[3] = {-1, 0, 1}; }",
    "__shared__ float tile[256];",
    "struct Acc { float v; __device__ Acc() : v(0.f) {} __device__ void add(float a) { v += a; } };",
    "template <int N> __device__ __forceinline__ float sum_n(const float* p) { float s = 0.f; "
    "for (int i = 0; i < N; ++i) s += p[i]; return s; }",
    "typedef float real;\nusing idx = int;\nenum Mode { A, B };\nstruct Pair { int a, b; };",
    "#define D __device__\nD float twice(float a) { return 2.f * a; }",
    "#define WARP 32\n#define MIN(a, b) ((a) < (b) ? (a) : (b))\n#pragma unroll",
    "#include <cuda_fp16.h>\n#include <cooperative_groups.h>",
    "extern \"C\" {\n__device__ float helper(float a) { return a; }\n}",
])
def test_legitimate_constructs_pass(before: str) -> None:
    assert check(csr(f"static const float t[2] = {{1.f, 2.f}}; {HONEST} (void)t;", before=before)) is None, before


def test_signature_type_mismatch_message() -> None:
    text = GOOD.replace("const float* __restrict__ x", "const double* __restrict__ x")
    v = check(text)
    assert v is not None and v.kind == "contract_error" and "double*" in v.message


def test_kernel_defined_through_a_macro_is_checked() -> None:
    sig = 'extern "C" __global__ void spmv_kernel(int m, int n, int nnz, const int* row_ptr, const int* col_idx, ' \
          'const float* val, const float* x, float* y)'
    text = csr(HONEST, sig="#define KERNEL " + sig + "\nKERNEL")
    assert check(text) is None
    bad = csr(HONEST, sig="#define KERNEL " + sig.replace("int nnz, ", "") + "\nKERNEL")
    assert check(bad).kind == "contract_error"


def test_timed_run_detectors_see_no_verification_input() -> None:
    """The 'timed' adversarial kernels skip work when x looks like a timed run's input; on every
    verification input they must compute, so their GPU verdict comes from a checked timed run."""
    from sparserl.harness.verify import VerifyConfig, make_inputs
    from tests.harness.adversarial.timed import TEST_N, looks_timed

    inputs = make_inputs((TEST_N,), VerifyConfig())
    assert not any(looks_timed(x) for _, x in inputs)
    rng = np.random.default_rng(0)
    grid = (rng.integers(0, 1 << 24, size=(100, 8)) * np.float32(2.0 ** -23) - np.float32(1)).astype(np.float32)
    assert sum(looks_timed(g) for g in grid) >= 99  # what the timed runs' refresh kernel produces


def test_an_spmv_kernel_checked_as_spmm_is_told_so() -> None:
    """The default kernel name follows --op: an SpMV completion checked as SpMM names spmm_kernel, which its code
    does not define; the message says which op the code looks written for."""
    from sparserl.harness.extract import extract
    from sparserl.harness.static_check import static_check
    from sparserl.kernels.contract import Op
    from sparserl.kernels.library import variants

    ex = extract(variants("spmv", "CSR")[0].render(), Op.SPMM)
    bad = static_check(ex.code, ex.header, Op.SPMM)
    assert bad is not None and bad.kind == "contract_error" and "an spmv kernel checked as spmm?" in bad.message
    assert "checked as" not in static_check(ex.code.replace("spmv_kernel", "other"), ex.header, Op.SPMV).message
