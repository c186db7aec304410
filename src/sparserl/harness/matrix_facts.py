"""Facts of the matrix a kernel may name instead of spelling: the harness writes their definitions.

A specialised kernel bakes a few structural facts of its matrix into its code (the diagonal offsets, the one
row length, the blocks per block row) so that the compiler unrolls and folds them. Spelled out, they are numbers
a policy must copy from the matrix card, and a policy that copies from memory writes another matrix's (the
results of 2026-12-06, policy-full-preset-t0.7: 28 of the families' 36 failures). Named, the code is one text for
every matrix. The names (:data:`FACTS`):

* ``MATRIX_DIA_RUNS``: ``__device__ constexpr int MATRIX_DIA_RUNS[]``, the diagonal offsets (column - row) as
  the card lists them, ascending, first and last of each run (a single offset twice); the matrix's card must
  list its offsets (at most ``MAX_CARD_DIAGONALS`` diagonals);
* ``MATRIX_ROW_LEN``: ``constexpr int``, the length of every row, when all rows have one length;
* ``MATRIX_BLOCK_ROW_LEN``: ``constexpr int``, the blocks in every block row, when every block row of the card's
  block shape holds the same number; only under ``FORMAT: BSR`` with that shape (another shape's blocks are
  counted differently);
* ``MATRIX_LONG_ROWS``: ``__constant__ int MATRIX_LONG_ROWS[]``, the rows longer than the kernel's ``LONG_LEN``
  (a PARAMS name), ascending; at least one, and the card must list them all;
* ``MATRIX_LONG_ROW_COUNT``: ``constexpr int``, how many rows are longer than ``LONG_LEN`` (0 allowed).

Where a completion's code names one (an identifier outside comments), :func:`materialise` puts its definition
between the header and the code, from the matrix the harness is about to verify on, and the completion is then
judged as if written so; a name the matrix has no value for is a contract error, one line. The single integers
(:data:`~sparserl.kernels.contract.LAUNCH_FACT_NAMES`) may be read by a LAUNCH expression too (the grid of a
kernel with a block per long row): their values are written into the LAUNCH line in the same step. A completion
that names none is unchanged (compiled as written, its compile cache shared across matrices). A kernel saved for a
user is the materialised text, so it stands alone.
"""

from __future__ import annotations

import re
from typing import Callable

from sparserl.errors import ContractError
from sparserl.harness.extract import Extracted, ExtractError, extract
from sparserl.harness.source import SourceError, splice, strip_comments
from sparserl.kernels.contract import LAUNCH_FACT_NAMES, MATRIX_FACT_NAMES, Header, header_line
from sparserl.matrices.card import MatrixCard, offset_runs


def _runs(card: MatrixCard, header: Header) -> str:
    if card.dia_offsets is None:
        raise ContractError(f"MATRIX_DIA_RUNS: this matrix's card lists no diagonal offsets "
                            f"({card.num_diagonals} diagonals)")
    runs = ", ".join(f"{a}, {b}" for a, b in offset_runs(card.dia_offsets))
    return f"__device__ constexpr int MATRIX_DIA_RUNS[] = {{{runs}}};"


def _row_len_value(card: MatrixCard, header: Header) -> int:
    if card.row_len_min != card.row_len_max:
        raise ContractError(f"MATRIX_ROW_LEN: this matrix's rows differ in length "
                            f"({card.row_len_min} to {card.row_len_max})")
    return card.row_len_max


def _block_row_len_value(card: MatrixCard, header: Header) -> int:
    if card.block_shape is None or card.block_row_len is None:
        raise ContractError("MATRIX_BLOCK_ROW_LEN: this matrix's block rows do not all hold the same number of "
                            f"blocks (block shape {card.block_shape})")
    shape = (header.params.get("R"), header.params.get("C"))
    if header.format != "BSR" or shape != card.block_shape:
        r, c = card.block_shape
        raise ContractError(f"MATRIX_BLOCK_ROW_LEN counts blocks of {r}x{c}: write it under FORMAT: BSR R={r} C={c}")
    return card.block_row_len


def _long_rows_of(name: str, card: MatrixCard, header: Header) -> tuple[int, ...]:
    """The rows longer than the header's LONG_LEN, ascending (the card must list them all)."""
    long_len = header.constants.get("LONG_LEN")
    if long_len is None:
        raise ContractError(f"{name} counts the rows longer than the kernel's LONG_LEN: give LONG_LEN in PARAMS")
    listed = card.rows_longer_than(long_len)
    if listed is None:
        raise ContractError(f"{name}: this matrix's card lists only the rows of length {card.long_rows_min} or "
                            f"more, not every row longer than LONG_LEN={long_len}")
    return tuple(sorted(r for r, _ in listed))


def _long_row_count_value(card: MatrixCard, header: Header) -> int:
    return len(_long_rows_of("MATRIX_LONG_ROW_COUNT", card, header))


def _long_rows(card: MatrixCard, header: Header) -> str:
    rows = _long_rows_of("MATRIX_LONG_ROWS", card, header)
    if not rows:
        raise ContractError(f"MATRIX_LONG_ROWS: no row of this matrix is longer than LONG_LEN="
                            f"{header.constants['LONG_LEN']} (longest {card.row_len_max}), and a table needs one")
    return f"__constant__ int MATRIX_LONG_ROWS[{len(rows)}] = {{{', '.join(map(str, rows))}}};"


VALUES: dict[str, Callable[[MatrixCard, Header], int]] = {
    "MATRIX_ROW_LEN": _row_len_value, "MATRIX_BLOCK_ROW_LEN": _block_row_len_value,
    "MATRIX_LONG_ROW_COUNT": _long_row_count_value}
"""The facts that are one integer -> their value for a card (a LAUNCH expression may read these)."""
assert tuple(VALUES) == LAUNCH_FACT_NAMES


def _constexpr(name: str) -> Callable[[MatrixCard, Header], str]:
    return lambda card, header: f"constexpr int {name} = {VALUES[name](card, header)};"


FACTS: dict[str, Callable[[MatrixCard, Header], str]] = {
    "MATRIX_DIA_RUNS": _runs, "MATRIX_ROW_LEN": _constexpr("MATRIX_ROW_LEN"),
    "MATRIX_BLOCK_ROW_LEN": _constexpr("MATRIX_BLOCK_ROW_LEN"), "MATRIX_LONG_ROWS": _long_rows,
    "MATRIX_LONG_ROW_COUNT": _constexpr("MATRIX_LONG_ROW_COUNT")}
"""Each name a kernel may use for its matrix's facts -> its C declaration for a card (or a :class:`ContractError`
saying why the card gives it no value), in the order their definitions are written (the contract's
:data:`~sparserl.kernels.contract.MATRIX_FACT_NAMES`, which no PARAMS name may take)."""
assert tuple(FACTS) == MATRIX_FACT_NAMES

_NAME = re.compile(r"\b(" + "|".join(FACTS) + r")\b")
_DECLARED = re.compile(r"(?:\bconstexpr\s+int\s+|\b__constant__\s+int\s+|#\s*define\s+)("
                       + "|".join(FACTS) + r")\b")


def named_facts(code: str) -> list[str]:
    """The facts ``code`` names (as identifiers outside comments) and does not declare itself (``constexpr int
    NAME``, ``__constant__ int NAME`` or ``#define NAME``: a materialised text, or a kernel that spells a fact its
    own way), in :data:`FACTS`' order; [] when none (or when the code cannot be read, which the static check then
    reports). A name inside a string literal counts as named (a definition the kernel does not use, or a contract
    error: never a pass)."""
    try:
        code = strip_comments(splice(code))
    except SourceError:
        return []
    seen = set(_NAME.findall(code)) - set(_DECLARED.findall(code))  # a name the code declares is its own
    return [name for name in FACTS if name in seen]


def definitions(names: list[str], card: MatrixCard, header: Header) -> str:
    """The definition lines of ``names`` for ``card`` (raises :class:`ContractError` for a name without a value)."""
    return "".join(FACTS[n](card, header) + "\n" for n in names)


Card = MatrixCard | Callable[[], MatrixCard | None] | None
"""The matrix's card, or a function that makes it (called only when a fact is named)."""


def launch_facts(header: Header) -> list[str]:
    """The facts the header's LAUNCH expressions read, in :data:`VALUES`' order."""
    seen = frozenset().union(*(launch.names for launch in header.launches))
    return [name for name in VALUES if name in seen]


def _launch_values(head: str, values: dict[str, int]) -> str:
    """``head`` (the header lines as written) with each name of ``values`` in its LAUNCH lines written as its value."""
    name = re.compile(r"\b(" + "|".join(values) + r")\b")
    lines = head.split("\n")  # as extract splits lines (not at form feeds or other breaks str.splitlines knows)
    for i, line in enumerate(lines):
        got = header_line(line.strip())
        if got is not None and got[0] == "LAUNCH":
            lines[i] = name.sub(lambda m: str(values[m.group(1)]), line)
    return "\n".join(lines)


def with_facts(ex: Extracted, card: Card) -> str | None:
    """The completion ``ex`` (extracted) with the definitions of the facts its code names written between its
    header and its code, and the values of those its LAUNCH lines read written into them; None when it names
    none. Raises :class:`ContractError` when a named fact has no value for the card (or there is no card)."""
    names, in_launch = named_facts(ex.body), launch_facts(ex.header)
    if not names and not in_launch:
        return None
    card = card() if callable(card) else card
    if card is None:
        named = names + [n for n in in_launch if n not in names]
        raise ContractError(f"{', '.join(named)}: a matrix's facts need the matrix (none given)")
    head = ex.text[:len(ex.text) - len(ex.body)]
    if in_launch:
        head = _launch_values(head, {n: VALUES[n](card, ex.header) for n in in_launch})
    return head + definitions(names, card, ex.header) + ex.body


def extract_with_facts(ex: Extracted, op, card: Card) -> Extracted | ExtractError:
    """``ex`` as the harness judges it: extracted again with :func:`with_facts`'s definitions written in, or ``ex``
    itself when its code names no fact; an :class:`ExtractError` when the definitions take the text over the length
    limit. Raises :class:`ContractError` as :func:`with_facts` does, and when the text written out reads otherwise
    than ``ex`` (code whose first lines are header lines, which a fence or the text between kept apart: the
    completion must be judged as what it is)."""
    named = with_facts(ex, card)
    if named is None:
        return ex
    got = extract(named, op)
    if isinstance(got, Extracted) and (len(got.header.launches) != len(ex.header.launches)
                                       or not got.body.endswith(ex.body)):
        raise ContractError("the code after the header begins with a header line (FORMAT:, PARAMS: or LAUNCH:), "
                            "which would read as the header's once the matrix's facts are written in: start the "
                            "code with code")
    return got


def materialise(text: str, op, card: Card) -> str:
    """:func:`with_facts` of a completion's text: the text itself when it names no fact, or cannot be read
    (the harness then says why)."""
    ex = extract(text, op)
    got = with_facts(ex, card) if isinstance(ex, Extracted) else None
    return text if got is None else got
