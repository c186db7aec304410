"""Static checks: each banned construct is named; legitimate code (the library) passes."""

from __future__ import annotations

import pytest

from sparserl.harness.static_check import static_check, strip_comments_and_strings
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import all_variants
from tests.harness.adversarial import ADVERSARIAL, GOOD


def check(text: str, op: Op = Op.SPMV):
    header, code = split_completion(text, op)
    return static_check(code, header, op)


@pytest.mark.parametrize("variant", all_variants(), ids=lambda v: v.id)
def test_library_passes(variant) -> None:
    assert check(variant.render(), variant.op) is None


def test_good_kernel_passes_and_comments_do_not_count() -> None:
    assert check(GOOD) is None
    assert check(GOOD.replace("y[row] = sum;", "y[row] = sum; // printf(\"x\"); asm  clock()")) is None


@pytest.mark.parametrize("name", [n for n, (_, kind) in ADVERSARIAL.items() if kind in ("static_check", "contract_error")
                                  and n not in ("no_header", "bad_launch_expression")])
def test_adversarial_static_cases_are_refused(name: str) -> None:
    text, kind = ADVERSARIAL[name]
    v = check(text)
    assert v is not None and v.kind == kind, (name, v)


@pytest.mark.parametrize("name", [n for n, (_, kind) in ADVERSARIAL.items()
                                  if kind in ("incorrect", "input_modified", "crashed", "timeout", "resource_limit")])
def test_runtime_cheats_pass_static_checks(name: str) -> None:
    """They must be caught by running them, so the static check must not claim them."""
    assert check(ADVERSARIAL[name][0]) is None


def test_strip_keeps_lines() -> None:
    code = 'a /* x\ny */ b // c\n"str // not comment" d'
    out = strip_comments_and_strings(code)
    assert out.count("\n") == code.count("\n") and "str" not in out and "x" not in out and "d" in out


def test_signature_type_mismatch_message() -> None:
    text = GOOD.replace("const float* __restrict__ x", "const double* __restrict__ x")
    v = check(text)
    assert v is not None and v.kind == "contract_error" and "double*" in v.message
