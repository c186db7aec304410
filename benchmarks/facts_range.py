"""How many distinct facts blocks can a teacher built on these matrices show its policy?

A specialised template that spells its facts (``csr_adaptive_spec``: SHORT_MAX and the long rows) bakes them,
read off the matrix card, into one block at its top; those that name them (``csr_split_spec``, ``dia_window_spec``,
``csr_lanes_spec``, ``bsr_stream_spec``: ``MATRIX_LONG_ROWS``, ``MATRIX_DIA_RUNS`` and the like, defined by the
harness from the card) have none to vary, one text for every matrix, and are left out (results recorded before
they did were made with the code of their commit). A policy learns to copy the facts from the card only if its teacher's
rows show different blocks for different cards; where every matrix of a family has the same block, writing it
from memory is as good as reading it. This reads folders of generated matrices (``sparserl data build
--matrices-only``) and, per folder, family and template that spells its facts, renders the template at its first
seed point that its check accepts for each matrix's card (as the search's first candidate of that template; the
block read as ``evaluate`` reads a sample's, :func:`sparserl.eval.library_match.baked_facts`) and counts the
distinct blocks: an upper bound on what a teacher from those matrices can show, since it teaches a template only
where the search found it fastest.

    sparserl data build --out DEFAULT --families banded,random --per-family 8 --min-rows 100000 \\
        --max-rows 2000000 --size-draw stratified --seed 1 --matrices-only --val-fraction 0 --test-fraction 0
    sparserl data build --out DRAWN ...the same... --vary-params
    python benchmarks/facts_range.py DEFAULT DRAWN --out range.json

SpMV only: the specialised templates are SpMV's. CPU only: nothing is compiled or run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.eval.library_match import baked_facts
from sparserl.harness.matrix_facts import named_facts
from sparserl.kernels.contract import Op
from sparserl.kernels.templates import templates
from sparserl.matrices.card import matrix_card
from sparserl.matrices.generators import family_of_generated
from sparserl.matrices.io import load_matrix, matrices_in
from sparserl.progress import progress


def facts_blocks(card, op: Op) -> dict[str, str]:
    """Each specialised template's block of facts for ``card`` at its first seed point that its check accepts for
    the card (templates without one are left out), for the templates that spell their facts: one whose kernel
    names a fact (:func:`~sparserl.harness.matrix_facts.named_facts`: one text for every matrix) is left out."""
    out = {}
    for t in templates(op):
        points = t.seeds(card, None) if t.specialised else []
        if points and not named_facts(t.render(points[0], card)):
            block = baked_facts(t, points[0], card)
            if block is not None:
                out[t.name] = block
    return out


def facts_range(folder: Path, op: Op) -> dict[str, dict[str, dict[str, int]]]:
    """{family: {template: {"matrices": n, "distinct_facts": d}}} over the generated matrices in ``folder`` (or in
    its ``matrices`` folder: a data folder)."""
    blocks: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    if (folder / "matrices").is_dir():  # a data folder: its matrices
        folder = folder / "matrices"
    if not folder.is_dir():
        raise SparseRLError(f"{folder} is not a folder")
    files = [(family_of_generated(p.name.split(".")[0]), p) for p in matrices_in(folder)]
    files = [(family, p) for family, p in files if family]
    if not files:
        raise SparseRLError(f"{folder} holds no generated matrices (make them with sparserl data build --matrices-only)")
    with progress() as bar:
        task = bar.add_task(f"cards of {folder}", total=len(files))
        for family, path in files:
            for template, block in facts_blocks(matrix_card(load_matrix(path)), op).items():
                blocks[family][template].append(block)
            bar.advance(task)
    return {f: {t: {"matrices": len(b), "distinct_facts": len(set(b))} for t, b in sorted(by.items())}
            for f, by in sorted(blocks.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", type=Path, nargs="+", help="folders of generated matrices (data build --matrices-only)")
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    args = ap.parse_args(argv)
    names = [f.name for f in args.folders]  # the JSON keys each folder by its last name, which keeps paths out
    if len(set(names)) < len(names):
        print(f"error: two folders have the same last name ({', '.join(sorted({n for n in names if names.count(n) > 1}))}); "
              "the JSON keys each by it: give them distinct names", file=sys.stderr)
        return 2
    table = {}
    try:
        for folder in args.folders:
            table[str(folder)] = facts_range(folder, Op.SPMV)
    except (SparseRLError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for folder, by_family in table.items():
        for family, by in by_family.items():
            cells = ", ".join(f"{t} {v['distinct_facts']} of {v['matrices']}" for t, v in by.items())
            print(f"{folder}  {family}: {cells}")
    if args.out:
        args.out.write_text(json.dumps({"op": "spmv", "folders": {Path(f).name: v for f, v in table.items()}},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
