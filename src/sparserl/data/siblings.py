"""Sibling rows: a teacher's specialised kernel taught again on other matrices of its family, so that the policy
sees many facts blocks per template and has to read them from the card.

Why: a specialised template bakes the matrix's facts into the kernel (DIA offsets, a row length, block columns).
The teacher keeps such a kernel only where a search found it fastest, so its rows hold few distinct facts blocks
(3-8 per template in the small preset's teacher, even with each matrix's parameters drawn), and the policy learns
them by heart: at 1M rows it wrote only blocks it had been taught, never the card's where the card's were new
(results of 2026-12-05 and 2026-12-06, spec-facts-copy and teacher-params-drawn). Since then the DIA, BSR, lane
and split templates name their facts (``MATRIX_DIA_RUNS``, ``MATRIX_LONG_ROWS`` and the like, defined by the harness
from the card): one text for every matrix, nothing for a sibling to vary. Siblings remain for the one template that
still spells its facts (``csr_adaptive_spec``: its long rows in constant tables, SHORT_MAX, LONG_ROWS), on draws
whose long rows make as many pieces as its row's (their count is the long-row kernel's grid in its LAUNCH line,
which a sibling keeps).

What: for each teacher row whose kernel is a specialised template's
(:func:`~sparserl.eval.library_match.specialised_facts`), up to ``per_row`` new matrices of the row's family (its
generator, a size within ``spread`` of the row's, a seed and, with ``vary_params``, parameters drawn), each taught the
same template at the row's own numbers rendered for the new matrix's card
(:func:`~sparserl.eval.library_match.fill_facts`: the kernel the template writes there, nothing else changed). A
sibling is kept only when the template's check accepts its card, its facts block is one no row taught yet nor one
the template writes for a held-out matrix (``held_out_cards``: a sibling never teaches a held-out matrix's facts,
which would spoil the question the siblings are for), and its structure is none of ``avoid`` (held-out matrices: no
held-out matrix is ever a training one) nor an earlier sibling's.

What it is not: a measurement. A sibling's kernel is the teacher's choice carried to a matrix of the same family
and nearly the same size, correct by the template's construction (and judged by the harness wherever the policy
later writes it), but never timed there: its row carries no times and says which row it came from
(``sibling_of``). Rows of other templates, and rows whose matrix name is not a generated family's, get none.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sparserl.data.rows import SFTRow
from sparserl.errors import SparseRLError
from sparserl.eval.library_match import facts_as_card, fill_facts, specialised_facts
from sparserl.matrices import generate, save_matrix
from sparserl.matrices.card import MatrixCard, matrix_card, structure_fingerprint
from sparserl.matrices.generators import draw_params, family_of_generated, generated_name

log = logging.getLogger(__name__)

FRUITLESS = 8
"""Draws in a row that made nothing, for one family and template, after which that pair's later rows get no more
draws (every diagonal matrix has one offsets block: its 30 teacher rows would otherwise cost 480 draws)."""

MAX_PER_FAMILY = 1000
"""Siblings per family at most (their names number them in three digits, as ``data build`` names its matrices)."""

MAX_DRAWS = 4
"""Matrices drawn per sibling wanted at most: a draw whose facts a row taught already (every diagonal matrix has
the same offsets) or whose structure is held out is drawn again, up to this many times."""


@dataclass(frozen=True)
class SiblingConfig:
    """How many siblings, of what size, drawn how."""

    per_row: int = 4
    """Siblings wanted per specialised teacher row."""
    spread: float = 0.15
    """A sibling's rows are drawn log-uniformly within this fraction of its teacher row's (0.15: 0.87x-1.15x), so it
    sits where the teacher found the template fastest."""
    vary_params: bool = True
    """Draw each sibling's structural parameters (bands, row lengths, blocks per block row), not its family's
    defaults: otherwise most families' facts would not change with the size."""
    coords: int = 1024
    """Sampled nonzero coordinates per row (the store's export writes as many)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.per_row < 1:
            raise SparseRLError(f"--per-row must be at least 1, got {self.per_row}")
        if not 0 <= self.spread < 1:
            raise SparseRLError(f"--spread must be in [0, 1) (0.15 is 15%), got {self.spread}")
        if self.coords < 1:
            raise SparseRLError(f"coords must be at least 1, got {self.coords}")


@dataclass
class SiblingCounts:
    """What :func:`sibling_rows` made and why it made no more."""

    teacher_rows: int = 0
    """Teacher rows read."""
    specialised_rows: int = 0
    """Of those, rows whose kernel is a specialised template's (the ones siblings are drawn for)."""
    not_generated: int = 0
    """Specialised rows whose matrix is not a generated family's (a real matrix's): no siblings."""
    made: Counter = field(default_factory=Counter)
    """Siblings made, by template."""
    facts_taught: Counter = field(default_factory=Counter)
    """Draws left out because their facts block was taught already, by template."""
    refused: Counter = field(default_factory=Counter)
    """Draws left out because the template's check refused their card, by template."""
    held_out: int = 0
    """Draws left out because their structure is held out (or an earlier sibling's)."""
    held_out_facts: Counter = field(default_factory=Counter)
    """Draws left out because their facts block is one the template writes for a held-out matrix, by template."""
    gave_up: Counter = field(default_factory=Counter)
    """Specialised rows left without draws because their family's last :data:`FRUITLESS` draws made nothing, by
    template."""
    distinct_facts: dict[str, int] = field(default_factory=dict)
    """Distinct facts blocks per template, teacher rows and siblings together."""

    def to_dict(self) -> dict:
        return {"teacher_rows": self.teacher_rows, "specialised_rows": self.specialised_rows,
                "not_generated": self.not_generated, "made": dict(self.made), "facts_taught": dict(self.facts_taught),
                "refused": dict(self.refused), "held_out": self.held_out,
                "held_out_facts": dict(self.held_out_facts), "gave_up": dict(self.gave_up),
                "distinct_facts": self.distinct_facts}


def _draw_rows(rows: int, spread: float, rng: np.random.Generator) -> int:
    """A size log-uniform within ``spread`` of ``rows`` (at least 2)."""
    lo, hi = math.log(rows * (1 - spread)), math.log(rows * (1 + spread))
    return max(2, int(round(math.exp(rng.uniform(lo, hi)))))


class _HeldOutBlocks:
    """The facts blocks a specialised kernel's template writes, at the kernel's own numbers, for the held-out
    matrices' cards: computed once per (template, header)."""

    def __init__(self, cards: Iterable[MatrixCard]):
        self.cards, self.blocks = list(cards), {}

    def of(self, r: SFTRow, template: str, own: str) -> set[str]:
        """The blocks for the held-out cards of ``r``'s kernel (``own``: its own block, already read)."""
        header = tuple(line for line in r.code.splitlines() if line.startswith(("FORMAT:", "PARAMS:", "LAUNCH:")))
        key = (template, r.op, r.k, header)  # the template's point is read from the header
        if key not in self.blocks:
            found = set()
            for card in self.cards:
                code = fill_facts(r.code, r.op, card)
                if code is not None:
                    found.add(specialised_facts(code, r.op)[1])
                elif facts_as_card(r.code, r.op, card):
                    found.add(own)
            self.blocks[key] = found
        return self.blocks[key]


def sibling_rows(rows: Iterable[SFTRow], cfg: SiblingConfig, out: str | Path, avoid: Iterable[str] = (),
                 held_out_cards: Iterable[MatrixCard] = ()) -> tuple[list[SFTRow], SiblingCounts]:
    """The sibling rows of ``rows`` (a teacher's, in order) and what was made; each sibling's matrix is saved under
    ``out`` (``out/matrices``), so a held-out set can be checked against it. ``avoid``: structure fingerprints no
    sibling may have (the held-out matrices'); ``held_out_cards``: the held-out matrices' cards, whose facts blocks no
    sibling may teach."""
    from sparserl.encoding import sample_nonzeros  # torch

    rows = list(rows)
    held_out_blocks = _HeldOutBlocks(held_out_cards)
    folder = Path(out) / "matrices"
    folder.mkdir(parents=True, exist_ok=True)
    taken = set(avoid)
    counts = SiblingCounts(teacher_rows=len(rows))
    read = [specialised_facts(r.code, r.op) for r in rows]  # (template, facts block) of each row, read once
    taught: dict[str, set[str]] = {}
    for sf in read:
        if sf is not None:
            taught.setdefault(sf[0], set()).add(sf[1])
    rng = np.random.default_rng(cfg.seed)
    index: Counter = Counter()  # siblings made per family, for their names
    made: list[SFTRow] = []
    seen: set[tuple] = set()  # a kernel taught twice on one matrix (an ordinary row and a refinement row) is one
    fruitless: Counter = Counter()  # (family, template) -> draws in a row that made nothing
    for r, sf in zip(rows, read):
        source = (r.name, r.matrix, r.origin.fingerprint if r.origin else None, r.op, r.k, r.code)
        if sf is None or source in seen:
            continue
        seen.add(source)
        counts.specialised_rows += 1
        template = sf[0]
        fam = family_of_generated(r.name or r.matrix_name)
        if fam is None:
            counts.not_generated += 1
            continue
        wanted = cfg.per_row
        for _ in range(cfg.per_row * MAX_DRAWS):
            if wanted == 0:
                break
            if fruitless[fam, template] >= FRUITLESS:
                counts.gave_up[template] += 1
                break
            fruitless[fam, template] += 1
            n = _draw_rows(r.shape[0], cfg.spread, rng)
            seed = int(rng.integers(1 << 30))
            params = draw_params(fam, rng) if cfg.vary_params else {}
            A = generate(fam, n, seed=seed, **params)
            fp = structure_fingerprint(A)
            if fp in taken:
                counts.held_out += 1
                continue
            card = matrix_card(A)
            code = fill_facts(r.code, r.op, card)  # None: the check refuses this card, or the facts are the row's
            if code is None:
                if facts_as_card(r.code, r.op, card):
                    counts.facts_taught[template] += 1
                else:
                    counts.refused[template] += 1
                continue
            facts = specialised_facts(code, r.op)[1]
            if facts in taught[template]:
                counts.facts_taught[template] += 1
                continue
            if facts in held_out_blocks.of(r, template, sf[1]):
                counts.held_out_facts[template] += 1
                continue
            if index[fam] >= MAX_PER_FAMILY:
                break
            taught[template].add(facts)
            taken.add(fp)
            name = generated_name(fam, index[fam], A.shape[0])
            index[fam] += 1
            path = folder / f"{name}.npz"
            save_matrix(A, path, compress=False)
            ri, ci = sample_nonzeros(A, cfg.coords, cfg.seed)
            made.append(SFTRow(rows=ri.tolist(), cols=ci.tolist(), shape=tuple(A.shape), code=code, format=r.format,
                               op=r.op, k=r.k, nnz=int(A.nnz), matrix=str(path), family=fam, split="train",
                               variant=r.variant, name=name, card=card.to_dict(),
                               extra={"sibling_of": r.name, "params": params}))
            counts.made[template] += 1
            fruitless[fam, template] = 0
            wanted -= 1
    counts.distinct_facts = {t: len(f) for t, f in sorted(taught.items())}
    log.info("siblings: %d rows from %d specialised teacher rows (%s); distinct facts blocks now %s",
             len(made), counts.specialised_rows, dict(counts.made) or "none", counts.distinct_facts)
    return made, counts
