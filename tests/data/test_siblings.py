"""Sibling rows: a teacher's specialised kernel rendered for new matrices of its family, kept only where the facts
are new and the structure is not held out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.data.rows import SFTRow
from sparserl.eval.library_match import specialised_facts
from sparserl.kernels.library import variants
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate, load_matrix
from sparserl.matrices.card import matrix_card, structure_fingerprint
from sparserl.matrices.generators import generated_name
from tests.conftest import one_line_error

pytest.importorskip("torch")  # the rows' sampled coordinates

TEMPLATE = "csr_adaptive_spec"
"""The one template that spells its matrix's facts (its long rows in a constant table, SHORT_MAX, LONG_ROWS): the
others name theirs (``MATRIX_LONG_ROWS`` and the like, written in by the harness), one text for every matrix."""
POINT = {"rpw": 32, "items": 8, "long_len": 1024, "seg": 4096, "block": 256}
"""A point of ``csr_adaptive_spec`` for the skewed rows below: their long rows (4096 entries) are longer than
long_len, so the kernel bakes in a table of them (one piece of SEG each); a matrix with no row longer than long_len
is refused at it (seg is then unused: only its first value is a distinct point)."""
ROWS = 6000  # a skewed matrix of 6000 rows has 6 long rows (its default long_fraction 0.001)
SPREAD = 0.07  # sizes within 7% keep those 6: the long-row kernel's LAUNCH line (grid=6) stays its row's


def _row(family: str, rows: int, code: str, name: str | None = None) -> SFTRow:
    A = generate(family, rows, seed=3)
    return SFTRow(rows=[0], cols=[0], shape=tuple(A.shape), code=code, format="CSR", nnz=int(A.nnz),
                  family="best_known", split="train", name=name or generated_name(family, 0, A.shape[0]),
                  card=matrix_card(A).to_dict())


def _spec(rows: int = ROWS, seed: int = 3) -> str:
    return get_template("spmv", TEMPLATE).render(POINT, matrix_card(generate("skewed", rows, seed=seed)))


def _cfg(**kw):
    from sparserl.data.siblings import SiblingConfig

    return SiblingConfig(spread=SPREAD, vary_params=False, **kw)


def test_siblings_are_the_rows_template_at_its_numbers_for_new_matrices_with_new_facts(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """A skewed row's ``csr_adaptive_spec`` gets 3 siblings: each is the template at the row's own point rendered
    for the sibling's card (read back from the saved matrix), of a size within the spread, with a facts block no row
    taught; a random matrix's row with that kernel gets none (no random matrix has a row longer than long_len 1024:
    the check refuses every draw), nor does a library kernel's row or a real matrix's. Mutations killed: the
    sibling's own card not used (the row's kernel copied), the spread not applied (sizes from half to twice the
    row's), fruitless families drawn on (no ``gave_up``, or their matrices still made)."""
    import sparserl.data.siblings as siblings
    from sparserl.data.siblings import FRUITLESS, sibling_rows

    made_of: list[str] = []
    real_generate = siblings.generate
    monkeypatch.setattr(siblings, "generate", lambda fam, *a, **kw: made_of.append(fam) or real_generate(fam, *a, **kw))
    skewed = _row("skewed", ROWS, _spec())
    scattered = _row("random", 5000, _spec(seed=4))
    library = _row("skewed", 8000, variants("spmv", "CSR")[0].render())
    real = _row("skewed", ROWS, _spec(seed=5), name="lp_ship04l")
    made, counts = sibling_rows([skewed, scattered, library, real], _cfg(per_row=3, seed=1), tmp_path)
    assert len(made) == 3 and counts.made == {TEMPLATE: 3}
    assert counts.specialised_rows == 3 and counts.not_generated == 1 and counts.refused[TEMPLATE] > 0
    assert counts.gave_up == {TEMPLATE: 1}, "the random row stops after FRUITLESS draws that made nothing"
    assert made_of.count("random") == FRUITLESS, "no more of its matrices made after that"
    spec = get_template("spmv", TEMPLATE)
    facts = {specialised_facts(r.code, "spmv")[1] for r in (skewed, scattered, real)}
    for s in made:
        A = load_matrix(s.matrix)
        assert s.code == spec.render(POINT, matrix_card(A)), "the row's template at its numbers, for this matrix"
        assert s.card == matrix_card(A).to_dict() and s.shape == tuple(A.shape) and s.times is None
        assert (1 - SPREAD) * ROWS <= A.shape[0] <= (1 + SPREAD) * ROWS
        assert s.family == "skewed" and s.split == "train" and s.extra["sibling_of"] == skewed.name
        f = specialised_facts(s.code, "spmv")[1]
        assert f not in facts, "a facts block no row taught"
        facts.add(f)
    assert counts.distinct_facts == {TEMPLATE: 6}  # the three rows' blocks and three new ones


def test_siblings_never_repeat_a_held_out_structure(tmp_path: Path) -> None:
    """The first run's first sibling, given as held out, is drawn again: no sibling has its structure, and the
    draw is counted. Mutation killed: ``avoid`` ignored."""
    from sparserl.data.siblings import sibling_rows

    row = _row("skewed", ROWS, _spec())
    cfg = _cfg(per_row=2, seed=1)
    first, _ = sibling_rows([row], cfg, tmp_path / "a")
    held = structure_fingerprint(load_matrix(first[0].matrix))
    again, counts = sibling_rows([row], cfg, tmp_path / "b", avoid={held})
    assert counts.held_out >= 1 and len(again) == 2
    assert held not in {structure_fingerprint(load_matrix(s.matrix)) for s in again}


def test_the_siblings_command_writes_rows_a_summary_and_refuses_bad_input(cli, tmp_path: Path) -> None:
    """``sparserl data siblings`` writes siblings.jsonl and summary.json; with --force over an earlier set it keeps only
    its own matrices (an earlier set's files would be read as held out from it); an earlier set without --force, a
    spread outside [0, 1) and a --distinct-from folder that is missing or holds no matrix are one line each."""
    from sparserl.data.rows import read_rows, write_rows

    teacher = tmp_path / "teacher.jsonl"
    write_rows(teacher, [_row("skewed", ROWS, _spec())])
    out = tmp_path / "sib"
    r = cli("data", "siblings", teacher, "--out", out, "--per-row", 2, "--seed", 1, "--spread", SPREAD, "--default-params")
    assert r.rc == 0, r.err
    assert len(read_rows(out / "siblings.jsonl")) == 2 and "2 sibling rows" in r.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["made"] == {TEMPLATE: 2} and summary["config"]["per_row"] == 2
    one_line_error(cli("data", "siblings", teacher, "--out", out), "--force")
    again = cli("data", "siblings", teacher, "--out", out, "--per-row", 1, "--seed", 2, "--force", "--spread", SPREAD,
                "--default-params")
    assert again.rc == 0, again.err
    kept = sorted(p.name for p in (out / "matrices").glob("*.npz"))
    assert kept == sorted(Path(r.matrix).name for r in read_rows(out / "siblings.jsonl")) and len(kept) == 1, kept
    one_line_error(cli("data", "siblings", teacher, "--out", tmp_path / "x", "--spread", 1.5), "--spread")
    one_line_error(cli("data", "siblings", teacher, "--out", tmp_path / "y", "--distinct-from", tmp_path / "none"),
                   "--distinct-from", "not a folder")
    (tmp_path / "empty").mkdir()
    one_line_error(cli("data", "siblings", teacher, "--out", tmp_path / "z", "--distinct-from", tmp_path / "empty"),
                   "no matrices")


def test_no_sibling_repeats_a_block_another_row_taught(tmp_path: Path) -> None:
    """The siblings a first run draws, given back as rows of real matrices (so they get no siblings of their own,
    yet teach their blocks): a second run with the same seed draws the same matrices first, counts each as taught
    and makes others. Mutation killed: siblings compared with their own row's facts only (the first run's made
    again)."""
    from sparserl.data.siblings import sibling_rows

    row = _row("skewed", ROWS, _spec())
    first, _ = sibling_rows([row], _cfg(per_row=2, seed=1), tmp_path / "a")
    taught = [SFTRow(**{**r.__dict__, "name": f"real{i}", "family": "best_known"}) for i, r in enumerate(first)]
    made, counts = sibling_rows([row] + taught, _cfg(per_row=2, seed=1), tmp_path / "b")
    assert counts.facts_taught[TEMPLATE] == 2 and counts.not_generated == 2 and len(made) == 2
    assert not {s.code for s in made} & {s.code for s in first}


def test_a_sibling_row_is_trained_with_its_own_card(tmp_path: Path) -> None:
    """SFT's input for a sibling row shows the sibling's card, whose long rows its kernel bakes in: the pairing the
    rows exist to teach. Mutations killed: the sibling's matrix not saved where its row says, another matrix saved
    under its name (the teacher row's: the card would list its long rows)."""
    from sparserl.data.siblings import sibling_rows
    from sparserl.encoding import EncodingConfig
    from sparserl.model.policy import PolicyConfig
    from sparserl.train.dataset import SFTDataset

    row = _row("skewed", ROWS, _spec())
    (s,), _ = sibling_rows([row], _cfg(per_row=1, seed=1), tmp_path)
    card = SFTDataset([s], PolicyConfig(encoding=EncodingConfig(max_nnz=8))).sample(s).card
    own, theirs = (sorted(r for r, _ in matrix_card(A).long_rows)
                   for A in (load_matrix(s.matrix), generate("skewed", ROWS, seed=3)))
    assert own != theirs and ", ".join(map(str, own)) in s.code
    assert all(f" {r}:4096" in card for r in own) and not any(f" {r}:4096" in card for r in theirs)


def test_no_sibling_teaches_a_held_out_matrixs_facts(tmp_path: Path) -> None:
    """With the cards of a first run's siblings held out (their structures not: the check is on the facts block),
    a second run with the same seed draws those matrices first and makes none of them: each draw is counted, and
    the siblings made are others. Mutation killed: the held-out blocks not checked (a held-out block taught)."""
    from sparserl.data.siblings import sibling_rows

    row = _row("skewed", ROWS, _spec())
    first, _ = sibling_rows([row], _cfg(per_row=2, seed=1), tmp_path / "a")
    held = [matrix_card(load_matrix(s.matrix)) for s in first]
    made, counts = sibling_rows([row], _cfg(per_row=2, seed=1), tmp_path / "b", held_out_cards=held)
    assert counts.held_out_facts[TEMPLATE] == 2 and len(made) == 2
    assert not {s.code for s in made} & {s.code for s in first}
