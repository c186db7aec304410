"""What a worker knows about its GPU and the instruments timing needs on it.

:class:`GpuProbe` holds the GPU's name, architecture and SM count, the L2 flush buffer, the
measured copy bandwidth (cached on disk per GPU model, the roofline's denominator) and the
launch-latency probe a restarted worker uses to wait until a killed predecessor's kernel has left
the GPU.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


class GpuProbe:
    """One worker's GPU (device 0 of its ``CUDA_VISIBLE_DEVICES``)."""

    def __init__(self, cache: Path, scrub_shared: bool = True):
        import cupy as cp

        from sparserl.harness.device import device_arch, num_sms

        self.cp = cp
        self.name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        self.arch = device_arch()
        self.sms = num_sms()
        self.cache = Path(cache)
        self._flush = None
        self.scrub_shared = scrub_shared
        self._bandwidth: float | None = None

    @property
    def flush(self):
        """The :class:`~sparserl.harness.timing.FlushBuffer` (made on first use)."""
        from sparserl.harness.timing import FlushBuffer

        if self._flush is None:
            self._flush = FlushBuffer(scrub_shared=self.scrub_shared)
        return self._flush

    def flush_intact(self) -> bool:
        """Whether the flush buffer still holds only zeros (a kernel writing far outside its own
        buffers can land there: it is the largest allocation of the worker); zeroes it again."""
        if self._flush is None:
            return True
        ok = int(self.cp.count_nonzero(self._flush.buf)) == 0
        if not ok:
            self._flush.buf.fill(0)
        return ok

    def bandwidth(self, before_measuring: Callable[[], None] = lambda: None) -> float:
        """Device-to-device copy bandwidth (bytes/s), measured once per GPU model and cached on disk."""
        from sparserl.harness.timing import measured_copy_bandwidth

        if self._bandwidth is None:
            path = self.cache / "bandwidth" / f"{self.name.replace(' ', '_')}.json"
            try:
                self._bandwidth = float(json.loads(path.read_text())["bytes_per_s"])
            except (OSError, ValueError, KeyError):
                before_measuring()
                self._bandwidth = measured_copy_bandwidth()
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"gpu": self.name, "bytes_per_s": self._bandwidth}))
        return self._bandwidth

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

    def wait_for_idle(self, limit_s: float = 120.0, threshold_ms: float = 1.0) -> tuple[float, float]:
        """Wait until launches are fast again (a killed worker's hung kernel can keep the GPU busy
        while the driver tears its context down). Returns (waited s, latency ms)."""
        t0 = time.perf_counter()
        lat = self.sync_latency_ms()
        while lat > threshold_ms and time.perf_counter() - t0 < limit_s:
            time.sleep(0.25)
            lat = self.sync_latency_ms()
        return time.perf_counter() - t0, lat
