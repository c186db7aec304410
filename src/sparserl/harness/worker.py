"""The GPU worker process: one per GPU, long-lived, disposable.

A worker owns one GPU (``CUDA_VISIBLE_DEVICES`` is set before CUDA starts) and serves
jobs from the parent over a pipe. It keeps per-matrix state between jobs (plan once,
run many): the uploaded conversions with pristine copies, the verification inputs
and fp64 references, and cuSPARSE's timings. The parent rebuilds nothing: when a
worker dies, the next one reloads matrices lazily from the files the parent saved.

Protocol (tuples over a ``multiprocessing`` pipe):

* parent -> worker: ``("eval", job)``, ``("baseline", job)``, ``("stop", None)``
* worker -> parent: ``("ready", info)`` once at start; ``("phase", name)`` before each
  phase of a job so the parent can apply that phase's time limit; ``("done", payload)``
  at the end of a job; ``("fatal", payload)`` when the CUDA context is unusable (the
  worker exits right after and the parent starts a new one).

A kernel that hangs is killed by the parent (SIGKILL on the whole process), which is
the only way to stop a running CUDA kernel.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import traceback
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)

MAX_MATRICES = 4  # per worker, least recently used evicted


def save_matrix_file(A: sp.csr_array, folder: Path) -> tuple[str, Path]:
    """Save ``A`` for workers; returns (content key, path). Same matrix, same file."""
    h = hashlib.sha1()
    h.update(np.asarray(A.shape, np.int64).tobytes())
    for arr in (A.indptr, A.indices, A.data):
        h.update(np.ascontiguousarray(arr).tobytes())
    key = h.hexdigest()[:20]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.npz"
    if not path.exists():
        tmp = folder / f"{key}.{os.getpid()}.tmp.npz"
        np.savez(tmp, indptr=A.indptr, indices=A.indices, data=A.data, shape=np.asarray(A.shape))
        os.replace(tmp, path)
    return key, path


def load_matrix_file(path: str) -> sp.csr_array:
    with np.load(path) as z:
        return sp.csr_array((z["data"], z["indices"], z["indptr"]), shape=tuple(int(s) for s in z["shape"]))


def fingerprint(arrays) -> tuple[int, ...]:
    """Per array, the sum of its 32- or 64-bit words (wrapping): computed on the GPU, kept on the
    host, so damage to the device copies (pristine ones included) is found without a transfer."""
    import cupy as cp

    out = []
    for a in arrays:
        word = {8: cp.uint64, 4: cp.uint32}.get(a.dtype.itemsize, cp.uint8)
        words = cp.ascontiguousarray(a).view(word)
        out.append(int(words.sum(dtype=cp.uint64)))
    return tuple(out)


class _MatrixState:
    """Everything a worker keeps for one matrix."""

    def __init__(self, A: sp.csr_array):
        from sparserl.harness.launcher import MatrixOnDevice

        self.A = A
        self.on_device = MatrixOnDevice(A)
        self.pristine: dict[tuple, dict] = {}
        self.pristine_sums: dict[tuple, tuple] = {}
        self.verifiers: dict = {}
        self.verifier_sums: dict = {}
        self.baselines: dict = {}

    def keep_pristine(self, conv_key: tuple, arrays: dict) -> None:
        """Copy a fresh conversion's arrays (restored from after every launch) and fingerprint them."""
        self.pristine[conv_key] = {n: a.copy() for n, a in arrays.items()}
        self.pristine_sums[conv_key] = fingerprint(self.pristine[conv_key][n] for n in sorted(arrays))

    def damage(self, conv_key: tuple, arrays: dict, k: int | None) -> list[str]:
        """What differs from the upload: arrays unlike their pristine copies, pristine copies unlike
        their fingerprints, verification references unlike theirs (empty when all is intact)."""
        import cupy as cp

        pristine = self.pristine[conv_key]
        bad = [n for n, a in arrays.items() if not bool(cp.array_equal(a, pristine[n]))]
        if fingerprint(pristine[n] for n in sorted(arrays)) != self.pristine_sums[conv_key]:
            bad.append("their pristine copies")
        if k in self.verifiers and fingerprint(self.verifiers[k].device_arrays()) != self.verifier_sums[k]:
            bad.append("the verification references")
        return bad


class WorkerState:
    def __init__(self, conn, settings: dict):
        import cupy as cp

        from sparserl.harness.device import device_arch, num_sms

        self.conn = conn
        self.settings = settings
        self.cp = cp
        props = cp.cuda.runtime.getDeviceProperties(0)
        self.gpu = props["name"].decode()
        self.arch = device_arch()
        self.sms = num_sms()
        self.matrices: OrderedDict[str, _MatrixState] = OrderedDict()
        self._bandwidth: float | None = None
        self._flush = None
        self.cache = Path(settings["cache_dir"])
        self.serving = False  # phases are reported to the parent only once "ready" was sent

    # -- state ---------------------------------------------------------------------------

    def matrix(self, ref: dict) -> _MatrixState:
        st = self.matrices.get(ref["key"])
        if st is None:
            st = _MatrixState(load_matrix_file(ref["path"]))
            self.matrices[ref["key"]] = st
            while len(self.matrices) > MAX_MATRICES:
                self.matrices.popitem(last=False)
                self.cp.get_default_memory_pool().free_all_blocks()
        self.matrices.move_to_end(ref["key"])
        return st

    def flush_buffer(self):
        from sparserl.harness.timing import FlushBuffer

        if self._flush is None:
            self._flush = FlushBuffer()
        return self._flush

    def bandwidth(self) -> float:
        from sparserl.harness.timing import measured_copy_bandwidth

        if self._bandwidth is None:
            path = self.cache / "bandwidth" / f"{self.gpu.replace(' ', '_')}.json"
            try:
                self._bandwidth = float(json.loads(path.read_text())["bytes_per_s"])
            except (OSError, ValueError, KeyError):
                self.lease_gpu()
                self._bandwidth = measured_copy_bandwidth()
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"gpu": self.gpu, "bytes_per_s": self._bandwidth}))
        return self._bandwidth

    def timing_config(self, regime: str):
        from sparserl.harness.timing import TimingConfig

        s = self.settings
        if regime == "cold":
            return TimingConfig(regime="cold", trials=s["cold_trials"], warmup=s["warmup"])
        return TimingConfig(regime="warm", trials=s["warm_trials"], warmup=s["warmup"],
                            warm_target_ms=s["warm_target_ms"])

    def baseline(self, ref: dict, op, k: int | None, regime: str) -> dict:
        """cuSPARSE's best time for (matrix, op, k, regime): memory, then disk, then measured."""
        from sparserl.harness.baseline import time_cusparse

        st = self.matrix(ref)
        key = (op.value, k, regime)
        if key in st.baselines:
            return st.baselines[key]
        cfg = self.timing_config(regime)
        path = (self.cache / "baselines" / self.gpu.replace(" ", "_") /
                f"{ref['key']}_{op.value}_{k}_{regime}_{cfg.trials}.json")
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError):
            self.lease_gpu()
            r = time_cusparse(st.A, op, k, cfg, self.flush_buffer())
            res = {"alg": r.best_alg, **r.timing.to_dict(), "per_alg_us": r.per_alg_us}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(res))
            os.replace(tmp, path)
        st.baselines[key] = res
        return res

    def warm_up(self) -> None:
        """Evaluate a library kernel on a tiny matrix (SpMV and SpMM) through the job path.

        CuPy compiles its elementwise kernels on first use and libraries initialise lazily
        (seconds on a fresh machine); doing it here, under the startup time limit, keeps
        that cost out of the verify phase, whose limit is meant for the candidate alone.
        """
        from sparserl.harness.compile import CompileOptions, compile_source
        from sparserl.harness.verify import VerifyConfig
        from sparserl.kernels.contract import split_completion
        from sparserl.kernels.library import variants
        from sparserl.matrices import generate

        # large enough that CuPy takes the same reduction paths (CUB) as on real matrices
        A = generate("random", 50_000, cols=40_000, seed=0, nnz_per_row=5)
        key, path = save_matrix_file(A, self.cache / "matrices")
        for op, k in (("spmv", None), ("spmm", 4)):
            v = variants(op, "CSR", k)[0]
            header, code = split_completion(v.render(), v.op)
            built = compile_source(code, CompileOptions(arch=self.arch), self.cache / "cubin")
            if not built.ok:
                log.warning("warm-up kernel did not compile: %s", built.log[-300:])
                return
            job = {"op": op, "k": k, "matrix": {"key": key, "path": str(path), "name": "warm-up"},
                   "header": header.render(), "cubin_path": built.cubin_path, "uses_atomics": False,
                   "static_smem": {}, "regimes": list(self.settings["regimes"]),
                   "reward_regime": self.settings["reward_regime"], "verify": asdict(VerifyConfig())}
            res = self.evaluate(job)
            if res.get("error_kind") != "none":
                raise RuntimeError(f"warm-up evaluation failed: {res.get('message')}")
        self.matrices.pop(key, None)
        self.cp.cuda.runtime.deviceSynchronize()

    def sync_latency_ms(self, samples: int = 20) -> float:
        """Median round trip of a tiny launch + synchronize (ms): high while the GPU is shared."""
        cp = self.cp
        buf = cp.empty(1, dtype=cp.float32)
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            buf.fill(0)
            cp.cuda.runtime.deviceSynchronize()
            times.append((time.perf_counter() - t) * 1e3)
        return float(np.median(times))

    def wait_for_idle_gpu(self, limit_s: float = 120.0, threshold_ms: float = 1.0) -> tuple[float, float]:
        """Wait until launches are fast again (a killed worker's hung kernel can keep
        the GPU busy while the driver tears its context down). Returns (waited s, latency ms)."""
        t0 = time.perf_counter()
        lat = self.sync_latency_ms()
        while lat > threshold_ms and time.perf_counter() - t0 < limit_s:
            time.sleep(0.25)
            lat = self.sync_latency_ms()
        return time.perf_counter() - t0, lat

    # -- jobs ----------------------------------------------------------------------------

    def lease_gpu(self) -> None:
        """Wait until the parent grants this GPU for timing (see pool.py); held until the next message."""
        if self.serving:
            self.conn.send(("want_gpu", None))
            tag, _ = self.conn.recv()
            if tag != "gpu":
                raise RuntimeError(f"expected the GPU lease, got {tag!r}")

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        if getattr(self, "_phase", None) is not None:
            self.phase_seconds[self._phase] = self.phase_seconds.get(self._phase, 0.0) + now - self._phase_t0
        self._phase, self._phase_t0 = name, now
        if self.serving:
            self.conn.send(("phase", name))

    def evaluate(self, job: dict) -> dict:
        from sparserl.harness.launcher import BoundKernel
        from sparserl.harness.result import ErrorKind
        from sparserl.harness.timing import time_run
        from sparserl.harness.verify import VerifyConfig, Verifier
        from sparserl.kernels.contract import Op, split_completion

        cp = self.cp
        op = Op(job["op"])
        k = job["k"]
        ref = job["matrix"]
        self.phase_seconds: dict[str, float] = {}
        self._phase = None
        out: dict = {"gpu": self.gpu, "arch": self.arch, "phase_seconds": self.phase_seconds}
        self.phase("prepare")
        st = self.matrix(ref)
        header, _ = split_completion(job["header"] + "\n", op)
        bound = BoundKernel.bind(header, op, job["cubin_path"], st.on_device, k, self.sms)
        if isinstance(bound, str):
            kind = ErrorKind.FORMAT_REFUSED if "would store" in bound else ErrorKind.CONTRACT
            return out | {"error_kind": kind.value, "message": bound}
        conv_key = (bound.dev.data.format, tuple(sorted(bound.dev.data.params.items())))
        if conv_key in st.pristine and (damaged := st.damage(conv_key, bound.dev.arrays, k)):
            # Before this job's first launch the matrix's state already differs from what was
            # uploaded: an earlier job wrote far outside its own buffers (past y's guard) into
            # memory this matrix owns (its arrays, their pristine copies or the verification
            # references) and was judged only on its own output. Rebuild the matrix from its
            # file so this job is not blamed for that damage.
            log.warning("matrix %s: %s changed since the last job on it (an earlier kernel wrote outside its "
                        "buffers); rebuilding its state on the GPU", ref["key"], ", ".join(damaged))
            out["matrix_rebuilt"] = damaged
            del self.matrices[ref["key"]]
            st = self.matrix(ref)
            bound = BoundKernel.bind(header, op, job["cubin_path"], st.on_device, k, self.sms)
            if isinstance(bound, str):
                return out | {"error_kind": ErrorKind.CONTRACT.value, "message": bound}
        if conv_key not in st.pristine:  # right after the upload, before anything can launch
            st.keep_pristine(conv_key, bound.dev.arrays)
        fd = bound.dev.data
        out["format"] = fd.format
        out["conversion_seconds"] = fd.convert_seconds
        static_smem = job.get("static_smem", {})
        smem = max((static_smem.get(c.kernel, 0) + c.smem for c in bound.launches), default=0)
        out["smem_bytes"] = smem
        if smem > self.settings["max_smem_bytes"]:
            return out | {"error_kind": ErrorKind.RESOURCE.value, "over_resource_limit": True,
                          "message": f"{smem} bytes of shared memory per block is over the limit "
                                     f"{self.settings['max_smem_bytes']}"}
        vkey = k
        if vkey not in st.verifiers:
            st.verifiers[vkey] = Verifier(st.A, k, VerifyConfig(**job["verify"]))
            st.verifier_sums[vkey] = fingerprint(st.verifiers[vkey].device_arrays())
        verifier = st.verifiers[vkey]
        baselines = {r: self.baseline(ref, op, k, r) for r in job["regimes"]}

        pristine = st.pristine[conv_key]

        def modified() -> list[str]:
            bad = [n for n, a in bound.dev.arrays.items() if not bool(cp.array_equal(a, pristine[n]))]
            for n in bad:  # restore, so the next job sees the true matrix
                bound.dev.arrays[n][...] = pristine[n]
            return bad

        outcome = verifier.run(bound, job["uses_atomics"], modified, self.phase)
        out["max_scaled_error"] = outcome.max_scaled_error
        if outcome.kind is not ErrorKind.NONE:
            return out | {"error_kind": outcome.kind.value, "message": outcome.message}

        self.phase("time")
        self.lease_gpu()
        x = cp.asarray(verifier.inputs[0][1])
        y = cp.empty((fd.m,) if k is None else (fd.m, k), dtype=cp.float32)
        timings = {}
        for regime in job["regimes"]:
            t = time_run(bound.runner(x, y), self.timing_config(regime), flush=self.flush_buffer())
            timings[regime] = {"regime": regime, "median_us": t.median_us, "p10_us": t.p10_us,
                               "p90_us": t.p90_us, "spread": t.spread}
        kk = k or 1
        compulsory = 4 * (fd.nnz + fd.n * kk + fd.m * kk)
        reg = job["reward_regime"]
        t_kernel = timings[reg]["median_us"]
        t_base = baselines[reg]["median_us"]
        out.update(
            error_kind=ErrorKind.NONE.value,
            timings=timings,
            baseline={r: {kk2: b[kk2] for kk2 in ("regime", "median_us", "p10_us", "p90_us", "spread")}
                      for r, b in baselines.items()},
            baseline_alg=baselines[reg]["alg"],
            regime=reg,
            speedup=t_base / t_kernel,
            roofline=compulsory / (t_kernel * 1e-6) / self.bandwidth(),
            break_even_calls=(fd.convert_seconds / ((t_base - t_kernel) * 1e-6)) if t_kernel < t_base else None,
        )
        return out

    def baseline_job(self, job: dict) -> dict:
        from sparserl.kernels.contract import Op

        op = Op(job["op"])
        k = job["k"]
        st = self.matrix(job["matrix"])
        res = {r: self.baseline(job["matrix"], op, k, r) for r in job["regimes"]}
        A = st.A
        kk = k or 1
        compulsory = 4 * (A.nnz + A.shape[1] * kk + A.shape[0] * kk)
        bw = self.bandwidth()
        return {"gpu": self.gpu, "arch": self.arch, "bandwidth_Bps": bw,
                "baselines": {r: b | {"roofline": compulsory / (b["median_us"] * 1e-6) / bw} for r, b in res.items()}}


def _context_usable(cp) -> bool:
    try:
        a = cp.ones(16, dtype=cp.float32)
        cp.cuda.runtime.deviceSynchronize()
        return float(a.sum()) == 16.0
    except Exception:
        return False


def worker_main(conn, device: int, settings: dict) -> None:
    """Entry point of a worker process (spawned; owns GPU ``device``)."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    # ``device`` indexes the GPUs the parent sees, which may be a subset of the machine's
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[device] if device < len(visible) else str(device)
    for var in ("NCCL_NVLS_ENABLE",):
        os.environ.setdefault(var, "0")
    import cupy as cp

    try:
        state = WorkerState(conn, settings)
        waited, latency = state.wait_for_idle_gpu()
        state.warm_up()
    except Exception as exc:  # no usable GPU
        conn.send(("fatal", {"error_kind": "internal_error", "message": f"worker could not start: {exc}"}))
        return
    state.serving = True
    conn.send(("ready", {"gpu": state.gpu, "arch": state.arch, "pid": os.getpid(), "device": device,
                         "waited_for_idle_s": waited, "sync_latency_ms": latency}))
    while True:
        try:
            kind, job = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "stop":
            return
        t0 = time.perf_counter()
        try:
            payload = state.evaluate(job) if kind == "eval" else state.baseline_job(job)
        except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as exc:
            if _context_usable(cp):
                conn.send(("done", {"error_kind": "launch_error", "message": str(exc)[:300]}))
                continue
            conn.send(("fatal", {"error_kind": "crashed", "message": str(exc)[:300]}))
            os._exit(3)  # the CUDA context is poisoned: start over
        except Exception as exc:
            if not _context_usable(cp):
                conn.send(("fatal", {"error_kind": "crashed", "message": str(exc)[:300]}))
                os._exit(3)
            conn.send(("done", {"error_kind": "internal_error", "message": f"{type(exc).__name__}: {exc}"[:300],
                                "log_tail": traceback.format_exc()[-2000:]}))
            continue
        payload["worker_seconds"] = time.perf_counter() - t0
        conn.send(("done", payload))


def settings_dict(cfg) -> dict:
    """The picklable settings a worker needs, from a HarnessConfig."""
    d = asdict(cfg)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items() if not isinstance(v, dict)}
