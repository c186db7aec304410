"""``sparserl search`` against the library oracle and cuSPARSE, matrix by matrix, in one run.

For each matrix, in one harness (one worker per GPU, the same timing for every kernel and for
cuSPARSE):

1. the search: ``--budget`` candidates (seeds, mutations, switches, random points; no policy),
   from a best-known store that does not know the matrix (a fresh one unless ``--store``), timed
   as wall seconds (the matrix card and the selector's features included);
2. the library oracle: every template's seeds and every library variant that applies, all
   through the harness (what the search already evaluated is answered from the harness's memo:
   the same text gets the same measurement); the oracle is the fastest verified one.

3. the two picks timed again side by side (``--retime N``, default 3): where the search's best is
   not the oracle's kernel, each is evaluated N more times, fresh (not from the memo), one at a
   time, every other pass in the reverse order. A best of 64 or 83 timings is the luckiest of
   them; the median of fresh passes is not, so ``ratio_retimed`` says whether the search's lead
   survives a second look.

4. with ``--headroom-budget N``, a second search of N candidates (N above ``--budget``) in a fresh store of its own,
   its pick retimed beside the two others: ``headroom`` is the search's time over the longer search's (first
   timing, and ``headroom_retimed`` from the fresh passes' medians), what more candidates find past the budget:
   the room a guide of the search (a model proposing, a better candidate order) has at that budget.

Recorded per matrix: cuSPARSE's time, the oracle (and the oracle over library variants alone),
the search's best with its provenance, the ratio search/oracle (t_oracle / t_search: above 1 the
search found a kernel faster than every enumerated one) and the same ratio from the fresh passes'
medians, the candidates evaluated and the wall time. Printed: a table and, per set, geometric means
and the number of matrices where the search beats the oracle (at all, and by 2% or more), from the
search's own timings and from the fresh passes. Written: JSON, after every matrix, so an
interrupted run keeps what it measured and ``--resume`` continues it. A matrix that cannot run (larger
than the GPU) is skipped with its reason (``skipped`` in the JSON) and the others go on.

    python benchmarks/search_bench.py --rows 200000 --families powerlaw,skewed --budget 16   # quick
    python benchmarks/search_bench.py --out search_bench.json                                # 11 families, 1M rows
    python benchmarks/search_bench.py --no-families --suitesparse DIR --out search_ss.json    # SuiteSparse

Matrices whose structure a search has already seen in ``--store`` start from the stored best;
keep the default (a fresh store per run) to measure the search itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.eval.retime import median_us, retime
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.improve.table import geomean_of
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.kernels.templates import templates
from sparserl.matrices import family_names, generate, load_matrix
from sparserl.request.context import MatrixContext
from sparserl.search.footprint import check_fits
from sparserl.search.loop import SearchConfig
from sparserl.search.run import search_array
from sparserl.search.store import open_store

log = logging.getLogger("search_bench")

LARGE_FAMILIES = ("diagonal", "banded", "stencil2d", "stencil3d_7", "stencil3d_27", "block", "random", "powerlaw",
                  "skewed", "empty_rows", "rectangular")
"""The 11 generated families of the search targets (generator defaults, seed ``--family-seed``)."""


def matrices(args):
    """(set, name, family, matrix) in order; generated ones are made only when reached."""
    fams = [] if args.no_families else (args.families.split(",") if args.families else list(LARGE_FAMILIES))
    unknown = set(fams) - set(family_names(include_application=True))
    if unknown:
        raise SystemExit(f"unknown families {sorted(unknown)}; families are "
                         f"{family_names(include_application=True)}")
    for fam in fams:
        yield "families", f"{fam}_{args.rows}", fam, lambda fam=fam: generate(fam, args.rows, seed=args.family_seed)
    if args.suitesparse:
        files = sorted(p for p in Path(args.suitesparse).iterdir() if p.name.endswith((".mtx", ".mtx.gz", ".npz")))
        if not files:
            raise SystemExit(f"no .mtx/.mtx.gz/.npz files in {args.suitesparse}")
        for f in files[:args.limit or None]:
            yield "suitesparse", f.name.split(".")[0], "suitesparse", lambda f=f: load_matrix(f)


def oracle_texts(op: Op, k: int | None, card) -> list[tuple[str, str, bool]]:
    """(id, text, is_library_variant) of every template seed and every library variant that
    applies, distinct texts (formats the matrix refuses come back ``format_refused``)."""
    lib = {" ".join(v.render().split()): (v.id, v.render()) for v in variants(op, None, k)}
    out, seen = [], set()

    def add(cid: str, text: str) -> None:
        key = " ".join(text.split())
        if key not in seen:
            seen.add(key)
            out.append((cid, text, key in lib))

    for t in templates(op):
        for p in t.seeds(card, k):
            try:
                text = t.render(p, card)
            except Exception as exc:  # a template bug: the search skips such points too
                log.warning("%s: seed %s does not render: %s", t.name, p, exc)
                continue
            add(t.candidate(p).id, text)
    for cid, text in lib.values():
        add(cid, text)
    return out


def load_by_matrix(path: Path) -> dict[str, str]:
    """``--cost-model-by-matrix``: matrix name -> model path (resolved against the JSON's folder); a
    missing or malformed file, or a model file that is not there, stops the run before any search."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: --cost-model-by-matrix {path}: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise SystemExit(f"error: --cost-model-by-matrix {path}: not a JSON object of matrix name -> model file")
    out = {name: str((path.parent / f).resolve()) for name, f in raw.items()}
    if missing := sorted({f for f in out.values() if not Path(f).is_file()}):
        raise SystemExit(f"error: --cost-model-by-matrix {path}: no model file at {', '.join(missing)}")
    return out


def second_look(oracle: str | None, search: str | None, long: str | None) -> tuple[dict[str, str], dict[str, float]]:
    """The picks to time again side by side (``oracle`` and ``long`` only where they are not the search's own kernel,
    up to white space: one kernel is never timed against itself) and the retimed ratios that are 1.0 for that reason
    (``ratio_retimed``: the oracle's kernel is the search's; ``headroom_retimed``: the longer search's is). None: no
    such pick (no verified oracle, no longer search)."""
    if search is None:
        return {}, {}
    picks, same = {}, {}
    for name, text, key in (("oracle", oracle, "ratio_retimed"), ("search", search, None),
                            ("long", long, "headroom_retimed")):
        if text is None:
            continue
        if key is not None and text.split() == search.split():
            same[key] = 1.0
        else:
            picks[name] = text  # the oracle first, as the passes have always run
    return (picks if len(picks) > 1 else {}), same


def retimed_ratio(times: dict[str, list[float | None]], slow: str = "oracle", fast: str = "search") -> float | None:
    """t_slow / t_fast (default t_oracle / t_search) from the medians of :func:`retime`'s passes; None if a pass of
    either failed."""
    t_slow, t_fast = median_us(times[slow]), median_us(times[fast])
    return t_slow / t_fast if t_slow is not None and t_fast is not None else None


def bench_one(ev, store, A, name: str, op: Op, k: int | None, args) -> dict:
    regime = args.regime
    t0 = time.perf_counter()
    if ev.has_gpu:
        check_fits(name, int(A.shape[0]), int(A.shape[1]), int(A.nnz), k)
    cfg = SearchConfig(budget=args.budget, seconds=args.seconds, regime=regime, seed=args.seed,
                       cost_model=args.by_matrix.get(name, args.cost_model), seed_share=args.seed_share,
                       beam=args.beam)
    t_search = time.perf_counter()
    ctx = MatrixContext(A, name, op, k)
    card = ctx.card
    res = search_array(ctx, cfg, ev, store, run_config={"benchmark": "search_bench", "budget": args.budget},
                       trace=args.trace_dir / f"{name}.trace.jsonl" if args.trace_dir else None)
    search_wall = time.perf_counter() - t_search
    t_oracle = time.perf_counter()
    texts = oracle_texts(op, k, card)
    ref = ev.register(A, name)
    results = ev.evaluate_many([(t, ref, op, k) for _, t, _ in texts], contenders=True)  # as evaluate's oracle
    oracle_wall = time.perf_counter() - t_oracle

    def fastest(pairs):
        ok = [(i, r) for i, r in pairs if r.ok and regime in r.timings]
        return min(ok, key=lambda x: x[1].timings[regime].median_us) if ok else None

    orc = fastest([(i, r) for (i, _, _), r in zip(texts, results)])
    orc_lib = fastest([(i, r) for (i, _, is_lib), r in zip(texts, results) if is_lib])
    b = res.best
    base = None
    for r in [*(e.result for e in res.entries), *results]:
        if r.ok and regime in r.baseline:
            base = r.baseline[regime].median_us
            break
    row = {
        "matrix": name, "rows": int(A.shape[0]), "cols": int(A.shape[1]), "nnz": int(A.nnz),
        "cusparse_us": base, "timed": res.timed,
        "oracle_id": orc[0] if orc else None, "oracle_us": orc[1].timings[regime].median_us if orc else None,
        "oracle_speedup": orc[1].speedup if orc else None,
        "oracle_library_id": orc_lib[0] if orc_lib else None,
        "oracle_library_us": orc_lib[1].timings[regime].median_us if orc_lib else None,
        "oracle_candidates": len(texts), "oracle_correct": sum(r.ok for r in results),
        "search_id": b.proposal.id if b else None, "search_provenance": b.proposal.provenance.value if b else None,
        "search_us": b.time_us(regime) if b else None, "search_speedup": b.result.speedup if b else None,
        "search_evaluated": res.evaluated, "search_correct": sum(e.result.ok for e in res.entries),
        "search_stopped": res.stopped, "search_seconds": res.seconds, "search_wall_seconds": search_wall,
        "oracle_wall_seconds": oracle_wall,
        "by_provenance": res.by_provenance(), "refused_formats": res.refused, "render_errors": res.render_errors,
        "gpu": next((r.gpu for r in results if r.gpu), None), "arch": next((r.arch for r in results if r.arch), None),
    }
    row["ratio"] = (row["oracle_us"] / row["search_us"]) if row["oracle_us"] and row["search_us"] else None
    long = None
    if args.headroom_budget:  # the longer search: a fresh store, the same harness (its memo answers repeats)
        t_long = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="search_bench_long_") as d:
            with open_store(Path(d) / "store.sqlite") as long_store:
                long = search_array(ctx, dataclasses.replace(cfg, budget=args.headroom_budget,
                                                             seconds=cfg.seconds and cfg.seconds * args.headroom_budget
                                                             / args.budget),
                                    ev, long_store, run_config={"benchmark": "search_bench",
                                                                "budget": args.headroom_budget}).best
        row |= {"long_budget": args.headroom_budget, "long_us": long.time_us(regime) if long else None,
                "long_provenance": long.proposal.provenance.value if long else None,
                "long_wall_seconds": time.perf_counter() - t_long}
        row["headroom"] = row["search_us"] / row["long_us"] if row["search_us"] and row["long_us"] else None
        row["headroom_retimed"] = None
    row["ratio_retimed"], row["retimed_us"] = None, None
    t_retime = time.perf_counter()
    if args.retime:
        oracle_text = next(t for i, t, _ in texts if i == orc[0]) if row["ratio"] is not None else None
        long_text = long.proposal.text if long is not None and row.get("headroom") is not None else None
        picks, same = second_look(oracle_text, b.proposal.text if b else None, long_text)
        row |= same
        if len(picks) > 1:
            row["retimed_us"] = retime(ev, ref, op, k, picks, args.retime, regime)
            if "oracle" in picks:
                row["ratio_retimed"] = retimed_ratio(row["retimed_us"])
            if "long" in picks:
                row["headroom_retimed"] = retimed_ratio(row["retimed_us"], "search", "long")
    row["retime_seconds"] = time.perf_counter() - t_retime
    row["total_seconds"] = time.perf_counter() - t0  # search, oracle and the second look
    return row


def summarise(rows: list[dict]) -> dict:
    out = {}
    for s in sorted({r["set"] for r in rows}):
        rs = [r for r in rows if r["set"] == s and r["ratio"] is not None]
        again = [r for r in rs if r.get("ratio_retimed") is not None]  # rows of runs before --retime have none
        out[s] = {
            "matrices": len([r for r in rows if r["set"] == s]), "compared": len(rs),
            "geomean_oracle_speedup": geomean_of([r["oracle_speedup"] for r in rs]),
            "geomean_search_speedup": geomean_of([r["search_speedup"] for r in rs]),
            "geomean_search_over_oracle": geomean_of([r["ratio"] for r in rs]),
            "search_wins": sum(r["ratio"] > 1.0 for r in rs), "search_wins_by_2pct": sum(r["ratio"] >= 1.02 for r in rs),
            "retimed": len(again), "geomean_search_over_oracle_retimed": geomean_of([r["ratio_retimed"] for r in again]),
            "search_wins_retimed": sum(r["ratio_retimed"] > 1.0 for r in again),
            "search_wins_by_2pct_retimed": sum(r["ratio_retimed"] >= 1.02 for r in again),
            "max_search_wall_seconds": max((r["search_wall_seconds"] for r in rs), default=None),
        }
        room = [r for r in rows if r["set"] == s and r.get("headroom") is not None]  # with or without an oracle
        if room:  # --headroom-budget: what the longer search found past the budget
            room_again = [r["headroom_retimed"] for r in room if r.get("headroom_retimed") is not None]
            out[s] |= {"headroom_compared": len(room), "geomean_headroom": geomean_of([r["headroom"] for r in room]),
                       "headroom_compared_retimed": len(room_again), "geomean_headroom_retimed": geomean_of(room_again),
                       "max_headroom_retimed": max(room_again, default=None),
                       "headroom_by_2pct_retimed": sum(h >= 1.02 for h in room_again)}
    return out


def fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def print_table(rows: list[dict], summary: dict) -> None:
    head = (f"{'matrix':28} {'nnz':>10} {'cuSPARSE us':>11} {'oracle us':>10} {'oracle x':>8} {'search us':>10} "
            f"{'search x':>8} {'s/oracle':>8} {'retimed':>8} {'found by':>14} {'wall s':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['matrix'][:28]:28} {r['nnz']:>10} {fmt(r['cusparse_us']):>11} {fmt(r['oracle_us']):>10} "
              f"{fmt(r['oracle_speedup'], '.2f', 'x'):>8} {fmt(r['search_us']):>10} "
              f"{fmt(r['search_speedup'], '.2f', 'x'):>8} {fmt(r['ratio'], '.3f'):>8} "
              f"{fmt(r.get('ratio_retimed'), '.3f'):>8} "
              f"{(r['search_provenance'] or '-'):>14} {r['search_wall_seconds']:>7.1f}")
    for s, d in summary.items():
        print(f"\n{s}: {d['compared']}/{d['matrices']} matrices compared; geomean speedup vs cuSPARSE: oracle "
              f"{fmt(d['geomean_oracle_speedup'], '.3f', 'x')}, search {fmt(d['geomean_search_speedup'], '.3f', 'x')}; "
              f"search/oracle geomean {fmt(d['geomean_search_over_oracle'], '.3f')}; search wins on "
              f"{d['search_wins']} ({d['search_wins_by_2pct']} by >= 2%); slowest search "
              f"{fmt(d['max_search_wall_seconds'], '.0f', ' s')}")
        if d.get("headroom_compared"):
            print(f"{s}, a search of {rows[0].get('long_budget')} beside it ({d['headroom_compared']} matrices): the "
                  f"search's time over its, geomean {fmt(d['geomean_headroom'], '.3f')}, retimed "
                  f"{fmt(d['geomean_headroom_retimed'], '.3f')} (at most {fmt(d['max_headroom_retimed'], '.3f')}; "
                  f"{d['headroom_by_2pct_retimed']} matrices by >= 2%)")
        if d["retimed"]:
            print(f"{s}, the two picks timed again ({d['retimed']} matrices): search/oracle geomean "
                  f"{fmt(d['geomean_search_over_oracle_retimed'], '.3f')}; search wins on "
                  f"{d['search_wins_retimed']} ({d['search_wins_by_2pct_retimed']} by >= 2%)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of each generated matrix")
    ap.add_argument("--families", default="", help="comma-separated families (default: the 11 large ones)")
    ap.add_argument("--family-seed", type=int, default=2,
                    help="seed of the generated matrices (default 2: seed 1 made the packaged cost model's training "
                         "matrices, benchmarks/cost_model_data.py, so a search on them ranks in-sample; runs "
                         "before 2026-12-07 used seed 1)")
    ap.add_argument("--no-families", action="store_true", help="no generated matrices (e.g. SuiteSparse only)")
    ap.add_argument("--suitesparse", type=Path, help="folder of real matrices (.mtx/.mtx.gz/.npz)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many SuiteSparse matrices, the first by file name (0: all)")
    ap.add_argument("--only", default="", help="comma-separated matrix names to run (others skipped)")
    ap.add_argument("--budget", type=int, default=64, help="candidates per search")
    ap.add_argument("--seconds", type=float, default=None, help="time limit per search")
    ap.add_argument("--op", choices=["spmv", "spmm"], default="spmv")
    ap.add_argument("--k", type=int, default=32, help="SpMM columns")
    ap.add_argument("--regime", choices=["cold", "warm"], default="cold")
    ap.add_argument("--retime", type=int, default=3,
                    help="time the search's and the oracle's picks again this many times each, fresh, side by "
                         "side, where they differ (0: not)")
    ap.add_argument("--headroom-budget", type=int, default=0, metavar="N",
                    help="also a search of N candidates (above --budget) in a fresh store, its pick retimed beside "
                         "the others: what a longer search finds past the budget (default 0: none)")
    ap.add_argument("--store", type=Path, default=None, help="best-known store to use and update (default: fresh)")
    ap.add_argument("--trace-dir", type=Path, default=None, help="write each search's trace here")
    ap.add_argument("--out", type=Path, default=Path("search_bench.json"))
    ap.add_argument("--resume", action="store_true", help="keep the matrices already in --out, run the rest")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: exercise the paths, time nothing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seed-share", type=float, default=SearchConfig.seed_share,
                    help="at most this share of the budget goes to seeds before mutations start")
    ap.add_argument("--beam", type=int, default=SearchConfig.beam, help="mutate from the best this many kernels")
    ap.add_argument("--cost-model", default="default",
                    help="the search's candidate order: default (the packaged cost model), none, or a model file")
    ap.add_argument("--cost-model-by-matrix", type=Path,
                    help="JSON {matrix name: model file, relative to the JSON's folder}: those matrices' searches "
                         "use that model (cost_model_quality.py --fold-models: a model never fitted on the matrix)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.budget < 1:
        raise SystemExit("--budget must be at least 1")
    if args.retime < 0:
        raise SystemExit("--retime must be 0 or more")
    if args.headroom_budget and args.headroom_budget <= args.budget:
        raise SystemExit(f"--headroom-budget must be above --budget ({args.budget}), got {args.headroom_budget}")
    args.by_matrix = load_by_matrix(args.cost_model_by_matrix) if args.cost_model_by_matrix else {}
    op = Op(args.op)
    k = args.k if op is Op.SPMM else None
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if args.resume and args.out.exists():
        rows = json.loads(args.out.read_text())["matrices"]
        log.info("resuming: %d matrices already in %s", len(rows), args.out)
    done = {r["matrix"] for r in rows}
    only = set(filter(None, args.only.split(",")))
    if args.by_matrix:  # a real matrix left out of the map would be searched with a model that may have seen it
        missing = [name for st, name, _, _ in matrices(args)
                   if st == "suitesparse" and name not in args.by_matrix and (not only or name in only)]
        if missing:
            raise SystemExit(f"error: --cost-model-by-matrix names no model for {len(missing)} of the matrices "
                             f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): give a complete map, "
                             "or --only the matrices it names")
    tmp = tempfile.TemporaryDirectory(prefix="search_bench_")
    store = open_store(args.store or Path(tmp.name) / "store.sqlite")
    config = {k2: (str(v) if isinstance(v, Path) else v) for k2, v in vars(args).items()}
    t_all = time.perf_counter()
    skipped: dict[str, str] = {}

    def write(**extra) -> dict:  # after every matrix, and once more at the end with the run's seconds
        summary = summarise(rows)
        args.out.write_text(json.dumps({"config": config, "summary": summary, "matrices": rows, "skipped": skipped}
                                       | extra, indent=1, default=str))
        return summary

    try:
        with Evaluator(HarnessConfig(compile_only=args.compile_only, regimes=(args.regime,),
                                     reward_regime=args.regime)) as ev:
            if not ev.has_gpu and not args.compile_only:
                raise SystemExit("no GPU visible: run on the GPU machine, or pass --compile-only to exercise the paths")
            if ev.has_gpu:  # start and warm the workers now, so the first search's clock does not pay for it
                t = time.perf_counter()
                ev.pool  # noqa: B018 - the property starts the pool
                log.info("GPU workers started and warmed up in %.1f s (outside every search's time)",
                         time.perf_counter() - t)
            for set_name, name, fam, make in matrices(args):
                if name in done or (only and name not in only):
                    continue
                t = time.perf_counter()
                A = make()
                log.info("%s: %d x %d, %d nonzeros (made in %.1f s)", name, *A.shape, A.nnz, time.perf_counter() - t)
                try:
                    row = bench_one(ev, store, A, name, op, k, args) | {"set": set_name, "family": fam}
                except SparseRLError as exc:  # e.g. larger than the GPU: the others still run
                    log.error("%s: skipped: %s", name, exc)
                    skipped[name] = str(exc)
                    continue
                rows.append(row)
                log.info("%s: oracle %s, search %s (%s), search/oracle %s, search %.0f s", name,
                         fmt(row["oracle_speedup"], ".2f", "x"), fmt(row["search_speedup"], ".2f", "x"),
                         row["search_provenance"], fmt(row["ratio"], ".3f"), row["search_wall_seconds"])
                write()
    finally:
        store.close()
        tmp.cleanup()
    summary = write(seconds=time.perf_counter() - t_all)
    print_table(rows, summary)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
