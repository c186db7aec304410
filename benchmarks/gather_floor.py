"""How fast can any SpMV kernel be on the irregular families? The access pattern's own floor.

A target asked for a library oracle of >= 1.3x cuSPARSE on the power-law, skewed, random and
empty-rows families at 2M rows; every kernel we have lands at 1.04-1.08x. This script measures
what the *reads alone* cost, with no row structure, no reduction across threads and no output
beyond one float per thread, in the same cold regime (L2 flushed before each run) and with the
same timing function as cuSPARSE and the harness:

- ``stream``: read ``val`` and ``col`` once, in order, 16 bytes per load (the compulsory
  index and value traffic);
- ``gather``: the same, plus ``x[col[j]]`` for every nonzero, in the matrix's own order: the
  reads any kernel that multiplies each stored value by its x entry must issue (a kernel may
  visit the nonzeros in another order, but the contract gives it no other array to read them
  from, and the cold regime leaves nothing of x in L2);
- ``gather_rows``: ``gather`` plus reading ``row_ptr`` and writing ``y`` once per row (a CSR
  kernel's remaining compulsory traffic, assigned per thread without balancing).

- ``launch``: one block that writes one float per thread and reads nothing: what any kernel costs
  in this regime (a true lower bound for one launch, whatever the matrix);
- ``fill_launch``: the same after zeroing a y of the matrix's rows, as the harness does before a
  format that accumulates (COO with ``zero_y=1``): what that zeroing adds to a one-launch kernel;
- ``memset_launch``: the same with the zeroing as a memset (``cudaMemsetAsync``, a memset node of
  the timed graph) instead of CuPy's fill kernel: whether a cheaper zeroing exists.

Each floor is the fastest of several grid sizes (1 to 64 blocks of 256 threads per SM, and the
smallest grid that gives each thread one 16-byte load, for small matrices; the runs of
2026-12-01 tried 4 to 64, and the gather was fastest at 4 on every irregular matrix). ``cusparse /
floor`` then estimates the largest speedup over cuSPARSE of a kernel issuing those reads. It is an
estimate, not a bound: the floor is one implementation (a grid-stride loop, ``__ldg`` loads, not
unrolled, one float written per thread), and a better one may issue the same reads faster.
The roofline (compulsory bytes at the measured copy bandwidth) is printed beside it, to show how
far the gather sits above pure streaming.

    python benchmarks/gather_floor.py --out gather_floor.json                  # 4 irregular families, 2M rows
    python benchmarks/gather_floor.py --only random16_2M,rectangular_1Mx2M     # a subset of library_speed's LARGE
    python benchmarks/gather_floor.py --families random,powerlaw --rows 1000000  # search_bench's matrices (seed 1)
    python benchmarks/gather_floor.py --suitesparse DIR --compare search_ss.json # real matrices, against a search run

``--compare`` reads a ``search_bench.py`` JSON of the same matrices and prints, per matrix and as a
geometric mean, how far its library oracle sits above the floors: ``oracle / launch`` bounds what
any one-launch kernel could gain over the oracle there, ``oracle / gather_rows`` estimates what a
kernel issuing only CSR's compulsory reads could gain. The oracle's times come from that other run;
cuSPARSE, timed in both, rescales them to this run (``cusparse_here / cusparse_there``).

Needs a GPU (CuPy). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from sparserl.devices import visible_gpus
from sparserl.harness.baseline import time_cusparse
from sparserl.harness.timing import FlushBuffer, TimingConfig, measured_copy_bandwidth, time_run
from sparserl.improve.table import geomean_of
from sparserl.kernels.contract import Op
from sparserl.matrices import family_names, generate, load_matrix
from sparserl.matrices.io import matrices_in

sys.path.insert(0, str(Path(__file__).resolve().parent))
from library_speed import LARGE  # noqa: E402

log = logging.getLogger("gather_floor")

IRREGULAR = ("powerlaw_2M", "skewed_2M", "random16_2M", "empty_rows_2M")

KERNELS = r"""
// sum of val[j] * x[col[j]] (with_x) or of val[j] + col[j] (without), over this thread's share of
// the nonzeros in order, 16-byte loads of col and val
template <bool with_x>
__device__ float nonzeros(const int* __restrict__ col, const float* __restrict__ val, const float* __restrict__ x,
                          long long nnz, long long tid, long long stride) {
    const long long n4 = nnz / 4;
    const int4* c4 = reinterpret_cast<const int4*>(col);
    const float4* v4 = reinterpret_cast<const float4*>(val);
    float acc = 0.f;
    for (long long i = tid; i < n4; i += stride) {
        const int4 c = __ldg(c4 + i);
        const float4 v = __ldg(v4 + i);
        if (with_x)
            acc += v.x * __ldg(x + c.x) + v.y * __ldg(x + c.y) + v.z * __ldg(x + c.z) + v.w * __ldg(x + c.w);
        else
            acc += v.x + v.y + v.z + v.w + (float)(c.x ^ c.y ^ c.z ^ c.w);
    }
    for (long long j = 4 * n4 + tid; j < nnz; j += stride)
        acc += with_x ? __ldg(val + j) * __ldg(x + __ldg(col + j)) : __ldg(val + j) + (float)__ldg(col + j);
    return acc;
}

extern "C" __global__ void launch_floor(float* __restrict__ out) { out[threadIdx.x] = 0.f; }

extern "C" __global__ void stream_floor(const int* __restrict__ col, const float* __restrict__ val,
                                        long long nnz, float* __restrict__ out) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    out[tid] = nonzeros<false>(col, val, nullptr, nnz, tid, (long long)gridDim.x * blockDim.x);
}

extern "C" __global__ void gather_floor(const int* __restrict__ col, const float* __restrict__ val,
                                        const float* __restrict__ x, long long nnz, float* __restrict__ out) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    out[tid] = nonzeros<true>(col, val, x, nnz, tid, (long long)gridDim.x * blockDim.x);
}

extern "C" __global__ void gather_rows_floor(const int* __restrict__ row_ptr, const int* __restrict__ col,
                                             const float* __restrict__ val, const float* __restrict__ x,
                                             long long nnz, int rows, float* __restrict__ out,
                                             float* __restrict__ y) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const float acc = nonzeros<true>(col, val, x, nnz, tid, stride);
    for (long long r = tid; r < rows; r += stride) y[r] = (float)__ldg(row_ptr + r + 1) + acc;
    out[tid] = acc;
}
"""


def floors(A, config: TimingConfig, flush: FlushBuffer) -> dict:
    """The fastest time of each floor kernel over a few grid sizes, in microseconds."""
    import cupy as cp

    mod = cp.RawModule(code=KERNELS, options=("-std=c++17",))
    sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    col = cp.asarray(A.indices.astype(np.int32))
    val = cp.asarray(A.data.astype(np.float32))
    ptr = cp.asarray(A.indptr.astype(np.int32))
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal(A.shape[1]).astype(np.float32))
    y = cp.empty(A.shape[0], dtype=cp.float32)
    nnz, rows = np.int64(A.nnz), np.int32(A.shape[0])
    out: dict[str, dict] = {}
    launch = mod.get_function("launch_floor")
    sink = cp.empty(256, dtype=cp.float32)
    zeroings = {"launch_floor": lambda: None, "fill_launch_floor": lambda: y.fill(0),
                "memset_launch_floor": lambda: cp.cuda.runtime.memsetAsync(y.data.ptr, 0, y.nbytes,
                                                                           cp.cuda.get_current_stream().ptr)}
    for name, zero_y in zeroings.items():  # one block that reads nothing, after y zeroed (or not)

        def run(zero_y=zero_y) -> None:
            zero_y()
            launch((1,), (256,), (sink,))

        out[name] = {"us": time_run(run, config, flush=flush).median_us, "blocks_per_sm": 0, "per_blocks_per_sm": {}}
    loads = -(-int(nnz) // 4)  # 16-byte loads of col (and of val)
    fit = max(1, -(-loads // 256))  # the smallest grid giving each thread one
    for name in ("stream_floor", "gather_floor", "gather_rows_floor"):
        kernel = mod.get_function(name)
        per_grid: dict[float, float] = {}
        for blocks_per_sm in sorted({1, 2, 4, 8, 16, 32, 64, fit / sms}):
            grid = max(1, round(sms * blocks_per_sm))
            sink = cp.empty(grid * 256, dtype=cp.float32)
            args = {"stream_floor": (col, val, nnz, sink),
                    "gather_floor": (col, val, x, nnz, sink),
                    "gather_rows_floor": (ptr, col, val, x, nnz, rows, sink, y)}[name]
            t = time_run(lambda: kernel((grid,), (256,), args), config, flush=flush)
            per_grid[blocks_per_sm] = t.median_us
        best = min(per_grid, key=per_grid.get)
        out[name] = {"us": per_grid[best], "blocks_per_sm": best,
                     "per_blocks_per_sm": {f"{b:g}": t for b, t in per_grid.items()}}
    return out


def ceilings(rows: list[dict], search_rows: list[dict]) -> dict:
    """How far each matrix's library oracle (and search result) of a ``search_bench.py`` run sits above
    this run's floors, their times rescaled to this run by cuSPARSE's (timed in both); pure.

    Per matrix: ``oracle_over_launch`` (no one-launch kernel can beat the oracle by more: a bound),
    ``oracle_over_gather_rows`` (a kernel issuing only CSR's compulsory reads, as this script's
    implementation does: an estimate), ``search_over_oracle`` as that run measured it. Matrices in
    only one of the two are left out and counted."""
    other = {r["matrix"]: r for r in search_rows if r.get("oracle_us") and r.get("cusparse_us")}
    per = []
    for r in rows:
        o = other.get(r["matrix"])
        if o is None or not r.get("cusparse_us"):
            continue
        scale = r["cusparse_us"] / o["cusparse_us"]
        oracle = o["oracle_us"] * scale
        per.append({"matrix": r["matrix"], "nnz": r["nnz"], "cusparse_scale": scale, "oracle_us": oracle,
                    "launch_us": r["launch_floor"], "fill_launch_us": r.get("fill_launch_floor"),
                    "memset_launch_us": r.get("memset_launch_floor"),
                    "gather_rows_us": r["gather_rows_floor"],
                    "oracle_over_launch": oracle / r["launch_floor"],
                    "oracle_over_gather_rows": oracle / r["gather_rows_floor"],
                    "search_over_oracle": (o["oracle_us"] / o["search_us"]) if o.get("search_us") else None})
    summary = {"matrices": len(per), "left_out": len(rows) - len(per)}
    for key in ("cusparse_scale", "oracle_over_launch", "oracle_over_gather_rows", "search_over_oracle",
                "launch_us", "fill_launch_us", "memset_launch_us"):
        summary[key] = geomean_of([p[key] for p in per])
    # what a search at the estimate's ceiling would reach: each matrix at the better of its search and that
    summary["search_capped_at_gather_rows"] = geomean_of(
        [max(p["search_over_oracle"] or 1.0, p["oracle_over_gather_rows"]) for p in per])
    return {"per_matrix": per, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--only", default=",".join(IRREGULAR),
                    help="comma-separated names from library_speed.py's LARGE set (default: the 4 irregular families)")
    ap.add_argument("--families", default="",
                    help="instead of --only: these generator families at --rows rows, generator defaults, seed 1 "
                         "(search_bench.py's matrices)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of each --families matrix")
    ap.add_argument("--suitesparse", type=Path, help="instead of --only: every .mtx/.mtx.gz/.npz in this folder")
    ap.add_argument("--compare", type=Path, help="a search_bench.py JSON of the same matrices (the first run of a file of several): the oracle's "
                                                 "distance from the floors (module docstring)")
    ap.add_argument("--trials", type=int, default=41, help="cold runs per timing (the harness's default)")
    ap.add_argument("--out", type=Path, default=Path("gather_floor.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.compare is not None and not args.compare.is_file():
        raise SystemExit(f"error: --compare {args.compare}: no such file")
    if args.suitesparse:
        files = matrices_in(args.suitesparse) if args.suitesparse.is_dir() else []
        if not files:
            raise SystemExit(f"error: no .mtx/.mtx.gz/.npz files in {args.suitesparse}")
        chosen = [(f.name.split(".")[0], f, 0, None) for f in files]
    elif args.families:
        fams = [f for f in args.families.split(",") if f]
        unknown = sorted(set(fams) - set(family_names(include_application=True)))
        if unknown:
            raise SystemExit(f"unknown families {unknown}; families are "
                             f"{family_names(include_application=True)}")
        chosen = [(f"{f}_{args.rows}", f, args.rows, {}) for f in fams]
    else:
        wanted = [s for s in args.only.split(",") if s]
        unknown = sorted(set(wanted) - {n for n, *_ in LARGE})
        if unknown:
            raise SystemExit(f"unknown matrix name(s) {unknown}; choose from {[n for n, *_ in LARGE]}")
        chosen = [e for e in LARGE if e[0] in wanted]
    if not visible_gpus():
        raise SystemExit("gather_floor needs a CUDA GPU and CuPy; CuPy sees none here")
    config = TimingConfig(regime="cold", trials=args.trials)
    flush = FlushBuffer()
    bw = measured_copy_bandwidth()
    log.info("copy bandwidth %.2f TB/s", bw / 1e12)
    rows = []
    for name, fam, n, params in chosen:
        t0 = time.perf_counter()
        A = load_matrix(fam) if isinstance(fam, Path) else generate(fam, n, seed=1, **params)
        base = time_cusparse(A, Op.SPMV, None, config, flush=flush)
        f = floors(A, config, flush)
        m, c = A.shape
        compulsory = 4 * (2 * A.nnz + (m + 1) + c + m)  # val, col, row_ptr, x and y once
        row = {"matrix": name, "rows": m, "cols": c, "nnz": int(A.nnz), "cusparse_us": base.timing.median_us,
               "cusparse_alg": base.best_alg, "roofline_us": compulsory / bw * 1e6,
               **{k: v["us"] for k, v in f.items()}, "floors": f,
               "cusparse_over_gather": base.timing.median_us / f["gather_floor"]["us"],
               "cusparse_over_gather_rows": base.timing.median_us / f["gather_rows_floor"]["us"],
               "gathers_per_s": A.nnz / (f["gather_floor"]["us"] * 1e-6)}
        rows.append(row)
        log.info("%s done in %.0f s", name, time.perf_counter() - t0)
        args.out.write_text(json.dumps({"copy_bandwidth_bytes_s": bw, "trials": args.trials, "rows": rows}, indent=1))
    print(f"\ncold regime, {args.trials} runs each, medians in us; copy bandwidth {bw / 1e12:.2f} TB/s")
    print(f"{'matrix':20} {'nnz':>10} {'roofline':>9} {'launch':>8} {'stream':>8} {'gather':>8} {'+rows':>8} {'cuSPARSE':>9}"
          f" {'cuSP/gather':>11} {'cuSP/+rows':>10} {'Ggathers/s':>10}")
    for r in rows:
        print(f"{r['matrix']:20} {r['nnz']:>10} {r['roofline_us']:>9.1f} {r['launch_floor']:>8.2f} {r['stream_floor']:>8.1f} "
              f"{r['gather_floor']:>8.1f} {r['gather_rows_floor']:>8.1f} {r['cusparse_us']:>9.1f} "
              f"{r['cusparse_over_gather']:>10.2f}x {r['cusparse_over_gather_rows']:>9.2f}x "
              f"{r['gathers_per_s'] / 1e9:>10.0f}")
    if args.compare is not None:
        raw = json.loads(args.compare.read_text())
        runs = [raw] if "matrices" in raw else [v for v in raw.values() if isinstance(v, dict) and "matrices" in v]
        if not runs:
            raise SystemExit(f"error: --compare {args.compare}: no 'matrices' list (not a search_bench.py JSON)")
        result = ceilings(rows, runs[0]["matrices"])
        s = result["summary"]
        print(f"\nagainst {args.compare} ({s['matrices']} matrices, {s['left_out']} not in it; its times x "
              f"cuSPARSE here / there, geomean {s['cusparse_scale']:.3f}):")
        print(f"{'matrix':22} {'nnz':>9} {'oracle':>7} {'launch':>7} {'fill+l':>7} {'+rows':>7} {'or/launch':>9} {'or/+rows':>8} "
              f"{'search/or':>9}")
        for p in sorted(result["per_matrix"], key=lambda p: p["nnz"]):
            print(f"{p['matrix']:22} {p['nnz']:>9} {p['oracle_us']:>7.2f} {p['launch_us']:>7.2f} {p['fill_launch_us']:>7.2f} "
                  f"{p['gather_rows_us']:>7.2f} {p['oracle_over_launch']:>9.3f} {p['oracle_over_gather_rows']:>8.3f} "
                  f"{p['search_over_oracle'] or 0:>9.3f}")
        print("geomean: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items() if isinstance(v, float)))
        args.out.write_text(json.dumps({"copy_bandwidth_bytes_s": bw, "trials": args.trials, "rows": rows,
                                        "compare": str(args.compare), **result}, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
