"""How a sampled kernel relates to the reference library (pure functions).

A policy taught on the library's kernels writes, for each sample, one of three things:

* ``library``: one of the library's variants exactly (header and body);
* ``mismatch``: a library variant's body under the FORMAT/LAUNCH header of another variant. The
  two disagree on a parameter the body bakes in (a block shape, the rows a block handles, the
  batches a warp scans), so the launch covers the wrong rows or the body reads the wrong layout;
* ``new``: a body the library does not have: a specialised or mutated kernel, or a garbled one.

Counting a system's samples by class, with the correct share of each, tells whether its
incorrect samples are mismatched library parts or new code. A completion is read as the harness
reads it (:func:`sparserl.harness.extract.extract`: fences, chatter and markdown dropped, the header
parsed and rendered back with its format parameters' defaults filled in); bodies are compared
with their whitespace collapsed. A completion the harness cannot extract is ``new``. Nothing is
compiled or run.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from enum import Enum
from functools import lru_cache

from sparserl.harness.extract import Extracted, extract
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants


class LibraryMatch(str, Enum):
    """What a completion is, against the library (see the module docstring)."""

    LIBRARY = "library"
    MISMATCH = "mismatch"
    NEW = "new"


DESCRIPTION = {
    LibraryMatch.LIBRARY: "a library variant exactly",
    LibraryMatch.MISMATCH: "a library body under another variant's FORMAT/LAUNCH header",
    LibraryMatch.NEW: "a body the library does not have",
}


def _parts(text: str, op: Op) -> tuple[str, str] | None:
    """(the header as the contract renders it, the code with its whitespace collapsed), or None
    when the harness would find no completion in ``text``."""
    got = extract(text, op)
    if not isinstance(got, Extracted):
        return None
    return got.header.render(), re.sub(r"\s+", " ", got.code).strip()


@lru_cache(maxsize=4)
def _library(op: Op) -> dict[str, frozenset[str]]:
    """Library bodies of ``op`` -> the headers they come with."""
    bodies: dict[str, set[str]] = defaultdict(set)
    for v in variants(op):
        head, body = _parts(v.render(), op)
        bodies[body].add(head)
    return {b: frozenset(h) for b, h in bodies.items()}


def library_match(text: str, op: Op | str) -> LibraryMatch:
    """The class of one completion (see the module docstring)."""
    op = Op(op)
    parts = _parts(text, op)
    heads = _library(op).get(parts[1]) if parts else None
    if heads is None:
        return LibraryMatch.NEW
    return LibraryMatch.LIBRARY if parts[0] in heads else LibraryMatch.MISMATCH


def library_match_table(samples: Iterable[tuple[str, str, bool]], op: Op | str) -> dict[str, dict[str, dict]]:
    """Per system, per class: how many samples and how many of them correct.

    ``samples`` are (system, completion, correct) triples; every class appears for every system
    (zeros included), so tables of different runs line up."""
    counts: dict[str, dict[LibraryMatch, list[int]]] = defaultdict(lambda: {c: [0, 0] for c in LibraryMatch})
    for system, text, correct in samples:
        c = counts[system][library_match(text, op)]
        c[0] += 1
        c[1] += bool(correct)
    return {s: {c.value: {"samples": n, "correct": k} for c, (n, k) in by.items()} for s, by in counts.items()}


def markdown(table: dict[str, dict[str, dict]]) -> list[str]:
    """The table as markdown lines: samples and correct share of each class, per system."""
    if not table:
        return []
    cols = [c for c in LibraryMatch]
    lines = ["## Samples against the library", "",
             "Each sample is " + "; ".join(f"*{c.value}*: {DESCRIPTION[c]}" for c in cols)
             + ". Cells: samples (share of the system's samples), correct share among them.", "",
             "| system | " + " | ".join(c.value for c in cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for system, by in table.items():
        total = sum(v["samples"] for v in by.values()) or 1
        cells = []
        for c in cols:
            n, k = by[c.value]["samples"], by[c.value]["correct"]
            cells.append(f"{n} ({100 * n / total:.0f}%), {100 * k / n:.0f}% correct" if n else "0")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return lines


def shares(by_class: dict[str, dict] | None) -> dict[str, float]:
    """``{CLASS}_share`` of one system's samples (from :func:`library_match_table`); {} when it drew none."""
    total = sum(v["samples"] for v in (by_class or {}).values())
    if not total:
        return {}
    return {f"{c.value}_share": by_class.get(c.value, {"samples": 0})["samples"] / total for c in LibraryMatch}
