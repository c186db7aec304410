"""Where a sampled kernel comes from, against the reference library (pure functions).

A policy taught on the library's kernels writes, for each sample, one of three things:

* ``library``: one of the library's variants exactly (header and body);
* ``mismatch``: a library variant's body under the FORMAT/LAUNCH header of another variant. The
  two disagree on a parameter the body bakes in (a block shape, the rows a block handles, the
  batches a warp scans), so the launch covers the wrong rows or the body reads the wrong layout;
* ``new``: a body the library does not have: a specialised or mutated kernel, or a garbled one.

Counting a system's samples by class, with the correct share of each, tells whether its
incorrect samples are mismatched library parts or new code. Bodies are compared with their
whitespace collapsed; nothing is compiled or run.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from sparserl.kernels.contract import Op

HEADER_KEYS = ("FORMAT:", "LAUNCH:")


class Provenance(str, Enum):
    LIBRARY = "library"
    MISMATCH = "mismatch"
    NEW = "new"


DESCRIPTION = {
    Provenance.LIBRARY: "a library variant exactly",
    Provenance.MISMATCH: "a library body under another variant's FORMAT/LAUNCH header",
    Provenance.NEW: "a body the library does not have",
}


def split_completion(text: str) -> tuple[tuple[str, ...], str]:
    """(the FORMAT/LAUNCH lines, stripped; the rest with its whitespace collapsed)."""
    head, body = [], []
    for line in text.splitlines():
        (head if line.lstrip().startswith(HEADER_KEYS) else body).append(line)
    return tuple(h.strip() for h in head), re.sub(r"\s+", " ", "\n".join(body)).strip()


@lru_cache(maxsize=4)
def _library(op: Op) -> tuple[dict[str, frozenset[tuple[str, ...]]], frozenset[tuple[str, ...]]]:
    """Library bodies of ``op`` -> the headers they come with; and every header of ``op``."""
    from sparserl.kernels.library import variants

    bodies: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for v in variants(op):
        head, body = split_completion(v.render())
        bodies[body].add(head)
    return {b: frozenset(h) for b, h in bodies.items()}, frozenset(h for hs in bodies.values() for h in hs)


def provenance(text: str, op: Op | str) -> Provenance:
    """The class of one completion (see the module docstring)."""
    head, body = split_completion(text)
    bodies, _ = _library(Op(op))
    heads = bodies.get(body)
    if heads is None:
        return Provenance.NEW
    return Provenance.LIBRARY if head in heads else Provenance.MISMATCH


@dataclass(frozen=True)
class ClassCount:
    samples: int
    correct: int


def provenance_table(samples: Iterable[tuple[str, str, bool]], op: Op | str) -> dict[str, dict[str, dict]]:
    """Per system, per class: how many samples and how many of them correct.

    ``samples`` are (system, completion, correct) triples; every class appears for every system
    (zeros included), so tables of different runs line up."""
    counts: dict[str, dict[Provenance, list[int]]] = defaultdict(lambda: {c: [0, 0] for c in Provenance})
    for system, text, correct in samples:
        c = counts[system][provenance(text, op)]
        c[0] += 1
        c[1] += bool(correct)
    return {s: {c.value: {"samples": n, "correct": k} for c, (n, k) in by.items()} for s, by in counts.items()}


def markdown(table: dict[str, dict[str, dict]]) -> list[str]:
    """The table as markdown lines: samples and correct share of each class, per system."""
    if not table:
        return []
    cols = [c for c in Provenance]
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
    """``{CLASS}_share`` of one system's samples (from :func:`provenance_table`); {} when it drew none."""
    total = sum(v["samples"] for v in (by_class or {}).values())
    if not total:
        return {}
    return {f"{c.value}_share": by_class.get(c.value, {"samples": 0})["samples"] / total for c in Provenance}
