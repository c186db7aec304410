"""GPU: library kernels run through the contract's launch path and match the fp64 reference.

Skipped without a GPU; run on the device machine (`python -m pytest -m gpu`).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.formats import convert
from sparserl.harness.compile import CompileOptions, compile_source
from sparserl.harness.device import DeviceMatrix, LoadedKernels, kernel_args, launch_all, prepare_output
from sparserl.harness.reference import Fp64Reference
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
    assert Fp64Reference(A).compare(x, y).ok


def test_unwritten_rows_are_caught() -> None:
    """A kernel that skips odd rows leaves NaN poison there, and the comparison fails."""
    A = generate("random", 1000, seed=1, nnz_per_row=8)
    v = variants(Op.SPMV, "CSR")[0]
    broken = v.render().replace("if (row >= m) return;", "if (row >= m || (row & 1)) return;")
    assert broken != v.render()
    x = np.ones(A.shape[1], np.float32)
    res = Fp64Reference(A).compare(x, run(broken, Op.SPMV, A, x))
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


def test_io_buffers_guards_and_refresh() -> None:
    """Guards catch a write on either side of x and y by bit pattern; refresh gives fresh x in
    [0, 1) from the device seed and poisons y."""
    import cupy as cp

    from sparserl.harness.buffers import NAN_BITS, IOBuffers

    io = IOBuffers(1000, 700)
    assert io.guard_problem() is None and bool(cp.isnan(io.y).all())
    seed = cp.asarray([12345], dtype=cp.uint64)
    io.y.fill(1.0)
    io.refresh(seed, 0)
    x0 = io.x.copy()
    assert bool(cp.isnan(io.y).all()) and float(io.x.min()) >= 0.0 and float(io.x.max()) < 1.0
    assert float(cp.abs(io.x).mean()) > 0.3  # spread over the interval, not a constant
    io.refresh(seed, 1)
    assert not bool(cp.array_equal(io.x, x0))
    io.refresh(seed, 0, poison=False)
    assert bool(cp.array_equal(io.x, x0))  # the same seed and offset give the same x again
    for full, where in ((io.yfull, "before the start of y"), (io.xfull, "past the end of x")):
        i = 3 if "before" in where else full.size - 2
        full[i] = 0.0
        assert io.guard_problem() == f"wrote {where}"
        full.view(cp.uint32)[i] = NAN_BITS
    io.yfull.view(cp.uint32)[io.yfull.size - 1] = 0x7FC00001  # another NaN is still a write
    assert io.guard_problem() == "wrote past the end of y"


def test_timed_runs_are_prepared_and_checked() -> None:
    """time_run with a CheckedIO: an honest kernel passes every check; one that skips rows already
    holding a number computes on every poisoned y (warm) and is rejected cold at the run whose y keeps
    the previous run's output (a user's y); one that leaves y alone on timed runs, or zeroes most of x
    and answers for what it left, is rejected, saying which run (cold, the second kills a check that
    reads the x left in the buffer). Kills: the cold stale-y run left out (the skipping kernel passes)."""
    import cupy as cp

    from sparserl.harness.buffers import CheckedIO, IOBuffers
    from sparserl.harness.launcher import BoundKernel, MatrixOnDevice
    from sparserl.harness.timing import TimedRunRejected, TimingConfig, time_run
    from tests.harness.adversarial import ADVERSARIAL, GOOD

    A = generate("random", 20_000, seed=3, nnz_per_row=12)
    ref = Fp64Reference(A, cp)
    mod = MatrixOnDevice(A)

    def bound(text):
        header, code = split_completion(text, Op.SPMV)
        built = compile_source(code)
        assert built.ok, built.log
        return BoundKernel.bind(header, Op.SPMV, built.cubin_path, mod, None, 132)

    for regime in ("cold", "warm"):
        cfg = TimingConfig(regime=regime, trials=5, warm_target_ms=0.2)
        skips = ADVERSARIAL["skips_rows_already_written"][0]
        for text in (GOOD, skips) if regime == "warm" else (GOOD,):
            io = IOBuffers(*A.shape)
            checked = CheckedIO(io, ref)
            t = time_run(bound(text).runner(io.x, io.y), cfg, io=checked)
            assert t.median_us > 0 and checked.checked >= (5 if regime == "cold" else 10)
        if regime == "cold":
            io = IOBuffers(*A.shape)
            with pytest.raises(TimedRunRejected, match="its y holding the previous run's output"):
                time_run(bound(skips).runner(io.x, io.y), cfg, io=CheckedIO(io, ref))
        for cheat in ("skips_on_timed_input_grid", "zeroes_x_when_timed"):
            io = IOBuffers(*A.shape)
            with pytest.raises(TimedRunRejected, match=f"timed run \\({regime}"):
                time_run(bound(ADVERSARIAL[cheat][0]).runner(io.x, io.y), cfg, io=CheckedIO(io, ref))


@pytest.mark.parametrize("batched", [False, True])
def test_resident_matrix_finds_damage_to_arrays_pristine_copies_and_references(batched: bool) -> None:
    """The check a worker runs before a job's first launch, on a matrix state built in this process
    (batched: the arrays compared by kernels and everything read back in one copy; the balanced
    check's plan fingerprinted with the references)."""
    import cupy as cp

    from sparserl.harness.resident import ResidentMatrix
    from sparserl.harness.verify import VerifyConfig

    A = generate("random", 5_000, seed=1)
    st = ResidentMatrix(A, batched=batched)
    assert not np.array_equal(st.A_alt.data, A.data) and np.array_equal(st.A_alt.indices, A.indices)
    key = ("A", ("CSR", ()))
    arrays = {"row_ptr": cp.asarray(A.indptr), "val": cp.asarray(A.data)}
    st.keep_pristine(key, arrays)
    st.verifier(None, VerifyConfig())
    assert st.damage(key, arrays) == []
    arrays["val"][7] += 1.0
    assert st.damage(key, arrays) == ["val"]
    assert st.modified(key, arrays) == ["val"] and st.damage(key, arrays) == []  # restored
    st.pristine[key]["row_ptr"][3] += 1  # a stray write into the pristine copy itself
    assert st.damage(key, arrays) == ["row_ptr", "their pristine copies"]
    st.pristine[key]["row_ptr"][3] -= 1
    assert st.damage(key, arrays) == []
    st.references["A"].val[0] += 1.0  # the fp64 reference's copy of the values
    assert st.damage(key, arrays) == ["the verification references or inputs"]
    st.references["A"].val[0] -= 1.0
    next(iter(st.verifiers.values())).inputs[0][1][5] += 1.0  # a verification input
    assert st.damage(key, arrays) == ["the verification references or inputs"]
    next(iter(st.verifiers.values())).inputs[0][1][5] -= 1.0
    assert st.damage(key, arrays) == []
    if batched:
        st.checks["A_alt"].chunk_ptr[0] += 1  # the balanced check's plan
        assert st.damage(key, arrays) == ["the verification references or inputs"]
        st.checks["A_alt"].chunk_ptr[0] -= 1
    # two targets, one of them damaged: each is named on its own
    other = ("A_alt", ("CSR", ()))
    alt = {"row_ptr": cp.asarray(A.indptr), "val": cp.asarray(st.A_alt.data)}
    st.keep_pristine(other, alt)
    alt["val"][0] = 0.0
    assert st.damage_report([(key, arrays), (other, alt)]) == ({key: [], other: ["val"]}, False)


@pytest.mark.parametrize("k", [None, 3])
def test_gpu_comparison_agrees_with_the_host_one(k) -> None:
    """The worker's one-pass fp64 check gives the host (SciPy) comparison's verdict and figures."""
    import cupy as cp

    A = generate("powerlaw", 5000, seed=2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((A.shape[1],) if k is None else (A.shape[1], k)).astype(np.float32)
    exact = (A.astype(np.float64) @ x.astype(np.float64)).astype(np.float32)
    bad = exact.copy()
    bad[[3, 17]] += 1.0
    bad[40] = np.nan
    host, dev = Fp64Reference(A), Fp64Reference(A, cp)
    for y in (exact, bad):
        a, b = host.compare(x, y), dev.compare(cp.asarray(x), cp.asarray(y))
        assert (a.ok, a.bad_rows, a.nonfinite, a.first_bad_row) == (b.ok, b.bad_rows, b.nonfinite, b.first_bad_row)
        assert b.max_scaled_error == pytest.approx(a.max_scaled_error, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("k", [None, 3])
def test_the_host_double_of_the_check_kernel_agrees_with_it(k) -> None:
    """The CPU tests run the one-pass path with ``CheckKernelDouble`` in place of ``fp64_check``: on
    the same outputs (correct, wrong rows, a NaN, an unwritten last row) the double and the CUDA
    kernel give the same verdicts and figures."""
    import cupy as cp

    from tests.harness.check_kernel_double import CheckKernelDouble

    A = generate("powerlaw", 3000, seed=5)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((A.shape[1],) if k is None else (A.shape[1], k)).astype(np.float32)
    exact = (A.astype(np.float64) @ x.astype(np.float64)).astype(np.float32)
    bad = exact.copy()
    bad[[5, 2999]] *= 1.01
    bad[7] = np.nan
    double, dev = Fp64Reference(A, np, check=CheckKernelDouble()), Fp64Reference(A, cp)
    for y in (exact, bad, exact):
        a, b = double.compare(x, y), dev.compare(cp.asarray(x), cp.asarray(y))
        assert (a.ok, a.bad_rows, a.nonfinite, a.first_bad_row) == (b.ok, b.bad_rows, b.nonfinite, b.first_bad_row)
        assert b.max_scaled_error == pytest.approx(a.max_scaled_error, rel=1e-6, abs=1e-9)
    assert not double.compare(x, bad).ok


def test_every_nvrtc_build_reports_its_kernels_resources(tmp_path) -> None:
    """Where a driver is installed, NVRTC 13 reuses the driver's compile cache (a source compiled
    before, in any process, or one that differs only in its comments) and returns the cubin with an
    empty log: the register and static shared-memory limits would read nothing (measured on an H100).
    Each build here is new to the package's cache and not to the driver's. Kills: NVRTC's process
    run without ``CUDA_CACHE_DISABLE`` (the second build a ``compiler_failure``: no report)."""
    v = variants(Op.SPMV, "CSR")[0]
    _, code = split_completion(v.render(), Op.SPMV)
    for i in range(2):
        r = compile_source(code + f"// build {i}\n", CompileOptions(backend="nvrtc"), cache_dir=tmp_path / str(i))
        assert r.ok and r.resources and all(x.registers > 0 for x in r.resources), (r.error_kind, r.log)


def test_the_limits_read_the_loaded_cubin_where_the_report_is_missing(tmp_path, monkeypatch) -> None:
    """The shared-memory limit and the register count read the driver's view of the loaded cubin
    (``cuFuncGetAttribute``) besides the compiler's ``ptxas -v`` report, so a report that is missing or
    misread lets nothing past them. Here every compile result comes without its report: a kernel with
    40000 bytes of static shared memory and 70000 of dynamic (under the hardware's 227 KB, over the
    100 KiB limit) is still ``resource_limit``, and an honest kernel still has its registers counted.
    Kills: the worker's read of the loaded kernel's resources removed (the first kernel runs and is
    correct; the second has no register count)."""
    import dataclasses

    import sparserl.harness.evaluator as evaluator
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.harness.result import ErrorKind
    from sparserl.matrices import generate
    from tests.harness.adversarial.base import DOT, GOOD, csr

    real = evaluator.compile_source
    monkeypatch.setattr(evaluator, "compile_source",
                        lambda *a, **kw: dataclasses.replace(real(*a, **kw), resources=()))
    big = csr(f"__shared__ float s[10000]; s[threadIdx.x] = 0.f; extern __shared__ float d[]; d[threadIdx.x] = 0.f; "
              f"__syncthreads(); if (row >= m) return; {DOT} y[row] = sum + s[threadIdx.x] + d[threadIdx.x];",
              head="FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256), block=256, smem=70000\n")
    with Evaluator(HarnessConfig(memo=0, cold_trials=5, warm_trials=3, cache_dir=str(tmp_path))) as ev:
        mat = ev.register(generate("random", 5000, seed=1, nnz_per_row=8), "random5k")
        r = ev.evaluate(big, mat, "spmv")
        assert r.error_kind is ErrorKind.RESOURCE and r.smem_bytes == 110000, (r.error_kind, r.message)
        ok = ev.evaluate(GOOD, mat, "spmv")
        assert ok.correct and ok.registers and ok.registers > 0, (ok.error_kind, ok.message, ok.registers)
