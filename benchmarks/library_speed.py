"""The library oracle against cuSPARSE: every variant verified, then timed side by side.

For each matrix: every applicable library variant is run once against the fp64
reference (NaN-poisoned output); the ones that pass are timed with the harness's
timing function (CUDA graph, cold = L2 flushed before each run, or warm), and so is
cuSPARSE (every CSR algorithm, fastest kept) in the same process on the same stream.
The oracle is the fastest verified variant. Reported per matrix: cuSPARSE time, the
oracle's variant and time, speedup = t_cusparse / t_oracle, the best per format, and
the roofline fraction = compulsory bytes / t / measured copy bandwidth, where
compulsory bytes = 4 * (nnz + n*k + m*k) (values, x, y once; no index bytes).

    python benchmarks/library_speed.py --set large --out results/speed_large.json
    python benchmarks/library_speed.py --set suitesparse --suitesparse DIR --regime warm

Sets: ``large`` = generated families at millions of nonzeros (DRAM-bound), ``suitesparse``
= the real matrices (all fit in the H200's L2). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np

from sparserl.harness.baseline import time_cusparse
from sparserl.harness.compile import CompileOptions, compile_many
from sparserl.harness.device import cupy_module, device_arch, num_sms
from sparserl.harness.launcher import BoundKernel, MatrixOnDevice
from sparserl.harness.reference import compare
from sparserl.harness.timing import FlushBuffer, TimingConfig, measured_copy_bandwidth, time_run
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import all_variants
from sparserl.matrices import compute_features, generate, load_matrix

log = logging.getLogger("library_speed")

# Large generated matrices: ~4M rows where the nonzero count stays moderate.
LARGE = [
    ("diagonal_4M", "diagonal", 4_000_000, {}),
    ("banded9_4M", "banded", 4_000_000, {"bands": 9}),
    ("stencil2d_4M", "stencil2d", 4_000_000, {}),
    ("stencil3d7_4M", "stencil3d_7", 4_000_000, {}),
    ("stencil3d27_1M", "stencil3d_27", 1_000_000, {}),
    ("block8_1M", "block", 1_000_000, {"block": 8, "blocks_per_row": 4}),
    ("random16_2M", "random", 2_000_000, {"nnz_per_row": 16}),
    ("powerlaw_2M", "powerlaw", 2_000_000, {}),
    ("skewed_2M", "skewed", 2_000_000, {}),
    ("empty_rows_2M", "empty_rows", 2_000_000, {"nnz_per_row": 16}),
    ("rectangular_1Mx2M", "rectangular", 1_000_000, {"cols": 2_000_000}),
]


def matrices(which: str, suitesparse: Path | None, only: set[str] | None):
    if which == "large":
        for name, fam, rows, params in LARGE:
            if only and name not in only:
                continue
            t = time.perf_counter()
            A = generate(fam, rows, seed=1, **params)
            log.info("generated %s: %d x %d, %d nnz in %.1f s", name, *A.shape, A.nnz, time.perf_counter() - t)
            yield name, fam, A
    else:
        if suitesparse is None:
            raise SystemExit("--set suitesparse needs --suitesparse DIR")
        for f in sorted(suitesparse.glob("*.mtx.gz")):
            name = f.name.removesuffix(".mtx.gz")
            if only and name not in only:
                continue
            yield name, "suitesparse", load_matrix(f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=["large", "suitesparse"], default="large")
    ap.add_argument("--suitesparse", type=Path)
    ap.add_argument("--only", default="", help="comma-separated matrix names")
    ap.add_argument("--op", choices=["spmv", "spmm"], default="spmv")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--regime", choices=["cold", "warm"], default="cold")
    ap.add_argument("--trials", type=int, default=11)
    ap.add_argument("--out", type=Path, default=Path("library_speed.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    cp = cupy_module()
    op = Op(args.op)
    k = args.k if op is Op.SPMM else None
    arch, sms = device_arch(), num_sms()
    bw = measured_copy_bandwidth()
    log.info("copy bandwidth %.0f GB/s", bw / 1e9)
    variants = [v for v in all_variants() if v.op is op and v.applicable(k)]
    parsed = [split_completion(v.render(), v.op) for v in variants]
    built = compile_many([c for _, c in parsed], CompileOptions(arch=arch))
    cfg = TimingConfig(regime=args.regime, trials=args.trials)
    flush = FlushBuffer()
    rng = np.random.default_rng(0)
    rows = []
    only = set(filter(None, args.only.split(",")))
    for name, fam, A in matrices(args.set, args.suitesparse, only or None):
        m, n = A.shape
        feats = compute_features(A)
        base = time_cusparse(A, op, k, cfg, flush)
        on_dev = MatrixOnDevice(A)
        shape_x = (n,) if k is None else (n, k)
        xh = rng.standard_normal(shape_x).astype(np.float32)
        x = cp.asarray(xh)
        y = cp.empty((m,) if k is None else (m, k), dtype=cp.float32)
        results = []
        for v, (header, _), c in zip(variants, parsed, built):
            if not c.ok:
                continue
            bound = BoundKernel.bind(header, op, c.cubin_path, on_dev, k, sms)
            if isinstance(bound, str):
                continue
            y.fill(np.nan)
            bound.run(x, y)
            cp.cuda.runtime.deviceSynchronize()
            if not compare(A, xh, cp.asnumpy(y)).ok:
                results.append({"variant": v.id, "format": v.format, "correct": False})
                log.warning("INCORRECT %s on %s", v.id, name)
                continue
            try:
                t = time_run(bound.runner(x, y), cfg, flush=flush)
            except Exception as exc:
                log.warning("timing failed for %s on %s: %s", v.id, name, exc)
                results.append({"variant": v.id, "format": v.format, "correct": True, "timing_error": str(exc)})
                continue
            results.append({"variant": v.id, "format": v.format, "correct": True, "us": t.median_us,
                            "spread": t.spread})
        on_dev = None
        ok = [r for r in results if r["correct"] and "us" in r]
        best = min(ok, key=lambda r: r["us"])
        per_fmt = {}
        for r in ok:
            if r["format"] not in per_fmt or r["us"] < per_fmt[r["format"]]["us"]:
                per_fmt[r["format"]] = r
        kk = k or 1
        compulsory = 4 * (A.nnz + n * kk + m * kk)
        row = {
            "matrix": name, "family": fam, "rows": m, "cols": n, "nnz": int(A.nnz),
            "features": feats.to_dict(),
            "cusparse_us": base.timing.median_us, "cusparse_alg": base.best_alg, "cusparse_per_alg_us": base.per_alg_us,
            "best_variant": best["variant"], "best_us": best["us"], "speedup": base.timing.median_us / best["us"],
            "best_csr_speedup": base.timing.median_us / per_fmt["CSR"]["us"] if "CSR" in per_fmt else None,
            "roofline_best": compulsory / (best["us"] * 1e-6) / bw,
            "roofline_cusparse": compulsory / (base.timing.median_us * 1e-6) / bw,
            "per_format_us": {f: r["us"] for f, r in per_fmt.items()},
            "per_format_variant": {f: r["variant"] for f, r in per_fmt.items()},
            "incorrect": [r["variant"] for r in results if not r["correct"]],
            "variants_timed": len(ok),
        }
        rows.append(row)
        log.info("%-20s cuSPARSE %8.1f us  best %8.1f us (%s)  speedup %.2fx  roofline %.2f", name,
                 row["cusparse_us"], row["best_us"], row["best_variant"], row["speedup"], row["roofline_best"])

    print(f"\n{args.op} {args.regime} on {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'matrix':22} {'nnz':>10} {'cuSPARSE us':>11} {'best us':>9} {'speedup':>8} {'roofl':>6} {'CSR-only':>8}  best variant")
    for r in rows:
        csr = f"{r['best_csr_speedup']:.2f}" if r["best_csr_speedup"] else "-"
        print(f"{r['matrix']:22} {r['nnz']:>10} {r['cusparse_us']:>11.1f} {r['best_us']:>9.1f} "
              f"{r['speedup']:>7.2f}x {r['roofline_best']:>6.2f} {csr:>8}  {r['best_variant']}")
    gm = math.exp(np.mean([math.log(r["speedup"]) for r in rows]))
    print(f"geometric-mean speedup of the library oracle over cuSPARSE: {gm:.2f}x over {len(rows)} matrices")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"op": args.op, "k": k, "regime": args.regime, "set": args.set,
                                    "copy_bandwidth_Bps": bw, "geomean_speedup": gm, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
