"""The batched path: verification launches back to back and timed runs enqueued ahead, each launch
followed by its checks as GPU kernels (:mod:`~sparserl.harness.gpucheck`), one wait per batch.

**Verification** (:class:`BatchedVerifier`) runs exactly the sequential path's launches
(:class:`~sparserl.harness.verify.Verifier`: every input on ``A``, the first again on a y holding
another input's output, the first ``revalued_inputs`` and the non-negative one on ``A_alt``), each on freshly allocated
guarded buffers, and after each launch
the same checks in the same order: x unchanged, the matrix arrays against their pristine copies
(restored), the guards, the fp64 comparison; the re-run's output against the first. The first launch
runs alone and is judged before anything else is enqueued (most broken kernels stop there, as
before); the others go back to back and are judged from the board in order, so the verdict and its
message are the sequential path's. One difference: a kernel that fails a check on one input and
then crashes or hangs on a later one, in the same batch, is reported ``crashed`` or ``timeout``
instead of the earlier failure (both are failures; the sequential path never ran the later input).
When the first launch took so long that the others would run past the time limit the worker asks
for them (:func:`~sparserl.harness.speed.predicted_overrun`), verification stops after judging it:
``timeout``, without running them, so the worker is neither killed nor restarted.

**Timing** (:func:`time_cold`, :func:`time_warm`): the same sequence per run as
:func:`sparserl.harness.timing.time_run` (cold: fresh x and poisoned y, the L2 flush, start event,
graph replay, stop event; warm: a graph of prepared repetitions between two events, and the
preparations alone timed the same way and subtracted), with each run's output checked on the GPU
right behind it instead of on the host between runs. By default the host waits for each run and its
checks before it enqueues the next (``SpeedConfig.runs_ahead``): every run starts on an idle GPU with
nothing queued behind it, as on the sequential path; runs enqueued back to back measured slower. The
host reads the times and the board only at the looks. Cold timing is adaptive
(:func:`~sparserl.harness.speed.enough_runs`) and stops early for a hopeless kernel
(:func:`~sparserl.harness.speed.is_slow`), both decided only at those looks, on checked runs.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sparserl.harness import gpucheck, profile
from sparserl.harness.buffers import STALE_Y_NOTE, IOBuffers, stale_y_run
from sparserl.harness.result import ErrorKind
from sparserl.harness.speed import VerifyLimit, look, look_points, predicted_overrun
from sparserl.harness.timing import FlushBuffer, SharedMemoryScrub, Timing, TimingConfig, _reps, _summary, capture
from sparserl.harness.verify import VerifyOutcome, stale_source, verification_runs


@dataclass
class GpuTarget:
    """A kernel bound to one version of the matrix, with what its checks need on the GPU."""

    bound: object
    """The :class:`~sparserl.harness.launcher.BoundKernel`."""
    check: gpucheck.Fp64Check
    """The balanced fp64 comparison of that version's reference."""
    pristine: dict
    """The conversion's pristine copies, by array name."""
    sms: int

    @property
    def arrays(self) -> dict:
        return self.bound.dev.arrays

    def enqueue_tamper(self, row) -> None:
        """Count (and restore) every matrix array's words that differ from the pristine copy, one
        counter per array from ``row``."""
        for i, (name, a) in enumerate(self.arrays.items()):
            gpucheck.enqueue_diff(a, self.pristine[name], row[i:], restore=True, sms=self.sms, bitwise=True)

    def modified(self, counters: np.ndarray) -> list[str]:
        """Names of the arrays whose counters (from :data:`gpucheck.ARRAYS`) are non-zero."""
        return [name for i, name in enumerate(self.arrays) if counters[i]]


_EVENTS: list = []


def _event_pairs(n: int) -> list:
    """``n`` (start, stop) pairs of timing events, made once per process and reused (an evaluation
    needs up to 2 x 41, and each is waited for and read before the next timing starts)."""
    import cupy as cp

    while len(_EVENTS) < n:
        _EVENTS.append((cp.cuda.Event(), cp.cuda.Event()))
    return _EVENTS[:n]


def _sync(stream=None) -> None:
    import cupy as cp

    (stream or cp.cuda.get_current_stream()).synchronize()
    profile.count("syncs")


class BatchedVerifier:
    """Verification through the board (module docstring); the inputs are the sequential
    :class:`~sparserl.harness.verify.Verifier`'s, shared."""

    def __init__(self, base):
        self.base = base
        self.m, self.n, self.k, self.cfg = base.m, base.n, base.k, base.cfg

    def run(self, main: GpuTarget, alt: GpuTarget | None, uses_atomics: bool,
            phase: Callable[..., None] = lambda *a, **kw: None,
            limit: VerifyLimit | None = None) -> VerifyOutcome:
        """Verify; CUDA errors propagate to the worker, which classifies them. ``phase(name, launches)``
        is announced before the launches of each batch (the parent's time limit covers them, and the
        checks enqueued between them) and ``phase("check")`` before the verdict is read.
        ``limit(launches)``: the seconds the worker asks the parent for a batch of that many
        launches (None: not scaled; no ``limit``, never); the remaining launches are not run when the
        first one's time predicts they would overrun it (module docstring), a first launch shorter
        than ``limit.min_first_s`` never predicting."""
        limit = limit if limit is not None else VerifyLimit()
        if len(main.arrays) > gpucheck.MAX_ARRAYS:
            raise ValueError(f"a format with {len(main.arrays)} arrays needs a wider board")
        inputs = self.base.inputs
        runs = verification_runs(inputs, main, alt, self.cfg)
        board = gpucheck.Board(len(runs))
        keep: list[IOBuffers] = []  # every buffer held to the end: no pointer is ever reused
        first_y = None
        worst = first_s = 0.0
        for lo, hi in ((0, 1), (1, len(runs))):  # the first launch alone, then the rest back to back
            if lo > 0 and predicted_overrun(first_s, hi - lo, limit_s := limit(hi - lo), limit.min_first_s):
                profile.count("verify_predicted_timeouts")
                return VerifyOutcome(ErrorKind.TIMEOUT, f"the first launch took {first_s:.2f} s: the {hi - lo} "
                                     f"remaining launches would run past the verify limit of {limit_s:.3g} s", worst)
            with profile.step("verify_inputs"):  # enqueued ahead of the launches on the same stream
                ios = []
                for target, _, x, _, _ in runs[lo:hi]:
                    io = IOBuffers(self.m, self.n, self.k)
                    io.load_x(x)
                    ios.append(io)
                keep += ios
            phase("verify", hi - lo)
            with profile.step("verify_first" if lo == 0 else "verify_batch"):  # the first launch alone, then the rest
                t0 = time.perf_counter()
                for idx in range(lo, hi):
                    target, _, x, _, _ = runs[idx]
                    io = ios[idx - lo]
                    if (src := stale_source(idx, len(inputs))) is not None:  # behind launch src on the stream
                        io.y[...] = keep[src].y
                    target.bound.run(io.x, io.y)
                    profile.count("verify_launches")
                    board.enqueue_reset(idx)  # nothing the kernel wrote into its row beforehand counts
                    row = board.row(idx)
                    gpucheck.enqueue_diff(io.x, x, board.row(idx, gpucheck.X_CHANGED), restore=False, sms=target.sms)
                    target.enqueue_tamper(board.row(idx, gpucheck.ARRAYS))
                    gpucheck.enqueue_guards(io, board.row(idx, gpucheck.GUARDS))
                    target.check.enqueue(io.x, io.y, row)
                    if idx == 0:
                        first_y = io.y.copy()
                    elif idx == len(inputs):
                        gpucheck.enqueue_diff(io.y, first_y, board.row(idx, gpucheck.RERUN), restore=False,
                                              sms=target.sms)
                _sync()
                if lo == 0:
                    first_s = time.perf_counter() - t0
            phase("check")
            with profile.step("verify_verdict"):
                counts = board.read()
                for idx in range(lo, hi):
                    out, worst = self._judge(idx, runs[idx], counts[idx], worst, uses_atomics)
                    if out is not None:
                        return out
        return VerifyOutcome(ErrorKind.NONE, "", worst)

    def _judge(self, idx: int, run, row: np.ndarray, worst: float, uses_atomics: bool):
        """The sequential path's verdict on launch ``idx`` from its counters: (outcome or None, worst)."""
        target, name, _, where, hint = run
        label = f"{where}input '{name}'"
        if row[gpucheck.X_CHANGED]:
            return VerifyOutcome(ErrorKind.INPUT_MODIFIED, f"{label}: the kernel wrote to x", worst), worst
        if modified := target.modified(row[gpucheck.ARRAYS:]):
            return VerifyOutcome(ErrorKind.INPUT_MODIFIED,
                                 f"{label}: the kernel wrote to the matrix arrays {', '.join(modified)}", worst), worst
        if (g := gpucheck.guard_problem(row)) is not None:
            kind = ErrorKind.INPUT_MODIFIED if g.endswith(" x") else ErrorKind.INCORRECT
            return VerifyOutcome(kind, f"{label}: {g}", float("inf")), worst
        res = gpucheck.comparison(row)
        worst = max(worst, res.max_scaled_error)
        if not res.ok:
            return VerifyOutcome(ErrorKind.INCORRECT, f"{label}: {res.describe()}{hint}", worst), worst
        if idx == len(self.base.inputs) and not uses_atomics and row[gpucheck.RERUN]:
            return VerifyOutcome(ErrorKind.NONDETERMINISTIC,
                                 "two runs on the same input differ and the compiled code uses no atomics",
                                 worst), worst
        return None, worst


# -- timing ------------------------------------------------------------------------------------


class BoardIO:
    """Fresh x and a poisoned y before each timed run, the output checked on the GPU behind it
    (the batched counterpart of :class:`~sparserl.harness.buffers.CheckedIO`)."""

    def __init__(self, io: IOBuffers, check: gpucheck.Fp64Check | None):
        """``check`` None: prepare without checking (cuSPARSE, which is trusted)."""
        import cupy as cp

        self.cp = cp
        self.io = io
        self.check = check
        self.seed = cp.zeros(1, dtype=cp.uint64)
        self.seed_value = 0
        """The host's copy of the seed last written to ``seed``."""
        self.snapshot = cp.empty_like(io.y) if check is not None else None
        self.snapshot_rep: int | None = None
        self.checked = 0
        """Outputs compared with the reference so far."""

    def new_seed(self) -> None:
        """A seed from the OS for the next cold run or warm sample, written on the current stream (a fill behind
        what is queued: the GPU never holds a later run's seed)."""
        self.seed_value = secrets.randbits(63)
        self.seed[...] = self.seed_value

    def prepare(self, rep: int) -> None:
        self.io.refresh(self.seed, rep)

    def mark(self, rep: int) -> None:
        if rep == self.snapshot_rep:
            self.snapshot[...] = self.io.y

    def enqueue_check(self, board: gpucheck.Board, row: int, seed, rep: int, snapshot_row: int | None = None) -> None:
        """Enqueue the checks of the output the last run left (and of the kept repetition), each into a
        board row reset after the run (so nothing the kernel wrote there beforehand counts). The last
        run was repetition ``rep`` of ``seed`` (a one-element device array): its x is written again from
        them before the comparison, so a kernel that rewrote x is judged on the x it was given; ``seed`` is first
        written again from the host's copy of the last :meth:`new_seed`, so a kernel that rewrote the seed (device
        memory it could reach) is not judged on an x of its choosing."""
        if self.check is None:
            return
        board.enqueue_reset(row)
        if snapshot_row is not None:
            board.enqueue_reset(snapshot_row)
        gpucheck.enqueue_guards(self.io, board.row(row, gpucheck.GUARDS))
        seed[...] = self.seed_value
        self.io.refresh(seed, rep, poison=False)
        self.check.enqueue(self.io.x, self.io.y, board.row(row))
        if snapshot_row is not None and self.snapshot_rep is not None:
            self.io.refresh(self.seed, self.snapshot_rep, poison=False)
            self.check.enqueue(self.io.x, self.snapshot, board.row(snapshot_row))

    def verdict(self, row: np.ndarray, what: str) -> str | None:
        """The sequential path's message for a checked output's counters, or None."""
        if self.check is None:
            return None
        if (g := gpucheck.guard_problem(row)) is not None:
            return f"timed run ({what}) {g}"
        res = gpucheck.comparison(row)
        self.checked += 1
        if not res.ok:
            return f"timed run ({what}): output differs from the reference: {res.describe()}"
        return None


@dataclass
class TimedResult:
    """What batched timing measured, or why it stopped."""

    timing: Timing | None
    """None when a timed output was wrong."""
    failure: str | None = None
    """The message of the first wrong timed output."""
    slow: bool = False
    """Stopped early: the median of the first checked runs was over the threshold."""
    samples_us: list[float] = field(default_factory=list)


def time_cold(run: Callable[[], None], config: TimingConfig, flush: FlushBuffer, io: BoardIO, *,
              floor: int, ci: float, batch: int, early_runs: int = 0, slow_above_us: float | None = None,
              ahead: int = 1, stream=None) -> TimedResult:
    """Cold timing, each run checked on the GPU right behind it (module docstring).

    ``ahead``: runs enqueued before the host waits for the GPU (1: every run starts on an idle GPU, as
    on the sequential path; see ``SpeedConfig.runs_ahead``). Looks at the times and the board at
    :func:`~sparserl.harness.speed.look_points` (after ``early_runs`` runs when ``slow_above_us`` is
    given, after ``floor`` and then every ``batch`` runs when ``ci`` > 0, at ``config.trials``) and
    decides by :func:`~sparserl.harness.speed.look`."""
    import cupy as cp

    stream = stream or cp.cuda.Stream(non_blocking=True)
    ceiling = config.trials
    with profile.step("time_prepare"):
        cp.cuda.runtime.deviceSynchronize()  # buffers made on the default stream are ready for this one
        one = capture(run, stream)
        for _ in range(config.warmup):
            one.launch(stream)
        with stream:
            board = gpucheck.Board(ceiling)
        events = _event_pairs(ceiling)
    of = f"up to {ceiling}" if ci > 0 else str(ceiling)
    samples: list[float] = []
    done = 0
    stale = stale_y_run(ceiling)
    for end in look_points(early_runs, slow_above_us is not None, floor, ci, batch, ceiling):
        with profile.step("time_runs"):
            with stream:
                for t in range(done, end):
                    # each run's seed written on the stream just before it (behind the last run's check): no run
                    # finds a later run's seed on the GPU (it could work out that run's x and answer ahead)
                    io.new_seed()
                    seed = io.seed
                    io.io.refresh(seed, 0, poison=t != stale)
                    flush.flush(stream)
                    events[t][0].record(stream)
                    one.launch(stream)
                    events[t][1].record(stream)
                    io.enqueue_check(board, t, seed, 0)
                    if (t + 1 - done) % ahead == 0 or t + 1 == end:
                        _sync(stream)
            profile.count("cold_runs", end - done)
        with profile.step("time_check"):
            counts = board.read() if io.check is not None else None
            messages = []
            for t in range(done, end):
                samples.append(cp.cuda.get_elapsed_time(*events[t]) * 1e3)
                if counts is not None:
                    messages.append(io.verdict(counts[t], f"cold, run {t + 1} of {of}"
                                               + (STALE_Y_NOTE if t == stale else "")))
                    if messages[-1] is not None:
                        break
        done = end
        what, msg = look(samples, messages, early_runs=early_runs, slow_above_us=slow_above_us, ci=ci,
                         floor=floor, ceiling=ceiling)
        if what == "wrong":
            return TimedResult(None, msg, samples_us=samples)
        if what in ("slow", "enough"):
            return TimedResult(_summary("cold", np.asarray(samples), 1), slow=what == "slow", samples_us=samples)
    return TimedResult(_summary("cold", np.asarray(samples), 1), samples_us=samples)


def time_warm(run: Callable[[], None], config: TimingConfig, io: BoardIO, ahead: int = 1,
              stream=None, scrub: SharedMemoryScrub | None = None) -> TimedResult:
    """Warm timing as :func:`sparserl.harness.timing.time_run` does it, each sample's checks on the GPU
    behind it; the host waits after every ``ahead`` samples (as :func:`time_cold` does). ``scrub`` (the
    flush's) ends each repetition's preparation, in both graphs."""
    import cupy as cp

    stream = stream or cp.cuda.Stream(non_blocking=True)
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    with profile.step("time_prepare"):
        cp.cuda.runtime.deviceSynchronize()  # buffers made on the default stream are ready for this one
        one = capture(_reps(run, io, 1, True, scrub), stream)
        for _ in range(config.warmup):
            one.launch(stream)
        estimate = []
        for _ in range(5):
            with stream:
                io.new_seed()
            start.record(stream)
            one.launch(stream)
            stop.record(stream)
            stop.synchronize()
            estimate.append(cp.cuda.get_elapsed_time(start, stop))
        per_run_ms = max(sum(estimate) / 5, 1e-4)
        reps = int(min(config.max_reps, max(1, round(config.warm_target_ms / per_run_ms))))
        io.snapshot_rep = secrets.randbelow(reps) if io.snapshot is not None else None
        many = capture(_reps(run, io, reps, True, scrub), stream)
        many.launch(stream)
        with stream:
            board = gpucheck.Board(2 * config.trials)

    def timed(graph, check: bool) -> list[float]:
        events = _event_pairs(config.trials)
        with stream:
            for t in range(config.trials):
                io.new_seed()
                events[t][0].record(stream)
                graph.launch(stream)
                events[t][1].record(stream)
                if check:
                    io.enqueue_check(board, 2 * t, io.seed, reps - 1, 2 * t + 1)
                if (t + 1) % ahead == 0 or t + 1 == config.trials:
                    _sync(stream)
        return [cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in events]

    with profile.step("time_runs"):
        totals = timed(many, True)
        profile.count("warm_samples", config.trials)
    with profile.step("time_check"):
        if io.check is not None:
            counts = board.read()
            for t in range(config.trials):
                what = f"warm, sample {t + 1} of {config.trials}, {reps} runs each"
                if (msg := io.verdict(counts[2 * t], what)) is not None:
                    return TimedResult(None, msg)
                if io.snapshot_rep is not None:
                    res = gpucheck.comparison(counts[2 * t + 1])
                    io.checked += 1
                    if not res.ok:
                        return TimedResult(None, f"timed run ({what}, repetition {io.snapshot_rep + 1}): output "
                                                 f"differs from the reference: {res.describe()}")
    with profile.step("time_runs"):  # the preparations alone, subtracted (cuSPARSE's too, as before)
        prep = capture(_reps(run, io, reps, False, scrub), stream)
        prep.launch(stream)
        prep_us = float(np.median(timed(prep, False)))
    per_run = (np.asarray(totals) - prep_us) / reps
    return TimedResult(_summary("warm", np.maximum(per_run, 1e-3), reps))
