"""Refinement rows from the store's search history (``sparserl best export --refinements``): a
verified kernel whose parent is verified on the same matrix and at least 2% slower becomes a row
whose prompt shows the parent and its time as search and RL show a previous kernel, and whose
completion is the child.

Mutations killed: the gain's edge moved (a child 1.9% faster kept, or 2.0% dropped), the parent
looked up on another matrix, the parent and child swapped in the row, a parent's slowest time used
instead of its fastest, the refinement lost when a row is written and read back, the prompt built
without the previous kernel or with another measured line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.data.rows import Refinement, SFTRow, read_rows
from sparserl.encoding import EncodingConfig
from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.model.policy import PolicyConfig, prompt_text
from sparserl.search.export import ExportFilter, export_sft, refinement_rows
from sparserl.search.store import BestStore, VerifiedKernel, harness_version

TEXTS = {v.id: v.render() for v in variants("spmv", "CSR")[:5]}
IDS = list(TEXTS)


def record(st: BestStore, card, cid: str, t: float, parent: str | None, provenance: str = "mutation",
           roofline: float | None = None) -> None:
    st.record(VerifiedKernel(card.fingerprint, "spmv", None, "sm_90", "H200", "cold", TEXTS[cid], t, 20.0, 20.0 / t,
                             roofline, "CSR", cid.split("/")[1], cid, provenance, parent, None, "r", harness_version()))


def add_matrices(st: BestStore) -> list:
    """A 500-row banded and a 500-row random matrix in the store, with their sampled coordinates; their cards."""
    from sparserl.encoding import sample_nonzeros

    cards = []
    for i, fam in enumerate(("banded", "random")):
        A = generate(fam, 500, seed=i)
        card = matrix_card(A)
        r, c = sample_nonzeros(A, 1024, 0)
        st.add_matrix(card, fam, None, (r.tolist(), c.tolist()))
        cards.append(card)
    return cards


@pytest.fixture
def store(tmp_path: Path):
    with BestStore(tmp_path / "s.db") as st:
        a, b = add_matrices(st)
        record(st, a, IDS[0], 10.0, None, "seed")
        record(st, a, IDS[0], 10.5, None, "seed")      # the parent again, slower: its fastest time counts
        record(st, a, IDS[1], 9.8, IDS[0], roofline=0.45)   # 10 / 9.8 = 1.0204: a refinement row
        record(st, a, IDS[2], 9.81, IDS[0])            # 1.9% faster: within the noise, no row
        record(st, a, IDS[3], 9.0, IDS[1])             # a grandchild: a row with IDS[1] as its parent
        record(st, a, IDS[4], 5.0, "spmv/csr_vector/-/nope")   # its parent is not in the store
        record(st, b, IDS[4], 30.0, None, "seed")      # IDS[4]'s only other result is on another matrix
        record(st, b, IDS[1], 8.0, IDS[0])             # its parent IDS[0] was verified on matrix a only
        yield st, a, b


def test_rows_pair_each_kernel_with_the_parent_it_was_found_from(store) -> None:
    st, a, _ = store
    rows, skipped = refinement_rows(st)
    got = sorted((r.refinement.parent, r.variant) for r in rows)
    assert got == sorted([(IDS[0], IDS[1]), (IDS[1], IDS[3])])
    assert skipped["not_faster"] == 1
    by_child = {r.variant: r for r in rows}
    first = by_child[IDS[1]]
    assert first.code == TEXTS[IDS[1]] and first.refinement.previous == TEXTS[IDS[0]]
    assert first.refinement.outcome == "correct; 10.00 us against cuSPARSE's 20.00 us (2.00x), cold L2."
    assert first.refinement.correct and first.times.kernel_us == 9.8 and first.origin.fingerprint == a.fingerprint
    assert by_child[IDS[3]].refinement.outcome == ("correct; 9.80 us against cuSPARSE's 20.00 us (2.04x), cold L2, "
                                                   "0.45 of the memory roofline.")  # the parent's roofline, as search shows it


def test_a_lower_gain_admits_the_near_tie_and_min_speedup_filters_the_child(store) -> None:
    st, _, _ = store
    rows, _ = refinement_rows(st, min_gain=0.0)
    assert sorted(r.variant for r in rows) == sorted([IDS[1], IDS[2], IDS[3]])
    rows, skipped = refinement_rows(st, ExportFilter(min_speedup=2.1))
    assert [r.variant for r in rows] == [IDS[3]] and skipped["slow"] == 1


def test_the_prompt_is_the_one_search_and_rl_show(store, tmp_path: Path) -> None:
    """Written with the other rows, read back, and turned into a policy sample: the prompt shows the
    matrix's task line, its card, the previous kernel, its measured line and asks for a faster one."""
    from sparserl.train.dataset import SFTDataset

    st, a, _ = store
    res = export_sft(st, tmp_path / "rows.jsonl", ExportFilter(per_matrix=5), refinements=True)
    rows = read_rows(tmp_path / "rows.jsonl")
    refined = [r for r in rows if r.refinement is not None]
    assert res["refinement_rows"] == len(refined) == 2 and len(rows) == res["rows"]
    assert sum(r.refinement is None for r in rows) == res["rows"] - 2
    row = next(r for r in refined if r.variant == IDS[1])
    ds = SFTDataset(rows, PolicyConfig(encoding=EncodingConfig(max_nnz=64), card=True))
    text = prompt_text(ds.sample(row), text_prompt=True, card=True)
    card = ds.sample(row).card
    expected = (f"SpMV y = A x for the 500 x 500 sparse matrix above ({a.nnz} nonzeros).\nMatrix card:\n{card.strip()}\n"
                f"Previous kernel:\n{TEXTS[IDS[0]].strip()}\n"
                "Measured: correct; 10.00 us against cuSPARSE's 20.00 us (2.00x), cold L2.\n"
                "Write a faster correct kernel:\n")
    assert text == expected
    plain = next(r for r in rows if r.refinement is None)
    assert "Previous kernel" not in prompt_text(ds.sample(plain), text_prompt=True, card=True)
    no_card = SFTDataset(rows, PolicyConfig(encoding=EncodingConfig(max_nnz=64), card=False)).sample(row)
    assert "Matrix card" not in prompt_text(no_card, text_prompt=True, card=False)


def test_the_prompt_matches_search_s_refinement_prompt() -> None:
    """The same text as :func:`refinement_prompt` on an EvalResult of those times."""
    from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
    from sparserl.search.policy import describe_timing, refinement_prompt, refinement_text

    t = KernelTiming(regime="cold", median_us=10.0, p10_us=9.9, p90_us=10.1, spread=0.01)
    base = KernelTiming(regime="cold", median_us=20.0, p10_us=19.9, p90_us=20.1, spread=0.01)
    res = EvalResult(op="spmv", k=None, matrix="m", error_kind=ErrorKind.NONE, compiled=True, correct=True,
                     regime="cold", timings={"cold": t}, baseline={"cold": base}, roofline=0.45)
    assert res.ok
    args = (Op.SPMV, None, (4, 4), 7, "card line", "FORMAT: CSR\nprev")
    assert refinement_prompt(*args, res) == refinement_text(*args, describe_timing(10.0, 20.0, "cold", 0.45), True)


def test_a_malformed_refinement_is_one_line() -> None:
    row = SFTRow(rows=[0], cols=[0], shape=(1, 1), code="FORMAT: CSR\nx", refinement=Refinement("p", "o", True, None))
    d = row.to_dict()
    assert SFTRow.from_dict(d).refinement == row.refinement
    del d["refinement"]["outcome"]
    with pytest.raises(SparseRLError, match="malformed row"):
        SFTRow.from_dict(d)


def test_best_export_refinements_on_the_command_line(store, tmp_path: Path, cli) -> None:
    """Exit 0; the line counts the refinement rows among the rows; without the flag there are none."""
    st, _, _ = store
    out = tmp_path / "r.jsonl"
    res = cli("best", "export", out, "--store", st.path, "--per-matrix", "5", "--refinements")
    assert res.rc == 0 and ", 2 of them refinements) to " in res.out, res.out + res.err
    assert sum(r.refinement is not None for r in read_rows(out)) == 2
    res = cli("best", "export", out, "--store", st.path, "--per-matrix", "5")
    assert res.rc == 0 and "of them refinements" not in res.out
    assert all(r.refinement is None for r in read_rows(out))
