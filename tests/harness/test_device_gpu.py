"""GPU: library kernels run through the contract's launch path and match the fp64 reference.

Skipped without a GPU; run on the device machine (`python -m pytest -m gpu`).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.formats import convert
from sparserl.harness.compile import compile_source
from sparserl.harness.device import DeviceMatrix, LoadedKernels, kernel_args, launch_all, prepare_output
from sparserl.harness.reference import compare
from sparserl.kernels.contract import FORMAT_NAMES, Op, evaluate_launches, split_completion
from sparserl.kernels.library import variants
from sparserl.matrices import generate

pytestmark = pytest.mark.gpu


def run(variant_text: str, op: Op, A, x: np.ndarray, k: int | None = None) -> np.ndarray:
    import cupy as cp

    header, code = split_completion(variant_text, op)
    built = compile_source(code)
    assert built.ok, built.log
    fd = convert(A, header.format, header.params)
    dev = DeviceMatrix.upload(fd)
    launches = evaluate_launches(header, op, fd.launch_env(op, k, 132))
    xd = cp.asarray(x)
    y = cp.full((A.shape[0],) if k is None else (A.shape[0], k), np.nan, dtype=cp.float32)
    prepare_output(fd, y)
    launch_all(LoadedKernels(built.cubin_path), launches, kernel_args(op, dev, xd, y, k))
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(y)


@pytest.mark.parametrize("op", list(Op))
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_first_variant_of_each_format_is_correct(op: Op, fmt: str) -> None:
    A = generate("banded", 3001, seed=0, bands=7)
    k = 8 if op is Op.SPMM else None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((A.shape[1],) if k is None else (A.shape[1], k)).astype(np.float32)
    v = variants(op, fmt, k)[0]
    y = run(v.render(), op, A, x, k)
    assert compare(A, x, y).ok


def test_unwritten_rows_are_caught() -> None:
    """A kernel that skips odd rows leaves NaN poison there, and the comparison fails."""
    A = generate("random", 1000, seed=1, nnz_per_row=8)
    v = variants(Op.SPMV, "CSR")[0]
    broken = v.render().replace("if (row >= m) return;", "if (row >= m || (row & 1)) return;")
    assert broken != v.render()
    x = np.ones(A.shape[1], np.float32)
    res = compare(A, x, run(broken, Op.SPMV, A, x))
    assert not res.ok and res.bad_rows == 500 and res.nonfinite == 500


def test_timing_and_cusparse_baseline() -> None:
    """cuSPARSE through the baseline path is correct and times with a small spread."""
    from sparserl.harness.baseline import time_cusparse
    from sparserl.harness.timing import TimingConfig

    A = generate("stencil2d", 250_000, seed=0)
    for op, k in ((Op.SPMV, None), (Op.SPMM, 8)):
        res = time_cusparse(A, op, k, TimingConfig(regime="cold", trials=7), check=True)
        assert res.best_alg in res.per_alg_us
        assert res.timing.median_us > 0 and res.timing.spread < 0.5, res.to_dict()
