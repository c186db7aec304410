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
    on a random matrix the floors order as their traffic: launch <= stream <= gather <= gather + rows."""
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
    assert 0 < f["launch_floor"]["us"] <= f["stream_floor"]["us"] * 1.05  # one block that reads nothing
    assert f["launch_floor"]["us"] <= f["fill_launch_floor"]["us"] * 1.05  # the same after a fill of y
    assert f["launch_floor"]["us"] <= f["memset_launch_floor"]["us"] * 1.05  # ... or after a memset of y
    assert 0 < f["stream_floor"]["us"] <= f["gather_floor"]["us"] * 1.05
    assert f["gather_floor"]["us"] <= f["gather_rows_floor"]["us"] * 1.05


def test_ceilings_rescale_the_other_runs_oracle_by_cusparse_and_bound_it_by_the_floors() -> None:
    """``ceilings``: the other run's oracle time is moved to this run by cuSPARSE's ratio, divided by
    this run's launch and gather-plus-rows floors; matrices missing from either side are left out and
    counted; the capped search takes each matrix's better of its search and the estimate. Kills the
    rescale dropped or inverted, a missing matrix counted, and the cap taking the search alone."""
    rows = [{"matrix": "a", "nnz": 10, "cusparse_us": 20.0, "launch_floor": 4.0, "gather_rows_floor": 5.0,
             "fill_launch_floor": 6.0, "memset_launch_floor": 5.0},
            {"matrix": "b", "nnz": 20, "cusparse_us": 10.0, "launch_floor": 4.0, "gather_rows_floor": 8.0},
            {"matrix": "only_here", "nnz": 1, "cusparse_us": 10.0, "launch_floor": 4.0, "gather_rows_floor": 4.0}]
    other = [{"matrix": "a", "cusparse_us": 10.0, "oracle_us": 3.0, "search_us": 3.0},   # here 2x slower: 6 us
             {"matrix": "b", "cusparse_us": 10.0, "oracle_us": 8.8, "search_us": 8.0},
             {"matrix": "only_there", "cusparse_us": 10.0, "oracle_us": 1.0, "search_us": 1.0}]
    out = _script().ceilings(rows, other)
    per = {p["matrix"]: p for p in out["per_matrix"]}
    assert set(per) == {"a", "b"} and out["summary"]["left_out"] == 1 and out["summary"]["matrices"] == 2
    assert per["a"]["oracle_us"] == pytest.approx(6.0) and per["a"]["oracle_over_launch"] == pytest.approx(1.5)
    assert per["a"]["oracle_over_gather_rows"] == pytest.approx(1.2) and per["a"]["search_over_oracle"] == 1.0
    assert per["b"]["oracle_over_gather_rows"] == pytest.approx(1.1) and per["b"]["search_over_oracle"] == pytest.approx(1.1)
    # a: max(1.0, 1.2) = 1.2; b: max(1.1, 1.1) = 1.1
    assert out["summary"]["search_capped_at_gather_rows"] == pytest.approx((1.2 * 1.1) ** 0.5)
    assert out["summary"]["search_over_oracle"] == pytest.approx((1.0 * 1.1) ** 0.5)
    assert out["summary"]["fill_launch_us"] == pytest.approx(6.0)  # b has none: left out of the mean
    assert out["summary"]["memset_launch_us"] == pytest.approx(5.0)


def test_bad_input_stops_before_any_gpu_work(tmp_path: Path) -> None:
    """An empty --suitesparse folder and a --compare file that is not there: one-line errors, on a
    machine with or without a GPU."""
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gather_floor.py"
    for extra, said in (([], "no .mtx/.mtx.gz/.npz files"), (["--compare", str(tmp_path / "none.json")], "no such file")):
        p = subprocess.run([sys.executable, str(script), "--suitesparse", str(tmp_path), *extra],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and said in p.stderr, p.stderr[-500:]
