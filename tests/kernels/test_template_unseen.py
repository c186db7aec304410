"""What a specialised template bakes in that the policy's prompt card does not show, and the
teacher export that leaves such kernels out: expert iteration must not train the policy to write
constants (long-row tables, diagonal offsets) it cannot read from its prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.kernels.templates import get_template
from sparserl.matrices.card import LONGEST_ROWS, PROMPT_OFFSET_ITEMS, matrix_card
from sparserl.search.export import ExportFilter, export_rows, unseen_facts
from sparserl.search.store import BestStore, VerifiedKernel, harness_version

from tests.search.test_cli import run_cli

ADAPTIVE = {"rpw": 32, "items": 8, "long_len": 256, "seg": 1024, "block": 256}


def _long_rows(n_long: int, rows: int = 3000, extra: tuple[tuple[int, int], ...] = ()) -> sp.csr_array:
    """``n_long`` rows of 600-700 entries (lengths all distinct), ``extra`` (count, length) rows
    more, the rest of 3."""
    rng = np.random.default_rng(0)
    lengths = np.full(rows, 3)
    picks = rng.choice(rows, n_long + sum(c for c, _ in extra), replace=False)
    lengths[picks[:n_long]] = 600 + np.arange(n_long)
    at = n_long
    for count, length in extra:
        lengths[picks[at:at + count]] = length
        at += count
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = np.concatenate([np.sort(rng.choice(rows, n, replace=False)) for n in lengths])
    return sp.csr_array((np.ones(indptr[-1], np.float32), cols, indptr), shape=(rows, rows))


def _diagonals(offsets: list[int], n: int = 2000) -> sp.csr_array:
    return sp.csr_array(sp.diags([np.ones(n - abs(o), np.float32) for o in offsets], offsets, shape=(n, n)))


def test_the_prompt_card_helpers_are_what_the_prompt_prints() -> None:
    card = matrix_card(_long_rows(20))
    listed = card.prompt_longest_rows()
    assert len(listed) == LONGEST_ROWS  # 20 long rows: only the 8 longest are on the prompt
    line = next(x for x in card.prompt().splitlines() if x.startswith("longest rows"))
    assert line == "longest rows row:length: " + " ".join(f"{r}:{n}" for r, n in listed)
    few = matrix_card(_diagonals([-2, 0, 5]))
    assert few.prompt_offsets() == (-2, 0, 5) and "diagonal offsets: -2 0 5" in few.prompt()
    many = matrix_card(_diagonals(list(range(-3 * 20, 3 * 20, 3))))  # 40 offsets, no runs: 40 items
    assert many.dia_offsets is not None and len(many.dia_offsets) > PROMPT_OFFSET_ITEMS
    assert many.prompt_offsets() is None and "diagonal offsets" not in many.prompt()


@pytest.mark.parametrize("n_long,hidden", [(3, False), (LONGEST_ROWS, False), (20, True)])
def test_a_long_row_table_is_unseen_when_the_card_lists_fewer_rows(n_long: int, hidden: bool) -> None:
    card = matrix_card(_long_rows(n_long))
    t = get_template("spmv", "csr_adaptive_spec")
    assert t.check(ADAPTIVE, card) is None
    why = t.unseen_facts(ADAPTIVE, card)
    assert (why is not None) == hidden, why
    if hidden:
        assert f"({n_long} rows of length 512-1023, {LONGEST_ROWS} listed)" in why
    no_table = dict(ADAPTIVE, long_len=16384, seg=1024)  # no row is longer: no table, nothing baked
    assert t.unseen_facts(no_table, card) is None
    assert get_template("spmv", "csr_adaptive").unseen_facts(ADAPTIVE, card) is None  # the generic form


@pytest.mark.parametrize("n_long,hidden", [(3, False), (LONGEST_ROWS, False), (20, True)])
def test_csr_split_table_is_unseen_when_the_card_lists_fewer_rows(n_long: int, hidden: bool) -> None:
    """csr_split_spec bakes the same table of long rows as csr_adaptive_spec: unseen exactly when the
    prompt's card cannot prove it complete. Kills a split template that hides nothing."""
    card = matrix_card(_long_rows(n_long))
    t = get_template("spmv", "csr_split_spec")
    p = {"tpr": 4, "unroll": 4, "long_len": 256, "block": 256}
    assert t.check(p, card) is None
    why = t.unseen_facts(p, card)
    assert (why is not None) == hidden, why
    if hidden:
        assert f"({n_long} rows of length 512-1023, {LONGEST_ROWS} listed)" in why


def test_a_table_is_seen_only_when_the_card_proves_it_complete() -> None:
    """Eight rows of 5000 and four of exactly 4096, long_len 4096: the table is the eight listed
    rows, but the card cannot tell the four unlisted rows of 4096-8191 from rows of 4500, which the
    table would need. Twenty rows of 600-619 and eight of 3000, long_len 1024: the table is the eight
    longest, all listed, and no other row may be longer: seen though most long rows are unlisted."""
    t = get_template("spmv", "csr_adaptive_spec")
    p = dict(ADAPTIVE, long_len=4096, seg=4096)
    card = matrix_card(_long_rows(0, rows=6000, extra=((8, 5000), (4, 4096))))
    assert t.check(p, card) is None and len(card.prompt_longest_rows()) == LONGEST_ROWS
    assert "(12 rows of length 4096-8191, 8 listed)" in t.unseen_facts(p, card)
    card = matrix_card(_long_rows(20, rows=4000, extra=((8, 3000),)))
    p = dict(ADAPTIVE, long_len=1024, seg=1024)
    assert t.check(p, card) is None and len(card.long_rows) == 28
    assert t.unseen_facts(p, card) is None


def test_every_specialised_template_says_what_it_hides_or_hides_nothing() -> None:
    """A new specialised template must decide what of its baked facts the prompt's card shows."""
    from sparserl.kernels.templates import templates

    shows_all = {"csr_lanes_spec": "the row length: min = max on the card",
                 "bsr_stream_spec": "block shape and blocks per block row: the card's dense-blocks line"}
    for t in templates():
        if t.specialised:
            assert t.unseen is not None or t.name in shows_all, f"{t.name} needs an unseen hook or a reason here"


VECTOR = get_template("spmv", "csr_vector").candidate({"tpr": 4, "block": 128}).id


def test_specialised_points_that_cannot_be_judged_are_unseen() -> None:
    card = matrix_card(_long_rows(3))
    assert "does not know" in unseen_facts("spmv/nosuch/-/a=1/spec", card)
    spec = get_template("spmv", "csr_adaptive_spec").candidate(ADAPTIVE).id
    assert "no card" in unseen_facts(spec, None)
    assert unseen_facts(spec, card) is None
    assert unseen_facts(VECTOR, None) is None  # generic: nothing baked


@pytest.mark.parametrize("cid", [None, "", "text/0123456789abcdef", "spmv/csr_vector/-/x", "spmv/csr_vector/-/tpr=4",
                                 "spmv/csr_vector/-/tpr=4,block=100", "spmv/csr_vector/-/tpr=4,block=128/spec",
                                 "spmv/csr_adaptive_spec/-/rpw=x/spec", "spmv/csr_adaptive_spec/-/rpw=32",
                                 "spmv/csr_vector/-/tpr=4,block=128/extra/more", "nosuchop/csr_vector/-/tpr=4"])
def test_what_the_filter_cannot_read_is_left_out(cid) -> None:
    """Kills the mutation that passed whatever the filter could not parse (None, free text, a
    malformed or foreign id, a specialised template's id without /spec, a /spec id whose
    parameters do not parse): each is unjudged, so the teacher leaves it out."""
    from sparserl.search.export import UNJUDGED

    why = unseen_facts(cid, matrix_card(_long_rows(3)))
    assert why is not None and why.startswith(UNJUDGED), why


def test_diagonal_offsets_are_unseen_when_too_many_to_list() -> None:
    t = get_template("spmv", "dia_window_spec")
    p = {"block": 256, "v": 1}
    assert t.unseen_facts(p, matrix_card(_diagonals([-1, 0, 1]))) is None
    why = t.unseen_facts(p, matrix_card(_diagonals(list(range(-60, 60, 3)))))
    assert why is not None and "40 diagonal offsets" in why
    runs = [o for start in range(-100, 100, 20) for o in range(start, start + 4)]  # 40 offsets in 10 runs
    card = matrix_card(_diagonals(runs, n=3000))
    assert len(card.dia_offsets) == 40 and card.prompt_offsets() == card.dia_offsets
    assert t.unseen_facts(p, card) is None


def test_the_teacher_export_leaves_out_kernels_with_unseen_facts(tmp_path: Path, capsys) -> None:
    """The fastest kernel bakes a table of 20 long rows (12 not on the prompt): with seen_only the
    export takes the next one (within 50% of the best), and counts what it left out."""
    card = matrix_card(_long_rows(20))
    spec = get_template("spmv", "csr_adaptive_spec").candidate(ADAPTIVE).id
    assert unseen_facts(spec, card) is not None
    assert unseen_facts(VECTOR, card) is None

    def kernel(cid: str, t: float, tag: str) -> VerifiedKernel:
        return VerifiedKernel(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200", regime="cold",
                              text=f"FORMAT: CSR\nLAUNCH: grid=1, block=128\n// {tag}\n", time_us=t, cusparse_us=100.0,
                              speedup=100.0 / t, roofline=0.4, format="CSR", template=cid.split("/")[1],
                              candidate_id=cid, provenance="mutation", parent_id=None, model=None, run_id="r",
                              harness_version=harness_version())

    with BestStore(tmp_path / "s.sqlite") as st:
        st.add_matrix(card, "long_rows", coords=([0, 1], [0, 1]))
        st.record(kernel(spec, 10.0, "a"))
        st.record(kernel(VECTOR, 12.0, "b"))
        both, _ = export_rows(st, ExportFilter(per_matrix=4, within=0.5))
        seen, skipped = export_rows(st, ExportFilter(per_matrix=4, within=0.5, seen_only=True))
        one, skipped1 = export_rows(st, ExportFilter(per_matrix=1, within=0.5, seen_only=True))
    assert [r.variant for r in both] == [spec, VECTOR]
    assert [r.variant for r in seen] == [VECTOR] and skipped["unseen_facts"] == 1 and skipped["unjudged"] == 0
    assert [r.variant for r in one] == [VECTOR] and skipped1["unseen_facts"] == 1
    out = tmp_path / "teacher.jsonl"
    rc, msg, _ = run_cli(["best", "export", str(out), "--store", str(tmp_path / "s.sqlite"), "--per-matrix", "4",
                          "--within", "0.5", "--seen-only"], capsys)
    assert rc == 0 and "wrote 1 rows" in msg and "'unseen_facts': 1" in msg, msg


def test_free_text_is_judged_by_who_wrote_it(tmp_path: Path) -> None:
    """Free text passes only when the policy wrote it from the prompt (a policy sample), or refined
    it from a kernel the filter vouches for; a refinement of a kernel with unseen facts, a
    refinement of what cannot be judged, and free text met only as a known best's re-run are left
    out and counted as unjudged. Kills the mutation that passed every free-text kernel."""
    card = matrix_card(_long_rows(20))
    spec = get_template("spmv", "csr_adaptive_spec").candidate(ADAPTIVE).id
    assert unseen_facts(spec, card) is not None and not unseen_facts(spec, card).startswith("cannot be judged")

    def kernel(tag: str, t: float, provenance: str, parent: str | None = None) -> VerifiedKernel:
        from sparserl.search.space import text_id

        text = f"FORMAT: CSR\nLAUNCH: grid=1, block=128\n// {tag}\n"
        return VerifiedKernel(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200", regime="cold",
                              text=text, time_us=t, cusparse_us=100.0, speedup=100.0 / t, roofline=0.4, format="CSR",
                              template=None, candidate_id=text_id(text), provenance=provenance, parent_id=parent,
                              model="m", run_id="r", harness_version=harness_version())

    sample = kernel("sample", 10.0, "policy-sample")
    chain = kernel("refined-from-sample", 11.0, "policy-refine", sample.candidate_id)
    generic = kernel("refined-from-generic", 12.0, "policy-refine", VECTOR)
    leaked = kernel("refined-from-spec", 9.0, "policy-refine", spec)  # may copy the hidden table it was shown
    orphan = kernel("refined-from-unknown", 8.0, "policy-refine", "text/ffffffffffffffff")
    rerun = kernel("known-rerun", 7.0, "known-best")
    with BestStore(tmp_path / "s.sqlite") as st:
        st.add_matrix(card, "long_rows", coords=([0, 1], [0, 1]))
        for v in (sample, chain, generic, leaked, orphan, rerun):
            st.record(v)
        rows, skipped = export_rows(st, ExportFilter(per_matrix=10, seen_only=True))
    assert sorted(r.times.kernel_us for r in rows) == [10.0, 11.0, 12.0]
    assert skipped["unseen_facts"] == 3 and skipped["unjudged"] == 3


def test_a_specialised_point_not_valid_for_the_card_cannot_be_judged() -> None:
    """csr_lanes_spec bakes one row length: on a card whose rows differ its facts mean nothing, and the filter
    leaves it out rather than asking the template what it hides. Kills: the point's validity not checked (the
    filter then passed it as seen)."""
    card = matrix_card(_long_rows(3))
    t = get_template("spmv", "csr_lanes_spec")
    point = {q.name: q.values[0] for q in t.space}
    why = unseen_facts(t.candidate(point).id, card)
    assert why is not None and why.startswith("cannot be judged: not a valid point here (rows differ in length")


def test_free_text_authorship_rules() -> None:
    """:func:`free_text_unseen` from an authors table alone: a policy sample passes; a refinement passes when its
    parent passes, through text parents and up to ``MAX_REFINEMENT_CHAIN`` refinements, with the card handed to
    the parent's judgement; a kernel another author (a search mutation) derived from a vouched kernel does not
    pass. Kills: ``and`` made ``or`` in the refinement rule, the chain's bound moved or its depth started
    elsewhere, the card or the depth not passed down."""
    from sparserl.search.export import MAX_REFINEMENT_CHAIN, free_text_unseen

    card = matrix_card(_long_rows(3))
    spec = get_template("spmv", "csr_adaptive_spec").candidate(ADAPTIVE).id
    assert unseen_facts(spec, card) is None  # its table is on this card
    authors = {"text/sample": [("policy-sample", None)],
               "text/from-spec": [("policy-refine", spec)],
               "text/from-text-from-spec": [("policy-refine", "text/from-spec")],
               "text/mutated": [("mutation", VECTOR)]}
    for cid in ("text/sample", "text/from-spec", "text/from-text-from-spec"):
        assert free_text_unseen(cid, authors, card) is None, cid
    assert free_text_unseen("text/from-spec", authors, None) is not None  # the spec point needs the card
    assert free_text_unseen("text/from-text-from-spec", authors, None) is not None
    assert free_text_unseen("text/mutated", authors, card).startswith("cannot be judged: free text not written")

    def chain(n: int) -> dict:
        """text/r0 refined from text/r1 ... text/r{n-1} refined from text/r{n}, a policy sample: n refinements."""
        table = {f"text/r{i}": [("policy-refine", f"text/r{i + 1}")] for i in range(n)}
        table[f"text/r{n}"] = [("policy-sample", None)]
        return table

    assert free_text_unseen("text/r0", chain(MAX_REFINEMENT_CHAIN), card) is None
    assert free_text_unseen("text/r0", chain(MAX_REFINEMENT_CHAIN + 1), card) is not None


def test_the_export_judges_free_text_with_its_matrix_card(tmp_path: Path) -> None:
    """Through the store: a policy refinement of a specialised point whose facts this matrix's card shows is
    exported. Kills: the export judging free text without the card (it then left out every refinement of a
    specialised kernel)."""
    from sparserl.search.space import text_id

    card = matrix_card(_long_rows(3))
    spec = get_template("spmv", "csr_adaptive_spec").candidate(ADAPTIVE).id
    assert unseen_facts(spec, card) is None
    text = "FORMAT: CSR\nLAUNCH: grid=1, block=128\n// refined\n"
    with BestStore(tmp_path / "s.sqlite") as st:
        st.add_matrix(card, "long_rows", coords=([0, 1], [0, 1]))
        st.record(VerifiedKernel(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200",
                                 regime="cold", text=text, time_us=10.0, cusparse_us=100.0, speedup=10.0, roofline=0.4,
                                 format="CSR", template=None, candidate_id=text_id(text), provenance="policy-refine",
                                 parent_id=spec, model="m", run_id="r", harness_version=harness_version()))
        rows, skipped = export_rows(st, ExportFilter(per_matrix=10, seen_only=True))
    assert len(rows) == 1 and skipped["unseen_facts"] == 0
