"""Near-duplicates across the train/held-out boundary: a held-out file whose text the model saw in one
training file, all but a few lines (another copyright year, indentation or line ends, a line added or
taken out).

A text is read as the set of its lines, each stripped of the white space around it (blank lines left
out). A held-out file's similarity to a training file is the share of its lines found in that file
(containment: the part of the held-out text the model has seen there; for a file and its copy with one
line in eight changed, 7/8), and :func:`near_copies` gives each held-out file its largest similarity to
any one training file, exactly (every line compared, no sketch): an index of the held-out files' lines,
then one pass over the training texts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np


def line_ids(text: str, vocab: dict[str, int], fresh: Iterator[int]) -> np.ndarray:
    """The distinct stripped, non-blank lines of ``text`` as numbers, sorted; ``vocab`` numbers the lines
    (filled as texts are read, from ``fresh``: one of each for every text compared)."""
    lines = set(map(str.strip, text.splitlines()))
    lines.discard("")
    return np.sort(np.fromiter(map(vocab.setdefault, lines, fresh), dtype=np.int64, count=len(lines)))


@dataclass(frozen=True)
class Match:
    """A held-out file's closest training file."""

    similarity: float
    """Share of the held-out file's distinct lines found in that training file (0 when none is)."""
    train: int
    """That training file's index (-1 when none shares a line)."""


def near_copies(heldout: list[str], train: Iterable[str]) -> list[Match]:
    """Each held-out text's closest training text (:class:`Match`), exactly."""
    vocab: dict[str, int] = {}
    fresh = itertools.count()
    held = [line_ids(t, vocab, fresh) for t in heldout]
    known = len(vocab)  # a line first met in a training text is in no held-out text
    vals, owner = [], []
    for i, text in enumerate(train):
        ids = line_ids(text, vocab, fresh)
        shared = ids[ids < known]
        vals.append(shared)
        owner.append(np.full(shared.size, i, dtype=np.int64))
    if not vals:
        return [Match(0.0, -1) for _ in held]
    vals_a, owner_a = np.concatenate(vals), np.concatenate(owner)
    order = np.argsort(vals_a, kind="stable")
    vals_a, owner_a = vals_a[order], owner_a[order]
    out = []
    for ids in held:
        lo, hi = np.searchsorted(vals_a, ids, "left"), np.searchsorted(vals_a, ids, "right")
        n = hi - lo
        if not n.any():
            out.append(Match(0.0, -1))
            continue
        # the training files holding each shared line: one slice [lo, hi) of ``owner_a`` per line
        files = owner_a[np.repeat(lo - np.cumsum(n) + n, n) + np.arange(n.sum())]
        counts = np.bincount(files)
        best = int(np.argmax(counts))
        out.append(Match(float(counts[best]) / ids.size, best))
    return out
