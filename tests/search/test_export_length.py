"""The length limit on what the policy is taught (``best export --max-chars``, ``data build
--max-target-chars``): a kernel longer than the limit, without its comments, is not a target, and
the next fastest within it takes its place.

Mutations killed: the limit ignored (the long kernel exported), the matrix dropped instead of its
next fastest kernel taken, the length measured with the comments (a kernel under the limit without
them left out), the refinement rows' child not limited, the library targets not limited."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.data.targets import without_comments
from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.search.export import ExportFilter, export_rows, refinement_rows
from sparserl.search.store import BestStore, VerifiedKernel, harness_version

LONG = next(v for v in variants("spmv", "CSR") if v.strategy == "csr_adaptive")
SHORT = next(v for v in variants("spmv", "CSR") if v.strategy == "csr_vector")
LIMIT = 6300


def record(st: BestStore, card, v, t: float, parent: str | None) -> None:
    st.record(VerifiedKernel(card.fingerprint, "spmv", None, "sm_90", "H200", "cold", v.render(), t, 20.0, 20.0 / t,
                             None, "CSR", v.strategy, v.id, "mutation", parent, None, "r", harness_version()))


@pytest.fixture
def store(tmp_path: Path):
    from sparserl.encoding import sample_nonzeros

    with BestStore(tmp_path / "s.db") as st:
        A = generate("skewed", 2000, seed=1)
        card = matrix_card(A)
        r, c = sample_nonzeros(A, 1024, 0)
        st.add_matrix(card, "skewed", None, (r.tolist(), c.tolist()))
        record(st, card, SHORT, 8.0, None)
        record(st, card, LONG, 5.0, SHORT.id)  # the fastest, found from the short one: a refinement row
        # the fixtures straddle the limit, and only without comments does the long one fit its own bare length
        assert len(without_comments(LONG.render())) > LIMIT >= len(without_comments(SHORT.render()))
        assert len(LONG.render()) > len(without_comments(LONG.render()))
        yield st


def test_the_next_fastest_within_the_limit_is_exported(store) -> None:
    rows, skipped = export_rows(store)
    assert [r.variant for r in rows] == [LONG.id] and skipped["too_long"] == 0
    rows, skipped = export_rows(store, ExportFilter(max_chars=LIMIT))
    assert [r.variant for r in rows] == [SHORT.id] and skipped["too_long"] == 1
    # measured without comments: a limit at the long kernel's bare length (under its length as written) keeps it
    rows, _ = export_rows(store, ExportFilter(max_chars=len(without_comments(LONG.render()))))
    assert [r.variant for r in rows] == [LONG.id]


def test_within_counts_from_the_fastest_kernel_within_the_limit(store) -> None:
    """The short kernel is 60% slower than the long one: with ``within=0.05`` it is still the matrix's
    row under the limit (kills reading the best known before the length check: the matrix lost)."""
    rows, _ = export_rows(store, ExportFilter(within=0.05))
    assert [r.variant for r in rows] == [LONG.id]
    rows, skipped = export_rows(store, ExportFilter(within=0.05, max_chars=LIMIT, per_matrix=3))
    assert [r.variant for r in rows] == [SHORT.id] and skipped["too_long"] == 1


def test_the_refinement_child_is_limited(store) -> None:
    rows, _ = refinement_rows(store)
    assert [r.variant for r in rows] == [LONG.id]
    rows, skipped = refinement_rows(store, ExportFilter(max_chars=LIMIT))
    assert rows == [] and skipped["too_long"] == 1


def test_the_library_targets_are_limited_too() -> None:
    from sparserl.data.sft_build import SFTDataConfig, taught_variants

    every = taught_variants(Op.SPMV, None, None)
    kept = taught_variants(Op.SPMV, None, LIMIT)
    assert {v.strategy for v in every} - {v.strategy for v in kept} == {"csr_adaptive"}
    assert all(len(without_comments(v.render())) <= LIMIT for v in kept)
    with pytest.raises(SparseRLError, match="--max-target-chars"):
        SFTDataConfig(out="x", max_target_chars=0)
    with pytest.raises(SparseRLError, match="--max-chars"):
        ExportFilter(max_chars=0)
    from sparserl.improve.config import ImproveConfig

    with pytest.raises(SparseRLError, match="--max-target-chars"):
        ImproveConfig(data="d", model="m", out="o", max_target_chars=0)


class _CompiledEverything:
    """A harness without a GPU whose every kernel compiled: each variant is usable (compile-only)."""

    has_gpu = False

    def register(self, A, name):
        return name

    def evaluate_many(self, items, contenders=False):
        from sparserl.harness.result import ErrorKind, EvalResult

        self.texts = [t for t, *_ in items]
        return [EvalResult.failure("spmv", None, "m", ErrorKind.NO_GPU, "no GPU", compiled=True) for _ in items]


@pytest.mark.parametrize("limit", [None, LIMIT])
def test_the_data_build_evaluates_and_writes_only_variants_within_the_limit(tmp_path: Path, limit) -> None:
    from sparserl.data.rows import read_rows
    from sparserl.data.sft_build import SFTDataConfig, build_sft_data

    cfg = SFTDataConfig(out=str(tmp_path / "d"), families=("dense_lines",), matrices_per_family=1, min_rows=3000,
                        max_rows=3000, val_fraction=0.0, test_fraction=0.0, targets_per_matrix=200,
                        compile_only=True, max_target_chars=limit)
    ev = _CompiledEverything()
    build_sft_data(cfg, evaluator=ev)
    written = {r.variant.split("/")[1] for r in read_rows(tmp_path / "d" / "train.jsonl")}
    evaluated = {len(without_comments(t)) > LIMIT for t in ev.texts}
    assert ("csr_adaptive" in written) is (limit is None) and (True in evaluated) is (limit is None)
