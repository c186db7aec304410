"""The contract's edges: each limit at and past its value, the messages a policy and a user read in full, and the
parts of a completion around its header. Written from what mutation testing of ``kernels/contract.py`` let
through (docs/testing.md): each test names the mutations it kills."""

from __future__ import annotations

import pytest

from sparserl.errors import ContractError
from sparserl.kernels.contract import (
    MAX_GRID,
    MAX_SMEM_BYTES,
    PARAM_MAX,
    PARAM_MIN,
    Header,
    Op,
    evaluate_launches,
    header_line,
    parse_format_line,
    parse_header,
    parse_launch_line,
    parse_params_line,
    render_params_line,
    signature,
    split_completion,
)

ENV = {"m": 1000, "n": 1000, "nnz": 5000, "num_sms": 132}
LONG = "x" * 80


@pytest.mark.parametrize("make, message", [
    (lambda: parse_params_line("  "),
     "PARAMS line names nothing; write PARAMS: NAME=integer, ... or leave the line out"),
    (lambda: parse_header(["FORMAT: CSR C=4", "LAUNCH: grid=1, block=1"], Op.SPMV),
     "CSR has no parameter 'C'; its parameters are: none"),
    (lambda: parse_header(["FORMAT: BSR Q=4", "LAUNCH: grid=1, block=1"], Op.SPMV),
     "BSR has no parameter 'Q'; its parameters are: R, C"),
    (lambda: parse_header(["FORMAT: BSR R=0 C=4", "LAUNCH: grid=1, block=1"], Op.SPMV),
     "BSR parameter R=0 is out of range [1, 64]"),
    (lambda: parse_header(["FORMAT: BSR R=64 C=32", "LAUNCH: grid=1, block=1"], Op.SPMV),
     "BSR block R*C must be at most 1024 entries"),
    (lambda: parse_header(["FORMAT: JDS", "LAUNCH: grid=1, block=1"], Op.SPMV),
     "unknown format 'JDS'; formats are: CSR, COO, ELL, SELL, DIA, BSR, HYB"),
    (lambda: parse_format_line(" "), "FORMAT: line names no format"),
    (lambda: parse_format_line("BSR R==4"), "FORMAT parameter R='=4' is not an integer"),
    (lambda: parse_format_line("BSR =4"), "FORMAT parameter '=4' is not key=value"),
    (lambda: parse_launch_line("grid=(m)), block=1"), "unbalanced parentheses in LAUNCH line 'grid=(m)), block=1'"),
    (lambda: parse_launch_line("grid=1, block"), "LAUNCH field 'block' is not key=value"),
    (lambda: parse_launch_line("grid=1, block=1, stream=a=b"),
     "unknown LAUNCH field 'stream' (fields: grid, block, smem, kernel)"),
    (lambda: parse_launch_line("grid=1, block=1, grid=2"), "LAUNCH field grid given twice"),
    (lambda: parse_launch_line("grid=(1, 2, 3, 4), block=1"), "grid has more than 3 dimensions: '(1, 2, 3, 4)'"),
    (lambda: parse_launch_line("grid=1, block=(1, 2, 3, 4)"), "block has more than 3 dimensions: '(1, 2, 3, 4)'"),
    (lambda: parse_header([], Op.SPMV), "completion has no FORMAT: line"),
    (lambda: parse_header([f"LAUNCH: grid=1, block=1 // {LONG}"], Op.SPMV),
     "first header line must be 'FORMAT: ...', got " + repr(f"LAUNCH: grid=1, block=1 // {LONG}"[:60])),
    (lambda: parse_header(["FORMAT: CSR", "PARAMS: A=1", "PARAMS: B=1", "LAUNCH: grid=1, block=1"], Op.SPMV),
     "a completion has at most one PARAMS line, right after the FORMAT line"),
    (lambda: parse_header(["FORMAT: CSR", "LAUNCH: grid=1, block=1", f"// {LONG}"], Op.SPMV),
     "expected a 'LAUNCH: ...' line, got " + repr(f"// {LONG}"[:60])),
    (lambda: parse_header(["FORMAT: CSR"], Op.SPMV), "completion has no LAUNCH: line"),
    (lambda: parse_header(["FORMAT: ELL", "PARAMS: B=2", "LAUNCH: grid=ceil_div(Q, P), block=B"], Op.SPMV),
     "LAUNCH expression 'ceil_div(Q, P)' uses P, Q; for spmv ELL the names are: B, m, n, nnz, num_sms, width, "
     "and the matrix's facts MATRIX_ROW_LEN, MATRIX_BLOCK_ROW_LEN, MATRIX_LONG_ROW_COUNT"),
])
def test_messages_in_full(make, message: str) -> None:
    """What a refinement prompt shows the policy and what a user reads, word for word. Kills: a message
    emptied, changed in case or wording, a list joined otherwise, the quoted line cut at another length, the
    FORMAT name left out of a range message, a dimension named otherwise, '=' split at its last occurrence."""
    with pytest.raises(ContractError) as err:
        make()
    assert str(err.value) == message


def test_params_values_reach_both_ends_of_a_c_int() -> None:
    """Kills: either bound of the int range made exclusive."""
    assert parse_params_line(f"LO={PARAM_MIN}, HI={PARAM_MAX}") == {"LO": PARAM_MIN, "HI": PARAM_MAX}
    for bad in (PARAM_MIN - 1, PARAM_MAX + 1):
        with pytest.raises(ContractError, match="does not fit a C int"):
            parse_params_line(f"V={bad}")


def test_format_line_spelling() -> None:
    """Commas between FORMAT parameters, any case of their names (given in the format's own spelling), and a
    value in backticks. Kills: commas kept as part of a token, the name matched in one case only, an unknown
    name's canonical form lost, the backticks kept."""
    assert parse_format_line("BSR R=8, C=2") == ("BSR", {"R": 8, "C": 2})
    assert parse_format_line("bsr r=8 c=2") == ("BSR", {"R": 8, "C": 2})
    assert parse_format_line("sell c=16 SIGMA=32") == ("SELL", {"C": 16, "sigma": 32})
    assert header_line("FORMAT: `CSR`") == ("FORMAT", "CSR")
    assert header_line("LAUNCH: grid=1, block=32, kernel=fixX") == ("LAUNCH", "grid=1, block=32, kernel=fixX")
    with pytest.raises(ContractError, match="BSR has no parameter 'Q'"):
        parse_format_line("BSR Q=4")


def test_bsr_block_of_exactly_1024_entries() -> None:
    """Kills: the R*C limit made exclusive or moved up by one."""
    assert parse_format_line("BSR R=32 C=32")[1] == {"R": 32, "C": 32}
    for r, c in ((64, 17), (41, 25)):  # 1088 and 1025 entries, each side within [1, 64]
        with pytest.raises(ContractError, match="at most 1024"):
            parse_format_line(f"BSR R={r} C={c}")


def test_launch_line_skips_empty_fields() -> None:
    """A doubled or trailing comma leaves an empty field, skipped. Kills: the first empty field ending the line
    (block then missing)."""
    spec = parse_launch_line("grid=1,, block=32,")
    assert [e.text for e in spec.block] == ["32"]


def test_launch_names_follow_the_op_and_cover_smem() -> None:
    """``k`` is a LAUNCH name for SpMM only, through parse_header and split_completion; smem's names are checked
    like grid's. Kills: the op not passed on, smem's expression left out of the check."""
    lines = ["FORMAT: CSR", "LAUNCH: grid=ceil_div(m * k, 256), block=256"]
    assert parse_header(lines, Op.SPMM).launches[0].grid[0].names == {"m", "k"}
    with pytest.raises(ContractError, match="uses k"):
        parse_header(lines, Op.SPMV)
    split_completion("\n".join(lines) + "\n__global__ void f() {}\n", Op.SPMM)
    with pytest.raises(ContractError, match="uses k"):
        split_completion("\n".join(lines) + "\n__global__ void f() {}\n", Op.SPMV)
    with pytest.raises(ContractError, match="uses foo"):
        parse_header(["FORMAT: CSR", "LAUNCH: grid=1, block=32, smem=4 * foo"], Op.SPMV)


def test_exactly_four_launch_lines_are_allowed() -> None:
    """Kills: the limit of four LAUNCH lines made exclusive."""
    assert len(parse_header(["FORMAT: CSR"] + ["LAUNCH: grid=1, block=1"] * 4, Op.SPMV).launches) == 4


@pytest.mark.parametrize("launch, ok", [
    (f"grid={MAX_GRID[0]}, block=32", True),
    (f"grid=({MAX_GRID[0]}, {MAX_GRID[1]}, {MAX_GRID[2]}), block=32", True),
    (f"grid={MAX_GRID[0] + 1}, block=32", False),
    ("grid=1, block=1024", True),
    ("grid=1, block=1025", False),
    ("grid=1, block=(1, 1, 64)", True),
    ("grid=1, block=(1, 1, 65)", False),
    (f"grid=1, block=32, smem={MAX_SMEM_BYTES}", True),
    (f"grid=1, block=32, smem={MAX_SMEM_BYTES + 1}", False),
])
def test_cuda_limits_at_and_past_their_values(launch: str, ok: bool) -> None:
    """Kills: any of the grid, block, block-z and shared-memory limits made exclusive or moved by one."""
    h = parse_header(["FORMAT: CSR", f"LAUNCH: {launch}"], Op.SPMV)
    if ok:
        assert len(evaluate_launches(h, Op.SPMV, ENV)) == 1
    else:
        with pytest.raises(ContractError):
            evaluate_launches(h, Op.SPMV, ENV)


def test_launch_configs_name_their_kernel_and_default_smem_to_zero() -> None:
    """Kills: smem defaulting to anything but 0, a ``kernel=`` name replaced by the op's default kernel or
    dropped."""
    h = parse_header(["FORMAT: CSR", "LAUNCH: grid=1, block=32", "LAUNCH: grid=2, block=64, kernel=fixup"], Op.SPMV)
    first, second = evaluate_launches(h, Op.SPMV, ENV)
    assert (first.kernel, first.smem) == ("spmv_kernel", 0)
    assert (second.kernel, second.grid, second.block) == ("fixup", (2, 1, 1), (64, 1, 1))


def test_split_completion_around_the_header() -> None:
    """Blank lines before the header, a header with no code after it, and code whose first line is indented and
    whose last ends in X: the code comes back as written, one newline at its end. Kills: the blank-line skip
    resetting its index (two blank lines then loop), reading past the last line, the code stripped of spaces or
    of X's."""
    head = "FORMAT: CSR\nPARAMS: B=4\nLAUNCH: grid=ceil_div(m, B), block=B\n"
    code = "    int a = 0;  \n#define LAST_X\n"
    header, source = split_completion("\n\n\n" + head + code, Op.SPMV)
    assert header.constants == {"B": 4} and source == "constexpr int B = 4;\n" + code
    header, source = split_completion(head.rstrip("\n"), Op.SPMV)
    assert len(header.launches) == 1 and source == "constexpr int B = 4;\n\n"


def test_rendering_params_and_launch_bounds() -> None:
    """Kills: an empty PARAMS mapping rendered as a line, a header's PARAMS line dropped or rendered from
    nothing, ``__launch_bounds__`` left out of a signature that asks for it."""
    assert render_params_line({}) == ""
    h = Header("CSR", {}, parse_header(["FORMAT: CSR", "LAUNCH: grid=1, block=32"], Op.SPMV).launches, {"B": 4})
    assert h.render() == "FORMAT: CSR\nPARAMS: B=4\nLAUNCH: grid=1, block=32"
    assert parse_header(h.render().splitlines(), Op.SPMV) == h
    assert "__launch_bounds__(256) spmv_kernel(" in signature("CSR", Op.SPMV, launch_bounds=256)
    assert "__launch_bounds__" not in signature("CSR", Op.SPMV)
