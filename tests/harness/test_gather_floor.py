"""benchmarks/gather_floor.py: its floor kernels compile for sm_90 with nvcc (CPU), and on a GPU
the floors come out in the order their reads impose and the gather reads what it claims."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import load_benchmark


def _script():
    return load_benchmark("gather_floor")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on the PATH")
def test_floor_kernels_compile_for_hopper(tmp_path: Path) -> None:
    src = tmp_path / "floors.cu"
    src.write_text(_script().KERNELS)
    p = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "floors.cubin"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "floors.cubin").stat().st_size > 0


@pytest.mark.gpu
def test_floors_on_a_gpu() -> None:
    """The gather kernel computes sum(val * x[col]) over its threads (so its reads are real), and
    on a random matrix the floors order as their traffic: stream <= gather <= gather + rows."""
    import cupy as cp
    import scipy.sparse as sp

    from sparserl.harness.timing import FlushBuffer, TimingConfig
    from sparserl.matrices import generate

    mod = _script()
    A = sp.csr_array(generate("random", 200_000, seed=3, nnz_per_row=16))
    col, val = cp.asarray(A.indices.astype(np.int32)), cp.asarray(A.data.astype(np.float32))
    x_h = np.random.default_rng(1).standard_normal(A.shape[1]).astype(np.float32)
    sink = cp.zeros(132 * 256, dtype=cp.float32)
    fn = cp.RawModule(code=mod.KERNELS, options=("-std=c++17",)).get_function("gather_floor")
    fn((132,), (256,), (col, val, cp.asarray(x_h), np.int64(A.nnz), sink))
    want = float(np.dot(A.data.astype(np.float64), x_h[A.indices].astype(np.float64)))
    assert float(sink.sum()) == pytest.approx(want, rel=1e-3, abs=1e-2)

    f = mod.floors(A, TimingConfig(regime="cold", trials=11), FlushBuffer())
    assert 0 < f["stream_floor"]["us"] <= f["gather_floor"]["us"] * 1.05
    assert f["gather_floor"]["us"] <= f["gather_rows_floor"]["us"] * 1.05
