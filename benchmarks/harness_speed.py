"""The harness's evaluation speed, the sequential path and the batched one side by side in one run.

For each matrix (generated families at ``--rows`` rows, SuiteSparse files from a folder), a fixed set
of library SpMV kernels is evaluated by one evaluator per path of ``--paths`` (by default two: the
sequential path, ``SpeedConfig.classic()``: one launch, one synchronisation and one host-side check
at a time, 41 cold runs, fixed time limits, and the batched one, the default; ``unstaged`` is the
batched path without the page-locked staging buffer), one after the other so only one worker uses
the GPU at a time. Candidates are submitted as a search does (a few in flight, the best
time so far noted with the evaluator, so the batched path stops hopeless ones early). Compiles are
cached before either path runs; matrices, conversions and cuSPARSE baselines are each path's own.

Each path evaluates the kernel set ``--repeats`` times per matrix (the first pass makes the tables of
speed; the passes together give each path's own repeat-to-repeat spread of the cold median, the noise
against which the agreement of the two paths is judged).

Printed, per path and matrix set: evaluations per second (1 / the median over candidates of the
worker's time on a candidate, the round trip included; and candidates / wall time), candidates whose
own time (the worker's, plus a conversion made in this process ahead of it: ``preconvert``) is over
3 s, the median worker time of candidates that made a new conversion and of those that reused one,
the slowest candidate by its own time with its largest steps, the mean time per profile step (``sparserl.harness.profile``),
verdict counts; then the agreement of the two paths: verdicts, the batched / sequential ratio of the
cold median (and of the speedup over cuSPARSE) per kernel fully timed by both, each path's repeat
spread, cuSPARSE's ratio per matrix; and, with ``--modes``, cuSPARSE and one library kernel timed in
this process by each timing loop (the sequential one, the batched one with 1 run ahead and with all
runs ahead), several times over, to tell a systematic difference of the loops from noise.
Written: ``--out``/harness_speed.json with every evaluation.

    python benchmarks/harness_speed.py --quick --suitesparse DIR --out results/harness_speed   # ~2 min, one H200
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
from sparserl.harness.compile import compile_many, compile_source
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.speed import SpeedConfig
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import get_variant, variants
from sparserl.matrices import generate, load_matrix
from sparserl.matrices.io import matrices_in

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
PATHS = {"sequential": SpeedConfig.classic(), "batched": SpeedConfig(), "unstaged": SpeedConfig(staging_bytes=0)}
"""The evaluation paths ``--paths`` chooses from: ``batched`` is the default (its uploads through one page-locked
staging buffer, ``sparserl.harness.staging``); ``unstaged`` is the batched path with every upload through CuPy's
pinned pool instead, for timing the buffer against what it replaced in one run."""
FRONT = ("extract", "static_check", "compile", "plan", "preconvert", "queue")
"""Profile steps outside the worker's time on a candidate (the parent's, or waiting for the worker)."""
CONVERSION = ("convert", "upload", "load_conversion")
"""Profile steps of a candidate that made a new conversion of its matrix (the first of its format)."""
LIMIT_S = 3.0
"""The target's most seconds for one candidate."""
MODES_KERNEL = "spmv/csr_vector/-/tpr=4,block=256"
"""The library kernel ``--modes`` times beside cuSPARSE."""


def matrices(args):
    """(set, name, build) in order; each matrix is built only when reached."""
    fams = list(QUICK_FAMILIES if args.quick else FAMILIES) if args.families is None else \
        [f for f in args.families.split(",") if f]
    for fam in fams:
        yield "families", f"{fam}_{args.rows}", lambda fam=fam: generate(fam, args.rows, seed=1)
    if args.suitesparse:
        files = matrices_in(args.suitesparse)
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


def row_of(path: str, set_: str, name: str, kid: str, r, repeat: int = 0) -> dict:
    cold = r.timings.get("cold")
    base = r.baseline.get("cold")
    return {"path": path, "set": set_, "matrix": name, "kernel": kid, "repeat": repeat, "verdict": r.error_kind.value,
            "message": r.message[:200], "cold_us": cold.median_us if cold else None,
            "trials": cold.trials if cold else None, "cusparse_us": base.median_us if base else None,
            "checked_timed_outputs": r.checked_timed_outputs, "eval_s": r.eval_seconds,
            "worker_s": worker_seconds(r), "profile": r.profile.seconds if r.profile else {},
            "counts": r.profile.counts if r.profile else {}}


def summarise(rows: list[dict], walls: dict) -> dict:
    """Per (path, set), over the first pass: evaluations per second, candidates over the limit, new
    conversions against reused ones, the slowest candidate, mean seconds per step, verdicts."""
    out: dict = {}
    rows = [r for r in rows if r.get("repeat", 0) == 0]
    for key in sorted({(r["path"], r["set"]) for r in rows}):
        rs = [r for r in rows if (r["path"], r["set"]) == key]
        ws = [r["worker_s"] for r in rs if r["worker_s"] is not None]
        made = [r["worker_s"] for r in rs if r["worker_s"] is not None and any(r["profile"].get(s) for s in CONVERSION)]
        reused = [r["worker_s"] for r in rs if r["worker_s"] is not None and not any(r["profile"].get(s) for s in CONVERSION)]
        steps = sorted({s for r in rs for s in r["profile"]})
        own = {id(r): r["worker_s"] + r["profile"].get("preconvert", 0.0) for r in rs if r["worker_s"] is not None}
        slowest = max((r for r in rs if id(r) in own), key=lambda r: own[id(r)], default=None)
        kinds: dict[str, int] = {}
        for r in rs:
            kinds[r["verdict"]] = kinds.get(r["verdict"], 0) + 1
        wall = sum(w for (p, s, _), w in walls.items() if (p, s) == key)
        out[f"{key[0]}/{key[1]}"] = {
            "candidates": len(rs), "median_worker_s": statistics.median(ws) if ws else None,
            "evals_per_s_median": 1.0 / statistics.median(ws) if ws else None,
            "evals_per_s_wall": len(rs) / wall if wall else None, "wall_s": wall,
            "over_limit": sum(w > LIMIT_S for w in own.values()),
            "new_conversion": {"candidates": len(made), "median_worker_s": statistics.median(made) if made else None},
            "reused_conversion": {"candidates": len(reused),
                                  "median_worker_s": statistics.median(reused) if reused else None},
            "slowest": {k: slowest[k] for k in ("matrix", "kernel", "verdict", "worker_s")} | {
                "own_s": own[id(slowest)],
                "top_steps": sorted(slowest["profile"].items(), key=lambda kv: -kv[1])[:4]} if slowest else None,
            "mean_step_s": {s: statistics.fmean(r["profile"].get(s, 0.0) for r in rs) for s in steps},
            "verdicts": kinds,
            "cold_runs_mean": statistics.fmean(r["counts"].get("cold_runs", 0) for r in rs),
        }
    return out


def _spread(ratios: list[float]) -> dict:
    """How far ratios that should be 1 are from it: median and largest |r - 1|, within 2% and 5%."""
    dev = sorted(abs(x - 1) for x in ratios)
    return {"n": len(ratios), "median_dev": statistics.median(dev) if dev else None, "max_dev": dev[-1] if dev else None,
            "within_2pct": sum(d <= 0.02 for d in dev), "within_5pct": sum(d <= 0.05 for d in dev)}


def repeat_spread(rows: list[dict]) -> dict:
    """Per path: a kernel's cold median in each later pass over its first pass (kernels timed in full
    both times): the path's own noise."""
    by = {(r["path"], r["matrix"], r["kernel"], r.get("repeat", 0)): r for r in rows}
    out = {}
    for path in sorted({r["path"] for r in rows}):
        ratios = []
        for (p, m, k, rep), r in by.items():
            first = by.get((p, m, k, 0))
            if p == path and rep > 0 and first and r["verdict"] == first["verdict"] == "none" and r["cold_us"] \
                    and first["cold_us"]:
                ratios.append(r["cold_us"] / first["cold_us"])
        out[path] = _spread(ratios)
    return out


def agreement(rows: list[dict]) -> dict:
    """Batched / sequential, per kernel and matrix: verdicts, and the cold median of kernels both
    paths timed in full (honest kernels) in every pass, as the mean over the passes; the same for the
    speedup over each path's own cuSPARSE time; the ratio for kernels the batched path stopped early
    (its 5-run median against the full 41) and for cuSPARSE per matrix; each path's repeat spread."""
    first = [r for r in rows if r.get("repeat", 0) == 0]
    by = {(r["matrix"], r["kernel"], r["path"]): r for r in first}
    pairs = [(by[(m, k, "sequential")], by[(m, k, "batched")]) for (m, k, p) in by
             if p == "sequential" and (m, k, "batched") in by]
    times: dict[tuple, list[float]] = {}
    for r in rows:
        times.setdefault((r["matrix"], r["kernel"], r["path"]), []).append(
            r["cold_us"] if r["verdict"] == "none" and r["cold_us"] else float("nan"))
    full = []
    for a, b in pairs:
        ta, tb = times[(a["matrix"], a["kernel"], "sequential")], times[(b["matrix"], b["kernel"], "batched")]
        if a["verdict"] == b["verdict"] == "none" and all(t == t for t in ta + tb):
            full.append((a, b, statistics.fmean(ta), statistics.fmean(tb)))
    ratios = [tb / ta for _, _, ta, tb in full]
    speedups = [(b["cusparse_us"] / tb) / (a["cusparse_us"] / ta) for a, b, ta, tb in full
                if a["cusparse_us"] and b["cusparse_us"]]
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
        "speedup_ratio_median": statistics.median(speedups) if speedups else None, "speedup_spread": _spread(speedups),
        "per_kernel": [{"matrix": a["matrix"], "kernel": a["kernel"], "sequential_us": ta, "batched_us": tb,
                        "ratio": tb / ta, "batched_trials": b["trials"],
                        "passes": len(times[(a["matrix"], a["kernel"], "sequential")])} for a, b, ta, tb in full],
        "slow_ratio_median": statistics.median(slow) if slow else None, "slow_count": len(slow),
        "cusparse_ratio": base, "repeat_spread": repeat_spread(rows),
    }


def timing_modes(A, name: str, kernel_text: str, trials: int = 41, repeats: int = 3) -> dict:
    """cuSPARSE (its default algorithm) and one library kernel on ``A``'s fresh-valued twin, timed cold
    in this process by the sequential loop (``timing.time_run``) and by the batched one
    (``batched.time_cold``) with 1 run and with every run enqueued ahead, ``repeats`` times each in a
    rotating order. Every run is prepared (and the kernel's checked) as in the harness. A difference
    between loops well above each loop's own repeat spread is systematic."""
    import cupy as cp

    from sparserl.harness.baseline import CusparseOp
    from sparserl.harness.batched import BoardIO, time_cold
    from sparserl.harness.buffers import CheckedIO, IOBuffers
    from sparserl.harness.device import num_sms
    from sparserl.harness.launcher import BoundKernel
    from sparserl.harness.resident import ResidentMatrix
    from sparserl.harness.timing import FlushBuffer, TimingConfig, time_run

    sms = num_sms()
    st = ResidentMatrix(A, batched=True, sms=sms)
    header, code = split_completion(kernel_text, Op.SPMV)
    built = compile_source(code)
    bound = BoundKernel.bind(header, Op.SPMV, built.cubin_path, st.on_device["A_alt"], None, sms)
    flush = FlushBuffer()
    cfg = TimingConfig(regime="cold", trials=trials, warmup=2)
    cus = CusparseOp(st.A_alt, Op.SPMV, None, "CUSPARSE_SPMV_ALG_DEFAULT")
    seq_io, bat_io = IOBuffers(*A.shape), BoardIO(IOBuffers(*A.shape), st.checks["A_alt"])
    checked = CheckedIO(seq_io, st.references["A_alt"])
    kernel_seq, kernel_bat = bound.runner(seq_io.x, seq_io.y), bound.runner(bat_io.io.x, bat_io.io.y)
    cus_bat = BoardIO(cus.io, None)

    def batched(run, io, ahead: int) -> float:
        r = time_cold(run, cfg, flush, io, floor=trials, ci=0.0, batch=trials, ahead=ahead)
        if r.failure is not None:
            raise RuntimeError(r.failure)
        return r.timing.median_us

    ways = {
        "cuSPARSE": {"sequential": lambda: time_run(cus.run, cfg, flush=flush, io=CheckedIO(cus.io)).median_us,
                     "batched, 1 ahead": lambda: batched(cus.run, cus_bat, 1),
                     f"batched, {trials} ahead": lambda: batched(cus.run, cus_bat, trials)},
        MODES_KERNEL: {"sequential": lambda: time_run(kernel_seq, cfg, flush=flush, io=checked).median_us,
                       "batched, 1 ahead": lambda: batched(kernel_bat, bat_io, 1),
                       f"batched, {trials} ahead": lambda: batched(kernel_bat, bat_io, trials)},
    }
    out: dict = {"matrix": name, "trials": trials, "repeats": repeats, "subjects": {}}
    try:
        for subject, modes in ways.items():
            names = list(modes)
            got: dict[str, list[float]] = {m: [] for m in names}
            for rep in range(repeats):
                for m in names[rep % len(names):] + names[:rep % len(names)]:
                    got[m].append(modes[m]())
            seq = statistics.fmean(got["sequential"])
            out["subjects"][subject] = {m: {"median_us": v, "mean_us": statistics.fmean(v),
                                            "ratio_to_sequential": statistics.fmean(v) / seq,
                                            "repeat_spread": max(v) / min(v) - 1} for m, v in got.items()}
    finally:
        cus.close()
        cp.cuda.runtime.deviceSynchronize()
    return out


def print_report(summary: dict, agree: dict, modes: list[dict] | None = None) -> None:
    print("\nevaluations per second, first pass (1 / median worker time per candidate; candidates / wall)")
    print(f"{'path/set':26} {'cands':>5} {'median s':>9} {'evals/s':>8} {'wall/s':>7} {'>3 s':>4} "
          f"{'new conv':>13} {'reused':>13} {'cold runs':>9}  slowest")
    for key, s in summary.items():
        sl = s["slowest"]
        slow_txt = (f"{sl['own_s']:.2f} s {sl['matrix']} {sl['kernel']} ({sl['verdict']}; "
                    + ", ".join(f"{k} {v:.2f}" for k, v in sl["top_steps"]) + ")") if sl else "-"
        eps = s["evals_per_s_median"]
        conv = [f"{c['candidates']}x {c['median_worker_s'] or 0:.3f}" for c in (s["new_conversion"], s["reused_conversion"])]
        print(f"{key:26} {s['candidates']:>5} {s['median_worker_s'] or 0:>9.3f} {eps or 0:>8.1f} "
              f"{s['evals_per_s_wall'] or 0:>7.1f} {s['over_limit']:>4} {conv[0]:>13} {conv[1]:>13} "
              f"{s['cold_runs_mean']:>9.1f}  {slow_txt}")
    print("\nmean seconds per step (per candidate, first pass)")
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
        print(f"cold median batched / sequential over {a['timed_both']} kernels timed in full by both (mean over "
              f"the passes): median {a['ratio_median']:.4f}, range {a['ratio_min']:.4f}-{a['ratio_max']:.4f}, "
              f"within 2%: {a['within_2pct']}/{a['timed_both']}, within 5%: {a['within_5pct']}/{a['timed_both']}")
        sp = a["speedup_spread"]
        if sp["n"]:
            print(f"speedup over cuSPARSE, batched / sequential: median {a['speedup_ratio_median']:.4f}, "
                  f"within 2%: {sp['within_2pct']}/{sp['n']}, within 5%: {sp['within_5pct']}/{sp['n']}")
        for path, r in a["repeat_spread"].items():
            if r["n"]:
                print(f"repeat spread, {path}: a later pass / the first, {r['n']} kernels: median |r - 1| "
                      f"{r['median_dev']:.4f}, largest {r['max_dev']:.4f}, within 2%: {r['within_2pct']}/{r['n']}, "
                      f"within 5%: {r['within_5pct']}/{r['n']}")
        print(f"{'matrix':28} {'kernel':58} {'seq us':>9} {'batch us':>9} {'ratio':>7} {'runs':>5}")
        for p in a["per_kernel"]:
            print(f"{p['matrix']:28} {p['kernel']:58} {p['sequential_us']:>9.2f} {p['batched_us']:>9.2f} "
                  f"{p['ratio']:>7.4f} {p['batched_trials']:>5}")
    if a["slow_count"]:
        print(f"stopped early (slow) by the batched path: {a['slow_count']}, their 5-run median / the sequential "
              f"41-run median: median {a['slow_ratio_median']:.4f}")
    if a["cusparse_ratio"]:
        print("cuSPARSE batched / sequential: " + ", ".join(f"{m} {v:.4f}" for m, v in a["cusparse_ratio"].items()))
    for m in modes or []:
        print(f"\ntiming loops on {m['matrix']} ({m['trials']} cold runs, {m['repeats']} times each, in this process): "
              "mean median us, / sequential, repeat spread (largest / smallest - 1)")
        for subject, ways in m["subjects"].items():
            print(f"  {subject:50} " + "; ".join(f"{w} {v['mean_us']:.2f} ({v['ratio_to_sequential']:.4f}, "
                                                   f"{v['repeat_spread']:.4f})" for w, v in ways.items()))


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
    ap.add_argument("--repeats", type=int, default=2, help="passes over the kernels per path and matrix (the "
                                                          "later ones measure each path's repeat spread)")
    ap.add_argument("--paths", default="sequential,batched",
                    help=f"comma-separated evaluation paths, batched among them (of {', '.join(PATHS)}); the "
                         "agreement tables need sequential and batched")
    ap.add_argument("--modes", type=int, default=2, help="matrices (the first family, the first SuiteSparse file) "
                                                        "on which the timing loops are compared in this process; "
                                                        "0: none")
    args = ap.parse_args()
    if args.repeats < 1 or args.modes < 0:
        raise SystemExit("error: --repeats must be at least 1 and --modes at least 0")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if "batched" not in paths or any(p not in PATHS for p in paths) or len(set(paths)) != len(paths):
        raise SystemExit(f"error: --paths must name batched and others of {', '.join(PATHS)}, each once; "
                         f"got {args.paths!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    kernels = kernel_set(args)
    tmp = tempfile.TemporaryDirectory(prefix="harness_speed_")
    cache = args.cache or tmp.name
    regimes = ("cold", "warm") if args.warm else ("cold",)
    t0 = time.perf_counter()
    evs = {p: Evaluator(HarnessConfig(memo=0, regimes=regimes, cache_dir=cache, speed=PATHS[p])) for p in paths}
    compiled = compile_many([split_completion(t, Op.SPMV)[1] for _, t in kernels], evs["batched"].config.compile,
                            cache_dir=evs["batched"].config.root / "cubin")  # both paths then find them cached
    log.info("compiled %d kernels (%d ok) in %.1f s", len(kernels), sum(c.ok for c in compiled),
             time.perf_counter() - t0)
    rows: list[dict] = []
    walls: dict = {}
    kept: dict = {}  # the first matrix of each set, for --modes
    gpu = None
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for path, ev in evs.items():  # start each path's worker now: start-up is not a candidate's time
            t1 = time.perf_counter()
            log.info("%s worker on %s, started in %.1f s", path, ev.pool.gpu, time.perf_counter() - t1)
        for i, (set_, name, build) in enumerate(matrices(args)):
            A = build()
            log.info("%s: %d x %d, %d nonzeros", name, A.shape[0], A.shape[1], A.nnz)
            if set_ not in kept:
                kept[set_] = (name, A)
            order = paths[i % len(paths):] + paths[:i % len(paths)]  # no path always goes first
            for rep in range(args.repeats):
                for path in order if rep % 2 == 0 else list(reversed(order)):
                    ev = evs[path]
                    ref = ev.register(A, name)
                    res, wall = run_set(ev, ref, kernels, args.parallel)
                    if rep == 0:
                        walls[(path, set_, name)] = wall
                    rows += [row_of(path, set_, name, kid, r, rep) for (kid, _), r in zip(kernels, res)]
                    ws = [w for w in (worker_seconds(r) for r in res) if w is not None]
                    log.info("  %-10s pass %d: %d candidates in %.1f s (median %.3f s each)", path, rep + 1, len(res),
                             wall, statistics.median(ws) if ws else float("nan"))
            summary, agree = summarise(rows, walls), agreement(rows)
            gpu = evs["batched"].pool.gpu
            (args.out / "harness_speed.json").write_text(json.dumps(
                {"gpu": gpu, "args": {k: str(v) for k, v in vars(args).items()},
                 "kernels": [k for k, _ in kernels], "summary": summary, "agreement": agree, "rows": rows},
                indent=1))
    finally:
        for ev in evs.values():
            ev.close()
        tmp.cleanup()
    modes = []
    for name, A in list(kept.values())[:args.modes]:  # the workers are gone: this process has the GPU alone
        log.info("timing loops compared on %s", name)
        modes.append(timing_modes(A, name, get_variant(MODES_KERNEL).render()))
    summary, agree = summarise(rows, walls), agreement(rows)
    (args.out / "harness_speed.json").write_text(json.dumps(
        {"gpu": gpu, "args": {k: str(v) for k, v in vars(args).items()}, "kernels": [k for k, _ in kernels],
         "summary": summary, "agreement": agree, "timing_modes": modes, "rows": rows}, indent=1))
    print_report(summary, agree, modes)
    print(f"\nwrote {args.out / 'harness_speed.json'} ({time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
