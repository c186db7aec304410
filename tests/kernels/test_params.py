"""The PARAMS header line: its grammar, the names it may not take, the constexpr prelude the
harness compiles, and LAUNCH expressions over its names."""

from __future__ import annotations

import pytest

from sparserl.errors import ContractError
from sparserl.harness.extract import Extracted, ExtractError, extract
from sparserl.kernels.contract import (
    MAX_PARAMS,
    Op,
    contract_names,
    evaluate_launches,
    parse_header,
    parse_params_line,
    split_completion,
)
from tests.harness.adversarial.base import GOOD, HONEST, csr

HEAD = "FORMAT: CSR\nPARAMS: BLOCK=256, BATCHES=4\nLAUNCH: grid=ceil_div(m, BLOCK * BATCHES), block=BLOCK\n"


def test_params_are_parsed_in_order_and_used_by_launch() -> None:
    h = parse_header(HEAD.strip().splitlines(), Op.SPMV)
    assert list(h.constants.items()) == [("BLOCK", 256), ("BATCHES", 4)]
    (cfg,) = evaluate_launches(h, Op.SPMV, {"m": 10_000, "n": 10, "nnz": 10, "num_sms": 132})
    assert cfg.grid == (10, 1, 1) and cfg.block == (256, 1, 1)
    assert h.render() == HEAD.strip()
    assert parse_header(h.render().splitlines(), Op.SPMV) == h


def test_prelude_is_one_constexpr_line_per_name_before_the_code() -> None:
    text = csr(HONEST, head=HEAD)
    header, source = split_completion(text, Op.SPMV)
    assert source.startswith("constexpr int BLOCK = 256;\nconstexpr int BATCHES = 4;\n")
    ex = extract("Here it is:\n```cuda\n" + text + "```\nDone.", Op.SPMV)
    assert isinstance(ex, Extracted) and ex.code == source
    assert ex.body == source.split("\n", 2)[2] and "constexpr" not in ex.body
    assert ex.text.startswith(HEAD)


def test_a_kernel_without_params_is_unchanged() -> None:
    header, source = split_completion(GOOD, Op.SPMV)
    assert header.constants == {} and header.prelude() == ""
    assert source == GOOD.split("\n", 2)[2].lstrip("\n")
    assert "PARAMS" not in header.render()


def test_markdown_decoration_and_negative_values() -> None:
    text = csr(HONEST, head="**FORMAT:** CSR\n**PARAMS:** SHIFT=-3,BLOCK = 128\nLAUNCH: grid=ceil_div(m, BLOCK), block=BLOCK\n")
    ex = extract(text, Op.SPMV)
    assert isinstance(ex, Extracted) and ex.header.constants == {"SHIFT": -3, "BLOCK": 128}
    assert ex.code.startswith("constexpr int SHIFT = -3;\nconstexpr int BLOCK = 128;\n")


@pytest.mark.parametrize("line, fragment", [
    ("", "names nothing"),
    ("BLOCK 256", "not NAME=integer"),
    ("BLOCK=256 BATCHES=4", "separated by commas"),
    ("BLOCK=256,, BATCHES=4", "not NAME=integer"),
    ("BLOCK=256;", "not a decimal integer"),
    ("BLOCK=2.5e2", "not a decimal integer"),
    ("BLOCK=0x100", "not a decimal integer"),
    ("BLOCK=0256", "not a decimal integer"),
    ("BLOCK=+256", "not a decimal integer"),
    ("BLOCK=1_000", "not a decimal integer"),
    ("BLOCK=2147483648", "does not fit"),
    ("BLOCK=-2147483649", "does not fit"),
    ("BLOCK=" + "1" * 5000, "does not fit"),  # past int()'s 4300 digits: a ValueError, once an internal_error
    ("BLOCK=-" + "9" * 12, "does not fit"),
    ("BLOCK=256, BLOCK=128", "twice"),
    (", ".join(f"P{i}={i}" for i in range(MAX_PARAMS + 1)), "at most 8"),
    ("nnz=4", "contract variable"),
    ("row_ptr=4", "contract variable"),
    ("coo_nnz=4", "contract variable"),
    ("R=4", "contract variable"),
    ("num_sms=4", "contract variable"),
    ("spmv_kernel=1", "contract variable"),
    ("ceil_div=1", "contract variable"),
    ("threadIdx=1", "keyword or built-in"),
    ("warpSize=16", "keyword or built-in"),
    ("int=1", "keyword or built-in"),
    ("float4=1", "keyword or built-in"),
    ("printf=1", "keyword or built-in"),
    ("_BLOCK=1", "underscore"),
    ("BLÖCK=1", "not NAME=integer"),
])
def test_bad_params_lines_are_one_line_contract_errors(line: str, fragment: str) -> None:
    """Each case is also what the harness answers, one line, as a contract_error."""
    with pytest.raises(ContractError, match=fragment) as err:
        parse_params_line(line)
    assert "\n" not in str(err.value)
    got = extract(csr(HONEST, head=f"FORMAT: CSR\nPARAMS: {line}\nLAUNCH: grid=ceil_div(m, 256), block=256\n"),
                  Op.SPMV)
    assert isinstance(got, ExtractError) and got.kind == "contract_error" and fragment in got.message
    assert "\n" not in got.message


def test_exactly_eight_names_are_allowed() -> None:
    assert len(parse_params_line(", ".join(f"P{i}={i}" for i in range(MAX_PARAMS)))) == MAX_PARAMS


@pytest.mark.parametrize("lines, fragment", [
    (["FORMAT: CSR", "LAUNCH: grid=1, block=1", "PARAMS: A=1"], "at most one PARAMS line, right after"),
    (["FORMAT: CSR", "PARAMS: A=1", "PARAMS: B=1", "LAUNCH: grid=1, block=1"], "at most one PARAMS line"),
    (["PARAMS: A=1", "FORMAT: CSR", "LAUNCH: grid=1, block=1"], "first header line"),
    (["FORMAT: CSR", "PARAMS: A=1"], "no LAUNCH"),
    (["FORMAT: CSR", "PARAMS: BLOCK=1", "LAUNCH: grid=ceil_div(m, BLOK), block=1"], "uses BLOK"),
])
def test_params_line_placement(lines: list[str], fragment: str) -> None:
    with pytest.raises(ContractError, match=fragment):
        parse_header(lines, Op.SPMV)


def test_contract_names_cover_every_format_argument_and_launch_variable() -> None:
    """Written out by hand from docs/contract.md, so a format that gains an argument without the
    reserved names following it fails here."""
    expected = {"m", "n", "nnz", "k", "x", "y", "X", "Y", "row_ptr", "col_idx", "val", "row_idx", "width",
                "num_slices", "slice_ptr", "row_perm", "C", "sigma", "num_diags", "offsets", "R", "mb", "nb", "nnzb",
                "block_row_ptr", "block_col_idx", "block_val", "coo_nnz", "ell_col_idx", "ell_val", "coo_row_idx",
                "coo_col_idx", "coo_val", "num_sms"}
    assert expected <= contract_names()
    for name in expected:
        with pytest.raises(ContractError, match="contract variable"):
            parse_params_line(f"{name}=1")


def test_with_a_params_line_the_format_parameters_are_constants_too() -> None:
    """FORMAT: BSR R=2 C=4 gives the code R and C (the block shape is written once, on the FORMAT line);
    SELL's default sigma is filled in; without a PARAMS line nothing is added."""
    bsr = parse_header(["FORMAT: BSR R=2 C=4", "PARAMS: G=8, BLOCK=128", "LAUNCH: grid=ceil_div(mb, BLOCK / G), block=BLOCK"],
                       Op.SPMV)
    assert bsr.prelude() == ("constexpr int R = 2;\nconstexpr int C = 4;\nconstexpr int G = 8;\n"
                             "constexpr int BLOCK = 128;\n")
    sell = parse_header(["FORMAT: SELL C=8", "PARAMS: BLOCK=64", "LAUNCH: grid=ceil_div(num_slices * C, BLOCK), block=BLOCK"],
                        Op.SPMV)
    assert sell.prelude() == "constexpr int C = 8;\nconstexpr int sigma = 1;\nconstexpr int BLOCK = 64;\n"
    plain = parse_header(["FORMAT: BSR R=2 C=4", "LAUNCH: grid=mb, block=32"], Op.SPMV)
    assert plain.prelude() == "" and plain.source("code\n") == "code\n"
