"""The harness's evaluation speed, the sequential path and the batched one side by side in one run.

For each matrix (generated families at ``--rows`` rows, SuiteSparse files from a folder), a fixed set
of library SpMV kernels is evaluated by two evaluators, the sequential path
(``SpeedConfig.classic()``: one launch, one synchronisation and one host-side check at a time, 41
cold runs, fixed time limits) and the batched one (the default), one after the other so only one
worker uses the GPU at a time. Candidates are submitted as a search does (a few in flight, the best
time so far noted with the evaluator, so the batched path stops hopeless ones early). Compiles are
cached before either path runs; matrices, conversions and cuSPARSE baselines are each path's own.

Printed, per path and matrix set: evaluations per second (1 / the median over candidates of the
worker's time on a candidate, the round trip included; and candidates / wall time), the slowest
candidate with its largest steps, the mean time per profile step (``sparserl.harness.profile``),
verdict counts; then the agreement of the two paths: verdicts, and the batched / sequential ratio of
the cold median per kernel fully timed by both (and of cuSPARSE's time per matrix).
Written: ``--out``/harness_speed.json with every evaluation.

    python benchmarks/harness_speed.py --quick --suitesparse DIR --out results/harness_speed   # ~4 min, one H200
    python benchmarks/harness_speed.py --suitesparse DIR --out results/harness_speed           # 11 families, all
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.harness.compile import compile_many
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.speed import SpeedConfig
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import get_variant, variants
from sparserl.matrices import generate, load_matrix

log = logging.getLogger("harness_speed")

FAMILIES = ("diagonal", "banded", "stencil2d", "stencil3d_7", "stencil3d_27", "block", "random", "powerlaw",
            "skewed", "empty_rows", "rectangular")
"""The 11 generated families of the targets (generator defaults, seed 1)."""
QUICK_FAMILIES = ("powerlaw", "stencil2d", "skewed")
"""Long rows, a regular stencil, a few rows of 4096 among short ones."""
QUICK_KERNELS = ("spmv/csr_scalar/-/block=256", "spmv/csr_vector/-/tpr=4,block=256",
                 "spmv/csr_vector/-/tpr=16,block=256", "spmv/csr_merge/-/block=256,ipt=7",
                 "spmv/csr_adaptive/-/rpw=64,items=4,long_len=4096,seg=4096,block=256",
                 "spmv/coo_segmented/-/batches=16,block=256", "spmv/ell_rows/-/block=256,rpt=1",
                 "spmv/sell_lanes/C=32,sigma=512/block=256", "spmv/dia_stream/-/block=256,v=1",
                 "spmv/bsr_group/R=2,C=2/g=16,block=256")
"""One or two kernels per format (refusals included: they cost a conversion attempt)."""
PATHS = {"sequential": SpeedConfig.classic(), "batched": SpeedConfig()}
FRONT = ("extract", "static_check", "compile", "plan", "queue")
"""Profile steps outside the worker's time on a candidate (the parent's, or waiting for the worker)."""


def matrices(args):
    """(set, name, build) in order; each matrix is built only when reached."""
    fams = list(QUICK_FAMILIES if args.quick else FAMILIES) if args.families is None else \
        [f for f in args.families.split(",") if f]
    for fam in fams:
        yield "families", f"{fam}_{args.rows}", lambda fam=fam: generate(fam, args.rows, seed=1)
    if args.suitesparse:
        files = [p for p in Path(args.suitesparse).iterdir() if p.name.endswith((".mtx", ".mtx.gz", ".npz"))]
        if not files:
            raise SystemExit(f"error: no .mtx/.mtx.gz/.npz files in {args.suitesparse}")
        limit = args.limit if args.limit is not None else (5 if args.quick else None)
        # quick: the largest files (the closest to the sizes users bring); otherwise every file by name
        files = sorted(files, key=lambda p: (-p.stat().st_size, p.name))[:limit] if args.quick else \
            sorted(files)[:limit]
        for f in files:
            yield "suitesparse", f.name.split(".")[0], lambda f=f: load_matrix(f)


def kernel_set(args) -> list[tuple[str, str]]:
    """(id, text) of the candidates."""
    if args.kernels:
        try:
            return [(i, get_variant(i).render()) for i in args.kernels]
        except SparseRLError as exc:
            raise SystemExit(f"error: {exc}") from None
    if args.quick:
        return [(i, get_variant(i).render()) for i in QUICK_KERNELS]
    return [(v.id, v.render()) for v in variants(Op.SPMV)]


def run_set(ev: Evaluator, ref, kernels, parallel: int) -> tuple[list, float]:
    """Evaluate ``kernels`` as a search does: ``parallel`` in flight, each new best time noted."""
    t0 = time.perf_counter()
    out: dict[int, object] = {}
    pending = list(enumerate(kernels))
    flight: dict = {}
    best = None
    while pending or flight:
        while pending and len(flight) < parallel:
            i, (_, text) = pending.pop(0)
            flight[ev.submit(text, ref, Op.SPMV)] = i
        done, _ = wait(list(flight), return_when=FIRST_COMPLETED)
        for f in done:
            i = flight.pop(f)
            r = out[i] = f.result()
            t = r.timings.get(r.regime)
            if r.correct and t is not None and (best is None or t.median_us < best):
                best = t.median_us
                ev.note_best(ref, Op.SPMV, None, best)
    return [out[i] for i in range(len(kernels))], time.perf_counter() - t0


def worker_seconds(r) -> float | None:
    """The worker's time on a candidate, the round trip included (None when it never reached one)."""
    if r.profile is None:
        return None
    s = sum(v for k, v in r.profile.seconds.items() if k not in FRONT)
    return s if any(k not in FRONT for k in r.profile.seconds) else None


def row_of(path: str, set_: str, name: str, kid: str, r) -> dict:
    cold = r.timings.get("cold")
    base = r.baseline.get("cold")
    return {"path": path, "set": set_, "matrix": name, "kernel": kid, "verdict": r.error_kind.value,
            "message": r.message[:200], "cold_us": cold.median_us if cold else None,
            "trials": cold.trials if cold else None, "cusparse_us": base.median_us if base else None,
            "checked_timed_outputs": r.checked_timed_outputs, "eval_s": r.eval_seconds,
            "worker_s": worker_seconds(r), "profile": r.profile.seconds if r.profile else {},
            "counts": r.profile.counts if r.profile else {}}


def summarise(rows: list[dict], walls: dict) -> dict:
    """Per (path, set): evaluations per second, the slowest candidate, mean seconds per step, verdicts."""
    out: dict = {}
    for key in sorted({(r["path"], r["set"]) for r in rows}):
        rs = [r for r in rows if (r["path"], r["set"]) == key]
        ws = [r["worker_s"] for r in rs if r["worker_s"] is not None]
        steps = sorted({s for r in rs for s in r["profile"]})
        slowest = max((r for r in rs if r["worker_s"] is not None), key=lambda r: r["worker_s"], default=None)
        kinds: dict[str, int] = {}
        for r in rs:
            kinds[r["verdict"]] = kinds.get(r["verdict"], 0) + 1
        wall = sum(w for (p, s, _), w in walls.items() if (p, s) == key)
        out[f"{key[0]}/{key[1]}"] = {
            "candidates": len(rs), "median_worker_s": statistics.median(ws) if ws else None,
            "evals_per_s_median": 1.0 / statistics.median(ws) if ws else None,
            "evals_per_s_wall": len(rs) / wall if wall else None, "wall_s": wall,
            "slowest": {k: slowest[k] for k in ("matrix", "kernel", "verdict", "worker_s")} | {
                "top_steps": sorted(slowest["profile"].items(), key=lambda kv: -kv[1])[:4]} if slowest else None,
            "mean_step_s": {s: statistics.fmean(r["profile"].get(s, 0.0) for r in rs) for s in steps},
            "verdicts": kinds,
            "cold_runs_mean": statistics.fmean(r["counts"].get("cold_runs", 0) for r in rs),
        }
    return out


def agreement(rows: list[dict]) -> dict:
    """Batched / sequential, per kernel and matrix: verdicts, and the cold median of kernels both
    paths timed in full (honest kernels); the same ratio for kernels the batched path stopped early
    (its 5-run median against the full 41), and for cuSPARSE per matrix."""
    by = {(r["matrix"], r["kernel"], r["path"]): r for r in rows}
    pairs = [(by[(m, k, "sequential")], by[(m, k, "batched")]) for (m, k, p) in by
             if p == "sequential" and (m, k, "batched") in by]
    full = [(a, b) for a, b in pairs if a["verdict"] == b["verdict"] == "none" and a["cold_us"] and b["cold_us"]]
    ratios = [b["cold_us"] / a["cold_us"] for a, b in full]
    slow = [b["cold_us"] / a["cold_us"] for a, b in pairs if b["verdict"] == "slow" and a["verdict"] == "none"]
    base = {}
    for a, b in pairs:
        if a["cusparse_us"] and b["cusparse_us"]:
            base[a["matrix"]] = b["cusparse_us"] / a["cusparse_us"]
    differ = [{"matrix": a["matrix"], "kernel": a["kernel"], "sequential": a["verdict"], "batched": b["verdict"]}
              for a, b in pairs if a["verdict"] != b["verdict"] and not (a["verdict"] == "none" and b["verdict"] == "slow")]
    return {
        "verdict_pairs": len(pairs), "verdicts_differ": differ,
        "timed_both": len(full), "ratio_median": statistics.median(ratios) if ratios else None,
        "within_2pct": sum(abs(x - 1) <= 0.02 for x in ratios), "within_5pct": sum(abs(x - 1) <= 0.05 for x in ratios),
        "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
        "per_kernel": [{"matrix": a["matrix"], "kernel": a["kernel"], "sequential_us": a["cold_us"],
                        "batched_us": b["cold_us"], "ratio": b["cold_us"] / a["cold_us"], "batched_trials": b["trials"]}
                       for a, b in full],
        "slow_ratio_median": statistics.median(slow) if slow else None, "slow_count": len(slow),
        "cusparse_ratio": base,
    }


def print_report(summary: dict, agree: dict) -> None:
    print("\nevaluations per second (1 / median worker time per candidate; candidates / wall)")
    print(f"{'path/set':26} {'cands':>5} {'median s':>9} {'evals/s':>8} {'wall/s':>7} {'cold runs':>9}  slowest")
    for key, s in summary.items():
        sl = s["slowest"]
        slow_txt = (f"{sl['worker_s']:.2f} s {sl['matrix']} {sl['kernel']} ({sl['verdict']}; "
                    + ", ".join(f"{k} {v:.2f}" for k, v in sl["top_steps"]) + ")") if sl else "-"
        eps = s["evals_per_s_median"]
        print(f"{key:26} {s['candidates']:>5} {s['median_worker_s'] or 0:>9.3f} {eps or 0:>8.1f} "
              f"{s['evals_per_s_wall'] or 0:>7.1f} {s['cold_runs_mean']:>9.1f}  {slow_txt}")
    print("\nmean seconds per step (per candidate)")
    steps = sorted({st for s in summary.values() for st in s["mean_step_s"]})
    keys = list(summary)
    print(f"{'step':20}" + "".join(f"{k:>26}" for k in keys))
    for st in steps:
        print(f"{st:20}" + "".join(f"{summary[k]['mean_step_s'].get(st, 0.0) * 1e3:>24.2f}ms" for k in keys))
    print("\nverdicts: " + "; ".join(f"{k}: {s['verdicts']}" for k, s in summary.items()))
    a = agree
    print(f"\nagreement: {a['verdict_pairs']} kernel/matrix pairs, {len(a['verdicts_differ'])} verdicts differ "
          "(none -> slow is early stopping, not a difference)")
    for d in a["verdicts_differ"]:
        print(f"  {d['matrix']} {d['kernel']}: sequential {d['sequential']}, batched {d['batched']}")
    if a["ratio_median"] is not None:
        print(f"cold median batched / sequential over {a['timed_both']} kernels timed in full by both: median "
              f"{a['ratio_median']:.4f}, range {a['ratio_min']:.4f}-{a['ratio_max']:.4f}, within 2%: "
              f"{a['within_2pct']}/{a['timed_both']}, within 5%: {a['within_5pct']}/{a['timed_both']}")
        print(f"{'matrix':28} {'kernel':58} {'seq us':>9} {'batch us':>9} {'ratio':>7} {'runs':>5}")
        for p in a["per_kernel"]:
            print(f"{p['matrix']:28} {p['kernel']:58} {p['sequential_us']:>9.2f} {p['batched_us']:>9.2f} "
                  f"{p['ratio']:>7.4f} {p['batched_trials']:>5}")
    if a["slow_count"]:
        print(f"stopped early (slow) by the batched path: {a['slow_count']}, their 5-run median / the sequential "
              f"41-run median: median {a['slow_ratio_median']:.4f}")
    if a["cusparse_ratio"]:
        print("cuSPARSE batched / sequential: " + ", ".join(f"{m} {v:.4f}" for m, v in a["cusparse_ratio"].items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for harness_speed.json")
    ap.add_argument("--quick", action="store_true",
                    help=f"{len(QUICK_FAMILIES)} families, the 5 largest SuiteSparse files, {len(QUICK_KERNELS)} kernels")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--families", default=None, help="comma-separated families (default: the 11, or quick's 3; '' none)")
    ap.add_argument("--suitesparse", default=None, help="folder of .mtx/.mtx.gz/.npz matrices")
    ap.add_argument("--limit", type=int, default=None, help="at most this many SuiteSparse files")
    ap.add_argument("--kernels", nargs="+", default=None, help="library variant ids (default: all SpMV; quick: 10)")
    ap.add_argument("--parallel", type=int, default=4, help="candidates in flight (a search's default)")
    ap.add_argument("--warm", action="store_true", help="time the warm regime too (cold only by default)")
    ap.add_argument("--cache", default=None, help="harness cache folder (default: a fresh one, so both paths "
                                                   "measure their own baselines)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    kernels = kernel_set(args)
    tmp = tempfile.TemporaryDirectory(prefix="harness_speed_")
    cache = args.cache or tmp.name
    regimes = ("cold", "warm") if args.warm else ("cold",)
    t0 = time.perf_counter()
    evs = {p: Evaluator(HarnessConfig(memo=0, regimes=regimes, cache_dir=cache, speed=s)) for p, s in PATHS.items()}
    compiled = compile_many([split_completion(t, Op.SPMV)[1] for _, t in kernels], evs["batched"].config.compile,
                            cache_dir=evs["batched"].config.root / "cubin")  # both paths then find them cached
    log.info("compiled %d kernels (%d ok) in %.1f s", len(kernels), sum(c.ok for c in compiled),
             time.perf_counter() - t0)
    rows: list[dict] = []
    walls: dict = {}
    try:
        for path, ev in evs.items():  # start each path's worker now: start-up is not a candidate's time
            t1 = time.perf_counter()
            log.info("%s worker on %s, started in %.1f s", path, ev.pool.gpu, time.perf_counter() - t1)
        for i, (set_, name, build) in enumerate(matrices(args)):
            A = build()
            log.info("%s: %d x %d, %d nonzeros", name, A.shape[0], A.shape[1], A.nnz)
            order = list(PATHS) if i % 2 == 0 else list(reversed(PATHS))  # neither path always goes first
            for path in order:
                ev = evs[path]
                ref = ev.register(A, name)
                res, wall = run_set(ev, ref, kernels, args.parallel)
                walls[(path, set_, name)] = wall
                rows += [row_of(path, set_, name, kid, r) for (kid, _), r in zip(kernels, res)]
                ws = [w for w in (worker_seconds(r) for r in res) if w is not None]
                log.info("  %-10s %d candidates in %.1f s (median %.3f s each)", path, len(res), wall,
                         statistics.median(ws) if ws else float("nan"))
            args.out.mkdir(parents=True, exist_ok=True)
            summary, agree = summarise(rows, walls), agreement(rows)
            (args.out / "harness_speed.json").write_text(json.dumps(
                {"gpu": evs["batched"].pool.gpu, "args": {k: str(v) for k, v in vars(args).items()},
                 "kernels": [k for k, _ in kernels], "summary": summary, "agreement": agree, "rows": rows},
                indent=1))
    finally:
        for ev in evs.values():
            ev.close()
        tmp.cleanup()
    print_report(summarise(rows, walls), agreement(rows))
    print(f"\nwrote {args.out / 'harness_speed.json'} ({time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
