"""The GPU worker process: one per GPU, long-lived, disposable.

A worker owns one GPU (``CUDA_VISIBLE_DEVICES`` is set before CUDA starts) and serves jobs from
the parent over a pipe. Each concern has one place:

* :class:`Channel` - the pipe: the phase of the job (so the parent can apply that phase's time
  limit) and the GPU's lease for timing;
* :class:`~sparserl.harness.probe.GpuProbe` - the GPU's facts, flush buffer, copy bandwidth;
* :class:`~sparserl.harness.resident.MatrixCache` - the matrices (plan once, run many: uploaded
  conversions with pristine copies, fresh-valued twins, fp64 references, verification inputs);
* :class:`~sparserl.harness.baseline.BaselineCache` - cuSPARSE's times;
* :class:`Worker` - a job from start to end: bind, verify, time, report.

The parent rebuilds nothing: when a worker dies, the next one reloads matrices lazily from the
files the parent saved.

Protocol (tuples over a ``multiprocessing`` pipe):

* parent -> worker: ``("eval", job)``, ``("baseline", job)``, ``("stop", None)``
* worker -> parent: ``("ready", info)`` once at start; ``("phase", name)`` before each
  phase of a job, or ``("phase", (name, launches, seconds))`` when the batched path scales the
  phase's limit with cuSPARSE's time (the parent never allows more than its ``PhaseLimits``, per
  launch for ``verify``); ``("want_gpu", None)`` before timing (answered ``("gpu", None)``),
  except in a job that says ``"gpu_granted": True`` (the parent took the GPU's lease for the
  whole job before sending it: nothing else computes on that GPU, so no round trip is needed);
  ``("done", payload)`` at the end of a job; ``("fatal", payload)`` when the CUDA context is
  unusable (the worker exits right after and the parent starts a new one).

A kernel that hangs is killed by the parent (SIGKILL on the whole process), which is the only way
to stop a running CUDA kernel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from sparserl.errors import ContractError
from sparserl.harness import profile
from sparserl.harness.matrix_files import save_matrix_file
from sparserl.harness.resident import MatrixCache
from sparserl.harness.speed import (SpeedConfig, VerifyLimit, contender_limit, scaled_limit, slow_threshold_us,
                                    timed_verdict)
from sparserl.harness.staging import staging

log = logging.getLogger(__name__)

EVERYTHING = 1.0 - 1e-9
"""A reserve no matrix meets: :meth:`MatrixCache.make_room` lets every other matrix and conversion go."""


class Channel:
    """The worker's side of the pipe: job phases and the GPU lease."""

    def __init__(self, conn):
        self.conn = conn
        self.serving = False  # phases are reported to the parent only once "ready" was sent
        self.granted = False  # the parent holds this GPU's lease for the whole current job
        self.seconds: dict[str, float] = {}
        self._phase: str | None = None
        self._t0 = 0.0

    def begin_job(self) -> dict[str, float]:
        self.seconds, self._phase = {}, None
        return self.seconds

    def phase(self, name: str, launches: int = 1, limit_s: float | None = None) -> None:
        """Announce a phase; ``limit_s`` (for ``launches`` launches of the candidate) asks the parent
        for a tighter limit than its configured one."""
        now = time.perf_counter()
        if self._phase is not None:
            self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + now - self._t0
        self._phase, self._t0 = name, now
        if self.serving:
            self.conn.send(("phase", name if limit_s is None and launches == 1 else (name, launches, limit_s)))

    def lease_gpu(self) -> None:
        """Wait until the parent grants this GPU for timing (see pool.py); held until the next message.
        Nothing to ask in a job the parent granted the GPU for, whole, before sending it."""
        if self.serving and not self.granted:
            self.conn.send(("want_gpu", None))
            tag, _ = self.conn.recv()
            if tag != "gpu":
                raise RuntimeError(f"expected the GPU lease, got {tag!r}")


class Worker:
    def __init__(self, conn, settings: dict):
        from sparserl.harness.baseline import BaselineCache
        from sparserl.harness.probe import GpuProbe

        self.settings = settings
        self.speed = SpeedConfig(**settings.get("speed", asdict(SpeedConfig.classic())))
        staging().cap_bytes = self.speed.staging_bytes
        self.cache = Path(settings["cache_dir"])
        self.channel = Channel(conn)
        self.gpu = GpuProbe(self.cache, scrub_shared=settings.get("scrub_shared", True))
        self.matrices = MatrixCache(batched=self.speed.batched, sms=self.gpu.sms)
        self.memory_reserve = float(settings.get("memory_reserve", 0.3))
        self.baselines = BaselineCache(self.cache / "baselines", self.gpu.name, batched=self.speed.batched,
                                       ahead=self.speed.runs_ahead, scrub_shared=self.gpu.scrub_shared)
        if self.speed.batched:
            from sparserl.harness.gpucheck import compile_kernels

            compile_kernels()

    def timing_config(self, regime: str):
        from sparserl.harness.timing import TimingConfig

        s = self.settings
        if regime == "cold":
            return TimingConfig(regime="cold", trials=s["cold_trials"], warmup=s["warmup"])
        return TimingConfig(regime="warm", trials=s["warm_trials"], warmup=s["warmup"],
                            warm_target_ms=s["warm_target_ms"])

    def baseline(self, ref: dict, op, k: int | None, regime: str) -> dict:
        st = self.matrices.get(ref)  # no room made here: a job binds its conversion before its baseline
        with profile.step("baseline"):
            return self.baselines.get(ref["key"], st.A, op, k, self.timing_config(regime), self.gpu.flush,
                                      self.channel.lease_gpu)

    def _limit(self, launches: int, cusparse_us: float | None, allowance_s: float = 0.0,
               kill: bool = False) -> float | None:
        """The scaled time limit of a phase that runs the candidate ``launches`` times (batched path).

        ``kill``: the limit the parent kills the worker at (the phase it is announced with) keeps the
        ordinary floor. The lower floor of a job granted the GPU whole applies only where no kill is
        needed: the verifier's prediction after the first launch (``speed.predicted_overrun``). A kill
        costs a worker restart (about 3 s), so a lower kill limit made the oracle slower on matrices
        whose hopeless kernels take 0.5-2 s (``benchmarks/oracle_time.py``)."""
        if not self.speed.batched:
            return None
        return scaled_limit(cusparse_us, launches, self.speed, allowance_s, granted=self.channel.granted and not kill)

    def _verify_limits(self, cusparse_us: float | None, contender_us: float | None = None):
        """(announce, limit) for the batched verifier: ``announce(name, launches)`` tells the parent a
        phase with its kill deadline (the ordinary floor); ``limit``, a
        :class:`~sparserl.harness.speed.VerifyLimit`, is what the prediction after the first launch
        compares with (the granted floor where the job has the GPU whole).

        ``contender_us``: in a job that asks only whether the kernel could be the fastest, the best
        time known (or None); where the job has the GPU whole the prediction then also compares with
        :func:`~sparserl.harness.speed.contender_limit`, the lower of the two binding, and where that
        one binds its first-launch floor is ``SpeedConfig.contender_min_s`` instead of ``PREDICT_MIN_S``."""

        def announce(name: str, launches: int = 1) -> None:
            self.channel.phase(name, launches, self._limit(launches, cusparse_us, kill=True) if name == "verify" else None)

        def contend(launches: int) -> float | None:
            if not (self.speed.batched and self.channel.granted):
                return None
            return contender_limit(contender_us, cusparse_us, launches, self.speed)

        limit = VerifyLimit(lambda launches: self._limit(launches, cusparse_us),
                            contend if contender_us is not None else None,
                            self.speed.contender_min_s, self.speed.contender_scale)
        return announce, limit

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
            built = compile_source(code, CompileOptions(arch=self.gpu.arch), self.cache / "cubin")
            if not built.ok:
                log.warning("warm-up kernel did not compile: %s", built.log[-300:])
                return
            job = {"op": op, "k": k, "matrix": {"key": key, "path": str(path), "name": "warm-up"},
                   "header": header.render(), "cubin_path": built.cubin_path, "uses_atomics": built.uses_atomics,
                   "static_smem": {}, "regimes": list(self.settings["regimes"]),
                   "reward_regime": self.settings["reward_regime"], "verify": asdict(VerifyConfig()),
                   "early_stop": False}  # the whole timing path runs once here, whatever the kernel's speed
            res = self.evaluate(job)
            if res.get("error_kind") not in ("none", "slow"):  # slow: verified, timed until stopped early
                raise RuntimeError(f"warm-up evaluation failed: {res.get('message')}")
        self.matrices.drop(key)
        self.gpu.cp.cuda.runtime.deviceSynchronize()

    # -- a job ---------------------------------------------------------------------------

    def _bind(self, job: dict, header, st, which: str):
        """The completion bound to one version of the matrix ("A" or "A_alt"), pristine copies kept."""
        from sparserl.harness.launcher import BoundKernel
        from sparserl.kernels.contract import Op

        bound = BoundKernel.bind(header, Op(job["op"]), job["cubin_path"], st.on_device[which], job["k"], self.gpu.sms)
        if not isinstance(bound, str) and (which, bound.conversion_key) not in st.pristine:
            with profile.step("upload"):
                st.keep_pristine((which, bound.conversion_key), bound.dev.arrays)  # before anything can launch
        return bound

    def _bind_both(self, job: dict, header, st, key: str, conversion: tuple):
        """The completion bound to "A" and "A_alt" (or the refusal and None), room made on the GPU
        first (:meth:`MatrixCache.make_room`); out of memory all the same, every other matrix and
        conversion is let go and the binding tried once more."""
        cp = self.gpu.cp
        for attempt in (0, 1):
            reserve = EVERYTHING if attempt else self.memory_reserve  # the retry lets all else go
            self.matrices.make_room(key, conversion, reserve,
                                    cp.cuda.runtime.memGetInfo, cp.get_default_memory_pool().free_all_blocks)
            try:
                bound = self._bind(job, header, st, "A")
                if isinstance(bound, str):
                    return bound, None
                alt = self._bind(job, header, st, "A_alt")
            except cp.cuda.memory.OutOfMemoryError:
                if attempt:
                    raise
                log.warning("out of GPU memory binding %s %s; letting every other matrix and conversion go",
                            header.format, dict(header.params))
                bound = alt = None  # nothing of the half-made conversion is held here,
                st.drop_conversion(conversion)  # nor in the caches
                if job.get("pattern") and st.twins is not None:  # the caller's conversion, for the retry
                    st.twins.files[conversion] = job["pattern"]
                continue
            return bound, alt
        raise AssertionError("unreachable")

    def _resident(self, job: dict, out: dict):
        """The job's matrix and the completion bound to both its versions ("A" and "A_alt"), the
        matrix rebuilt from its file if an earlier job damaged what this one will use."""
        from sparserl.kernels.contract import Op, split_completion

        ref = job["matrix"]
        with profile.step("bind"):
            header, _ = split_completion(job["header"] + "\n", Op(job["op"]))
        conversion = (header.format, tuple(sorted(header.params.items())))
        for attempt in (0, 1):
            st = self.matrices.get(ref)
            if job.get("pattern") and st.twins is not None:  # the caller converted the pattern already
                st.twins.files[conversion] = job["pattern"]
            bound, alt = self._bind_both(job, header, st, ref["key"], conversion)
            if isinstance(bound, str):
                return st, bound, None
            if isinstance(alt, str):  # same pattern, so the same conversion: never expected
                raise RuntimeError(f"the fresh-valued twin was refused: {alt}")
            with profile.step("damage_check"):
                per, refs = st.damage_report([(("A", bound.conversion_key), bound.dev.arrays),
                                              (("A_alt", alt.conversion_key), alt.dev.arrays)])
            damaged = [f"{key[0]}: {d}" for key, what in per.items() for d in what]
            damaged += ["the verification references or inputs"] if refs else []
            if not damaged or attempt:
                return st, bound, alt
            # Before this job's first launch the matrix's state already differs from what was
            # uploaded: an earlier job wrote far outside its own buffers (past y's guard) into
            # memory this matrix owns and was judged only on its own output. Rebuild the matrix
            # from its file so this job is not blamed for that damage.
            log.warning("matrix %s: %s changed since the last job on it (an earlier kernel wrote outside its "
                        "buffers); rebuilding its state on the GPU", ref["key"], ", ".join(damaged))
            out["matrix_rebuilt"] = damaged
            self.matrices.drop(ref["key"])
        raise AssertionError("unreachable")

    def evaluate(self, job: dict) -> dict:
        """One job, with its profile (:mod:`sparserl.harness.profile`) in the payload."""
        profile.begin()
        t0 = time.perf_counter()
        try:
            out = self._evaluate(job)
        finally:
            prof = profile.end()
        prof["seconds"].setdefault("other", 0.0)
        out["profile"] = prof | {"total_s": time.perf_counter() - t0}
        return out

    def _evaluate(self, job: dict) -> dict:
        from sparserl.harness.result import ErrorKind
        from sparserl.harness.verify import Target, VerifyConfig
        from sparserl.kernels.contract import Op

        op, k = Op(job["op"]), job["k"]
        out: dict = {"gpu": self.gpu.name, "arch": self.gpu.arch, "phase_seconds": self.channel.begin_job()}
        self.channel.phase("prepare")
        st, bound, alt = self._resident(job, out)
        if isinstance(bound, str):
            kind = ErrorKind.FORMAT_REFUSED if "would store" in bound else ErrorKind.CONTRACT
            return out | {"error_kind": kind.value, "message": bound}
        fd = bound.dev.data
        out.update(format=fd.format, conversion_seconds=fd.convert_seconds)
        # The limits read both the compiler's report (sent with the job) and the driver's view of the loaded
        # cubin, so a report that is missing or misread lets nothing past them.
        static = job.get("static_smem", {})
        loaded = {c.kernel: bound.kernels.resources(c.kernel) for c in bound.launches if not c.empty}
        smem = max((max(static.get(c.kernel, 0), loaded[c.kernel].static_smem) + c.smem
                    for c in bound.launches if not c.empty), default=0)
        out["smem_bytes"] = smem
        out["loaded_registers"] = max((r.registers for r in loaded.values()), default=None)
        if smem > self.settings["max_smem_bytes"]:
            return out | {"error_kind": ErrorKind.RESOURCE.value, "over_resource_limit": True,
                          "message": f"{smem} bytes of shared memory per block is over the limit "
                                     f"{self.settings['max_smem_bytes']}"}
        baselines = {r: self.baseline(job["matrix"], op, k, r) for r in job["regimes"]}
        reg = job["reward_regime"]
        t_base = baselines[reg]["median_us"]
        verifier = st.verifier(k, VerifyConfig(**job["verify"]))
        if self.speed.batched:
            from sparserl.harness.batched import BatchedVerifier, GpuTarget

            targets = [GpuTarget(b, st.checks[w], st.pristine[(w, b.conversion_key)], self.gpu.sms)
                       for b, w in ((bound, "A"), (alt, "A_alt"))]
            contender = job.get("contender", False)
            announce, limit = self._verify_limits(t_base, (job.get("best_us") or t_base) if contender else None)
            outcome = BatchedVerifier(verifier).run(targets[0], targets[1], job["uses_atomics"], announce,
                                                    limit=limit)
            outcome = limit.explain(outcome)
        else:
            targets = [Target(b, st.references[w],
                              lambda b=b, w=w: st.modified((w, b.conversion_key), b.dev.arrays))
                       for b, w in ((bound, "A"), (alt, "A_alt"))]
            outcome = verifier.run(targets[0], targets[1], job["uses_atomics"], self.channel.phase)
        out["max_scaled_error"] = outcome.max_scaled_error
        if outcome.kind is not ErrorKind.NONE:
            return out | {"error_kind": outcome.kind.value, "message": outcome.message}
        if self.speed.batched:
            threshold = (slow_threshold_us(self.speed.early_stop, job.get("best_us"), t_base)
                         if reg == "cold" and job.get("early_stop", True) else None)
            timed = self._time_batched(st, targets[1], k, job["regimes"], reg, out, t_base, threshold)
        else:
            timed = self._time(targets[1], k, job["regimes"], out)
        if timed is not None and timed.get("error_kind") != ErrorKind.SLOW.value:
            return out | timed
        with profile.step("speed"):
            res = out | self._speed(out["timings"], baselines, reg, fd, k)
        if timed is not None:  # slow: verified correct, timed until it was clear; the time is its measurement
            res |= timed
        return res

    def _time_batched(self, st, target, k: int | None, regimes: list[str], reward_regime: str, out: dict,
                      t_base: float, slow_above_us: float | None) -> dict | None:
        """The batched path's timing on the fresh-valued twin (:mod:`sparserl.harness.batched`): the
        reward regime first (where early stopping is decided), every run prepared and checked; a
        failure or ``slow`` dict, or None. The matrix is restored after the timed runs whatever
        their verdict."""
        from sparserl.harness.batched import BoardIO, time_cold, time_warm
        from sparserl.harness.buffers import IOBuffers
        from sparserl.harness.result import ErrorKind

        s = self.settings
        launches = s["warmup"] + s["cold_trials"] + (s["warmup"] + 5 + s["warm_trials"] if "warm" in regimes else 0)
        self.channel.phase("time", 1, self._limit(launches, t_base, allowance_s=10.0, kill=True))
        with profile.step("lease"):
            self.channel.lease_gpu()
        with profile.step("time_prepare"):
            if not self.gpu.flush_intact():  # zeroed again: an earlier job's far write, not this one's
                log.warning("the L2 flush buffer held non-zero data before this job was timed (an earlier kernel "
                            "wrote far outside its buffers); zeroed it again")
            m, n = target.bound.dev.data.shape
            io = BoardIO(IOBuffers(m, n, k), target.check)
        runner = target.bound.runner(io.io.x, io.io.y)
        key = ("A_alt", target.bound.conversion_key)
        timings: dict = {}
        wrong, slow = None, False
        try:
            for regime in sorted(regimes, key=lambda r: r != reward_regime):
                cfg = self.timing_config(regime)
                if regime == "cold":
                    sp = self.speed
                    r = time_cold(runner, cfg, self.gpu.flush, io, floor=min(sp.min_cold_trials, cfg.trials),
                                  ci=sp.ci, batch=sp.batch, early_runs=sp.early_stop_runs,
                                  slow_above_us=slow_above_us if regime == reward_regime else None,
                                  ahead=sp.runs_ahead)
                else:
                    with profile.step("time_warm"):
                        r = time_warm(runner, cfg, io, ahead=self.speed.runs_ahead, scrub=self.gpu.flush.scrub)
                if r.failure is not None:
                    wrong = r.failure
                    break
                t = r.timing
                timings[regime] = {"regime": regime, "median_us": t.median_us, "p10_us": t.p10_us,
                                   "p90_us": t.p90_us, "spread": t.spread, "trials": t.trials}
                if r.slow:
                    slow = True
                    break
        finally:
            out["checked_timed_outputs"] = io.checked
            with profile.step("time_after"):
                modified = st.modified(key, target.arrays)  # restored, whatever the verdict
        with profile.step("time_after"):
            intact = self.gpu.flush_intact() if wrong is None and not modified else True
        verdict = timed_verdict(wrong, modified, intact, slow)
        if verdict is not None and verdict[0] != ErrorKind.SLOW.value:
            return {"error_kind": verdict[0], "message": verdict[1]}
        out["timings"] = timings
        if verdict is None:
            return None
        t = timings[reward_regime]
        return {"error_kind": ErrorKind.SLOW.value,
                "message": f"stopped after {t['trials']} checked cold runs: the median {t['median_us']:.2f} us is "
                           f"over {self.speed.early_stop:g}x the best known time "
                           f"({slow_above_us / self.speed.early_stop:.2f} us)"}

    def _time(self, target, k: int | None, regimes: list[str], out: dict) -> dict | None:
        """Time the kernel on the fresh-valued twin, every run prepared and checked; a failure dict or None."""
        from sparserl.harness.buffers import CheckedIO, IOBuffers
        from sparserl.harness.result import ErrorKind
        from sparserl.harness.timing import TimedRunRejected, time_run

        self.channel.phase("time")
        with profile.step("lease"):
            self.channel.lease_gpu()
        if not self.gpu.flush_intact():  # zeroed again: an earlier job's far write, not this one's
            log.warning("the L2 flush buffer held non-zero data before this job was timed (an earlier kernel "
                        "wrote far outside its buffers); zeroed it again")
        m, n = target.bound.dev.data.shape
        io = IOBuffers(m, n, k)
        checked = CheckedIO(io, target.reference)
        timings = {}
        try:
            for regime in regimes:
                with profile.step("time_warm") if regime == "warm" else contextlib.nullcontext():
                    t = time_run(target.bound.runner(io.x, io.y), self.timing_config(regime), flush=self.gpu.flush,
                                 io=checked)
                timings[regime] = {"regime": regime, "median_us": t.median_us, "p10_us": t.p10_us,
                                   "p90_us": t.p90_us, "spread": t.spread, "trials": t.trials}
        except TimedRunRejected as exc:
            return {"error_kind": ErrorKind.INCORRECT.value, "message": str(exc)}
        finally:
            out["checked_timed_outputs"] = checked.checked
        with profile.step("time_after"):
            modified = target.modified()
            intact = self.gpu.flush_intact() if not modified else True
        if modified:
            return {"error_kind": ErrorKind.INPUT_MODIFIED.value,
                    "message": f"the kernel wrote to the matrix arrays {', '.join(modified)} during timed runs"}
        if not intact:
            return {"error_kind": ErrorKind.INCORRECT.value,
                    "message": "the kernel wrote far outside its buffers (into the harness's L2 flush buffer)"}
        out["timings"] = timings
        return None

    def _speed(self, timings: dict, baselines: dict, reg: str, fd, k: int | None) -> dict:
        from sparserl.harness.result import ErrorKind

        kk = k or 1
        compulsory = 4 * (fd.nnz + fd.n * kk + fd.m * kk)
        t_kernel = timings[reg]["median_us"]
        t_base = baselines[reg]["median_us"]
        return dict(
            error_kind=ErrorKind.NONE.value,
            timings=timings,
            baseline={r: {kk2: b[kk2] for kk2 in ("regime", "median_us", "p10_us", "p90_us", "spread", "trials")
                          if kk2 in b} for r, b in baselines.items()},
            baseline_alg=baselines[reg]["alg"],
            regime=reg,
            speedup=t_base / t_kernel,
            roofline=compulsory / (t_kernel * 1e-6) / self.gpu.bandwidth(self.channel.lease_gpu),
            break_even_calls=(fd.convert_seconds / ((t_base - t_kernel) * 1e-6)) if t_kernel < t_base else None,
        )

    def baseline_job(self, job: dict) -> dict:
        from sparserl.kernels.contract import Op

        op = Op(job["op"])
        k = job["k"]
        A = self.matrices.get(job["matrix"]).A
        res = {r: self.baseline(job["matrix"], op, k, r) for r in job["regimes"]}
        kk = k or 1
        compulsory = 4 * (A.nnz + A.shape[1] * kk + A.shape[0] * kk)
        bw = self.gpu.bandwidth(self.channel.lease_gpu)
        return {"gpu": self.gpu.name, "arch": self.gpu.arch, "bandwidth_Bps": bw,
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
        worker = Worker(conn, settings)
        waited, latency = worker.gpu.wait_for_idle()
        worker.warm_up()
    except Exception as exc:  # no usable GPU
        conn.send(("fatal", {"error_kind": "internal_error", "message": f"worker could not start: {exc}"}))
        return
    worker.channel.serving = True
    conn.send(("ready", {"gpu": worker.gpu.name, "arch": worker.gpu.arch, "pid": os.getpid(), "device": device,
                         "waited_for_idle_s": waited, "sync_latency_ms": latency}))
    _serve(conn, worker, cp)


def _serve(conn, worker: Worker, cp) -> None:
    while True:
        try:
            kind, job = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "stop":
            return
        t0 = time.perf_counter()
        worker.channel.granted = bool(job.get("gpu_granted"))
        try:
            payload = worker.evaluate(job) if kind == "eval" else worker.baseline_job(job)
        except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as exc:
            if _context_usable(cp):
                conn.send(("done", {"error_kind": "launch_error", "message": str(exc)[:300]}))
                continue
            conn.send(("fatal", {"error_kind": "crashed", "message": str(exc)[:300]}))
            os._exit(3)  # the CUDA context is poisoned: start over
        except ContractError as exc:  # the job's header, read again here: the candidate's, never the machine's
            conn.send(("done", {"error_kind": "contract_error", "message": str(exc)[:300]}))
            continue
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
    """The picklable settings a worker needs, from a HarnessConfig (its evaluation path included)."""
    d = asdict(cfg)
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items() if not isinstance(v, dict)}
    out["speed"] = d["speed"]
    return out
