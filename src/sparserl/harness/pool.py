"""The parent side of the isolated worker pool: one worker process per GPU.

``WorkerPool.run(kind, job)`` sends a job to an idle worker and waits for it under
per-phase time limits (the worker announces each phase). If the worker exceeds a
limit it is killed (SIGKILL: the only way to stop a running kernel) and restarted, and
the job comes back as ``{"error_kind": "timeout"}``. If it dies or reports a poisoned
CUDA context it is restarted, and who is blamed depends on the phase it was in
(:data:`KERNEL_PHASES`): while the candidate ran (``verify``, ``time``) the job comes back
as ``crashed``, the kernel's doing; in a phase of the harness's own (``prepare``, ``check``)
the job runs once more on the fresh worker, and a second death comes back as
``internal_error``, which rewards leave out. A worker that cannot be started again gives
``internal_error`` too. The caller never sees an exception from anything a kernel did, and
the pool keeps serving.

``submit`` runs jobs asynchronously (one thread per worker), so compiling on the CPU
and generating on the policy GPU can overlap evaluation.

Timing owns its GPU. Before it times anything a worker asks for that GPU's lease
(``want_gpu``) and waits for the grant; the lease goes back at the worker's next message
(or when it dies). Whoever else computes on that GPU in this process, the trainer, takes
the same lease with :meth:`WorkerPool.gpu_lease`, so no kernel is ever timed while the
policy is generating or training beside it. Compiling and verifying need no lease.

Until anyone has asked for a GPU's lease that way (an evaluation, the farm, a search without a
policy model on that GPU: nothing else computes on it), the pool takes the lease itself before it
sends a job and holds it to the job's end (``"gpu_granted"`` in the job): the worker then times
without a round trip through this process, whose threads may be busy compiling (in a process that
compiles on several threads the round trip waited 1-1.5 ms for the interpreter on a 12 ms
candidate). Once :meth:`WorkerPool.gpu_lease` has been called for a GPU, its jobs ask as above,
and a lease wanted while a granted job runs waits for that job's end.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sparserl.harness.worker import worker_main

log = logging.getLogger(__name__)


KERNEL_PHASES = ("verify", "time")
"""Phases in which the candidate kernel runs (its launches, and its timed runs with their checks).
A worker that dies or poisons its CUDA context in one of them crashed because of the kernel; in
any other phase (``prepare``: loading and converting the matrix, timing cuSPARSE; ``check``: the
harness's fp64 comparison after a launch that finished; ``startup``) the machine or the harness
failed, and the kernel is not blamed."""

MACHINE_RETRIES = 1
"""How many times a job whose worker died in a harness phase is run again on a fresh worker
before it comes back as ``internal_error``."""


@dataclass(frozen=True)
class PhaseLimits:
    """Seconds a worker may spend in each phase of a job before it is killed."""

    prepare: float = 600.0
    """Loading and converting a matrix, timing cuSPARSE (first use of a matrix only)."""
    verify: float = 30.0
    """One launch of the candidate on a verification input, to its end: a hang is caught here."""
    check: float = 120.0
    """The harness's checks of one output (fp64 comparison, inputs unchanged)."""
    time: float = 120.0
    """Timing the candidate (slow but correct kernels take a while)."""
    startup: float = 180.0
    """A new worker importing CUDA and creating its context."""

    def of(self, announced) -> tuple[str, float]:
        """(phase, seconds) for what a worker announced: a phase name, or (name, launches, seconds)
        when it asks for a limit scaled to the matrix (``sparserl.harness.speed.scaled_limit``). The
        configured limit always wins when it is tighter; ``verify``'s is per launch of the candidate."""
        if isinstance(announced, str):
            return announced, getattr(self, announced, self.prepare)
        name, launches, asked = announced
        base = getattr(self, name, self.prepare) * (max(1, int(launches)) if name == "verify" else 1)
        return name, base if asked is None else min(base, float(asked))


class _Worker:
    def __init__(self, ctx, device: int, settings: dict, limits: PhaseLimits, target=worker_main,
                 gpu_lock: threading.Lock | None = None, shared: threading.Event | None = None):
        self.ctx, self.device, self.settings, self.limits = ctx, device, settings, limits
        self.target = target
        self.gpu_lock = gpu_lock or threading.Lock()
        self.shared = shared or threading.Event()
        """Set once someone else asked for this GPU's lease: from then on jobs ask for it to time."""
        self.proc = None
        self.conn = None
        self.info: dict = {}
        self.restarts = -1
        self.jobs = 0
        """Jobs this worker has answered."""
        self.busy_s = 0.0
        """Seconds it spent on them."""
        self.start()

    def start(self, lease: bool = True) -> None:
        """Start the process; its warm-up times kernels, so under the GPU's lease unless the
        caller holds it already."""
        if not lease:
            return self._start()
        with self.gpu_lock:
            return self._start()

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=self.target, args=(child, self.device, self.settings), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.restarts += 1
        if not parent.poll(self.limits.startup):
            self.kill()
            raise RuntimeError(f"GPU worker {self.device} did not start within {self.limits.startup:g} s")
        tag, info = parent.recv()
        if tag != "ready":
            self.kill()
            raise RuntimeError(f"GPU worker {self.device} failed to start: {info.get('message')}")
        self.info = info
        if self.restarts:
            log.info("GPU worker %d restarted (pid %s): waited %.1f s for an idle GPU, launch latency %.2f ms",
                     self.device, info.get("pid"), info.get("waited_for_idle_s", 0), info.get("sync_latency_ms", 0))

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=30)
        if self.conn is not None:
            self.conn.close()

    def restart(self, holding: bool = False) -> None:
        self.kill()
        self.start(lease=not holding)

    def _restart_or_why(self, holding: bool) -> str | None:
        """Restart; None when the new worker is serving, else why it could not start (it is left
        dead, and the next job tries again)."""
        try:
            self.restart(holding)
        except (RuntimeError, OSError, EOFError) as exc:
            log.error("GPU worker %d could not be restarted: %s", self.device, exc)
            return str(exc)
        return None

    def _acquire_lease(self) -> None:
        """Take the GPU's lease, saying every minute that it waits (the trainer holds it)."""
        t_wait = time.monotonic()
        while not self.gpu_lock.acquire(timeout=60.0):
            log.warning("worker %d has waited %.0f s for its GPU's lease (held by the trainer)", self.device,
                        time.monotonic() - t_wait)

    def call(self, kind: str, job: dict) -> dict:
        granted = not self.shared.is_set()  # nobody else computes on this GPU: lease the whole job
        if granted:
            job = dict(job, gpu_granted=True)
        for attempt in range(MACHINE_RETRIES + 1):
            holding = [False]
            try:
                if granted:
                    self._acquire_lease()
                    holding[0] = True
                out, machine_fault = self._call(kind, job, holding, granted)
            finally:
                if holding[0]:
                    self.gpu_lock.release()
            if not machine_fault or attempt == MACHINE_RETRIES:
                return out
            log.warning("worker %d: %s; running the job again on a fresh worker", self.device, out["message"])
        raise AssertionError("unreachable")

    def _call(self, kind: str, job: dict, holding: list[bool], granted: bool = False) -> tuple[dict, bool]:
        """(the job's payload, whether it failed for a reason of the machine and may be run again).
        ``granted``: the caller holds the GPU's lease for the whole job (kept to its end)."""
        try:
            self.conn.send((kind, job))
        except (BrokenPipeError, OSError):
            if (why := self._restart_or_why(holding[0])) is not None:
                return _startup_failure(why), False
            self.conn.send((kind, job))
        limit = self.limits.prepare
        phase = "prepare"
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            try:
                ready = self.conn.poll(max(remaining, 0))
            except (EOFError, OSError):
                ready = True
            if not ready:
                log.warning("worker %d: %s phase ran past %.0f s; killing it", self.device, phase, limit)
                self._restart_or_why(holding[0])
                return {"error_kind": "timeout", "message": f"did not finish the {phase} phase within {limit:g} s"}, False
            try:
                tag, payload = self.conn.recv()
            except (EOFError, OSError):
                code = self.proc.exitcode if self.proc else None
                why = self._restart_or_why(holding[0])
                return self._death(phase, f"the worker process died (exit code {code})", why)
            if tag == "want_gpu":  # the worker is about to time: wait for the GPU's lease
                if not holding[0]:
                    t_wait = time.monotonic()
                    self._acquire_lease()
                    holding[0] = True
                    deadline += time.monotonic() - t_wait  # the wait was not the worker's time
                self.conn.send(("gpu", None))
                continue
            if holding[0] and not granted:
                self.gpu_lock.release()
                holding[0] = False
            if tag == "phase":
                phase, limit = self.limits.of(payload)
                deadline = time.monotonic() + limit
                continue
            if tag == "fatal":
                why = self._restart_or_why(holding[0])
                if phase in KERNEL_PHASES:
                    return payload, False
                return self._death(phase, payload.get("message") or "the worker's CUDA context became unusable", why)
            return payload, False

    def _death(self, phase: str, what: str, restart_failure: str | None) -> tuple[dict, bool]:
        """The payload of a job whose worker died (or lost its context) in ``phase``: the kernel's
        crash in a kernel phase, else a fault of the machine, to be run again when the worker is back."""
        if phase in KERNEL_PHASES:
            return {"error_kind": "crashed", "message": what}, False
        message = f"{what} in the {phase} phase, where no candidate kernel runs: a fault of the machine or the harness"
        if restart_failure is not None:
            message += f"; and the worker could not be started again ({restart_failure})"
        return {"error_kind": "internal_error", "message": message}, restart_failure is None


def _startup_failure(why: str) -> dict:
    return {"error_kind": "internal_error", "message": f"did not finish the startup phase: {why}"}


class WorkerPool:
    """Long-lived GPU workers, one per device, restarted whenever a job kills one."""

    def __init__(self, devices: list[int], settings: dict, limits: PhaseLimits | None = None,
                 target=worker_main):
        """``target`` is the worker's entry point (tests substitute a CPU-only stand-in)."""
        if not devices:
            raise ValueError("WorkerPool needs at least one GPU")
        ctx = mp.get_context("spawn")
        self.limits = limits or PhaseLimits()
        self.gpu_locks = {d: threading.Lock() for d in devices}
        self.shared = {d: threading.Event() for d in devices}
        self.workers = [_Worker(ctx, d, settings, self.limits, target, self.gpu_locks[d], self.shared[d])
                        for d in devices]
        self._idle: queue.Queue[_Worker] = queue.Queue()
        for w in self.workers:
            self._idle.put(w)
        self._executor = ThreadPoolExecutor(max_workers=len(self.workers), thread_name_prefix="harness")
        self._lock = threading.Lock()
        self.jobs_done = 0
        self.queue_seconds = 0.0

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)

    @property
    def gpu(self) -> str:
        return self.workers[0].info.get("gpu", "?")

    def run(self, kind: str, job: dict) -> dict:
        t0 = time.monotonic()
        w = self._idle.get()
        waited = time.monotonic() - t0
        try:
            out = w.call(kind, job)
        finally:
            w.jobs += 1
            w.busy_s += time.monotonic() - t0 - waited
            self._idle.put(w)
        with self._lock:
            self.jobs_done += 1
            self.queue_seconds += waited
        out.setdefault("gpu", w.info.get("gpu"))
        out["queue_seconds"] = waited
        out["call_seconds"] = time.monotonic() - t0 - waited
        return out

    def gpu_lease(self, device: int):
        """Hold GPU ``device`` against timing (a context manager; a no-op for a GPU the pool
        does not use). Never wait on a harness result while holding it. From the first call on,
        the GPU's jobs ask for the lease only to time (the module docstring)."""
        if device in self.shared:
            self.shared[device].set()
        return self.gpu_locks.get(device) or contextlib.nullcontext()

    def submit(self, kind: str, job: dict) -> Future:
        return self._executor.submit(self.run, kind, job)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        for w in self.workers:
            try:
                w.conn.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass
            if w.proc is not None:
                w.proc.join(timeout=10)
            w.kill()
