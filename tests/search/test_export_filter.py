"""Which verified kernels the teacher export takes (:class:`ExportFilter`): each filter alone, each edge at its
value, and the counts of what was skipped. Written from what mutation testing of ``search/export.py`` let through
(docs/testing.md).

Mutations killed: the op, architecture, regime or harness-version filter not passed to the store (a kernel
verified on another GPU or under an older harness, whose checks may have had a hole, taught as this one's); the
matrix filter inverted; ``--within`` or ``--min-speedup`` made exclusive at its edge; a kernel kept twice under two
keys not counted as a duplicate; a matrix without coordinates counted wrongly."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.search.export import ExportFilter, export_rows
from sparserl.search.store import BestStore, VerifiedKernel, harness_version
from tests.search.test_export_refinements import add_matrices

TEXTS = {v.id: v.render() for v in variants("spmv", "CSR")[:4]}
IDS = list(TEXTS)
HV = harness_version()


def record(st: BestStore, card, cid: str, t: float, *, op: str = "spmv", arch: str = "sm_90", regime: str = "cold",
           hv: str = HV, cusparse_us: float = 20.0) -> None:
    k = 32 if op == "spmm" else None
    st.record(VerifiedKernel(card.fingerprint, op, k, arch, "H200", regime, TEXTS[cid], t, cusparse_us,
                             cusparse_us / t, None, "CSR", cid.split("/")[1], cid, "mutation", None, None, "r", hv))


@pytest.fixture
def stores(tmp_path: Path):
    with BestStore(tmp_path / "s.db") as st:
        yield st, add_matrices(st)


def times(rows) -> list[float]:
    return sorted(r.times.kernel_us for r in rows)


def test_each_filter_alone(stores) -> None:
    st, (a, b) = stores
    record(st, a, IDS[0], 10.0)
    record(st, a, IDS[1], 11.0, op="spmm")
    record(st, a, IDS[2], 12.0, arch="sm_80")
    record(st, a, IDS[3], 13.0, regime="warm")
    record(st, b, IDS[0], 14.0, hv="0-old")
    every = ExportFilter(per_matrix=10)
    assert times(export_rows(st, every)[0]) == [10.0, 11.0, 12.0, 13.0, 14.0]
    for flt, kept in ((ExportFilter(per_matrix=10, op="spmv"), [10.0, 12.0, 13.0, 14.0]),
                      (ExportFilter(per_matrix=10, arch="sm_90"), [10.0, 11.0, 13.0, 14.0]),
                      (ExportFilter(per_matrix=10, regime="cold"), [10.0, 11.0, 12.0, 14.0]),
                      (ExportFilter(per_matrix=10, harness_version=HV), [10.0, 11.0, 12.0, 13.0]),
                      (ExportFilter(per_matrix=10, fingerprints=frozenset({b.fingerprint})), [14.0])):
        assert times(export_rows(st, flt)[0]) == kept, flt


def test_within_and_min_speedup_keep_their_edges(stores) -> None:
    """Times 10, 10.5 and 10.6 us: ``within`` 0.05 keeps 10.5 (exactly 5% slower) and drops 10.6;
    ``min_speedup`` 2.0 keeps the kernel at exactly 2.0x (cuSPARSE 21 us over 10.5)."""
    st, (a, _) = stores
    record(st, a, IDS[0], 10.0, cusparse_us=21.0)
    record(st, a, IDS[1], 10.5, cusparse_us=21.0)
    record(st, a, IDS[2], 10.6, cusparse_us=21.0)
    assert times(export_rows(st, ExportFilter(per_matrix=10, within=0.05))[0]) == [10.0, 10.5]
    assert times(export_rows(st, ExportFilter(per_matrix=10, min_speedup=2.0))[0]) == [10.0, 10.5]


def test_a_kernel_under_two_keys_is_one_row_and_a_matrix_without_coordinates_is_counted(stores, tmp_path) -> None:
    """The same kernel timed in two regimes is taught once (the second counted as a duplicate); kernels of a
    matrix the store has no coordinates for, and whose file is gone, are counted one each."""
    st, (a, _) = stores
    record(st, a, IDS[0], 10.0, regime="cold")
    record(st, a, IDS[0], 8.0, regime="warm")
    rows, skipped = export_rows(st, ExportFilter(per_matrix=10))
    assert len(rows) == 1 and skipped["duplicate"] == 1 and skipped["no_coordinates"] == 0
    bare = matrix_card(generate("powerlaw", 400, seed=3))
    st.add_matrix(bare, "powerlaw", None, None)
    record(st, bare, IDS[1], 9.0)
    record(st, bare, IDS[2], 9.5)
    rows, skipped = export_rows(st, ExportFilter(per_matrix=10))
    assert len(rows) == 1 and skipped["no_coordinates"] == 2 and skipped["duplicate"] == 1


def test_refinement_rows_apply_the_filter_to_the_child(stores) -> None:
    """A refinement row is kept by the same rules as a kernel: ``seen_only`` leaves out a child the filter cannot
    vouch for (free text a search mutation wrote) and keeps one the policy refined from a generic kernel; the
    harness-version filter leaves out a pair timed under another version; ``min_speedup`` keeps a child at exactly
    its value. Kills: ``seen_only`` ignored or judging nothing in refinement rows, the store filters not passed,
    the speed edge made exclusive."""
    from sparserl.search.export import refinement_rows
    from sparserl.search.space import text_id

    st, (a, b) = stores

    def child(card, tag: str, t: float, provenance: str, hv: str = HV) -> None:
        text = TEXTS[IDS[1]] + f"// {tag}\n"
        st.record(VerifiedKernel(card.fingerprint, "spmv", None, "sm_90", "H200", "cold", text, t, 20.0, 20.0 / t,
                                 None, "CSR", None, text_id(text), provenance, IDS[0], None, "r", hv))

    record(st, a, IDS[0], 10.0)
    child(a, "mutated", 8.0, "mutation")
    child(a, "refined", 9.0, "policy-refine")
    record(st, b, IDS[0], 10.0, hv="0-old")
    child(b, "old", 8.0, "policy-refine", hv="0-old")
    assert sorted(r.times.kernel_us for r in refinement_rows(st, ExportFilter())[0]) == [8.0, 8.0, 9.0]
    rows, skipped = refinement_rows(st, ExportFilter(seen_only=True, harness_version=HV))
    assert [r.times.kernel_us for r in rows] == [9.0] and skipped["unseen_facts"] == 1
    assert sorted(r.times.kernel_us for r in refinement_rows(st, ExportFilter(harness_version="0-old"))[0]) == [8.0]
    at_edge = refinement_rows(st, ExportFilter(min_speedup=20.0 / 9.0, harness_version=HV))
    assert sorted(r.times.kernel_us for r in at_edge[0]) == [8.0, 9.0]
