"""cuSPARSE as the baseline: ``cusparseSpMV`` / ``cusparseSpMM`` on CSR, set up once.

Descriptors and the work buffer are created once per (matrix, op, k, algorithm) and
the call is timed with :func:`sparserl.harness.timing.time_run`, the same function
and stream that time candidate kernels, with the same preparation of every run (fresh x,
poisoned y, in the same :class:`~sparserl.harness.buffers.IOBuffers` layout; cuSPARSE's outputs
are trusted, so they are not checked). Several cuSPARSE algorithms are tried and the
fastest is the baseline, so a reported speedup is against cuSPARSE at its best on
that matrix, not against its default. :class:`BaselineCache` keeps the result per (matrix, op,
k, regime) in memory and on disk.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparserl.harness.buffers import CheckedIO, IOBuffers
from sparserl.harness.device import cupy_module
from sparserl.harness.timing import FlushBuffer, Timing, TimingConfig, time_run
from sparserl.kernels.contract import Op

# cusparseSpMVAlg_t / cusparseSpMMAlg_t values from cusparse.h (CuPy does not export these names).
SPMV_ALGS = {"CUSPARSE_SPMV_ALG_DEFAULT": 0, "CUSPARSE_SPMV_CSR_ALG1": 2, "CUSPARSE_SPMV_CSR_ALG2": 3}
SPMM_ALGS = {"CUSPARSE_SPMM_ALG_DEFAULT": 0, "CUSPARSE_SPMM_CSR_ALG1": 4, "CUSPARSE_SPMM_CSR_ALG2": 6,
             "CUSPARSE_SPMM_CSR_ALG3": 12}


def _libcusparse():
    """The libcusparse CuPy loaded, through ctypes.

    CuPy's wrappers refuse to run during CUDA-graph capture; cuSPARSE's SpMV/SpMM with a
    caller-provided buffer can be captured, so the timed calls go straight to the library
    (the same loaded instance, so CuPy's handle and descriptors are valid).
    """
    import ctypes

    global _LIB
    if _LIB is None:
        path = None
        with open("/proc/self/maps") as maps:
            for line in maps:  # exactly libcusparse.so*, not libcusparseLt (torch loads that one too)
                mapped = line.split()[-1]
                if mapped.rsplit("/", 1)[-1].startswith("libcusparse.so"):
                    path = mapped
                    break
        if path is None:
            raise RuntimeError("libcusparse is not loaded")
        lib = ctypes.CDLL(path)
        vp, ci = ctypes.c_void_p, ctypes.c_int
        lib.cusparseSpMV.argtypes = [vp, ci, vp, vp, vp, vp, vp, ci, ci, vp]
        lib.cusparseSpMM.argtypes = [vp, ci, ci, vp, vp, vp, vp, vp, ci, ci, vp]
        lib.cusparseSetStream.argtypes = [vp, vp]
        for fn in (lib.cusparseSpMV, lib.cusparseSpMM, lib.cusparseSetStream):
            fn.restype = ci
        _LIB = lib
    return _LIB


_LIB = None


class CusparseOp:
    """One cuSPARSE SpMV/SpMM call on fixed device buffers, ready to run many times."""

    def __init__(self, A: sp.csr_array, op: Op, k: int | None = None, alg: str | None = None, seed: int = 0):
        cp = cupy_module()
        from cupy_backends.cuda.libs import cusparse as cs
        from cupy.cuda import device

        self._cs = cs
        self.op, self.k = op, k
        m, n = A.shape
        self.indptr = cp.asarray(A.indptr.astype(np.int32))
        self.indices = cp.asarray(A.indices.astype(np.int32))
        self.data = cp.asarray(A.data.astype(np.float32))
        rng = np.random.default_rng(seed)
        self.handle = device.get_cusparse_handle()
        f32 = 0  # CUDA_R_32F
        self.alpha = np.array(1.0, np.float32)
        self.beta = np.array(0.0, np.float32)
        self.mat = cs.createCsr(m, n, A.nnz, self.indptr.data.ptr, self.indices.data.ptr, self.data.data.ptr,
                                cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_BASE_ZERO, f32)
        opn = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        self.io = IOBuffers(m, n, k if op is Op.SPMM else None)
        self.io.load_x(rng.standard_normal(self.io.x.shape).astype(np.float32))
        self.x, self.y = self.io.x, self.io.y
        if op is Op.SPMV:
            self.vx = cs.createDnVec(n, self.x.data.ptr, f32)
            self.vy = cs.createDnVec(m, self.y.data.ptr, f32)
            self.alg_name = alg or "CUSPARSE_SPMV_ALG_DEFAULT"
            self.alg = SPMV_ALGS[self.alg_name]
            size = cs.spMV_bufferSize(self.handle, opn, self.alpha.ctypes.data, self.mat, self.vx,
                                      self.beta.ctypes.data, self.vy, f32, self.alg)
            self.buffer = cp.empty(max(int(size), 1), np.uint8)
            pre = getattr(cs, "spMV_preprocess", None)
            if pre is not None:
                pre(self.handle, opn, self.alpha.ctypes.data, self.mat, self.vx, self.beta.ctypes.data,
                    self.vy, f32, self.alg, self.buffer.data.ptr)
        else:
            if not k or k < 1:
                raise ValueError("SpMM needs k >= 1")
            row = cs.CUSPARSE_ORDER_ROW
            self.vx = cs.createDnMat(n, k, k, self.x.data.ptr, f32, row)
            self.vy = cs.createDnMat(m, k, k, self.y.data.ptr, f32, row)
            self.alg_name = alg or "CUSPARSE_SPMM_ALG_DEFAULT"
            self.alg = SPMM_ALGS[self.alg_name]
            size = cs.spMM_bufferSize(self.handle, opn, opn, self.alpha.ctypes.data, self.mat, self.vx,
                                      self.beta.ctypes.data, self.vy, f32, self.alg)
            self.buffer = cp.empty(max(int(size), 1), np.uint8)
            pre = getattr(cs, "spMM_preprocess", None)
            if pre is not None:
                pre(self.handle, opn, opn, self.alpha.ctypes.data, self.mat, self.vx, self.beta.ctypes.data,
                    self.vy, f32, self.alg, self.buffer.data.ptr)
        self._opn = opn
        self._lib = _libcusparse()

    def run(self) -> None:
        """Enqueue one call on CuPy's current stream (capturable in a CUDA graph)."""
        cp = cupy_module()
        lib = self._lib
        status = lib.cusparseSetStream(self.handle, cp.cuda.get_current_stream().ptr)
        if status == 0 and self.op is Op.SPMV:
            status = lib.cusparseSpMV(self.handle, self._opn, self.alpha.ctypes.data, self.mat, self.vx,
                                      self.beta.ctypes.data, self.vy, 0, self.alg, self.buffer.data.ptr)
        elif status == 0:
            status = lib.cusparseSpMM(self.handle, self._opn, self._opn, self.alpha.ctypes.data, self.mat,
                                      self.vx, self.beta.ctypes.data, self.vy, 0, self.alg, self.buffer.data.ptr)
        if status != 0:
            raise RuntimeError(f"cuSPARSE {self.alg_name} failed with status {status}")

    def close(self) -> None:
        cs = self._cs
        cs.destroySpMat(self.mat)
        if self.op is Op.SPMV:
            cs.destroyDnVec(self.vx)
            cs.destroyDnVec(self.vy)
        else:
            cs.destroyDnMat(self.vx)
            cs.destroyDnMat(self.vy)


@dataclass(frozen=True)
class BaselineResult:
    """cuSPARSE's best time on one matrix, and every algorithm tried."""

    op: str
    k: int | None
    best_alg: str
    timing: Timing
    per_alg_us: dict[str, float]
    errors: dict[str, str]
    """Algorithms that refused this matrix/shape, with cuSPARSE's message."""

    def to_dict(self) -> dict:
        return {"op": self.op, "k": self.k, "best_alg": self.best_alg, "timing": self.timing.to_dict(),
                "per_alg_us": self.per_alg_us, "errors": self.errors}


def _time_batched(run, io: IOBuffers, config: TimingConfig, flush: FlushBuffer | None, ahead: int = 1) -> Timing:
    """cuSPARSE timed by the batched path (:mod:`sparserl.harness.batched`), every run prepared as a
    candidate's is and not checked; always ``config.trials`` runs (no adaptive stop: the baseline is
    measured once per matrix); ``ahead`` as ``SpeedConfig.runs_ahead``."""
    from sparserl.harness.batched import BoardIO, time_cold, time_warm

    bio = BoardIO(io, None)
    if config.regime == "cold":
        r = time_cold(run, config, flush or FlushBuffer(), bio, floor=config.trials, ci=0.0, batch=config.trials,
                      ahead=ahead)
    else:
        r = time_warm(run, config, bio, ahead=ahead, scrub=flush.scrub if flush is not None else None)
    return r.timing


def time_cusparse(A: sp.csr_array, op: Op, k: int | None, config: TimingConfig,
                  flush: FlushBuffer | None = None, check: bool = True, batched: bool = False,
                  ahead: int = 1) -> BaselineResult:
    """Time every cuSPARSE algorithm for ``op`` on ``A`` and keep the fastest correct one (``batched``:
    timed as the batched path times candidates, ``ahead`` runs enqueued before each wait)."""
    from sparserl.harness.reference import Fp64Reference

    cp = cupy_module()
    reference = Fp64Reference(A, cp) if check else None
    best: tuple[str, Timing] | None = None
    per_alg: dict[str, float] = {}
    errors: dict[str, str] = {}
    for alg in SPMV_ALGS if op is Op.SPMV else SPMM_ALGS:
        try:
            runner = CusparseOp(A, op, k, alg)
        except Exception as exc:  # cuSPARSE refuses some algorithm/shape pairs
            errors[alg] = str(exc)[:200]
            continue
        try:
            if reference is not None:
                runner.run()
                cp.cuda.runtime.deviceSynchronize()
                if not reference.compare(runner.x, runner.y).ok:
                    errors[alg] = "result differs from the fp64 reference"
                    continue
            t = (_time_batched(runner.run, runner.io, config, flush, ahead) if batched else
                 time_run(runner.run, config, flush=flush, io=CheckedIO(runner.io)))
        except Exception as exc:  # e.g. an algorithm that cannot be captured in a graph
            errors[alg] = f"timing failed: {str(exc)[:200]}"
            continue
        finally:
            runner.close()
        per_alg[alg] = t.median_us
        if best is None or t.median_us < best[1].median_us:
            best = (alg, t)
    if best is None:
        raise RuntimeError(f"no cuSPARSE algorithm ran on this matrix: {errors}")
    return BaselineResult(op.value, k, best[0], best[1], per_alg, errors)


class BaselineCache:
    """cuSPARSE's best time per (matrix, op, k, regime): in memory, then on disk, then measured.

    Disk entries live under ``folder/<gpu>/`` and are named by the matrix's content key, op, k,
    regime, trials, the harness version and the timing path (``batched``, with ``ahead`` runs
    enqueued before each wait; a change in how runs are timed makes new entries)."""

    def __init__(self, folder: Path, gpu: str, batched: bool = False, ahead: int = 1, scrub_shared: bool = True):
        self.folder = Path(folder) / gpu.replace(" ", "_")
        self.batched = batched
        self.ahead = ahead
        self.scrub_shared = scrub_shared
        self._memory: dict[tuple, dict] = {}

    def get(self, key: str, A: sp.csr_array, op: Op, k: int | None, config: TimingConfig,
            flush: FlushBuffer | None, before_measuring=lambda: None) -> dict:
        """The cached result, or a new measurement (``before_measuring()`` first: the GPU lease)."""
        from sparserl.harness.result import HARNESS_VERSION

        mkey = (key, op.value, k, config.regime, config.trials)
        if mkey in self._memory:
            return self._memory[mkey]
        path = self.folder / (f"{key}_{op.value}_{k}_{config.regime}_{config.trials}_h{HARNESS_VERSION}"
                              f"{f'_batched_a{self.ahead}' if self.batched else ''}"
                              f"{'' if self.scrub_shared else '_unscrubbed'}.json")
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError):
            before_measuring()
            r = time_cusparse(A, op, k, config, flush, batched=self.batched, ahead=self.ahead)
            res = {"alg": r.best_alg, **r.timing.to_dict(), "per_alg_us": r.per_alg_us}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(res))
            os.replace(tmp, path)
        self._memory[mkey] = res
        return res
