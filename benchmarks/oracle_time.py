"""The library oracle's wall time per matrix (``evaluate --baselines oracle``), two harness settings side by side.

For each generated matrix (``--rows`` rows, one per family), every library variant of the op is
evaluated as ``sparserl evaluate``'s oracle does (``Evaluator.evaluate_many``: compiles in
parallel, the GPU worker takes them in turn), once per setting of ``limit_floor_granted_s`` (the
lowest time limit of a candidate's verification when the job has the GPU whole), with a separate
evaluator each, one after the other and alternating which goes first per matrix. Compiles are
made once ahead of both (a shared compile cache), so the wall time is the GPU worker's.

Printed per matrix and setting: the oracle's wall seconds, the verdicts (and seconds spent in each
kind), the kernels' seconds by profile step (the five largest; every step per kernel in the JSON),
the worker restarts (a kill for a verification over its limit costs one), the oracle's best
speedup over cuSPARSE; then every kernel whose verdict differs between the settings. A correct,
fully timed kernel that a lower floor times out is a false time-out (the exit status is 1 then); a
``slow`` one that becomes ``timeout`` ran longer than ``limit_scale`` x cuSPARSE per launch, which
only the higher floor let it do.

``--contenders`` compares instead ordinary jobs with contender jobs (``Evaluator.evaluate_many(...,
contenders=True)``, what the oracle asks now: verification stops after a first launch that predicts
more than ``SpeedConfig.contender_scale`` x the best known time a launch), both at the last floor.
The exit status is 1 too when a matrix's oracle pick in ordinary jobs was stopped as a contender.
``--contender-min S1,S2,...`` adds a contender setting per value of ``SpeedConfig.contender_min_s``
(the shortest first launch that may stop a contender job; 0.05 s by default), side by side.

    python benchmarks/oracle_time.py --families lp,arrow --out results/oracle_time.json       # ~2 min, one H200
    python benchmarks/oracle_time.py --out results/oracle_time.json                           # 13 + 8 families
    python benchmarks/oracle_time.py --families arrow,lp,circuit --floors 0.5 --contenders --out results/contenders.json
    python benchmarks/oracle_time.py --families arrow,circuit --floors 0.5 --contenders --contender-min 0.01,0.005 \
        --out results/contender_min.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from sparserl.errors import SparseRLError

log = logging.getLogger("oracle_time")


def families(arg: str | None) -> list[str]:
    from sparserl.matrices.generators import APPLICATION_FAMILIES, CLASSIC_FAMILIES

    if arg:
        return [f for f in arg.split(",") if f]
    return list(CLASSIC_FAMILIES) + list(APPLICATION_FAMILIES)


def run_oracle(ev, ref, op, k, texts: list[tuple[str, str]], contenders: bool = False) -> dict:
    """Every text on one matrix through ``evaluate_many`` (as contender jobs with ``contenders``, as
    ``sparserl evaluate``'s oracle asks); the wall seconds, each verdict and the oracle's pick."""
    pool = ev.pool
    restarts0 = sum(max(w.restarts, 0) for w in pool.workers)
    t = time.perf_counter()
    results = ev.evaluate_many([(text, ref, op, k) for _, text in texts], contenders=contenders)
    wall = time.perf_counter() - t
    restarts = sum(max(w.restarts, 0) for w in pool.workers) - restarts0
    per = {}
    seconds = defaultdict(float)
    for (vid, _), r in zip(texts, results):
        own = sum((r.profile.seconds or {}).values()) if r.profile else 0.0
        seconds[r.error_kind.value] += own
        steps, counts = (r.profile.seconds or {}, r.profile.counts or {}) if r.profile else ({}, {})
        per[vid] = {"kind": r.error_kind.value, "speedup": r.speedup, "seconds": own,
                    "message": (r.message or "")[:200], "first_launch_s": steps.get("verify_first"),
                    "later_launches_s": steps.get("verify_batch"), "verify_launches": counts.get("verify_launches"),
                    "steps": {name: round(v, 5) for name, v in steps.items()}}
    best = max(((r.speedup, vid) for (vid, _), r in zip(texts, results) if r.correct and r.speedup), default=None)
    return {"wall_s": wall, "restarts": restarts, "kinds": dict(Counter(v["kind"] for v in per.values())),
            "seconds_by_kind": dict(seconds), "seconds_by_step": seconds_by_step(per), "best_speedup": best[0] if best else None,
            "best_id": best[1] if best else None, "first_launch_excess_s": first_launch_excess(per), "kernels": per}


def seconds_by_step(per: dict[str, dict]) -> dict[str, float]:
    """The kernels' profile steps summed over every kernel, largest first (where a setting's seconds
    go: conversions, verification launches, timed runs; pure)."""
    total: dict[str, float] = defaultdict(float)
    for k in per.values():
        for name, v in (k.get("steps") or {}).items():
            total[name] += v
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def first_launch_excess(per: dict[str, dict]) -> dict | None:
    """How much longer a kernel's first verification launch (its checks and wait included) took than
    each of its later ones, over the kernels verified in full (``none``, ``slow``): the largest, the
    median, and the kernel of the largest; and the longest first launch of a kernel timed in full
    (``none``: within the early-stop factor of the best, a contender by any measure). None when no
    kernel has both. A contender job's floor on the first launch (``speed.PREDICT_MIN_S``) must stay
    above that longest first launch, one-time costs included."""
    rows = []
    for vid, k in per.items():
        first, later, n = k.get("first_launch_s"), k.get("later_launches_s"), k.get("verify_launches") or 0
        if k["kind"] in ("none", "slow") and first is not None and later is not None and n > 1:
            rows.append((first - later / (n - 1), vid))
    if not rows:
        return None
    rows.sort()
    timed = [k["first_launch_s"] for k in per.values() if k["kind"] == "none" and k.get("first_launch_s") is not None]
    return {"kernels": len(rows), "median_s": rows[len(rows) // 2][0], "max_s": rows[-1][0], "max_kernel": rows[-1][1],
            "longest_first_of_timed_s": max(timed, default=None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="JSON file to write (after every matrix)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of each generated matrix")
    ap.add_argument("--families", help="comma-separated families (default: the 13 classic and 8 application ones)")
    ap.add_argument("--floors", default="2.0,0.5",
                    help="comma-separated limit_floor_granted_s settings, side by side (the first is 'before')")
    ap.add_argument("--contenders", action="store_true",
                    help="instead: the last floor with ordinary jobs ('before') against contender jobs, side by side")
    ap.add_argument("--contender-min", default="",
                    help="with --contenders: comma-separated contender_min_s values, one more contender setting each")
    ap.add_argument("--op", default="spmv", choices=("spmv", "spmm"))
    ap.add_argument("--k", type=int, help="SpMM columns")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.harness.speed import PREDICT_MIN_S, SpeedConfig
    from sparserl.kernels.contract import Op
    from sparserl.kernels.library import variants
    from sparserl.matrices import generate

    try:
        floors = [float(f) for f in args.floors.split(",")]
        mins = list(dict.fromkeys(float(m) for m in args.contender_min.split(",") if m))  # each once
        if mins and not args.contenders:
            raise SparseRLError("--contender-min needs --contenders")
        # each setting: (label, floor, contender jobs, the contender jobs' first-launch floor); the first is 'before'
        settings = ([(f"floor {floors[-1]:g}", floors[-1], False, PREDICT_MIN_S),
                     ("contenders", floors[-1], True, PREDICT_MIN_S)]
                    + [(f"contenders, first launch {1e3 * m:g} ms", floors[-1], True, m) for m in mins]
                    if args.contenders else [(str(f), f, False, PREDICT_MIN_S) for f in floors])
        for *_, m in settings:
            SpeedConfig(contender_min_s=m)  # a value out of range is refused here, before any work
        names = families(args.families)
        op = Op(args.op)
        if op is Op.SPMM and not args.k:
            raise SparseRLError("--op spmm needs --k")
    except (ValueError, SparseRLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    k = args.k if op is Op.SPMM else None
    texts = [(v.id, v.render()) for v in variants(op, None, k)]
    tmp = tempfile.TemporaryDirectory(prefix="oracle_time_")
    cache = str(Path(tmp.name) / "cache")
    evs = {label: Evaluator(HarnessConfig(regimes=("cold",), memo=0, cache_dir=cache,
                                          speed=SpeedConfig(limit_floor_granted_s=f, contender_min_s=m)))
           for label, f, _, m in settings}
    contender = {label: c for label, _, c, _ in settings}
    labels = [label for label, *_ in settings]
    result = {"config": {**vars(args), "out": str(args.out)}, "kernels": len(texts), "matrices": []}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))

    if not next(iter(evs.values())).has_gpu:
        for ev in evs.values():
            ev.close()
        print("error: no NVIDIA GPU here: the oracle's time needs one", file=sys.stderr)
        return 2
    try:
        warm = generate("random", 2000, seed=0)  # compiles every kernel once, starts every worker
        for ev in evs.values():
            ev.evaluate_many([(text, ev.register(warm, "warm"), op, k) for _, text in texts])
        for i, fam in enumerate(names):
            t = time.perf_counter()
            A = generate(fam, args.rows, seed=args.seed)
            gen_s = time.perf_counter() - t
            row = {"matrix": f"{fam}_{args.rows}", "rows": A.shape[0], "nnz": int(A.nnz), "generate_s": gen_s,
                   "by_floor": {}}
            order = labels if i % 2 == 0 else labels[::-1]
            for label in order:
                ev = evs[label]
                ref = ev.register(A, row["matrix"])
                row["by_floor"][label] = run_oracle(ev, ref, op, k, texts, contender[label])
            base = row["by_floor"][labels[0]]["kernels"]
            row["differ"] = {f"{labels[0]} vs {label}": {vid: [base[vid]["kind"], row["by_floor"][label]["kernels"][vid]["kind"]]
                                                        for vid in base
                                                        if base[vid]["kind"] != row["by_floor"][label]["kernels"][vid]["kind"]}
                             for label in labels[1:]}
            # the oracle's pick before, stopped in another setting: the oracle lost its fastest kernel
            pick = row["by_floor"][labels[0]]["best_id"]
            row["pick_lost"] = [label for label in labels[1:]
                                if pick and row["by_floor"][label]["kernels"][pick]["kind"] not in ("none", "slow")]
            result["matrices"].append(row)
            save()
            walls = "  ".join(f"{label}: {row['by_floor'][label]['wall_s']:6.1f} s "
                              f"({row['by_floor'][label]['restarts']} restarts)" for label in labels)
            excess = row["by_floor"][labels[0]]["first_launch_excess_s"]
            if excess:
                longest = excess["longest_first_of_timed_s"]
                walls += (f"  first launch over a later one: median {1e3 * excess['median_s']:.2f} ms, "
                          f"largest {1e3 * excess['max_s']:.2f} ms ({excess['max_kernel']}); longest first launch "
                          f"of a kernel timed in full: {'-' if longest is None else f'{1e3 * longest:.1f} ms'}")
            print(f"{row['matrix']:>24}  {walls}", flush=True)
            for label in labels:
                top = list(row["by_floor"][label]["seconds_by_step"].items())[:5]
                print(f"{'':>24}  {label}, kernels' seconds by step: "
                      + ", ".join(f"{name} {v:.1f}" for name, v in top), flush=True)
    finally:
        for ev in evs.values():
            ev.close()
        save()
    print()
    print(table(result, labels))
    print(f"\nJSON in {args.out}")
    changes = verdict_changes(result)
    result["verdict_changes"] = dict(changes)
    lost = [r["matrix"] for r in result["matrices"] if r.get("pick_lost")]
    result["oracle_pick_lost"] = lost
    save()
    print(f"verdicts that differ from {labels[0]}'s: {dict(changes) or 'none'}")
    print("  'none -> timeout' would be a correct, fully timed kernel lost to the other setting (a false time-out);\n"
          "  'slow -> timeout' is a kernel stopped after its first launch that the first setting let run")
    print(f"matrices whose oracle pick the other setting stopped: {', '.join(lost) or 'none'}")
    return 1 if changes.get("none -> timeout") or lost else 0


def verdict_changes(result: dict) -> Counter:
    """How many kernels changed verdict between the first setting and each other one, by change
    ('slow -> timeout': 3); a correct kernel timed in full that becomes a time-out is 'none -> timeout'."""
    return Counter(f"{a} -> {b}" for r in result["matrices"] for d in r["differ"].values() for a, b in d.values())


def table(result: dict, labels: list[str]) -> str:
    head = "| matrix | nnz | " + " | ".join(f"oracle wall, {f} | verdicts | restarts" for f in labels) + \
        " | best speedup | verdicts that differ |"
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in result["matrices"]:
        cells = []
        for f in labels:
            b = r["by_floor"][f]
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(b["kinds"].items()))
            cells.append(f"{b['wall_s']:.1f} | {kinds} | {b['restarts']}")
        best = r["by_floor"][labels[-1]]["best_speedup"]
        differ = "; ".join(f"{vid}: {a} -> {b}" + (f" ({pair.split(' vs ')[1]})" if len(labels) > 2 else "")
                           for pair, d in r["differ"].items() for vid, (a, b) in d.items()) or "-"
        out.append(f"| {r['matrix']} | {r['nnz']} | " + " | ".join(cells) +
                   f" | {'-' if best is None else f'{best:.2f}x'} | {differ} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
