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

POINT = {"block": 128, "v": 2}


def _row(family: str, rows: int, code: str, name: str | None = None) -> SFTRow:
    A = generate(family, rows, seed=3)
    return SFTRow(rows=[0], cols=[0], shape=tuple(A.shape), code=code, format="DIA", nnz=int(A.nnz),
                  family="best_known", split="train", name=name or generated_name(family, 0, A.shape[0]),
                  card=matrix_card(A).to_dict())


def _spec(family: str, rows: int) -> str:
    return get_template("spmv", "dia_window_spec").render(POINT, matrix_card(generate(family, rows, seed=3)))


def test_siblings_are_the_rows_template_at_its_numbers_for_new_matrices_with_new_facts(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """A stencil2d row's ``dia_window_spec`` gets 3 siblings: each is the template at the row's own point rendered
    for the sibling's card (read back from the saved matrix), of a size within the spread, with a facts block no row
    taught; the diagonal family's row gets none (every diagonal matrix has the same offsets), nor does a library
    kernel's row or a real matrix's. Mutations killed: the sibling's own card not used (the row's kernel copied),
    the spread not applied (sizes from half to twice the row's), fruitless families drawn on (no ``gave_up``, or
    their matrices still made)."""
    import sparserl.data.siblings as siblings
    from sparserl.data.siblings import FRUITLESS, SiblingConfig, sibling_rows

    made_of: list[str] = []
    real_generate = siblings.generate
    monkeypatch.setattr(siblings, "generate", lambda fam, *a, **kw: made_of.append(fam) or real_generate(fam, *a, **kw))
    stencil = _row("stencil2d", 4900, _spec("stencil2d", 4900))
    diagonal = _row("diagonal", 5000, _spec("diagonal", 5000))
    library = _row("stencil2d", 6400, variants("spmv", "DIA")[0].render())
    real = _row("stencil2d", 3600, _spec("stencil2d", 3600), name="lp_ship04l")
    made, counts = sibling_rows([stencil, diagonal, library, real], SiblingConfig(per_row=3, spread=0.15, seed=1),
                                tmp_path)
    assert len(made) == 3 and counts.made == {"dia_window_spec": 3}
    assert counts.specialised_rows == 3 and counts.not_generated == 1 and counts.facts_taught["dia_window_spec"] > 0
    assert counts.gave_up == {"dia_window_spec": 1}, "the diagonal row stops after FRUITLESS draws that made nothing"
    assert made_of.count("diagonal") == FRUITLESS, "no more of its matrices made after that"
    spec = get_template("spmv", "dia_window_spec")
    facts = {specialised_facts(r.code, "spmv")[1] for r in (stencil, diagonal, real)}
    for s in made:
        A = load_matrix(s.matrix)
        assert s.code == spec.render(POINT, matrix_card(A)), "the row's template at its numbers, for this matrix"
        assert s.card == matrix_card(A).to_dict() and s.shape == tuple(A.shape) and s.times is None
        assert 0.85 * 4900 <= A.shape[0] <= 1.15 * 4900 + 200  # a grid's side is rounded: a few rows more
        assert s.family == "stencil2d" and s.split == "train" and s.extra["sibling_of"] == stencil.name
        f = specialised_facts(s.code, "spmv")[1]
        assert f not in facts, "a facts block no row taught"
        facts.add(f)
    assert counts.distinct_facts == {"dia_window_spec": 6}  # the three rows' blocks and three new ones


def test_siblings_never_repeat_a_held_out_structure(tmp_path: Path) -> None:
    """The first run's first sibling, given as held out, is drawn again: no sibling has its structure, and the
    draw is counted. Mutation killed: ``avoid`` ignored."""
    from sparserl.data.siblings import SiblingConfig, sibling_rows

    row = _row("stencil2d", 4900, _spec("stencil2d", 4900))
    cfg = SiblingConfig(per_row=2, seed=1)
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
    write_rows(teacher, [_row("stencil2d", 4900, _spec("stencil2d", 4900))])
    out = tmp_path / "sib"
    r = cli("data", "siblings", teacher, "--out", out, "--per-row", 2, "--seed", 1)
    assert r.rc == 0, r.err
    assert len(read_rows(out / "siblings.jsonl")) == 2 and "2 sibling rows" in r.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["made"] == {"dia_window_spec": 2} and summary["config"]["per_row"] == 2
    one_line_error(cli("data", "siblings", teacher, "--out", out), "--force")
    again = cli("data", "siblings", teacher, "--out", out, "--per-row", 1, "--seed", 2, "--force")
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
    """Rows for every stencil2d grid 60-80 wide, named as real matrices (so they get no siblings of their own, yet
    teach their blocks): a sibling of a generated 70-wide one (within 15%: 65-75 wide) can only draw a block some
    row taught, so none is made and each draw is counted as taught. Mutation killed: siblings compared with their
    own row's facts only."""
    from sparserl.data.siblings import SiblingConfig, sibling_rows

    taught = [_row("stencil2d", w * w, _spec("stencil2d", w * w), name=f"grid{w}") for w in range(60, 81)]
    row = _row("stencil2d", 4900, _spec("stencil2d", 4900))
    made, counts = sibling_rows([row] + taught, SiblingConfig(per_row=2, seed=1, vary_params=False), tmp_path)
    assert made == [] and counts.facts_taught["dia_window_spec"] >= 2 and counts.not_generated == 21


def test_a_sibling_row_is_trained_with_its_own_card(tmp_path: Path) -> None:
    """SFT's input for a sibling row shows the sibling's card, whose offsets its kernel bakes in: the pairing the
    rows exist to teach. Mutations killed: the sibling's matrix not saved where its row says, another matrix saved
    under its name (the teacher row's: the card would show 70)."""
    from sparserl.data.siblings import SiblingConfig, sibling_rows
    from sparserl.encoding import EncodingConfig
    from sparserl.matrices.card import offset_runs
    from sparserl.model.policy import PolicyConfig
    from sparserl.train.dataset import SFTDataset

    row = _row("stencil2d", 4900, _spec("stencil2d", 4900))
    (s,), _ = sibling_rows([row], SiblingConfig(per_row=1, seed=1), tmp_path)
    card = SFTDataset([s], PolicyConfig(encoding=EncodingConfig(max_nnz=8))).sample(s).card
    width = max(abs(a) for a, _ in offset_runs(matrix_card(load_matrix(s.matrix)).dia_offsets))
    assert width != 70 and f"diagonal offsets: -{width} -1..1 {width}" in card
    assert f"{{-{width}, -{width}, -1, 1, {width}, {width}}}" in s.code


def test_no_sibling_teaches_a_held_out_matrixs_facts(tmp_path: Path) -> None:
    """With the cards of every stencil2d grid 60-80 wide held out, a sibling of the 70-wide row (65-75 wide) could
    only teach a held-out matrix's facts block under another structure: none is made, and the draws are counted.
    Mutation killed: the held-out blocks not checked (a sibling of a new structure teaching a held-out block)."""
    from sparserl.data.siblings import SiblingConfig, sibling_rows

    row = _row("stencil2d", 4900, _spec("stencil2d", 4900))
    held = [matrix_card(generate("stencil2d", w * w, seed=3)) for w in range(60, 81) if w != 70]
    made, counts = sibling_rows([row], SiblingConfig(per_row=2, seed=1, vary_params=False), tmp_path,
                                held_out_cards=held)
    assert made == [] and counts.held_out_facts["dia_window_spec"] >= 2
