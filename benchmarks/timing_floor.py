"""What the cold-regime timing adds to a kernel's time: graph replay against a plain launch.

The harness times every launch sequence (candidates and cuSPARSE alike) by replaying a CUDA
graph between two events after an L2 flush (``sparserl.harness.timing``). This measures, in
the same process and the same cold regime, an empty kernel and a diagonal scaling kernel
(y = d * x over 4M rows, 48 MB of compulsory traffic) launched both ways, plus the warm
regime's graph timing, so the fixed cost the cold measurement carries is visible.

It also tries the other cold regime the harness issue allows, rotated buffers: ``--copies``
copies of the data (each run's data was last touched ``copies - 1`` runs earlier, more bytes
than L2 in between) run back to back in one graph, so every run reads from DRAM while the
launches overlap as in the warm regime. cuSPARSE (every SpMV algorithm, fastest kept, on the
same diagonal matrix in CSR) is timed both ways beside the diagonal kernel, so the two regimes'
speedups can be compared side by side.

Last, what hardening the timed runs costs (``sparserl.harness.buffers.CheckedIO``: fresh x and a
poisoned y before every timed run, every output checked against the fp64 reference): a library
kernel timed through the harness's launch path with and without the checks, in both regimes, on
the 4M-row diagonal and on a 20k-row random matrix (the size RL trains on). Reported: the shift of
the median (the device time the reward sees) and the wall time added per timed run.

    python benchmarks/timing_floor.py --out results/timing_floor.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from sparserl.harness.timing import (
    FlushBuffer,
    TimingConfig,
    capture,
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


def rotated(runs, reps: int = 25, trials: int = 11) -> float:
    """Median us per run of a graph that cycles through ``runs`` (one per data copy) ``reps`` times."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    seq = iter([runs[j % len(runs)] for j in range(len(runs) * reps)])
    n = len(runs) * reps
    graph = capture(lambda: next(seq)(), stream, reps=n)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(2):
        graph.launch(stream)
    samples = []
    for _ in range(trials):
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / n)
    return float(np.median(samples))


def cusparse_both_ways(rows: int, copies: int) -> dict:
    """cuSPARSE SpMV on the rows x rows diagonal: flushed cold (the harness) and rotated, per algorithm."""
    import scipy.sparse as sp

    from sparserl.harness.baseline import SPMV_ALGS, CusparseOp
    from sparserl.kernels.contract import Op

    rng = np.random.default_rng(0)
    A = sp.csr_array(sp.diags(rng.random(rows, dtype=np.float32) + 0.5, format="csr"))
    out = {}
    for alg in SPMV_ALGS:
        ops = []
        try:
            try:
                for i in range(copies):
                    ops.append(CusparseOp(A, Op.SPMV, None, alg, seed=i))
            except Exception as exc:  # noqa: BLE001 - an algorithm that refuses this matrix
                out[alg] = {"error": str(exc)[:200]}
                continue
            out[alg] = {"cold_flush": time_run(ops[0].run, TimingConfig(regime="cold")).median_us,
                        "cold_rotated": rotated([o.run for o in ops]),
                        "warm": time_run(ops[0].run, TimingConfig(regime="warm")).median_us}
        finally:
            for o in ops:
                o.close()
    return out


def hardening_cost(A, variant_id: str, trials: int = 41) -> dict:
    """One library kernel timed by the harness's launch path, with and without checked timed runs."""
    import cupy as cp

    from sparserl.harness.buffers import CheckedIO, IOBuffers
    from sparserl.harness.compile import CompileOptions, compile_source
    from sparserl.harness.device import device_arch, num_sms
    from sparserl.harness.launcher import BoundKernel, MatrixOnDevice
    from sparserl.harness.reference import Fp64Reference
    from sparserl.kernels.contract import Op, split_completion
    from sparserl.kernels.library import get_variant

    header, code = split_completion(get_variant(variant_id).render(), Op.SPMV)
    built = compile_source(code, CompileOptions(arch=device_arch()))
    bound = BoundKernel.bind(header, Op.SPMV, built.cubin_path, MatrixOnDevice(A), None, num_sms())
    io = IOBuffers(*A.shape)
    io.load_x(np.random.default_rng(0).uniform(-1, 1, A.shape[1]).astype(np.float32))
    ref = Fp64Reference(A, cp)
    flush = FlushBuffer()
    out: dict = {"variant": variant_id, "rows": int(A.shape[0]), "nnz": int(A.nnz)}
    for regime in ("cold", "warm"):
        cfg = TimingConfig(regime=regime, trials=trials, warm_target_ms=0.5)
        res = {}
        for name in ("plain", "checked"):
            checked = CheckedIO(io, ref) if name == "checked" else None
            t0 = time.perf_counter()
            t = time_run(bound.runner(io.x, io.y), cfg, flush=flush, io=checked)
            wall = time.perf_counter() - t0
            res[name] = {"median_us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us, "wall_s": wall,
                         "timed_runs": t.trials * t.reps, "checked_outputs": checked.checked if checked else 0}
        runs = res["checked"]["timed_runs"]
        res["median_shift_us"] = res["checked"]["median_us"] - res["plain"]["median_us"]
        res["added_wall_us_per_timed_run"] = (res["checked"]["wall_s"] - res["plain"]["wall_s"]) / runs * 1e6
        res["added_wall_ms_per_checked_output"] = ((res["checked"]["wall_s"] - res["plain"]["wall_s"])
                                                   / max(res["checked"]["checked_outputs"], 1) * 1e3)
        out[regime] = res
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--copies", type=int, default=4, help="data copies the rotated regime cycles through")
    ap.add_argument("--out", type=Path, default=Path("timing_floor.json"))
    args = ap.parse_args()
    if args.rows < 4 or args.rows % 4:
        ap.error("--rows must be a positive multiple of 4 (the kernel moves four rows per thread)")
    if args.copies < 1:
        ap.error("--copies must be at least 1")
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
    copies = [(cp.random.rand(args.rows, dtype=cp.float32), cp.random.rand(args.rows, dtype=cp.float32),
               cp.empty(args.rows, dtype=cp.float32)) for _ in range(args.copies)]
    out["us"]["empty"]["cold_rotated"] = rotated([kernels["empty"]] * args.copies)
    out["us"]["diag_scale"]["cold_rotated"] = rotated(
        [lambda c=c: diag(((n4 + 255) // 256,), (256,), (c[0], c[1], c[2], np.int32(n4))) for c in copies])
    cp.cuda.runtime.deviceSynchronize()
    assert all(bool(cp.allclose(c[2], c[0] * c[1])) for c in copies), "rotated diag_scale computed the wrong thing"
    del copies
    out["copies"] = args.copies
    out["cusparse_us"] = cusparse_both_ways(args.rows, args.copies)
    bw = out["copy_bandwidth_bytes_per_s"]
    print(f"{out['gpu']}: copy bandwidth {bw / 1e9:.0f} GB/s; {args.rows} rows, "
          f"{out['compulsory_bytes'] / 1e6:.0f} MB at that bandwidth = {out['compulsory_bytes'] / bw * 1e6:.2f} us")
    print(f"{'kernel':12} {'cold graph':>11} {'cold direct':>12} {'cold rotated':>13} {'warm graph':>11}   (us, medians)")
    for name, t in out["us"].items():
        print(f"{name:12} {t['cold_graph']:>11.2f} {t['cold_direct']:>12.2f} {t['cold_rotated']:>13.2f} "
              f"{t['warm_graph']:>11.2f}")
    ok = {a: t for a, t in out["cusparse_us"].items() if "error" not in t}
    for a, t in out["cusparse_us"].items():
        print(f"cuSPARSE {a}: " + (t["error"] if "error" in t else
                                   f"cold flushed {t['cold_flush']:.2f}, cold rotated {t['cold_rotated']:.2f}, "
                                   f"warm {t['warm']:.2f} us"))
    if ok:
        dg = out["us"]["diag_scale"]
        best = {r: min(t[r] for t in ok.values()) for r in ("cold_flush", "cold_rotated", "warm")}
        out["diag_scale_speedup"] = {"cold_flush": best["cold_flush"] / dg["cold_graph"],
                                     "cold_rotated": best["cold_rotated"] / dg["cold_rotated"],
                                     "warm": best["warm"] / dg["warm_graph"]}
        print("diag_scale against the fastest cuSPARSE algorithm: " +
              ", ".join(f"{r} {v:.2f}x" for r, v in out["diag_scale_speedup"].items()))
    from sparserl.matrices import generate

    out["hardening"] = [hardening_cost(generate("diagonal", args.rows, seed=1), "spmv/dia_stream/-/block=256,v=1"),
                        hardening_cost(generate("random", 20_000, seed=3, nnz_per_row=12), "spmv/csr_vector/-/tpr=8,block=128")]
    print("checked timed runs (fresh x, poisoned y, every output checked) against plain timing:")
    for h in out["hardening"]:
        for regime in ("cold", "warm"):
            r = h[regime]
            print(f"  {h['variant']:34} {h['rows']:>8} rows {regime}: median {r['plain']['median_us']:.2f} -> "
                  f"{r['checked']['median_us']:.2f} us ({r['median_shift_us']:+.2f}); wall +"
                  f"{r['added_wall_us_per_timed_run']:.1f} us per timed run, {r['checked']['checked_outputs']} outputs "
                  f"checked ({r['added_wall_ms_per_checked_output']:.2f} ms each)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
