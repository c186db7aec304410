"""Where one evaluation's wall time goes: named steps timed on the host, carried in the result.

The worker serves one job at a time on one thread, so the job's :class:`Profiler` is a module
global: :func:`step` and :func:`count` anywhere in the job's code add to it, and do nothing when no
job is being profiled (tools, tests). Steps nest; each records its *own* time (a step inside
another is not counted twice), so the steps of a job add up to the job's wall time.

GPU work is asynchronous: a step that only enqueues kernels records the enqueueing, and the GPU
time lands in the step that waits for it. The sequential path waits after every launch and every
check, so its steps are what each costs; the batched path waits once per batch (``verify_batch``,
``time_runs``), so there the wait holds the launches and their checks together.

Step names (``EvalProfile.seconds``, in the order an evaluation meets them):

=====================  ============================================================================
``extract``            finding the header and the code in the completion (parent)
``static_check``       the source checks (parent)
``compile``            compile, cached or not, with the PTX checks (parent)
``plan``               LAUNCH lines planned on the host (parent, without a GPU only)
``preconvert``         the matrix's pattern converted into the completion's format (parent, batched path,
                       first use of a format; :mod:`sparserl.harness.preconvert`)
``queue``              waiting for a free worker (parent)
``ipc``                the job's round trip to the worker, less the worker's own time (parent)
``matrix_load``        loading a matrix a worker did not hold: file, fresh-valued twin, references
``load_conversion``    the caller's conversion read from its folder into the staging buffer and copied to
                       the device from it (first use of a format; :mod:`sparserl.harness.staging`)
``convert``            host conversion into the completion's format (first use of a format, when the
                       caller did not make it)
``upload``             the conversion's upload (when the worker converted it), the check that it names
                       every nonzero once, the values gathered in, pristine copies and their fingerprints
``bind``               reading the header, planning the launches and loading the cubin
``damage_check``       the matrix's state against its pristine copies and fingerprints (one wait)
``baseline``           cuSPARSE timed (first use of a matrix, op, k and regime only)
``verify_inputs``      fresh guarded buffers and the inputs copied in (batched: enqueued only)
``verify_launch``      the candidate's verification launches (sequential: one at a time)
``verify_tamper``      x, matrix arrays and guards against what they held (sequential)
``verify_compare``     the fp64 comparisons (sequential)
``verify_determinism`` the re-run's output against the first (sequential)
``verify_first``       the batched path's first verification launch alone, its checks as GPU kernels, and
                       the wait (what :func:`sparserl.harness.speed.predicted_overrun` reads)
``verify_batch``       the other batched launches with every check as GPU kernels, and the wait
``verify_verdict``     reading the batch's counters and replaying the verdict
``lease``              waiting for the GPU's lease from the parent before timing (a round trip)
``time_prepare``       graph capture, warm-up replays, timing buffers
``time_runs``          timed runs: fresh x, poisoned y, flush, replay (batched: their checks too, and a
                       wait per ``SpeedConfig.runs_ahead`` runs)
``time_check``         timed outputs checked (sequential) / the counters read (batched)
``time_warm``          the warm regime, all of it
``time_after``         matrix arrays and flush buffer after the timed runs
``speed``              speedup and roofline (the copy bandwidth, measured once per GPU model)
``other``              the rest of the worker's time on the job
=====================  ============================================================================

Counts (``EvalProfile.counts``): ``verify_launches``, ``cold_runs``, ``warm_samples``,
``checked_outputs``, ``syncs`` (host waits on the GPU in the timed and verification loops),
``verify_predicted_timeouts`` (1 when verification stopped after its first launch because the
others would have run past their time limit: :func:`sparserl.harness.speed.predicted_overrun`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Profiler:
    """Wall seconds per named step (own time, nesting subtracted) and named counts."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._stack: list[list] = []  # [name, started, time spent in children]
        self.t0 = time.perf_counter()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        frame = [name, time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            spent = time.perf_counter() - frame[1]
            self.seconds[name] = self.seconds.get(name, 0.0) + spent - frame[2]
            if self._stack:
                self._stack[-1][2] += spent

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def close(self, total_s: float | None = None) -> dict:
        """The profile as a plain dict; ``other`` is ``total_s`` (default: since creation) less the steps."""
        total = time.perf_counter() - self.t0 if total_s is None else total_s
        other = total - sum(self.seconds.values())
        if other > 0:
            self.seconds["other"] = self.seconds.get("other", 0.0) + other
        return {"seconds": dict(self.seconds), "counts": dict(self.counts)}


_active: Profiler | None = None


def begin() -> Profiler:
    """Start profiling the current job (the worker's one thread)."""
    global _active
    _active = Profiler()
    return _active


def end() -> dict:
    """Stop profiling the current job; its profile as a dict (empty when none was running)."""
    global _active
    prof, _active = _active, None
    return prof.close() if prof is not None else {"seconds": {}, "counts": {}}


def step(name: str):
    """A context manager timing ``name`` in the current job's profile (a no-op without one)."""
    return _active.step(name) if _active is not None else contextlib.nullcontext()


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to a count of the current job's profile (a no-op without one)."""
    if _active is not None:
        _active.count(name, n)
