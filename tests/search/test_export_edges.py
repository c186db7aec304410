"""The teacher export's rows field by field, the refinement rows' filters and skip counts, and
export_sft's summary: the parts of ``search/export.py`` the other export tests leave unchecked.

Mutations killed (each by the test named in its docstring): a row field dropped or taken from
elsewhere (format, op, k, family, split, name, the times, the origin, the matrix path, rows and cols
swapped); coordinates sampled from a matrix file with another seed; a store filter not passed to the
refinement rows; a skipped child that stops the matrix's other children (``continue`` made
``break``); a skip counter set instead of counted; the refinement gain's edge made exclusive; a
kernel that is its own parent counted; export_sft teaching refinements by default, dropping the
filter for them, or losing the kernels' skip counts; the too-long and duplicate counts of
export_rows; the best known shared between matrices; a full matrix or a duplicate that stops the rest
(``continue`` made ``break`` in export_rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.data.targets import taught_length
from sparserl.encoding import sample_nonzeros
from sparserl.errors import SparseRLError
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.matrices.io import save_matrix
from sparserl.search.export import ExportFilter, export_rows, export_sft, refinement_rows
from sparserl.search.space import text_id
from sparserl.search.store import COORDS, BestStore, VerifiedKernel, harness_version
from tests.search.test_export_refinements import add_matrices

HV = harness_version()
CSR = [v.id for v in variants("spmv", "CSR")]
TEXT = {v.id: v.render() for v in variants("spmv", "CSR")}
PAD = "".join(f"__device__ float pad{i}(float a) {{ return a + {i}.f; }}\n" for i in range(400))


LONGEST = max(taught_length(t) for t in TEXT.values()) + 100
"""A length limit every library text is under and each text with ``PAD`` is over."""
assert taught_length(PAD) > LONGEST


def put(st: BestStore, card, cid: str, t: float, *, parent: str | None = None, cusparse_us: float = 20.0,
        op: str = "spmv", k: int | None = None, arch: str = "sm_90", regime: str = "cold", hv: str = HV,
        text: str | None = None, provenance: str = "mutation", gpu: str = "H200") -> None:
    text = TEXT[cid] if text is None else text
    st.record(VerifiedKernel(card.fingerprint, op, k, arch, gpu, regime, text, t, cusparse_us, cusparse_us / t,
                             None, "CSR", cid.split("/")[1] if "/" in cid else None, cid, provenance, parent, None,
                             "run-1", hv))


@pytest.fixture
def store(tmp_path: Path):
    with BestStore(tmp_path / "s.db") as st:
        yield st, add_matrices(st)


def test_an_exported_row_carries_its_result_and_its_matrix(tmp_path: Path) -> None:
    """Every field of an exported row, for an SpMM result on a matrix whose file exists (the path is
    kept, coordinates sampled from the file with seed 0) and for one whose file is gone (no path, the
    stored coordinates)."""
    A = generate("random", 900, seed=4, nnz_per_row=3)
    path = tmp_path / "m.mtx"
    save_matrix(A, path, compress=False)
    assert A.nnz > COORDS
    expected = sample_nonzeros(A, COORDS, 0)
    assert expected[0].tolist() != sample_nonzeros(A, COORDS, 1)[0].tolist()  # the seed shows
    gone = generate("banded", 300, seed=1)
    with BestStore(tmp_path / "s.db") as st:
        card, gone_card = matrix_card(A), matrix_card(gone)
        st.add_matrix(card, "on-file", str(path), None)
        st.add_matrix(gone_card, "gone", str(tmp_path / "deleted.mtx"), ([0, 1, 2], [0, 1, 5]))
        put(st, card, CSR[2], 8.0, op="spmm", k=32, cusparse_us=24.0, provenance="seed")
        put(st, gone_card, CSR[3], 5.0, arch="sm_80", regime="warm", cusparse_us=6.0)
        rows, skipped = export_rows(st, ExportFilter(per_matrix=5))
    assert skipped["no_coordinates"] == 0 and len(rows) == 2
    on_file = next(r for r in rows if r.name == "on-file")
    assert (on_file.rows, on_file.cols) == (expected[0].tolist(), expected[1].tolist())
    assert on_file.shape == (900, 900) and on_file.nnz == A.nnz and on_file.matrix == str(path)
    assert (on_file.format, on_file.op, on_file.k, on_file.variant) == ("CSR", "spmm", 32, CSR[2])
    assert (on_file.family, on_file.split, on_file.code) == ("best_known", "train", TEXT[CSR[2]])
    t = on_file.times
    assert (t.kernel_us, t.cusparse_us, t.speedup, t.regime) == (8.0, 24.0, 3.0, "cold")
    o = on_file.origin
    assert (o.fingerprint, o.arch, o.harness_version, o.provenance) == (card.fingerprint, "sm_90", HV, "seed")
    assert json.loads(json.dumps(on_file.card)) == json.loads(json.dumps(card.to_dict())) and on_file.refinement is None
    g = next(r for r in rows if r.name == "gone")
    assert (g.rows, g.cols, g.matrix, g.k) == ([0, 1, 2], [0, 1, 5], None, None)
    assert (g.times.regime, g.origin.arch, g.times.speedup) == ("warm", "sm_80", 6.0 / 5.0)


def test_refinement_rows_pass_each_store_filter(store) -> None:
    """One parent-child pair under each key (op, architecture, regime, matrix): each filter keeps only its own."""
    st, (a, b) = store
    for kw, card in (({}, a), ({"op": "spmm", "k": 32}, a), ({"arch": "sm_80"}, a), ({"regime": "warm"}, a), ({}, b)):
        put(st, card, CSR[0], 10.0, provenance="seed", **kw)
        put(st, card, CSR[1], 5.0 + len(kw) + (card is b), parent=CSR[0], **kw)  # a time for each key
    every = sorted(r.times.kernel_us for r in refinement_rows(st)[0])
    assert every == [5.0, 6.0, 6.0, 6.0, 7.0]
    for flt, kept in ((ExportFilter(op="spmm"), [7.0]), (ExportFilter(arch="sm_80"), [6.0]),
                      (ExportFilter(regime="warm"), [6.0]), (ExportFilter(fingerprints=frozenset({b.fingerprint})), [6.0]),
                      (ExportFilter(op="spmv", arch="sm_90", regime="cold", harness_version=HV,
                                    fingerprints=frozenset({a.fingerprint})), [5.0])):
        rows = refinement_rows(st, flt)[0]
        assert sorted(r.times.kernel_us for r in rows) == kept, flt
    warm = refinement_rows(st, ExportFilter(regime="warm"))[0][0]
    assert warm.times.regime == "warm" and warm.origin.arch == "sm_90"


def test_every_skip_is_counted_and_does_not_stop_the_matrix_s_other_children(store, tmp_path: Path) -> None:
    """On one matrix, two children of each kind the filter leaves out, all faster (so read earlier) than the
    one it keeps; on a matrix with neither coordinates nor a file, two children that would be kept. And a
    kernel recorded as its own child (a mutation that changed nothing) is no row and no count."""
    st, (a, _) = store
    bare = matrix_card(generate("powerlaw", 400, seed=3))
    st.add_matrix(bare, "bare", None, None)
    put(st, a, CSR[0], 2.01, provenance="seed")                      # P
    put(st, a, CSR[1], 2.0, parent=CSR[0])                           # not 2% faster than P
    put(st, a, CSR[2], 2.05, parent=CSR[0])                          # slower than P
    put(st, a, CSR[3], 3.0, parent=CSR[9], cusparse_us=3.0)          # 1.0x: under min_speedup
    put(st, a, CSR[4], 3.1, parent=CSR[9], cusparse_us=3.1)
    put(st, a, CSR[5], 4.0, parent=CSR[9], text=TEXT[CSR[5]] + PAD)  # longer than max_chars
    put(st, a, CSR[6], 4.1, parent=CSR[9], text=TEXT[CSR[6]] + PAD)
    for i, t in enumerate((5.0, 5.1)):                               # free text from a mutation: unjudged
        text = TEXT[CSR[7]] + f"// variant {i}\n"
        put(st, a, text_id(text), t, parent=CSR[9], text=text)
    put(st, a, CSR[8], 6.0, parent=CSR[9])                           # the one kept
    put(st, a, CSR[9], 10.0, provenance="seed")                      # Q
    put(st, a, CSR[10], 7.0, parent=CSR[10])                         # recorded only as its own child
    put(st, bare, CSR[0], 10.0, provenance="seed")
    put(st, bare, CSR[1], 5.0, parent=CSR[0])
    put(st, bare, CSR[2], 6.0, parent=CSR[0])
    longest = LONGEST
    flt = ExportFilter(min_speedup=1.5, max_chars=longest, seen_only=True)
    rows, skipped = refinement_rows(st, flt)
    assert [(r.variant, r.refinement.parent) for r in rows] == [(CSR[8], CSR[9])]
    assert skipped == {"not_faster": 2, "slow": 2, "too_long": 2, "unseen_facts": 2, "no_coordinates": 2}


def test_a_parent_child_pair_is_taught_once_per_matrix(store) -> None:
    """Two searches reached the same child kernel from the same parent kernel under other candidate ids (a
    re-run, a mutation that landed on the same text): one row, the faster child's; another child of that parent
    is still a row. The store keeps one candidate id per kernel text (the first), so the export's own memory of
    taught pairs is a second guard that this does not reach (its mutant survives); this holds the property
    whichever of the two keeps it."""
    st, (a, _) = store
    put(st, a, CSR[0], 10.0, provenance="seed")
    put(st, a, "spmv/csr_copy/-/p", 10.5, provenance="seed", text=TEXT[CSR[0]])   # the parent's kernel again
    put(st, a, CSR[1], 5.0, parent=CSR[0])
    put(st, a, "spmv/csr_copy/-/c", 5.5, parent="spmv/csr_copy/-/p", text=TEXT[CSR[1]])
    put(st, a, "spmv/csr_copy/-/d", 5.6, parent=CSR[0], text=TEXT[CSR[1]])
    put(st, a, CSR[2], 6.0, parent=CSR[0])
    rows, _ = refinement_rows(st)
    assert sorted((r.times.kernel_us, r.refinement.parent) for r in rows) == [(5.0, CSR[0]), (6.0, CSR[0])]


def test_the_gain_s_edge_is_kept(store) -> None:
    """A child exactly ``min_gain`` faster than its parent (2.0 us against 3.0 with a gain of 0.5) is a row."""
    st, (a, _) = store
    put(st, a, CSR[0], 3.0, provenance="seed")
    put(st, a, CSR[1], 2.0, parent=CSR[0])
    assert [r.variant for r in refinement_rows(st, min_gain=0.5)[0]] == [CSR[1]]
    assert refinement_rows(st, min_gain=0.6)[0] == []


def test_export_rows_counts_each_long_kernel_and_duplicate_and_keeps_each_matrix_s_best(store) -> None:
    """Two kernels over the length limit count 2; a kernel timed in three regimes is taught once (2 duplicates);
    ``within`` measures each matrix from its own best (matrix b's kernels, 3x slower than a's, are kept); kernels
    read after a long one, a slow one and one past ``within`` are still taken."""
    st, (a, b) = store
    put(st, a, CSR[0], 1.0, text=TEXT[CSR[0]] + PAD)
    put(st, a, CSR[1], 1.5, text=TEXT[CSR[1]] + PAD)
    put(st, a, CSR[2], 2.0)
    put(st, a, CSR[3], 2.05)
    put(st, a, CSR[2], 2.5, regime="warm")
    put(st, a, CSR[2], 2.6, regime="hot")
    put(st, b, CSR[4], 6.0)
    put(st, b, CSR[5], 6.2)
    put(st, b, CSR[6], 7.0)                    # past within 0.05 of b's best
    longest = LONGEST
    rows, skipped = export_rows(st, ExportFilter(per_matrix=5, within=0.05, max_chars=longest))
    assert sorted(r.times.kernel_us for r in rows) == [2.0, 2.05, 6.0, 6.2]
    assert skipped["too_long"] == 2 and skipped["duplicate"] == 2
    put(st, a, CSR[7], 2.02, cusparse_us=1.0)  # under min_speedup, read before CSR[3]
    rows, _ = export_rows(st, ExportFilter(per_matrix=5, within=0.05, max_chars=longest, min_speedup=1.5))
    assert sorted(r.times.kernel_us for r in rows) == [2.0, 2.05, 6.0, 6.2]


def test_a_full_matrix_or_a_duplicate_skips_only_that_kernel(store) -> None:
    """Results are read fastest first over every matrix: matrix a's second kernel (``per_matrix`` 1 reached) is
    skipped and b's slower one, read after it, is still taken; in one group a kernel already taught from another
    regime is skipped as a duplicate and the group's next kernel is still taken. Kills ``continue`` made
    ``break`` at the ``per_matrix`` test and at the duplicate test."""
    st, (a, b) = store
    put(st, a, CSR[0], 1.0)
    put(st, a, CSR[1], 1.5)                     # a is full: skipped
    put(st, b, CSR[2], 3.0)                     # read after it: taken
    rows, skipped = export_rows(st, ExportFilter(per_matrix=1))
    assert sorted((r.name, r.variant) for r in rows) == [("banded", CSR[0]), ("random", CSR[2])]
    put(st, a, CSR[0], 1.1, regime="warm")      # taught from the cold group: a duplicate
    put(st, a, CSR[3], 1.2, regime="warm")      # the warm group's next kernel: taken
    rows, skipped = export_rows(st, ExportFilter(per_matrix=2))
    assert skipped["duplicate"] == 1
    assert sorted((r.name, r.variant, r.times.kernel_us) for r in rows) == [
        ("banded", CSR[0], 1.0), ("banded", CSR[1], 1.5), ("banded", CSR[3], 1.2), ("random", CSR[2], 3.0)]


def test_export_sft_summary_and_its_refinements(store, tmp_path: Path) -> None:
    """Without ``refinements`` no refinement row is written; with it, the filter applies to them too, and the
    summary keeps the kernels' skip counts beside the refinements' and names the file written."""
    st, (a, _) = store
    put(st, a, CSR[0], 10.0, provenance="seed")
    put(st, a, CSR[1], 5.0, parent=CSR[0], cusparse_us=5.0)      # a refinement at 1.0x
    put(st, a, CSR[2], 4.0, parent=CSR[0], text=TEXT[CSR[2]] + PAD)
    out = tmp_path / "rows.jsonl"
    plain = export_sft(st, out, ExportFilter(per_matrix=5))
    assert plain["refinement_rows"] == 0 and plain["rows"] == 3 and plain["path"] == str(out)
    longest = LONGEST
    res = export_sft(st, out, ExportFilter(per_matrix=5, min_speedup=1.5, max_chars=longest), refinements=True)
    assert res["rows"] == 1 and res["refinement_rows"] == 0 and res["matrices"] == 1
    assert res["skipped"]["too_long"] == 1 and res["skipped"]["refinement_too_long"] == 1
    assert res["skipped"]["refinement_slow"] == 1 and "duplicate" in res["skipped"]


def test_nothing_to_export_says_whether_the_store_is_empty(tmp_path: Path) -> None:
    with BestStore(tmp_path / "s.db") as st:
        with pytest.raises(SparseRLError, match=r"nothing to export from .*s\.db: no verified kernel passes the "
                                                r"filters \(the store is empty\)$"):
            export_sft(st, tmp_path / "r.jsonl")
        (a, _) = add_matrices(st)
        put(st, a, CSR[0], 10.0)
        with pytest.raises(SparseRLError, match=r"passes the filters$"):
            export_sft(st, tmp_path / "r.jsonl", ExportFilter(min_speedup=5.0))


@pytest.mark.parametrize("kw, message", [
    ({"per_matrix": 0}, "--per-matrix must be at least 1, got 0"),
    ({"within": -0.1}, r"--within must be >= 0 \(a fraction: 0.05 is 5%\), got -0.1"),
    ({"min_speedup": -1.0}, "--min-speedup must be >= 0"),
    ({"max_chars": 0}, "--max-chars must be at least 1, got 0"),
    ({"op": "spgemm"}, "--op must be spmv or spmm, got 'spgemm'"),
])
def test_a_bad_filter_is_one_line(kw: dict, message: str) -> None:
    with pytest.raises(SparseRLError, match=f"^{message}$"):
        ExportFilter(**kw)


def test_the_filter_s_edges_are_valid() -> None:
    for kw in ({"per_matrix": 1}, {"within": 0.0}, {"min_speedup": 0.0}, {"max_chars": 1}, {"op": "spmm"},
               {"op": "spmv"}, {"op": None}):
        ExportFilter(**kw)


def test_within_compares_two_gpu_models_by_speedup(store) -> None:
    """An H200's 10 us (2.0x its cuSPARSE) and an H100's 12 and 12.5 us (3.0x and 2.88x its): ``within`` counts from
    the best speedup when one matrix was timed on two models, from the best time on one. Kills: raw times
    compared across models (only the H200's kernel, the shortest time, would be taught)."""
    st, (a, b) = store
    put(st, a, CSR[0], 10.0, cusparse_us=20.0)
    put(st, a, CSR[1], 12.0, cusparse_us=36.0, gpu="H100")
    put(st, a, CSR[2], 12.5, cusparse_us=36.0, gpu="H100")
    put(st, b, CSR[3], 10.0)
    put(st, b, CSR[4], 10.4)
    rows, _ = export_rows(st, ExportFilter(per_matrix=5, within=0.05))
    assert sorted(r.times.kernel_us for r in rows) == [10.0, 10.4, 12.0, 12.5]
