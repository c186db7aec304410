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


def _long_rows(n_long: int, rows: int = 3000) -> sp.csr_array:
    """``n_long`` rows of 600-700 entries (lengths all distinct), the rest of 3."""
    rng = np.random.default_rng(0)
    lengths = np.full(rows, 3)
    lengths[rng.choice(rows, n_long, replace=False)] = 600 + np.arange(n_long)
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
        assert why.startswith(f"{n_long - LONGEST_ROWS} of the {n_long} long rows")
    searching = dict(ADAPTIVE, long_len=16384, seg=1024)  # no row is longer: no table, nothing baked
    assert t.unseen_facts(searching, card) is None
    assert get_template("spmv", "csr_adaptive").unseen_facts(ADAPTIVE, card) is None  # the generic form


def test_diagonal_offsets_are_unseen_when_too_many_to_list() -> None:
    t = get_template("spmv", "dia_window_spec")
    p = {"block": 256, "v": 1}
    assert t.unseen_facts(p, matrix_card(_diagonals([-1, 0, 1]))) is None
    why = t.unseen_facts(p, matrix_card(_diagonals(list(range(-60, 60, 3)))))
    assert why is not None and "40 diagonal offsets" in why


def test_the_teacher_export_leaves_out_kernels_with_unseen_facts(tmp_path: Path, capsys) -> None:
    """The fastest kernel bakes a table of 20 long rows (12 not on the prompt): with seen_only the
    export takes the next one (within 50% of the best), and counts what it left out."""
    card = matrix_card(_long_rows(20))
    spec = get_template("spmv", "csr_adaptive_spec").candidate(ADAPTIVE).id
    assert unseen_facts(spec, card) is not None
    assert unseen_facts("spmv/csr_vector/-/x", card) is None and unseen_facts(None, card) is None

    def kernel(cid: str, t: float, tag: str) -> VerifiedKernel:
        return VerifiedKernel(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200", regime="cold",
                              text=f"FORMAT: CSR\nLAUNCH: grid=1, block=128\n// {tag}\n", time_us=t, cusparse_us=100.0,
                              speedup=100.0 / t, roofline=0.4, format="CSR", template=cid.split("/")[1],
                              candidate_id=cid, provenance="mutation", parent_id=None, model=None, run_id="r",
                              harness_version=harness_version())

    with BestStore(tmp_path / "s.sqlite") as st:
        st.add_matrix(card, "long_rows", coords=([0, 1], [0, 1]))
        st.record(kernel(spec, 10.0, "a"))
        st.record(kernel("spmv/csr_vector/-/tpr=4", 12.0, "b"))
        both, _ = export_rows(st, ExportFilter(per_matrix=4, within=0.5))
        seen, skipped = export_rows(st, ExportFilter(per_matrix=4, within=0.5, seen_only=True))
    assert [r["variant"] for r in both] == [spec, "spmv/csr_vector/-/tpr=4"]
    assert [r["variant"] for r in seen] == ["spmv/csr_vector/-/tpr=4"] and skipped["unseen_facts"] == 1
    out = tmp_path / "teacher.jsonl"
    rc, msg, _ = run_cli(["best", "export", str(out), "--store", str(tmp_path / "s.sqlite"), "--per-matrix", "4",
                          "--within", "0.5", "--seen-only"], capsys)
    assert rc == 0 and "wrote 1 rows" in msg and "'unseen_facts': 1" in msg, msg
