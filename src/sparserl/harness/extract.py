"""Pull a contract completion out of what a language model actually wrote.

Models wrap code in markdown fences, talk before and after it, and sometimes start a
second answer. The rules, in order:

1. Lines that are only a markdown fence (```` ``` ```` or ```` ```cuda ````) are fences.
2. Everything before the first ``FORMAT:`` line is chatter and is dropped.
3. The header is that line plus the ``PARAMS:`` and ``LAUNCH:`` lines right after it (blank lines
   allowed).
4. The code runs from there to the first fence after the header, or to a second
   ``FORMAT:`` line, or to the end of the text.

The result is an :class:`Extracted` value or an :class:`ExtractError` value (never an
exception), so the harness can turn either into an :class:`~sparserl.harness.result.EvalResult`.
Its ``code`` is the source the compiler and the checks see: the ``constexpr`` lines of a
``PARAMS:`` line, then the code as written (``body``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparserl.errors import ContractError
from sparserl.kernels.contract import Header, Op, header_line, parse_header

_FENCE = re.compile(r"^\s*```[\w+-]*\s*$")

MAX_COMPLETION_CHARS = 64_000


@dataclass(frozen=True)
class Extracted:
    header: Header
    code: str
    """The source the compiler sees: the PARAMS prelude (:meth:`Header.source`), then ``body``."""
    text: str
    """The clean completion: header lines and code, as a model should have written it."""
    body: str
    """The code as written, after the header."""


@dataclass(frozen=True)
class ExtractError:
    kind: str  # "extract_error" (nothing usable) or "contract_error" (header breaks the contract)
    message: str


def _kind(line: str) -> str | None:
    got = header_line(line)
    return got[0] if got else None


def _clean(line: str) -> str:
    """A header line without markdown decoration (``**FORMAT:** CSR`` -> ``FORMAT: CSR``)."""
    kind, body = header_line(line)
    return f"{kind}: {body}"


def extract(text: str, op: Op) -> Extracted | ExtractError:
    """Find the header and the code in ``text``."""
    if len(text) > MAX_COMPLETION_CHARS:
        return ExtractError("extract_error", f"completion longer than {MAX_COMPLETION_CHARS} characters")
    lines = text.replace("\r\n", "\n").split("\n")
    start = next((i for i, l in enumerate(lines) if _kind(l) == "FORMAT"), None)
    if start is None:
        return ExtractError("extract_error", "no 'FORMAT:' line found")
    header_lines = [_clean(lines[start])]
    i = start + 1
    while i < len(lines):
        line = lines[i]
        if _kind(line) in ("PARAMS", "LAUNCH"):
            header_lines.append(_clean(line))
        elif line.strip() and not _FENCE.match(line):
            break
        elif _FENCE.match(line) and len(header_lines) > 1:
            # a fence right after the LAUNCH lines opens the code block
            i += 1
            break
        i += 1
    code_lines = []
    for line in lines[i:]:
        if _FENCE.match(line) or _kind(line) == "FORMAT":
            break
        code_lines.append(line)
    code = "\n".join(code_lines).strip("\n")
    try:
        header = parse_header(header_lines, op)
    except ContractError as exc:
        return ExtractError("contract_error", str(exc))
    if not code.strip():
        return ExtractError("extract_error", "no CUDA code after the header")
    return Extracted(header, header.source(code + "\n"), "\n".join(header_lines) + "\n" + code + "\n", code + "\n")
