"""benchmarks/library_speed.py's matrices on the CPU: ``--gcn`` hands the harness each graph's GCN
adjacency, the one ``benchmarks/operator_e2e.py`` multiplies (the timing itself runs on the device).
Mutations killed: the flag ignored (the raw graph timed), the self loops left out, the normalisation
left out or one-sided, the name that says which matrix was timed dropped."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tests.conftest import load_benchmark

bench = load_benchmark("library_speed")


def test_gcn_times_the_normalised_adjacency_with_self_loops(suitesparse) -> None:
    (name, fam, raw), = bench.matrices("suitesparse", suitesparse, {"karate"})
    (gname, gfam, A), = bench.matrices("suitesparse", suitesparse, {"karate"}, gcn=True)
    assert (name, gname, fam, gfam) == ("karate", "gcn_karate", "suitesparse", "suitesparse")
    S = ((abs(raw) + abs(raw.T)) > 0).astype(np.float64) + sp.identity(raw.shape[0])
    d = 1.0 / np.sqrt(np.asarray(S.sum(axis=1)).ravel())
    want = (sp.diags_array(d) @ S @ sp.diags_array(d)).toarray()
    assert A.nnz == S.nnz == raw.nnz + raw.shape[0]  # karate has no self loops: one added a row
    assert np.allclose(A.toarray(), want, rtol=1e-6, atol=0)
    assert A.dtype == np.float32
