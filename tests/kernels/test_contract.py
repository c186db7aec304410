"""The kernel contract: signatures, header grammar, launch evaluation, and the library's use of it."""

from __future__ import annotations

import re

import pytest

from sparserl.errors import ContractError
from sparserl.kernels.contract import (
    FORMAT_NAMES,
    FORMATS,
    Op,
    evaluate_launches,
    kernel_params,
    launch_variables,
    parse_header,
    signature,
    split_completion,
)
from sparserl.kernels.library import all_variants


def test_csr_signature_is_the_one_design_fixes() -> None:
    ps = kernel_params("CSR", Op.SPMV)
    assert [(p.base, p.name) for p in ps] == [
        ("int", "m"), ("int", "n"), ("int", "nnz"),
        ("int*", "row_ptr"), ("int*", "col_idx"), ("float*", "val"), ("float*", "x"), ("float*", "y"),
    ]
    sig = signature("CSR", Op.SPMV)
    assert sig.startswith('extern "C" __global__ void spmv_kernel(')
    assert "const float* __restrict__ x" in sig and "float* __restrict__ y" in sig


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_spmm_adds_k_after_nnz_and_uses_X_Y(fmt: str) -> None:
    mv = [p.name for p in kernel_params(fmt, Op.SPMV)]
    mm = [p.name for p in kernel_params(fmt, Op.SPMM)]
    assert mm[:4] == ["m", "n", "nnz", "k"]
    assert mm[4:-2] == mv[3:-2]
    assert mm[-2:] == ["X", "Y"] and mv[-2:] == ["x", "y"]


def test_zero_fill_policy() -> None:
    assert {f for f, s in FORMATS.items() if s.zero_fill_y} == {"COO", "HYB"}


def _lines(text: str) -> list[str]:
    return [l for l in text.strip().splitlines()]


def test_parse_header_full() -> None:
    h = parse_header(_lines("""
        FORMAT: sell C=16 sigma=64
        LAUNCH: grid=ceil_div(num_slices * C, 128), block=128
        LAUNCH: grid=(ceil_div(m, 32), 2), block=(32, 4), smem=4 * num_slices, kernel=fixup
    """), Op.SPMV)
    assert h.format == "SELL" and h.params == {"C": 16, "sigma": 64}
    assert len(h.launches) == 2 and h.kernel_names(Op.SPMV) == ("spmv_kernel", "fixup")
    cfgs = evaluate_launches(h, Op.SPMV, {"m": 100, "n": 100, "nnz": 500, "num_slices": 7, "C": 16,
                                           "sigma": 64, "num_sms": 132})
    assert cfgs[0].grid == (1, 1, 1) and cfgs[0].block == (128, 1, 1)
    assert cfgs[1].grid == (4, 2, 1) and cfgs[1].block == (32, 4, 1) and cfgs[1].smem == 28
    assert parse_header(_lines(h.render()), Op.SPMV) == h


def test_defaults_are_filled_and_parenthesised_expression_is_not_a_tuple() -> None:
    h = parse_header(["FORMAT: SELL", "LAUNCH: grid=(m + 1), block=(256)"], Op.SPMV)
    assert h.params == {"C": 32, "sigma": 1}
    assert len(h.launches[0].grid) == 1


@pytest.mark.parametrize(
    "lines, msg",
    [
        ([], "no FORMAT"),
        (["LAUNCH: grid=1, block=1"], "first header line"),
        (["FORMAT: JDS", "LAUNCH: grid=1, block=1"], "unknown format 'JDS'"),
        (["FORMAT: CSR"], "no LAUNCH"),
        (["FORMAT: CSR C=4", "LAUNCH: grid=1, block=1"], "no parameter"),
        (["FORMAT: BSR R=4 C=x", "LAUNCH: grid=1, block=1"], "not an integer"),
        (["FORMAT: BSR R=0 C=4", "LAUNCH: grid=1, block=1"], "out of range"),
        (["FORMAT: BSR R=64 C=64", "LAUNCH: grid=1, block=1"], "at most 1024"),
        (["FORMAT: SELL C=32 sigma=48", "LAUNCH: grid=1, block=1"], "multiple of C"),
        (["FORMAT: SELL C=32 C=16", "LAUNCH: grid=1, block=1"], "twice"),
        (["FORMAT: CSR", "LAUNCH: grid=1"], "needs block"),
        (["FORMAT: CSR", "LAUNCH: grid=1, block=1, stream=2"], "unknown LAUNCH field"),
        (["FORMAT: CSR", "LAUNCH: grid=1, block=1, kernel=a b"], "not a C identifier"),
        (["FORMAT: CSR", "LAUNCH: grid=ceil_div(m, 8, block=1"], "unbalanced"),
        (["FORMAT: CSR", "LAUNCH: grid=ceil_div(k, 8), block=256"], "uses k"),
        (["FORMAT: CSR", "LAUNCH: grid=ceil_div(width, 8), block=256"], "uses width"),
        (["FORMAT: CSR", "LAUNCH: grid=(1, 2, 3, 4), block=1"], "more than 3"),
        (["FORMAT: CSR", "LAUNCH: grid=1, block=1", "// comment"], "expected a 'LAUNCH"),
        (["FORMAT: CSR"] + ["LAUNCH: grid=1, block=1"] * 5, "at most 4"),
    ],
)
def test_header_errors(lines: list[str], msg: str) -> None:
    with pytest.raises(ContractError, match=msg):
        parse_header(lines, Op.SPMV)


@pytest.mark.parametrize(
    "launch, msg",
    [
        ("grid=1, block=2048", "not a valid CUDA block"),
        ("grid=1, block=(32, 32, 2)", "not a valid CUDA block"),
        ("grid=m - 2000, block=32", "negative"),
        ("grid=(1, 70000), block=32", "exceeds"),
        ("grid=1, block=32, smem=1000000", "smem"),
    ],
)
def test_launch_limits(launch: str, msg: str) -> None:
    h = parse_header(["FORMAT: CSR", f"LAUNCH: {launch}"], Op.SPMV)
    with pytest.raises(ContractError, match=msg):
        evaluate_launches(h, Op.SPMV, {"m": 1000, "n": 1000, "nnz": 5000, "num_sms": 132})


def test_zero_grid_is_an_empty_launch() -> None:
    h = parse_header(["FORMAT: HYB", "LAUNCH: grid=ceil_div(coo_nnz, 256), block=256"], Op.SPMV)
    (cfg,) = evaluate_launches(h, Op.SPMV, {"m": 10, "n": 10, "nnz": 10, "width": 1, "coo_nnz": 0, "num_sms": 1})
    assert cfg.empty


def test_launch_variables_per_format() -> None:
    assert launch_variables("BSR", Op.SPMM) == ("m", "n", "nnz", "k", "mb", "nb", "nnzb", "R", "C", "num_sms")
    assert "k" not in launch_variables("CSR", Op.SPMV)


_DEF = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')


@pytest.mark.parametrize("variant", all_variants(), ids=lambda v: v.id)
def test_every_library_variant_follows_the_contract(variant) -> None:
    header, code = split_completion(variant.render(), variant.op)
    assert header.format == variant.format
    assert header.params == dict(variant.format_params) | {
        k: v for k, v in header.params.items() if k not in dict(variant.format_params)
    }
    defined = set(_DEF.findall(code))
    launched = set(header.kernel_names(variant.op))
    assert launched <= defined, f"launches {launched - defined} that the code does not define"
    # every defined kernel takes exactly the contract's parameter list
    expected = [p.name for p in kernel_params(variant.format, variant.op)]
    for m in _DEF.finditer(code):
        params = code[m.end(): code.index(")", m.end())]
        names = [p.split()[-1] for p in params.replace("\n", " ").split(",")]
        assert names == expected, f"{m.group(1)} takes {names}"
    assert "#include" not in code and "printf" not in code and "asm" not in code
    # launches evaluate for a plausible matrix
    env = {name: 4096 for name in header_env_names(variant)}
    for cfg in evaluate_launches(header, variant.op, env):
        assert cfg.block[0] * cfg.block[1] * cfg.block[2] % 32 == 0, "library blocks are whole warps"


def header_env_names(variant) -> tuple[str, ...]:
    return launch_variables(variant.format, variant.op)


def test_split_completion_keeps_code() -> None:
    text = "\nFORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256), block=256\n\n// code\nextern \"C\" __global__ void spmv_kernel() {}\n"
    header, code = split_completion(text, Op.SPMV)
    assert header.format == "CSR" and code.startswith("// code")


def test_docs_match_the_contract_module() -> None:
    from pathlib import Path

    from sparserl.kernels.contract_doc import contract_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
    assert doc.read_text() == contract_markdown(), (
        "docs/contract.md is stale: python -m sparserl.kernels.contract_doc > docs/contract.md"
    )
