"""Device-time measurement shared by candidate kernels and the cuSPARSE baseline.

Whatever is timed (a completion's launch sequence, or cuSPARSE's SpMV) is first
captured into a CUDA graph, so Python's launch cost never lands inside the timed
region, and both sides are timed by the same function on the same stream:

* ``cold`` (default): before every timed run the stream reads a buffer of twice the
  GPU's L2 size (evicting the matrix, x and y) and overwrites every SM's shared memory
  (:class:`SharedMemoryScrub`), then records the start event,
  replays the graph once and records the stop event. The flush keeps the GPU busy
  while the host enqueues the events, so the start event fires right before the
  kernels. This is the regime of a kernel that streams a large matrix from DRAM.
* ``warm``: a graph of ``reps`` back-to-back runs (enough for ~2 ms) replayed between
  two events; time per run = elapsed / reps. This is an iterative solver's regime,
  where a matrix that fits in L2 stays there.

**Timed runs are checked runs** when a :class:`~sparserl.harness.buffers.CheckedIO` is given
(the harness always gives one; cuSPARSE gets one that prepares without checking): every run
starts like a verification launch, from fresh x values and a NaN-poisoned y, and its output is
compared with the fp64 reference.

* cold: x and y are prepared *before* the flush, so the flush also evicts them and nothing of
  the preparation is timed; every one of the ``trials`` outputs is checked.
* warm: each repetition inside the graph is preceded by its own preparation (x from the
  sample's seed and the repetition's index, y poisoned), and a graph of the preparations alone is
  timed the same way and subtracted: time per run = (t(prepare + run) - t(prepare)) / reps. After
  every sample the last repetition's output is checked, and so is the output of one repetition
  chosen at random per evaluation (copied aside inside the graph; the copy is in both graphs).
  Given a scrub (:class:`SharedMemoryScrub`, the flush's), each preparation ends by overwriting
  every SM's shared memory, so no repetition finds what the one before left there; being part of
  the preparation, it is subtracted too.

A wrong timed output raises :class:`TimedRunRejected`. Each regime reports the median over
``trials`` and the spread (p10 to p90, relative to the median). A graph replay waits for all its
kernels, and the stop event is recorded after it on the same stream, so nothing a kernel leaves
running escapes the measurement (work moved to another stream inside the captured region is
refused by the capture itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sparserl.harness import profile
from sparserl.harness.buffers import STALE_Y_NOTE, stale_y_run
from sparserl.harness.device import cupy_module

REGIMES = ("cold", "warm")


class TimedRunRejected(Exception):
    """A timed run's output was wrong (the message says which run and how)."""


@dataclass(frozen=True)
class TimingConfig:
    """How to time one launch sequence."""

    regime: str = "cold"
    """'cold' (L2 flushed before each run) or 'warm' (back-to-back runs)."""
    trials: int = 21
    """Timed samples; the median is reported."""
    warmup: int = 3
    """Untimed replays first (module load, clocks, TLBs)."""
    warm_target_ms: float = 2.0
    """Warm regime: pick reps so one timed sample lasts about this long."""
    max_reps: int = 2000
    """Warm regime: at most this many runs in one graph."""

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            raise ValueError(f"regime must be one of {', '.join(REGIMES)}, got {self.regime!r}")
        if self.trials < 3 or self.warmup < 0:
            raise ValueError("need trials >= 3 and warmup >= 0")


@dataclass(frozen=True)
class Timing:
    """Device time of one run of a launch sequence."""

    regime: str
    median_us: float
    p10_us: float
    p90_us: float
    trials: int
    reps: int
    """Runs per timed sample (1 in the cold regime)."""

    @property
    def spread(self) -> float:
        """(p90 - p10) / median."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"regime": self.regime, "median_us": self.median_us, "p10_us": self.p10_us,
                "p90_us": self.p90_us, "trials": self.trials, "reps": self.reps, "spread": self.spread}


_FLUSH_KERNEL = r"""
extern "C" __global__ void l2_flush_read(const float4* __restrict__ buf, long long n4, float* __restrict__ sink)
{
    float acc = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        const float4 v = buf[i];
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 12345.f) sink[0] = acc;  // never true (buffer is zero); keeps the loads alive
}
"""


_SCRUB_KERNEL = r"""
extern "C" __global__ void smem_scrub(int words, unsigned int salt, unsigned int* __restrict__ sink)
{
    extern __shared__ unsigned int s[];
    for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = salt ^ (unsigned int)i * 2654435761u;
    __syncthreads();
    if (s[(threadIdx.x * 97u) % (unsigned int)words] == 0xffffffffu && salt == 7u) sink[0] = 1u;  // keeps the stores
}
"""
SCRUB_BLOCKS_PER_SM = 2
"""Blocks of the shared-memory scrub per SM: each takes the most shared memory a block may have, so
one fits on an SM at a time and the first wave alone covers every SM."""


class SharedMemoryScrub:
    """Overwrites every SM's shared memory: a kernel with the most shared memory a block may have, on
    twice as many blocks as SMs (one block an SM at a time). It touches no global memory.

    Shared memory is not cleared between launches, so a kernel could read back what its previous
    launch left there (part of the matrix, say, tagged with the arrays' addresses) and skip reading
    it from DRAM or L2. The cold flush runs it after evicting L2; the warm regime runs it in each
    repetition's preparation."""

    def __init__(self) -> None:
        cp = cupy_module()
        dev = cp.cuda.Device()
        self.nbytes = int(cp.cuda.runtime.getDeviceProperties(dev.id)["sharedMemPerBlockOptin"]) // 4 * 4
        self.kernel = cp.RawKernel(_SCRUB_KERNEL, "smem_scrub")
        self.kernel.max_dynamic_shared_size_bytes = self.nbytes
        self.grid = int(dev.attributes["MultiProcessorCount"]) * SCRUB_BLOCKS_PER_SM
        self.sink = cp.zeros(1, dtype=cp.uint32)

    def enqueue(self) -> None:
        """Launch the scrub on the current stream (inside a capture too)."""
        self.kernel((self.grid,), (1024,), (np.int32(self.nbytes // 4), np.uint32(0x5C0B), self.sink),
                    shared_mem=self.nbytes)


class FlushBuffer:
    """Twice the L2 size of clean data; reading it evicts everything else from L2. Then, with
    ``scrub_shared`` (the default), every SM's shared memory is overwritten (``scrub``, a
    :class:`SharedMemoryScrub`, which the warm regime uses too).

    The flush *reads* (a kernel over a zeroed buffer) rather than writes: a memset
    would leave L2 full of dirty lines whose write-back then lands inside the next
    timed kernel, charging every kernel (and cuSPARSE) for traffic that is not its own.
    The scrub runs after the read: it touches no global memory, so L2 stays as the flush left it.
    """

    def __init__(self, scrub_shared: bool = True) -> None:
        cp = cupy_module()
        dev = cp.cuda.Device()
        l2 = int(dev.attributes["L2CacheSize"])
        self.nbytes = max(2 * l2, 8 << 20) // 16 * 16
        self.buf = cp.zeros(self.nbytes // 4, dtype=cp.float32)
        self.sink = cp.zeros(1, dtype=cp.float32)
        self.kernel = cp.RawKernel(_FLUSH_KERNEL, "l2_flush_read")
        self.grid = int(dev.attributes["MultiProcessorCount"]) * 8
        self.scrub = SharedMemoryScrub() if scrub_shared else None
        cp.cuda.runtime.deviceSynchronize()

    def flush(self, stream) -> None:
        with stream:
            self.kernel((self.grid,), (256,), (self.buf, np.int64(self.nbytes // 16), self.sink))
            if self.scrub is not None:
                self.scrub.enqueue()


def capture(run: Callable[[], None], stream, reps: int = 1):
    """Capture ``reps`` calls of ``run`` (which enqueues on the current stream) into a graph."""
    with stream:
        stream.begin_capture()
        try:
            for _ in range(reps):
                run()
        finally:
            graph = stream.end_capture()
    return graph


def _summary(regime: str, samples_us: np.ndarray, reps: int) -> Timing:
    return Timing(
        regime=regime,
        median_us=float(np.median(samples_us)),
        p10_us=float(np.percentile(samples_us, 10)),
        p90_us=float(np.percentile(samples_us, 90)),
        trials=int(samples_us.size),
        reps=reps,
    )


def time_run(run: Callable[[], None], config: TimingConfig, stream=None, flush: FlushBuffer | None = None,
             io=None) -> Timing:
    """Time ``run`` (a function that enqueues GPU work on the current stream).

    ``io`` (a :class:`~sparserl.harness.buffers.CheckedIO`) prepares every run like a verification
    launch and checks its output (module docstring); without it the runs are timed as they are.
    ``flush``: the cold regime's (made here when not given); in the warm regime its scrub, if it
    has one, ends each repetition's preparation.
    """
    cp = cupy_module()
    stream = stream or cp.cuda.Stream(non_blocking=True)
    clock = _Clock(cp, stream, io)
    if config.regime == "cold":
        return _time_cold(run, config, clock, flush)
    return _time_warm(run, config, clock, flush.scrub if flush is not None else None)


class _Clock:
    """Two events on one stream around a graph's replay, and the check of a timed run's output
    (with a :class:`~sparserl.harness.buffers.CheckedIO`; without one, nothing is checked)."""

    def __init__(self, cp, stream, io) -> None:
        self.cp, self.stream, self.io = cp, stream, io
        self.start, self.stop = cp.cuda.Event(), cp.cuda.Event()

    def elapsed_us(self, graph) -> float:
        """One replay of ``graph`` between the two events, in us."""
        self.start.record(self.stream)
        graph.launch(self.stream)
        self.stop.record(self.stream)
        self.stop.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.stop) * 1e3

    def sample(self, graph) -> float:
        """Fresh input values (a new seed), then one timed replay of ``graph``, in us."""
        if self.io is not None:
            with self.stream:
                self.io.new_seed()
        return self.elapsed_us(graph)

    def reject_wrong(self, what: str, rep: int) -> None:
        """Raise when the last sample's output (its last run was repetition ``rep``) is wrong."""
        if self.io is not None and (msg := self.io.check(what, rep)) is not None:
            raise TimedRunRejected(msg)


def _time_cold(run: Callable[[], None], config: TimingConfig, clock: _Clock, flush: FlushBuffer | None) -> Timing:
    """The cold regime (module docstring): L2 flushed before every run, every run's output checked."""
    io, stream = clock.io, clock.stream
    with profile.step("time_prepare"):
        one = capture(run, stream)
        for _ in range(config.warmup):
            one.launch(stream)
        flush = flush or FlushBuffer()
        if io is not None:
            io.snapshot_rep = None  # one run per sample: its output is the one checked
    samples = []
    stale = stale_y_run(config.trials)
    for trial in range(config.trials):
        with profile.step("time_runs"):
            with stream:
                if io is not None:
                    io.new_seed()
                    io.prepare(0, poison=trial != stale)
                flush.flush(stream)
            samples.append(clock.elapsed_us(one))
            profile.count("cold_runs")
        with profile.step("time_check"):
            clock.reject_wrong(f"cold, run {trial + 1} of {config.trials}" + (STALE_Y_NOTE if trial == stale else ""),
                               0)
    return _summary("cold", np.asarray(samples), 1)


def _time_warm(run: Callable[[], None], config: TimingConfig, clock: _Clock,
               scrub: SharedMemoryScrub | None = None) -> Timing:
    """The warm regime (module docstring): one run estimated, then a graph of enough runs to drown the
    launch gap; with checks or a scrub, the preparations alone are timed the same way and subtracted."""
    io, stream = clock.io, clock.stream
    one = capture(_reps(run, io, 1, True, scrub), stream)
    for _ in range(config.warmup):
        one.launch(stream)
    per_run_ms = max(sum(clock.sample(one) for _ in range(5)) / 5e3, 1e-4)
    reps = int(min(config.max_reps, max(1, round(config.warm_target_ms / per_run_ms))))
    if io is not None:
        io.choose_snapshot(reps)
    many = capture(_reps(run, io, reps, True, scrub), stream)
    many.launch(stream)
    totals = []
    for trial in range(config.trials):
        totals.append(clock.sample(many))
        clock.reject_wrong(f"warm, sample {trial + 1} of {config.trials}, {reps} runs each", reps - 1)
    prep_us = 0.0
    if io is not None or scrub is not None:
        prep = capture(_reps(run, io, reps, False, scrub), stream)
        prep.launch(stream)
        prep_us = float(np.median([clock.sample(prep) for _ in range(config.trials)]))
    per_run = (np.asarray(totals) - prep_us) / reps
    return _summary("warm", np.maximum(per_run, 1e-3), reps)


def _reps(run: Callable[[], None], io, n: int, with_run: bool,
          scrub: SharedMemoryScrub | None = None) -> Callable[[], None]:
    """A body of ``n`` runs to capture, each prepared and marked by ``io`` when given, its preparation
    ended by ``scrub`` when given (``with_run`` False: the preparations alone)."""
    def body() -> None:
        for rep in range(n):
            if io is not None:
                io.prepare(rep)
            if scrub is not None:
                scrub.enqueue()
            if with_run:
                run()
            if io is not None:
                io.mark(rep)
    return body


_COPY_KERNEL = r"""
extern "C" __global__ void copy_f4(const float4* __restrict__ a, float4* __restrict__ b, long long n4)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        b[i] = a[i];
}
"""


def measured_copy_bandwidth(nbytes: int = 2 << 30, trials: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), median of trials.

    Measured with a 16-byte-per-thread grid-stride copy kernel over buffers far larger than
    L2 (the driver's cudaMemcpy path is slower than what kernels reach on Hopper).
    """
    cp = cupy_module()
    n4 = nbytes // 2 // 16
    a = cp.ones(n4 * 4, dtype=cp.float32)
    b = cp.empty_like(a)
    kernel = cp.RawKernel(_COPY_KERNEL, "copy_f4")
    sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])

    def run() -> None:
        kernel((sms * 8,), (256,), (a, b, np.int64(n4)))

    t = time_run(run, TimingConfig(regime="warm", trials=trials, warm_target_ms=20.0))
    return 2 * a.nbytes / (t.median_us * 1e-6)
