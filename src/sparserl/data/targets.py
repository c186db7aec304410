"""What the policy is taught to write: a kernel's text without its comments.

The library's and the templates' kernels explain themselves in ``//`` comments, about a fifth of their
tokens (772 of the 3818 of a ``csr_adaptive_spec`` kernel in the base model's tokens, 500 of the 2878
of the longest library kernel). A policy that copies them spends that share of every sample on text the
compiler drops, and the longest specialised kernels no longer fit its positions with a prompt in front.
SFT's targets are therefore the kernels without comments (:func:`without_comments`); the comments stay
in the library, the templates, the pre-training corpus and the prompts (a refinement prompt shows its
parent kernel as written). The library match (:mod:`sparserl.eval.library_match`) compares bodies
without comments on both sides, so a sample is a library body whether or not it kept them.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from sparserl.harness.source import SourceError, strip_comments

Row = TypeVar("Row")


def without_comments(code: str) -> str:
    """``code`` with its ``//`` and ``/* */`` comments removed: a line that held only a comment goes, a
    line that ends in one keeps its code (trailing spaces dropped); string literals and every other line
    stay as written. Text whose comments cannot be told apart (an unterminated ``/*``) is returned as it is:
    the harness judges it as written."""
    if "//" not in code and "/*" not in code:  # nothing to remove (what a policy taught this way writes)
        return code
    try:
        stripped = strip_comments(code)
    except SourceError:
        return code
    originals, lines = code.split("\n"), stripped.split("\n")
    if len(originals) != len(lines):  # strip_comments keeps every line; anything else: leave the text alone
        return code
    out = [s.rstrip() for o, s in zip(originals, lines) if s.strip() or not o.strip()]
    return "\n".join(out)


def taught_length(code: str) -> int:
    """Characters of ``code`` as the policy is taught it (:func:`without_comments`): what a length
    limit on the teacher (``best export --max-chars``, ``data build --max-target-chars``) measures."""
    return len(without_comments(code))


def taught_rows(rows: list[Row]) -> list[Row]:
    """SFT rows (dataclasses with a ``code``) with each code as the policy is taught it (:func:`without_comments`),
    each distinct code stripped once: the rows a fine-tune trains on."""
    bare: dict[str, str] = {}
    for r in rows:
        if r.code not in bare:
            bare[r.code] = without_comments(r.code)
    return [dataclasses.replace(r, code=bare[r.code]) for r in rows]
