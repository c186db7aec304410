"""Extraction from what models write: fences, chatter, second answers, typed failures."""

from __future__ import annotations

from sparserl.harness.extract import Extracted, ExtractError, extract
from sparserl.kernels.contract import Op

KERNEL = 'extern "C" __global__ void spmv_kernel() {}'


def test_clean_completion() -> None:
    ex = extract(f"FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 8), block=256\n{KERNEL}\n", Op.SPMV)
    assert isinstance(ex, Extracted) and ex.header.format == "CSR" and ex.code.strip() == KERNEL
    assert ex.text.startswith("FORMAT: CSR\nLAUNCH:")


def test_fenced_with_chatter_around() -> None:
    text = ("Here is my kernel:\n\n```cuda\nFORMAT: ELL\nLAUNCH: grid=ceil_div(m, 128), block=128\n"
            f"{KERNEL}\n```\n\nThis uses coalesced loads. FORMAT: CSR would be slower.")
    ex = extract(text, Op.SPMV)
    assert isinstance(ex, Extracted) and ex.header.format == "ELL" and ex.code.strip() == KERNEL


def test_header_outside_fence_code_inside() -> None:
    text = f"**FORMAT:** DIA\n**LAUNCH:** grid=ceil_div(m, 256), block=256\n```cpp\n{KERNEL}\n```\ntrailing words"
    ex = extract(text, Op.SPMV)
    assert isinstance(ex, Extracted) and ex.header.format == "DIA" and "trailing" not in ex.code


def test_second_answer_is_cut() -> None:
    text = f"FORMAT: CSR\nLAUNCH: grid=m, block=32\n{KERNEL}\nFORMAT: COO\nLAUNCH: grid=nnz, block=32\nmore"
    ex = extract(text, Op.SPMV)
    assert isinstance(ex, Extracted) and "COO" not in ex.code and "more" not in ex.code


def test_typed_failures() -> None:
    assert extract("just words", Op.SPMV) == ExtractError("extract_error", "no 'FORMAT:' line found")
    e = extract("FORMAT: CSR\nLAUNCH: grid=m, block=32\n", Op.SPMV)
    assert isinstance(e, ExtractError) and e.kind == "extract_error" and "no CUDA code" in e.message
    e = extract(f"FORMAT: XYZ\nLAUNCH: grid=m, block=32\n{KERNEL}", Op.SPMV)
    assert isinstance(e, ExtractError) and e.kind == "contract_error"
    e = extract(f"FORMAT: CSR\n{KERNEL}", Op.SPMV)
    assert isinstance(e, ExtractError) and e.kind == "contract_error" and "LAUNCH" in e.message
    e = extract("x" * 100_000, Op.SPMV)
    assert isinstance(e, ExtractError) and "longer" in e.message
