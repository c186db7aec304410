"""Device-time measurement shared by candidate kernels and the cuSPARSE baseline.

Whatever is timed (a completion's launch sequence, or cuSPARSE's SpMV) is first
captured into a CUDA graph, so Python's launch cost never lands inside the timed
region, and both sides are timed by the same function on the same stream:

* ``cold`` (default): before every timed run the stream writes a buffer of twice the
  GPU's L2 size (evicting the matrix, x and y), then records the start event,
  replays the graph once and records the stop event. The flush keeps the GPU busy
  while the host enqueues the events, so the start event fires right before the
  kernels. This is the regime of a kernel that streams a large matrix from DRAM.
* ``warm``: a graph of ``reps`` back-to-back runs (enough for ~2 ms) replayed between
  two events; time per run = elapsed / reps. This is an iterative solver's regime,
  where a matrix that fits in L2 stays there.

Each regime reports the median over ``trials`` and the spread (p10 to p90, relative
to the median). A graph replay waits for all its kernels, and the stop event is
recorded after it on the same stream, so nothing a kernel leaves running escapes the
measurement (work moved to another stream inside the captured region is refused by
the capture itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sparserl.harness.device import cupy_module

REGIMES = ("cold", "warm")


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
            raise ValueError(f"regime must be one of {REGIMES}, got {self.regime!r}")
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


class FlushBuffer:
    """Twice the L2 size of clean data; reading it evicts everything else from L2.

    The flush *reads* (a kernel over a zeroed buffer) rather than writes: a memset
    would leave L2 full of dirty lines whose write-back then lands inside the next
    timed kernel, charging every kernel (and cuSPARSE) for traffic that is not its own.
    """

    def __init__(self) -> None:
        cp = cupy_module()
        l2 = int(cp.cuda.Device().attributes["L2CacheSize"])
        self.nbytes = max(2 * l2, 8 << 20) // 16 * 16
        self.buf = cp.zeros(self.nbytes // 4, dtype=cp.float32)
        self.sink = cp.zeros(1, dtype=cp.float32)
        self.kernel = cp.RawKernel(_FLUSH_KERNEL, "l2_flush_read")
        self.grid = int(cp.cuda.Device().attributes["MultiProcessorCount"]) * 8
        cp.cuda.runtime.deviceSynchronize()

    def flush(self, stream) -> None:
        with stream:
            self.kernel((self.grid,), (256,), (self.buf, np.int64(self.nbytes // 16), self.sink))


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


def time_run(run: Callable[[], None], config: TimingConfig, stream=None, flush: FlushBuffer | None = None) -> Timing:
    """Time ``run`` (a function that enqueues GPU work on the current stream)."""
    cp = cupy_module()
    stream = stream or cp.cuda.Stream(non_blocking=True)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    one = capture(run, stream)
    for _ in range(config.warmup):
        one.launch(stream)
    if config.regime == "cold":
        flush = flush or FlushBuffer()
        samples = []
        for _ in range(config.trials):
            flush.flush(stream)
            start.record(stream)
            one.launch(stream)
            stop.record(stream)
            stop.synchronize()
            samples.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
        return _summary("cold", np.asarray(samples), 1)

    # warm: estimate one run, then build a graph long enough to drown the launch gap
    start.record(stream)
    for _ in range(5):
        one.launch(stream)
    stop.record(stream)
    stop.synchronize()
    per_run_ms = max(cp.cuda.get_elapsed_time(start, stop) / 5, 1e-4)
    reps = int(min(config.max_reps, max(1, round(config.warm_target_ms / per_run_ms))))
    many = capture(run, stream, reps)
    many.launch(stream)
    samples = []
    for _ in range(config.trials):
        start.record(stream)
        many.launch(stream)
        stop.record(stream)
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps)
    return _summary("warm", np.asarray(samples), reps)


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
