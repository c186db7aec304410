"""The library oracle against cuSPARSE: every variant verified, then timed side by side.

For each matrix, every applicable library variant goes through the full harness
(verification on seven inputs with NaN-poisoned outputs, then timing in the cold regime,
L2 flushed before each run, and the warm regime), in the same worker process and with
the same timing function as cuSPARSE (every CSR algorithm, fastest kept). The oracle
is the fastest verified variant. Reported per matrix: cuSPARSE time, the
oracle's variant and time, speedup = t_cusparse / t_oracle, the best per format, and
the roofline fraction = compulsory bytes / t / measured copy bandwidth, where
compulsory bytes = 4 * (nnz + n*k + m*k) (values, x, y once; no index bytes).

Also recorded: the timing floor, an empty kernel timed by the same function in each regime
(about 4.5 us cold on an H200, 0.5 us warm). Every cold time, cuSPARSE's included, carries
most of it, which compresses the ratios of the fastest kernels; it is not simply additive (a
kernel's launch overlaps some of it), so no bound is derived from it here. Run
``benchmarks/timing_floor.py`` for the simplest possible diagonal kernel timed the same way.

    python benchmarks/library_speed.py --set large --out results/speed_large.json
    python benchmarks/library_speed.py --set suitesparse --suitesparse DIR --regime warm
    python benchmarks/library_speed.py --set large --compare OLD.json   # old and new figures side by side
    python benchmarks/library_speed.py --set suitesparse --suitesparse DIR --only soc-brightkite --gcn \
        --op spmm --k 128 --regime warm --out FILE       # a GCN's normalised adjacency of the graph

Sets: ``large`` = generated families at millions of nonzeros (DRAM-bound), ``suitesparse``
= the real matrices (all fit in the H200's L2). ``--gcn`` times each matrix's GCN adjacency instead
(the symmetric pattern with self loops, symmetrically normalised, as ``benchmarks/operator_e2e.py``
builds it). Prints a table, writes JSON, every verified variant's time included.
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

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.timing import TimingConfig, measured_copy_bandwidth, time_run
from sparserl.kernels.contract import Op
from sparserl.kernels.library import all_variants
from sparserl.matrices import compute_features, generate, load_matrix

log = logging.getLogger("library_speed")

# Large generated matrices: ~4M rows where the nonzero count stays moderate.
LARGE = [
    ("diagonal_4M", "diagonal", 4_000_000, {}),
    ("banded9_4M", "banded", 4_000_000, {"bands": 9}),
    ("stencil2d_4M", "stencil2d", 4_000_000, {}),
    ("stencil3d7_4M", "stencil3d_7", 4_000_000, {}),
    ("stencil3d27_4M", "stencil3d_27", 4_000_000, {}),  # 108M nonzeros (1M rows before)
    ("block8_1M", "block", 1_000_000, {"block": 8, "blocks_per_row": 4}),
    ("random16_2M", "random", 2_000_000, {"nnz_per_row": 16}),
    ("powerlaw_2M", "powerlaw", 2_000_000, {}),
    ("skewed_2M", "skewed", 2_000_000, {}),
    ("empty_rows_2M", "empty_rows", 2_000_000, {"nnz_per_row": 16}),
    ("rectangular_1Mx2M", "rectangular", 1_000_000, {"cols": 2_000_000}),
]


def matrices(which: str, suitesparse: Path | None, only: set[str] | None, gcn: bool = False):
    """(name, family, matrix) of the set; with ``gcn`` each one's GCN adjacency."""
    if gcn:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from operator_e2e import gcn_adjacency

        for name, fam, A in matrices(which, suitesparse, only):
            yield f"gcn_{name}", fam, gcn_adjacency(A)
        return
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


def timing_floor_us() -> dict[str, float]:
    """Median time of an empty one-block kernel under each regime's timing function."""
    import cupy as cp

    kernel = cp.RawKernel('extern "C" __global__ void empty_kernel() {}', "empty_kernel")
    return {regime: time_run(lambda: kernel((1,), (32,), ()), TimingConfig(regime=regime)).median_us
            for regime in ("cold", "warm")}


def print_comparison(old: dict, rows: list[dict], label: str) -> None:
    """Old and new cuSPARSE time, oracle time and speedup per matrix, both regimes."""
    before = {r["matrix"]: r for r in old.get("rows", [])}
    print(f"\nbefore ({label}) and now, per regime: cuSPARSE us, oracle us, speedup")
    print(f"{'matrix':24} {'regime':6} {'cuSPARSE':>17} {'oracle':>17} {'speedup':>15}  oracle variant now")
    for r in rows:
        b = before.get(r["matrix"])
        for regime in ("cold", "warm"):
            now = r[regime]
            if b is None or regime not in b:
                print(f"{r['matrix']:24} {regime:6} {'-':>8} {now['cusparse_us']:>8.1f} {'-':>8} {now['best_us']:>8.1f} "
                      f"{'-':>6} {now['speedup']:>6.2f}x  {now['best_variant']}")
                continue
            o = b[regime]
            print(f"{r['matrix']:24} {regime:6} {o['cusparse_us']:>8.1f} {now['cusparse_us']:>8.1f} "
                  f"{o['best_us']:>8.1f} {now['best_us']:>8.1f} {o['speedup']:>6.2f}x {now['speedup']:>6.2f}x  "
                  f"{now['best_variant']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=["large", "suitesparse"], default="large")
    ap.add_argument("--suitesparse", type=Path)
    ap.add_argument("--only", default="", help="comma-separated matrix names")
    ap.add_argument("--op", choices=["spmv", "spmm"], default="spmv")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--regime", choices=["cold", "warm"], default="cold", help="regime of the headline speedup")
    ap.add_argument("--out", type=Path, default=Path("library_speed.json"))
    ap.add_argument("--compare", type=Path, help="an earlier run's JSON: print its figures beside this run's")
    ap.add_argument("--gcn", action="store_true",
                    help="time each matrix's GCN adjacency (symmetric pattern, self loops, normalised)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    op = Op(args.op)
    k = args.k if op is Op.SPMM else None
    texts = [(v.id, v.format, v.render()) for v in all_variants() if v.op is op and v.applicable(k)]
    rows = []
    only = set(filter(None, args.only.split(",")))
    with Evaluator(HarnessConfig(reward_regime=args.regime)) as ev:
        for name, fam, A in matrices(args.set, args.suitesparse, only or None, args.gcn):
            m, n = A.shape
            mat = ev.register(A, name)
            t0 = time.perf_counter()
            results = ev.evaluate_many([(text, mat, op, k) for _, _, text in texts])
            ok = [(vid, fmt, r) for (vid, fmt, _), r in zip(texts, results) if r.ok]
            bad = [(vid, r.error_kind.value, r.message) for (vid, _, _), r in zip(texts, results)
                   if not r.ok and r.error_kind.value != "format_refused"]
            if not ok:
                log.warning("%s: no library variant passed: %s", name, bad[:3])
                continue
            row = {"matrix": name, "family": fam, "rows": m, "cols": n, "nnz": int(A.nnz),
                   "features": compute_features(A).to_dict(), "failed": bad, "variants_ok": len(ok),
                   "eval_seconds": time.perf_counter() - t0,
                   "variants_us": {vid: {g: t.median_us for g, t in r.timings.items()} for vid, _, r in ok}}
            for regime in ("cold", "warm"):
                base = ok[0][2].baseline[regime].median_us
                best_vid, best_fmt, best = min(ok, key=lambda t: t[2].timings[regime].median_us)
                per_fmt: dict[str, float] = {}
                for vid, fmt, r in ok:
                    per_fmt[fmt] = min(per_fmt.get(fmt, float("inf")), r.timings[regime].median_us)
                row[regime] = {
                    "cusparse_us": base, "cusparse_alg": best.baseline_alg if regime == args.regime else None,
                    "best_variant": best_vid, "best_format": best_fmt, "best_us": best.timings[regime].median_us,
                    "speedup": base / best.timings[regime].median_us,
                    "csr_only_speedup": base / per_fmt["CSR"] if "CSR" in per_fmt else None,
                    "per_format_speedup": {f: base / t for f, t in per_fmt.items()},
                    "roofline_best": (best.roofline * best.timings[args.regime].median_us
                                      / best.timings[regime].median_us) if best.roofline else None,
                }
            rows.append(row)
            h = row[args.regime]
            log.info("%-22s cuSPARSE %8.1f us  best %8.1f us (%s)  speedup %.2fx  roofline %.2f  [%d ok, %.1f s]",
                     name, h["cusparse_us"], h["best_us"], h["best_variant"], h["speedup"], h["roofline_best"],
                     len(ok), row["eval_seconds"])
        gpu = ev.pool.gpu if ev.has_gpu else "?"
    floor = timing_floor_us()
    bandwidth = measured_copy_bandwidth()
    for r in rows:
        kk = k or 1
        r["compulsory_bytes"] = 4 * (r["nnz"] + r["cols"] * kk + r["rows"] * kk)
    log.info("timing floor (empty kernel): cold %.2f us, warm %.2f us; copy bandwidth %.0f GB/s",
             floor["cold"], floor["warm"], bandwidth / 1e9)

    print(f"\n{args.op}{f' k={k}' if k else ''} on {gpu}: library oracle (fastest verified variant) vs cuSPARSE "
          f"(fastest CSR algorithm), both timed by the harness; headline regime {args.regime}")
    print(f"{'matrix':24} {'nnz':>10} {'cuSPARSE us':>11} {'best us':>9} {'speedup':>8} {'warm':>6} {'roofl':>6} "
          f"{'CSR-only':>8}  best variant")
    for r in rows:
        h, w = r[args.regime], r["warm" if args.regime == "cold" else "cold"]
        csr = f"{h['csr_only_speedup']:.2f}" if h["csr_only_speedup"] else "-"
        print(f"{r['matrix']:24} {r['nnz']:>10} {h['cusparse_us']:>11.2f} {h['best_us']:>9.2f} {h['speedup']:>7.2f}x "
              f"{w['speedup']:>5.2f}x {h['roofline_best']:>6.2f} {csr:>8}  {h['best_variant']}")
    summary = {}
    for regime in ("cold", "warm"):
        sp = [r[regime]["speedup"] for r in rows]
        summary[regime] = {"geomean_speedup": math.exp(np.mean(np.log(sp))) if sp else None,
                           "loses_to_cusparse": [r["matrix"] for r in rows if r[regime]["speedup"] < 1.0]}
        print(f"{regime}: geometric-mean speedup {summary[regime]['geomean_speedup']:.2f}x over {len(rows)} matrices; "
              f"library slower than cuSPARSE on {len(summary[regime]['loses_to_cusparse'])}: "
              f"{', '.join(summary[regime]['loses_to_cusparse'][:12])}")
    if args.compare is not None:
        print_comparison(json.loads(args.compare.read_text()), rows, args.compare.name)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"op": args.op, "k": k, "set": args.set, "gcn": args.gcn,
                                    "headline_regime": args.regime, "gpu": gpu, "timing_floor_us": floor,
                                    "copy_bandwidth_bytes_per_s": bandwidth,
                                    "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
