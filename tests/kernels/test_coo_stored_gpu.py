"""COO SpMM with Y not zeroed (``FORMAT: COO zero_y=0``): every row written exactly once, or zeroed and
then added into, on the structures that make that hard.

The ``coo_runs_stored`` kernels skip the harness's memset of Y: a first launch zeroes the rows a
boundary between two groups of entries cuts and the rows before the first entry and after the last; the walk stores every other row, and the zeros of the empty rows between two entries.
The matrix here has empty rows before the first entry, after the last, in a run of 300 and scattered;
a row of 1500 entries that crosses many group boundaries; rows that end exactly on a boundary. k = 8
(a part of one column tile) and k = 136 (several tiles of 64 or 128 columns).

Mutations the GPU part kills (each leaves NaN poison or a lost partial sum in Y: ``incorrect``): the
leading or trailing empty rows not zeroed, the empty rows between entries not stored (inside a group
or before its first entry), a cut row not zeroed before the adds, a cut row stored instead of added
(the other group's part lost), a row inside one group added into instead of stored (it was never
zeroed).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.library import all_variants
from sparserl.matrices import canonicalize, generate

STORED = [v for v in all_variants() if v.strategy == "coo_runs_stored"]


def gaps_matrix() -> sp.csr_array:
    """3000 x 2000: empty rows at both ends, a run of 300 in the middle and every 7th elsewhere, one
    row of 1500 entries, rows of exactly 64 entries (boundaries between rows), the rest of 1-40."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 41, size=3000)
    lengths[:10] = 0
    lengths[-10:] = 0
    lengths[1200:1500] = 0
    lengths[20:1200:7] = 0
    lengths[1600] = 1500
    lengths[1700:1720] = 64
    rows = np.repeat(np.arange(3000), lengths)
    cols = np.concatenate([rng.choice(2000, size=n, replace=False) for n in lengths if n])
    vals = rng.standard_normal(rows.size)
    return canonicalize(sp.csr_array((vals, (rows, cols)), shape=(3000, 2000)))


def test_the_stored_kernels_say_zero_y_0_and_compile_on_these_matrices() -> None:
    """CPU part: the variants exist, declare the option, and get through the harness's front."""
    assert len(STORED) == 7 and all(v.render().startswith("FORMAT: COO zero_y=0\n") for v in STORED)
    A = gaps_matrix()
    assert A.shape == (3000, 2000) and np.diff(A.indptr)[[0, 2999, 1300, 1600]].tolist() == [0, 0, 0, 1500]
    with Evaluator(HarnessConfig(compile_only=True)) as ev:
        ref = ev.register(A, "gaps")
        for r in ev.evaluate_many([(v.render(), ref, "spmm", 136) for v in STORED]):
            assert r.compiled and r.error_kind in (ErrorKind.NO_GPU, ErrorKind.NONE), r.message


@pytest.mark.gpu
def test_the_stored_kernels_are_correct_where_rows_are_empty_or_shared(tmp_path) -> None:
    cfg = HarnessConfig(regimes=("cold",), reward_regime="cold", cold_trials=3, warm_trials=3, warmup=0,
                        cache_dir=str(tmp_path))
    mats = {"gaps": gaps_matrix(), "empty_rows": generate("empty_rows", 20_000, seed=3),
            "skewed": generate("skewed", 20_000, seed=3, long_len=5000, long_fraction=0.001)}
    with Evaluator(cfg) as ev:
        refs = {name: ev.register(A, name) for name, A in mats.items()}
        jobs = [(v, name, k) for v in STORED for name in mats for k in (8, 136)]
        results = ev.evaluate_many([(v.render(), refs[name], "spmm", k) for v, name, k in jobs])
    bad = [(v.id, name, k, r.error_kind.value, r.message[:200]) for (v, name, k), r in zip(jobs, results) if not r.correct]
    assert not bad, bad
