"""GPU: a search of budget 8 on a real SuiteSparse matrix through the real harness (no double), its
winner written to a best-known store, and that winner evaluated again by an independent harness.

Mutations this kills (each named where it is caught):
* the store keeping a candidate other than the fastest verified one, or a time other than the one
  the harness measured for it (the stored row against the search's trace);
* an unverified kernel entering the store, or a verified one left out (results against the
  trace's correct entries);
* a verdict or a time attached to the wrong candidate (the independent re-evaluation of the
  stored text must verify it and measure a time near the stored one).
"""

from __future__ import annotations

import pytest

from sparserl.kernels.contract import Op
from sparserl.matrices import load_matrix
from sparserl.matrices.card import matrix_card
from sparserl.search.loop import SearchConfig, StoreSink, run_search
from sparserl.search.store import BestStore, harness_version

pytestmark = pytest.mark.gpu

MATRIX = "bcsstk29"
"""A real FEM matrix: 13,992 rows, 619,488 nonzeros (the largest in the SuiteSparse folder)."""
CLOSE = (0.8, 1.25)
"""A time measured again by another harness, over the stored one (both medians of 15 cold runs)."""


def test_search_winner_is_verified_and_timed_again_by_an_independent_harness(
        suitesparse, loop_evaluator, fresh_evaluator, tmp_path) -> None:
    path = suitesparse / f"{MATRIX}.mtx.gz"
    A = load_matrix(path)
    card = matrix_card(A)
    with BestStore(tmp_path / "best.sqlite") as store:
        sink = StoreSink(store, card, MATRIX, str(path), None, {"test": "search on the GPU"})
        res = run_search(A, MATRIX, Op.SPMV, None, SearchConfig(budget=8, regime="cold", seed=0), loop_evaluator,
                         card=card, sink=sink, progress=False)
        rows = store.best(fingerprint=card.fingerprint, op="spmv", regime="cold", harness_version=harness_version())
        stored = store.results(fingerprint=card.fingerprint, op="spmv", regime="cold")

    verdicts = [(e.proposal.id, e.result.error_kind.value, e.result.message[:120]) for e in res.entries]
    assert res.timed and res.evaluated == 8 and res.stopped == "budget", verdicts
    verified = [e for e in res.entries if e.result.ok]
    assert len(verified) >= 2, verdicts  # library seeds verify on a real matrix
    assert all(e.time_us("cold") > 0 and e.result.speedup > 0 for e in verified)

    # the store holds every verified result and nothing else, and the fastest as its best
    assert len(stored) == len(verified) == res.store_writes
    assert sorted(r.time_us for r in stored) == sorted(e.time_us("cold") for e in verified)
    fastest = min(verified, key=lambda e: e.time_us("cold"))
    assert res.best is fastest and len(rows) == 1
    row = rows[0]
    assert row.text == fastest.proposal.text and row.candidate_id == fastest.proposal.id
    assert row.time_us == fastest.time_us("cold") and row.speedup == pytest.approx(row.cusparse_us / row.time_us)

    # an independent harness: the stored text is correct and about as fast as stored
    again = fresh_evaluator.evaluate(row.text, fresh_evaluator.register(load_matrix(path), MATRIX), Op.SPMV)
    assert again.ok, (again.error_kind.value, again.message)
    t, base = again.timings["cold"].median_us, again.baseline["cold"].median_us
    assert CLOSE[0] < t / row.time_us < CLOSE[1], (t, row.time_us)
    assert CLOSE[0] < base / row.cusparse_us < CLOSE[1], (base, row.cusparse_us)
