"""Extraction from what models write: fences, chatter, second answers, typed failures."""

from __future__ import annotations

import pytest

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


def test_a_header_the_worker_would_read_differently_is_refused_here() -> None:
    """The host splits a completion at newlines only, the worker reads the rendered header again with
    ``str.splitlines`` (which also breaks at a form feed, CR, file/group/record separators, NEL and
    the Unicode line separators). A header line holding one of them was accepted here and broke in the
    worker, an ``internal_error`` (left out of every update). Now it is a ``contract_error`` here,
    in a LAUNCH expression, between LAUNCH items or in a PARAMS line, and the worker reads what the host read.
    Kills: the header check removed (the header is accepted), tabs or other spaces refused (a model's
    harmless indentation)."""
    from sparserl.kernels.contract import split_completion

    for sep in ("\x0c", "\r", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00"):
        for text in (f"FORMAT: CSR\nLAUNCH: grid=ceil_div(m,{sep}256), block=256\n{KERNEL}\n",
                     f"FORMAT: CSR\nPARAMS: B=256,{sep}U=2\nLAUNCH: grid=ceil_div(m, B), block=B\n{KERNEL}\n",
                     f"FORMAT: CSR\nLAUNCH: grid=m,{sep} block=32\n{KERNEL}\n"):
            e = extract(text, Op.SPMV)
            assert isinstance(e, ExtractError) and e.kind == "contract_error", (repr(sep), text[:40], e)
            assert "\n" not in e.message
    ex = extract(f"FORMAT: CSR\nLAUNCH: grid=ceil_div(m,\t256), block=\xa0256\n{KERNEL}\n", Op.SPMV)
    assert isinstance(ex, Extracted)  # a tab or a no-break space breaks no line: read as before
    header, _ = split_completion(ex.text, Op.SPMV)  # what the worker reads is what was read here
    assert header.launches == ex.header.launches


def test_a_parser_error_on_the_candidates_header_is_its_contract_error(monkeypatch) -> None:
    """Any ValueError, OverflowError or RecursionError the header parser raises on a completion is
    the candidate's (``contract_error``), not an internal error left out of the update, here and in
    the worker's reading (``split_completion``). Kills: the translation in ``parse_header`` removed
    (the error escapes into the evaluator's or the worker's catch-all, internal_error)."""
    from sparserl.errors import ContractError
    from sparserl.kernels import contract as K

    text = f"FORMAT: CSR\nLAUNCH: grid=m, block=32\n{KERNEL}\n"
    for exc in (ValueError("Exceeds the limit (4300 digits) for integer string conversion"), OverflowError("big"),
                RecursionError("deep")):
        def boom(line, exc=exc):
            raise exc

        monkeypatch.setattr(K, "parse_launch_line", boom)
        e = extract(text, Op.SPMV)
        assert isinstance(e, ExtractError) and e.kind == "contract_error" and type(exc).__name__ in e.message
        with pytest.raises(ContractError, match=type(exc).__name__):
            K.split_completion(text, Op.SPMV)


def test_a_long_run_of_decoration_is_read_in_one_pass() -> None:
    """A line of 60,000 asterisks (or spaces) before an honest completion: header_line's pattern
    backtracked on such runs, quadratic in their length (140 s for this completion), in the compile
    thread, with no limit. Possessive now: well under a second. Kills: the plain quantifiers back."""
    import time

    for run in ("*" * 60_000, " " * 30_000 + "*" * 30_000, "-" * 30_000 + " " * 30_000):
        t = time.perf_counter()
        ex = extract(f"{run}\nFORMAT: CSR\nLAUNCH: grid=m, block=32\n{KERNEL}\n", Op.SPMV)
        assert isinstance(ex, Extracted) and time.perf_counter() - t < 2.0
    for decorated in ("**FORMAT:** CSR", "- FORMAT: CSR", "> ** FORMAT **: CSR", "#FORMAT: CSR", "  `FORMAT: CSR`"):
        ex = extract(f"{decorated}\nLAUNCH: grid=m, block=32\n{KERNEL}\n", Op.SPMV)
        assert isinstance(ex, Extracted) and ex.header.format == "CSR", decorated
