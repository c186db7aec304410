"""Harness throughput, compile throughput and timing stability on the GPU machine.

1. Evaluations per second: every SpMV library variant (compiles cached) evaluated in
   full (extract, checks, verify on 7 inputs, cold and warm timing) on a ~1M-nonzero
   matrix through the worker pool, after one warm-up evaluation (matrix upload,
   cuSPARSE baseline, copy bandwidth).
2. Cold compile throughput: N distinct sources (library variants with a unique comment)
   compiled into an empty cache with one nvcc per CPU core.
3. Timing stability: one kernel evaluated 10 times; spread of the medians
   (max/min - 1) per regime, for two kernels.

    python benchmarks/harness_bench.py --out results/harness_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sparserl.harness.compile import CompileOptions, compile_many
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import get_variant, variants
from sparserl.matrices import generate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("harness_bench.json"))
    ap.add_argument("--compile-sources", type=int, default=96)
    args = ap.parse_args()
    out: dict = {}

    # 2. cold compile throughput (first: uses only CPUs)
    vs = variants(Op.SPMV)
    sources = [split_completion(vs[i % len(vs)].render(), Op.SPMV)[1] + f"\n// unique {i} {time.time()}\n"
               for i in range(args.compile_sources)]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = compile_many(sources, CompileOptions(), cache_dir=tmp)
        wall = time.perf_counter() - t0
    assert all(r.ok for r in res)
    out["compile"] = {"sources": len(sources), "cores": os.cpu_count(), "wall_s": wall,
                      "compiles_per_s": len(sources) / wall,
                      "median_build_s": statistics.median(r.build_seconds for r in res)}
    print(f"cold compile: {len(sources)} sources in {wall:.1f} s on {os.cpu_count()} cores = "
          f"{len(sources) / wall:.1f} compiles/s (median build {out['compile']['median_build_s']:.2f} s each)")

    with Evaluator(HarnessConfig(memo=0)) as ev:  # repeated texts must really run again
        A = generate("stencil2d", 200_000, seed=0)  # ~1M nonzeros
        mat = ev.register(A, "stencil2d_200k")
        texts = [v.render() for v in vs]
        first = ev.evaluate(texts[0], mat, "spmv")  # warm-up: upload, baseline, bandwidth
        assert first.ok, first.message
        ev.evaluate_many([(t, mat, "spmv", None) for t in texts])  # compiles cached, conversions made
        t0 = time.perf_counter()
        results = ev.evaluate_many([(t, mat, "spmv", None) for t in texts])
        wall = time.perf_counter() - t0
        kinds: dict[str, int] = {}
        for r in results:
            kinds[r.error_kind.value] = kinds.get(r.error_kind.value, 0) + 1
        out["throughput"] = {"matrix": mat.name, "nnz": int(A.nnz), "evaluations": len(results), "wall_s": wall,
                             "evals_per_s": len(results) / wall, "kinds": kinds, "gpu": first.gpu}
        print(f"throughput: {len(results)} full evaluations on {mat.name} ({A.nnz} nnz) in {wall:.2f} s = "
              f"{len(results) / wall:.1f} evals/s; kinds {kinds}")

        # 3. stability
        out["stability"] = {}
        for vid in ("spmv/csr_vector/-/tpr=4,block=128", "spmv/dia_rows/-/block=128,rpt=2"):
            text = get_variant(vid).render()
            runs = [ev.evaluate(text, mat, "spmv") for _ in range(10)]
            assert all(r.ok for r in runs)
            st = {}
            for regime in ("cold", "warm"):
                med = [r.timings[regime].median_us for r in runs]
                st[regime] = {"medians_us": med, "max_over_min_minus_1": max(med) / min(med) - 1}
            sp = [r.speedup for r in runs]
            st["speedup_max_over_min_minus_1"] = max(sp) / min(sp) - 1
            out["stability"][vid] = st
            print(f"stability {vid}: cold medians vary {st['cold']['max_over_min_minus_1']:.2%}, "
                  f"warm {st['warm']['max_over_min_minus_1']:.2%} over 10 evaluations "
                  f"(cold median {statistics.median(st['cold']['medians_us']):.2f} us)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
