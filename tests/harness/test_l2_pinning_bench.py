"""benchmarks/l2_pinning.py on a CPU: its summary (medians, each ratio over the honest kernel's cold median)
and its kernels (the pinned one is what the compiled-code check refuses, the honest one alone passes). Kills a
mean instead of a median, a ratio the wrong way up or over the wrong measurement, and a benchmark whose
"pinned" kernel carries no L2 policy (it would measure nothing)."""

from __future__ import annotations

import pytest

from sparserl.harness.compile import CompileOptions, compile_source, find_nvcc
from tests.conftest import load_benchmark


def test_summary() -> None:
    rows = [{"matrix": "a", "matrix_mb": 16.0, "l2_mb": 60.0, "samples_us": {
        "honest": [10.0, 10.0, 40.0], "pinned": [5.0, 5.0, 5.0], "honest_after_pinned": [6.0],
        "honest_after_demote": [11.0], "warm": [4.0]}}]
    (t,) = load_benchmark("l2_pinning").summarize(rows)
    assert t["honest_us"] == 10.0 and t["pinned_us"] == 5.0
    assert (t["pinned_over_honest"], t["after_pinned_over_honest"], t["after_demote_over_honest"],
            t["warm_over_honest"]) == pytest.approx((0.5, 0.6, 1.1, 0.4))
    assert (t["matrix"], t["matrix_mb"], t["l2_mb"]) == ("a", 16.0, 60.0)


@pytest.mark.skipif(find_nvcc() is None, reason="no nvcc")
def test_the_pinned_kernel_carries_the_policy_the_check_refuses(tmp_path) -> None:
    mod = load_benchmark("l2_pinning")
    res = compile_source(mod.SOURCE, CompileOptions(backend="nvcc"), tmp_path / "both")
    assert res.ok and res.ptx_violation is not None and "L2 eviction policy" in res.ptx_violation
    honest_only = mod.SOURCE.split('extern "C" __global__ void pinned')[0]
    res = compile_source(honest_only, CompileOptions(backend="nvcc"), tmp_path / "honest")
    assert res.ok and res.ptx_violation is None, res.ptx_violation
