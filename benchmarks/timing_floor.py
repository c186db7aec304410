"""What the cold-regime timing adds to a kernel's time: graph replay against a plain launch.

The harness times every launch sequence (candidates and cuSPARSE alike) by replaying a CUDA
graph between two events after an L2 flush (``sparserl.harness.timing``). This measures, in
the same process and the same cold regime, an empty kernel and a diagonal scaling kernel
(y = d * x over 4M rows, 48 MB of compulsory traffic) launched both ways, plus the warm
regime's graph timing, so the fixed cost the cold measurement carries is visible:

    python benchmarks/timing_floor.py --out results/timing_floor.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sparserl.harness.timing import (
    FlushBuffer,
    TimingConfig,
    measured_copy_bandwidth,
    time_run,
)

_SRC = r"""
extern "C" __global__ void empty_kernel() {}
extern "C" __global__ void diag_scale(const float4* __restrict__ d, const float4* __restrict__ x,
                                      float4* __restrict__ y, int n4)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        const float4 a = __ldcs(d + i), b = __ldg(x + i);
        __stcs(y + i, make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w));
    }
}
"""


def direct_cold(run, trials: int = 21, warmup: int = 3) -> float:
    """Cold regime without a graph: flush, start event, plain launch, stop event; median us."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    flush = FlushBuffer()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        for _ in range(warmup):
            run()
    samples = []
    for _ in range(trials):
        flush.flush(stream)
        start.record(stream)
        with stream:
            run()
        stop.record(stream)
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
    return float(np.median(samples))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--out", type=Path, default=Path("timing_floor.json"))
    args = ap.parse_args()
    import cupy as cp

    mod = cp.RawModule(code=_SRC)
    empty, diag = mod.get_function("empty_kernel"), mod.get_function("diag_scale")
    n4 = args.rows // 4
    d, x = cp.random.rand(args.rows, dtype=cp.float32), cp.random.rand(args.rows, dtype=cp.float32)
    y = cp.empty_like(d)
    kernels = {"empty": lambda: empty((1,), (32,), ()),
               "diag_scale": lambda: diag(((n4 + 255) // 256,), (256,), (d, x, y, np.int32(n4)))}
    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": args.rows,
           "compulsory_bytes": 12 * args.rows, "copy_bandwidth_bytes_per_s": measured_copy_bandwidth(), "us": {}}
    for name, run in kernels.items():
        out["us"][name] = {
            "cold_graph": time_run(run, TimingConfig(regime="cold")).median_us,
            "cold_direct": direct_cold(run),
            "warm_graph": time_run(run, TimingConfig(regime="warm")).median_us,
        }
    cp.cuda.runtime.deviceSynchronize()
    assert bool(cp.allclose(y, d * x)), "diag_scale computed the wrong thing"
    bw = out["copy_bandwidth_bytes_per_s"]
    print(f"{out['gpu']}: copy bandwidth {bw / 1e9:.0f} GB/s; {args.rows} rows, "
          f"{out['compulsory_bytes'] / 1e6:.0f} MB at that bandwidth = {out['compulsory_bytes'] / bw * 1e6:.2f} us")
    print(f"{'kernel':12} {'cold graph':>11} {'cold direct':>12} {'warm graph':>11}   (us, medians)")
    for name, t in out["us"].items():
        print(f"{name:12} {t['cold_graph']:>11.2f} {t['cold_direct']:>12.2f} {t['warm_graph']:>11.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
