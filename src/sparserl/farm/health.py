"""Is a GPU ours alone, and at full clock? What ``nvidia-smi`` says, read into a :class:`GpuHealth`.

Timing owns its GPU: one timed kernel at a time per GPU (the worker pool's lease, one harness
worker per GPU actor). What the harness cannot prevent it reports:

* **shared**: a compute process on the GPU that is not one of our workers (another user, a stray
  trainer). Inside a container ``nvidia-smi`` may not see other namespaces' processes; the
  worker's launch-latency probe (``sync_latency_ms``, high while another context computes) is
  the second witness.
* **throttled**: the driver's active clock-event reasons that slow the SMs under load: hardware
  slowdown, thermal slowdown (software or hardware), power brake. A software power cap is
  reported too, as "power capped" (common on a loaded GPU, and it moves times).

The parsing is pure (tested on text in ``nvidia-smi``'s format); :func:`query` runs the tool.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

THROTTLE_REASONS = {0x8: "hardware slowdown", 0x20: "thermal slowdown (software)", 0x40: "thermal slowdown",
                    0x80: "power brake", 0x4: "power capped"}
"""Clock-event reason bits (``clocks_event_reasons.active``) that slow timed kernels, and their words."""

LATENCY_LIMIT_MS = 1.0
"""A launch + synchronize round trip slower than this at start-up means the GPU is busy with others."""

GPU_FIELDS = "index,uuid,name,clocks.sm,clocks.max.sm,temperature.gpu,clocks_event_reasons.active"
APP_FIELDS = "gpu_uuid,pid,process_name"


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's state as seen from its host."""

    index: int
    uuid: str
    name: str
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    temperature_c: float | None
    throttle: tuple[str, ...] = ()
    """Active clock-event reasons that slow kernels (see :data:`THROTTLE_REASONS`)."""
    others: tuple[int, ...] = ()
    """Process ids computing on it that are not ours."""
    latency_ms: float | None = None
    """The worker's launch-latency probe at start-up, when known."""

    @property
    def problems(self) -> list[str]:
        """What is wrong, in words (empty: ours alone, at full clock)."""
        out = []
        if self.others:
            out.append(f"shared with process{'es' if len(self.others) > 1 else ''} "
                       + ", ".join(map(str, self.others)))
        if self.latency_ms is not None and self.latency_ms > LATENCY_LIMIT_MS:
            out.append(f"slow launches ({self.latency_ms:.2f} ms round trip): busy with another context")
        out += list(self.throttle)
        return out


def parse_reasons(value: str) -> tuple[str, ...]:
    """The words for a ``clocks_event_reasons.active`` bitmask (``0x0000000000000044``)."""
    try:
        mask = int(value.strip(), 16)
    except ValueError:
        return ()
    return tuple(w for bit, w in THROTTLE_REASONS.items() if mask & bit)


def _num(value: str) -> float | None:
    try:
        return float(value.strip())
    except ValueError:
        return None


def parse(gpus_csv: str, apps_csv: str, ours: set[int]) -> list[GpuHealth]:
    """:class:`GpuHealth` per GPU from ``nvidia-smi --query-gpu=GPU_FIELDS`` and
    ``--query-compute-apps=APP_FIELDS`` (``--format=csv,noheader,nounits``); ``ours``: our workers' pids."""
    others: dict[str, list[int]] = {}
    for line in apps_csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) not in ours:
            others.setdefault(parts[0], []).append(int(parts[1]))
    out = []
    for line in gpus_csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 7 or not parts[0].isdigit():
            continue
        out.append(GpuHealth(index=int(parts[0]), uuid=parts[1], name=parts[2], sm_clock_mhz=_num(parts[3]),
                             max_sm_clock_mhz=_num(parts[4]), temperature_c=_num(parts[5]),
                             throttle=parse_reasons(parts[6]), others=tuple(sorted(others.get(parts[1], [])))))
    return out


@dataclass
class HealthWatch:
    """Reports each GPU's new problems once (a log warning) and keeps them for the summary."""

    seen: dict[str, set[str]] = field(default_factory=dict)

    def note(self, where: str, health: GpuHealth | None) -> list[str]:
        """The problems of ``health`` not reported for ``where`` before (logged now)."""
        if health is None:
            return []
        new = [p for p in health.problems if p not in self.seen.setdefault(where, set())]
        for p in new:
            self.seen[where].add(p)
            log.warning("%s (%s): %s; its times may be slower than the GPU's own", where, health.name, p)
        return new


def query(index: int | None = None, ours: set[int] = frozenset(), latency_ms: float | None = None,
          timeout: float = 10.0) -> list[GpuHealth]:
    """Every GPU's (or GPU ``index``'s) health on this host; empty without ``nvidia-smi``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    sel = ["-i", str(index)] if index is not None else []
    try:
        gpus = subprocess.run([smi, *sel, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout)
        apps = subprocess.run([smi, f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("nvidia-smi failed: %s", exc)
        return []
    found = parse(gpus.stdout, apps.stdout, set(ours))
    if latency_ms is not None:
        from dataclasses import replace

        found = [replace(h, latency_ms=latency_ms) for h in found]
    return found
