"""GPU: a worker lets go of conversions when memory is short, and its verdicts do not change.

Run on the device machine: python -m pytest -m gpu tests/harness/test_memory_gpu.py
"""

from __future__ import annotations

import pytest

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.pool import PhaseLimits
from sparserl.harness.result import ErrorKind
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from tests.harness.adversarial import ADVERSARIAL

pytestmark = pytest.mark.gpu


def test_make_room_hands_the_memory_back(tmp_path) -> None:
    """Four conversions of a 300k-row matrix on the device; told the GPU is full, make_room drops
    them all (never the one about to be made) and CuPy's pool gives back at least their bytes; a
    dropped conversion is made again on the next request. Kills: references kept somewhere (the pool
    would not shrink), blocks not freed, a dropped conversion that cannot be made again."""
    cp = pytest.importorskip("cupy")
    from sparserl.harness.matrix_files import save_matrix_file
    from sparserl.harness.resident import MatrixCache

    A = generate("random", 300_000, seed=1, nnz_per_row=16)
    key, path = save_matrix_file(A, tmp_path)
    cache = MatrixCache(batched=False)
    st = cache.get({"key": key, "path": str(path)})
    for fmt in ("ELL", "SELL", "HYB", "COO"):
        for w in ("A", "A_alt"):
            assert not isinstance(st.on_device[w].get(fmt, {}), str), fmt
    sizes = dict(st.conversion_sizes())
    assert len(sizes) == 4 and all(v > 8 * A.nnz for v in sizes.values())  # both versions, at least values+indices
    pool = cp.get_default_memory_pool()
    held = pool.total_bytes()  # what the pool holds from the device, used or not
    plan = cache.make_room(key, ("CSR", ()), 0.5, lambda: (0, 1 << 40), pool.free_all_blocks)
    assert set(plan.conversions) == set(sizes) and plan.matrices == []
    assert held - pool.total_bytes() >= sum(sizes.values()), (held, pool.total_bytes(), sizes)
    again = st.on_device["A"].get("ELL", {})
    assert not isinstance(again, str) and int(again.arrays["col_idx"].size) > 0


def test_verdicts_hold_when_every_new_conversion_sheds_the_rest(tmp_path) -> None:
    """A worker told to keep all but 0.01% of the GPU free drops the matrix's other conversions before
    each new one (its warm-up job included). On the second pass every format's conversion is made
    again (an ``upload`` step in the job's profile: the shedding happened), and library kernels of
    four formats stay correct on it; a kernel that writes into the matrix is still input_modified
    after its conversion was dropped and made again; the honest CSR kernel gives the same worst
    error before and after. Kills: a pristine copy dropped while its conversion stays (a KeyError in
    the damage check: internal_error), a stale pristine copy kept for a fresh conversion (every later
    kernel input_modified), the job's own conversion dropped by a later step of the job, verdicts
    that depend on what the worker keeps."""
    cfg = HarnessConfig(limits=PhaseLimits(verify=3.0), cold_trials=5, warm_trials=3, memo=0, memory_reserve=0.9999,
                        cache_dir=str(tmp_path / "harness"))
    with Evaluator(cfg) as ev:
        mat = ev.register(generate("random", 50_000, seed=3, nnz_per_row=12), "random50k")
        honest = variants("spmv", "CSR")[1].render()
        before = ev.evaluate(honest, mat, "spmv")
        assert before.ok and before.max_scaled_error is not None, before.message
        for round_ in range(2):  # the second pass finds each conversion dropped by the others
            for fmt in ("ELL", "SELL", "HYB", "COO"):
                res = ev.evaluate(variants("spmv", fmt)[0].render(), mat, "spmv")
                assert res.ok, (fmt, res.error_kind, res.message)
                assert res.profile is not None and res.profile.seconds.get("upload", 0) > 0, (round_, fmt)
            bad = ev.evaluate(ADVERSARIAL["modifies_matrix"][0], mat, "spmv")
            assert bad.error_kind is ErrorKind.INPUT_MODIFIED, (bad.error_kind, bad.message)
            after = ev.evaluate(honest, mat, "spmv")
            assert after.ok and after.max_scaled_error == before.max_scaled_error, after.message
