"""Measurements for the cost model: template seeds, library variants and a sample of mutations,
verified and timed (cold regime) on generated matrices of every trainable family at several sizes.

Families: the 13 classic ones and the trainable application families (lp, kronecker,
cartesian, arrow); never a held-out one (circuit, kkt, fem_mixed, road), which the cost model
is judged on: ``--held-out`` measures those alone, into their own folder, for
``cost_model_quality.py --held-out`` (training leaves them out whatever file they are in);
``--suitesparse DIR`` measures real matrices instead, for scoring too. For each matrix (and, with
``--op spmm``, each ``--ks`` width), in one harness: every template seed and library variant of the
operator (the library oracle's set, as ``search_bench.py`` enumerates it) and ``--mutations`` points
one step from a seed or drawn at random, in a seeded shuffled order. Each verdict and time goes to ``OUT/measurements.jsonl``, one
line per matrix as it finishes (the format ``sparserl best cost-model --data`` and
``benchmarks/cost_model_quality.py`` read).

``--seconds`` bounds the whole run: each matrix gets an equal share of the time left (what a
small matrix leaves over goes to the later, larger ones); a matrix whose share runs out stops
submitting (after 8 candidates at least), keeps what finished and is marked ``complete: false``;
matrices not reached by then are left out. The next matrix is generated and its card computed
on a CPU thread while the GPU times the current one.

    python benchmarks/cost_model_data.py --quick --out $OUT/cost_model_data         # ~3-4 min, one H200
    python benchmarks/cost_model_data.py --out $OUT/cost_model_data                  # every size, more mutations
    python benchmarks/cost_model_data.py --held-out --quick --sizes 100000,1000000 --seconds 90 --out $OUT/heldout
    python benchmarks/cost_model_data.py --suitesparse DIR --mutations 0 --seconds 120 --out $OUT/suitesparse
    python benchmarks/cost_model_data.py --op spmm --ks 32,128 --sizes 10000,100000 --out $OUT/spmm   # SpMM
    python benchmarks/cost_model_data.py --quick --compile-only --sizes 2000 --out /tmp/cmd   # CPU smoke: no times
    python benchmarks/cost_model_data.py --import-templates-speed FILE --out DIR      # CPU: a templates_speed.json

``--import-templates-speed`` turns the per-candidate times of a ``templates_speed.py`` result
into measurements: it makes each matrix again (seed 1, the sizes ``library_speed.LARGE`` names),
checks its shape and nonzeros against the file, and records its card and features with the
times. It needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from sparserl.matrices.card import card_and_features  # noqa: E402
from sparserl.matrices.io import matrices_in  # noqa: E402
from sparserl.matrices.generators import (  # noqa: E402
    APPLICATION_FAMILIES,
    CLASSIC_FAMILIES,
    HELD_OUT_FAMILIES,
    is_held_out,
)
from sparserl.search.cost_model import MatrixMeasurements  # noqa: E402
from sparserl.search.space import CandidateSpace, Provenance, select_templates  # noqa: E402

log = logging.getLogger("cost_model_data")

FAMILIES = CLASSIC_FAMILIES + tuple(f for f in APPLICATION_FAMILIES if not is_held_out(f))
"""Every family the cost model may be fitted on."""
QUICK_SIZES = (10_000, 100_000, 1_000_000)
FULL_SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
H200_ARCH = "sm_90"
"""The architecture of the GPU the imported templates_speed files were measured on (an H200)."""


def oracle_points(space: CandidateSpace, op: Op, k: int | None):
    """(id, text, provenance) of every template seed and every library variant (distinct texts)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from search_bench import oracle_texts

    return [(cid, text, "seed") for cid, text, _ in oracle_texts(op, k, space.card)]


def mutation_points(space: CandidateSpace, seeds: list, n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """``n`` points not among ``seeds``: half one step from a seed, half drawn at random."""
    seen = {" ".join(t.split()) for _, t, _ in seeds}
    out: list[tuple[str, str, str]] = []

    def add(p) -> bool:
        key = " ".join(p.text.split())
        if key in seen:
            return False
        seen.add(key)
        out.append((p.id, p.text, p.provenance.value))
        return True

    parents = [space.from_id(cid, Provenance.SEED) for cid, _, _ in seeds]
    parents = [p for p in parents if p is not None]
    rng.shuffle(parents)
    for parent in parents:
        if len(out) >= n // 2:
            break
        moves = space.neighbours(parent)
        rng.shuffle(moves)
        for m in moves[:1]:
            add(m)
    tries = 0
    while len(out) < n and tries < 20 * n:
        tries += 1
        p = next(space.random(tries=1), None)
        if p is not None:
            add(p)
    return out


def make_matrix(family: str, rows: int | Path):
    """A generated matrix (seed 1), or a matrix file when ``rows`` is a path."""
    from sparserl.matrices import load_matrix

    t = time.perf_counter()
    A = load_matrix(rows) if isinstance(rows, Path) else generate(family, rows, seed=1)
    card, feats = card_and_features(A)
    return A, card, feats, time.perf_counter() - t


def k_list(args) -> list[int | None]:
    """The dense widths to measure: [None] for SpMV, ``--ks`` for SpMM (each at least 1)."""
    if args.op == "spmv":
        if args.ks:
            raise SystemExit("--ks is for --op spmm (SpMV has no k)")
        return [None]
    try:
        ks = [int(x) for x in (args.ks or "64").split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--ks takes comma-separated integers, got {args.ks!r}") from None
    if not ks or min(ks) < 1:
        raise SystemExit(f"--ks needs widths of at least 1, got {args.ks!r}")
    return ks


def measured_name(name: str, k: int | None) -> str:
    """A matrix's name in the measurements: the SpMM width added (``powerlaw_10000_k64``), so that
    each (matrix, k) is its own line and ``--resume`` tells them apart."""
    return name if k is None else f"{name}_k{k}"


def _done(*value):
    """A finished future holding ``value`` (the next k of the same matrix reuses it)."""
    from concurrent.futures import Future

    f: Future = Future()
    f.set_result(value + (0.0,))
    return f


def measure(ev, name: str, family: str, A, card, feats, op: Op, k: int | None, mutations: int, seed: int,
            deadline: float, compile_only: bool) -> dict:
    """Evaluate one matrix's candidates until they are done or ``deadline`` (monotonic) passes."""
    space = CandidateSpace(card, op, k, select_templates(op), seed=seed)
    rng = random.Random(f"{seed}/{name}")
    seeds = oracle_points(space, op, k)
    cands = seeds + mutation_points(space, seeds, mutations, rng)
    rng.shuffle(cands)
    ref = ev.register(A, name)
    parallel = 8
    results: dict[str, tuple] = {}
    pending = {}
    it = iter(cands)
    t0 = time.perf_counter()
    cut = False
    while True:
        while len(pending) < parallel and not cut:
            if time.monotonic() >= deadline and len(results) + len(pending) >= parallel:  # a few at least
                cut = True
                break
            c = next(it, None)
            if c is None:
                break
            pending[ev.submit(c[1], ref, op, k)] = c
        if not pending:
            break
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        for f in done:
            cid, _, prov = pending.pop(f)
            results[cid] = (prov, f.result())
    seconds = time.perf_counter() - t0
    ok = [r for _, r in results.values() if r.ok and "cold" in r.timings]
    base = next((r.baseline["cold"].median_us for r in ok if "cold" in r.baseline), None)
    cand_rows = []
    for cid, (prov, r) in results.items():
        row = {"id": cid, "provenance": prov, "ok": bool(r.ok and "cold" in r.timings), "verdict":
               "correct" if r.ok else r.error_kind.value}
        if row["ok"]:
            row["time_us"] = r.timings["cold"].median_us
        cand_rows.append(row)
    arch = next((r.arch for _, r in results.values() if r.arch), None)
    gpu = next((r.gpu for _, r in results.values() if r.gpu), None)
    return {"matrix": name, "family": family, "op": op.value, "k": k, "arch": arch, "gpu": gpu, "regime": "cold",
            "rows": card.rows, "cols": card.cols, "nnz": card.nnz, "cusparse_us": base,
            "card": card.to_dict(), "features": feats.to_dict(), "candidates": cand_rows,
            "planned": len(cands), "evaluated": len(results), "complete": len(results) == len(cands),
            "eval_seconds": seconds, "compile_only": compile_only}


def collect(args) -> int:
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    allowed = HELD_OUT_FAMILIES if args.held_out else FAMILIES
    fams = [f for f in (args.families.split(",") if args.families else allowed) if f]
    bad = [f for f in fams if f not in allowed]
    if bad:
        raise SystemExit(f"{bad}: not {'held-out' if args.held_out else 'trainable'} families (held-out families "
                         f"are measured only with --held-out; these are: {', '.join(allowed)})")
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick else FULL_SIZES)
    mutations = args.mutations if args.mutations is not None else (12 if args.quick else 48)
    seconds = args.seconds if args.seconds is not None else (200.0 if args.quick else None)
    op, ks = Op(args.op), k_list(args)
    plan = [(f"{fam}_{rows}", fam, rows) for rows in sorted(sizes) for fam in fams]
    if args.suitesparse is not None:  # real matrices instead, for scoring
        files = matrices_in(args.suitesparse)
        if not files:
            raise SystemExit(f"no .mtx/.mtx.gz/.npz files in {args.suitesparse}")
        plan, fams, sizes = [(f.name.split(".")[0], "suitesparse", f) for f in files], ["suitesparse"], []
    plan = [(measured_name(name, k), fam, rows, k) for name, fam, rows in plan for k in ks]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "measurements.jsonl"
    done = set()
    if args.resume and path.exists():
        done = {json.loads(line)["matrix"] for line in path.read_text().splitlines() if line.strip()}
        log.info("resuming: %d matrices already in %s", len(done), path)
    plan = [p for p in plan if p[0] not in done]
    summary = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "sizes": sizes, "families": fams, "mutations": mutations, "matrices": []}
    t_start = time.monotonic()
    with Evaluator(HarnessConfig(compile_only=args.compile_only, regimes=("cold",), reward_regime="cold")) as ev, \
            ThreadPoolExecutor(1, thread_name_prefix="next-matrix") as prep:
        if not ev.has_gpu and not args.compile_only:
            raise SystemExit("no GPU visible: run on the GPU machine, or pass --compile-only to exercise the paths")
        if ev.has_gpu:
            t = time.perf_counter()
            ev.pool  # noqa: B018 - the property starts the workers
            log.info("GPU workers started in %.1f s", time.perf_counter() - t)
        t_run = time.monotonic()
        end = t_run + seconds if seconds is not None else float("inf")
        nxt = prep.submit(make_matrix, plan[0][1], plan[0][2]) if plan else None
        with path.open("a") as fh:
            for i, (name, fam, rows, k) in enumerate(plan):
                A, card, feats, made = nxt.result()
                if i + 1 < len(plan) and plan[i + 1][1:3] == (fam, rows):  # the same matrix at the next k
                    nxt = _done(A, card, feats)
                else:
                    nxt = prep.submit(make_matrix, *plan[i + 1][1:3]) if i + 1 < len(plan) else None
                left = len(plan) - i
                deadline = time.monotonic() + (end - time.monotonic()) / left if seconds is not None else float("inf")
                if time.monotonic() >= end:
                    log.info("out of time: %d matrices not measured", left)
                    break
                row = measure(ev, name, fam, A, card, feats, op, k, mutations, args.seed, deadline,
                              args.compile_only)
                del A
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                n_ok = sum(c["ok"] for c in row["candidates"])
                rate = row["evaluated"] / row["eval_seconds"] if row["eval_seconds"] else 0.0
                log.info("%s: %d nonzeros (made in %.1f s); %d/%d evaluated (%d verified) in %.1f s, %.1f/s%s",
                         name, row["nnz"], made, row["evaluated"], row["planned"], n_ok, row["eval_seconds"], rate,
                         "" if row["complete"] else " (time share spent)")
                summary["matrices"].append({k: row[k] for k in ("matrix", "nnz", "planned", "evaluated", "complete",
                                                                 "eval_seconds")} | {"verified": n_ok})
        if nxt is not None:
            nxt.cancel()
    ms = summary["matrices"]
    summary["seconds"] = time.monotonic() - t_start
    summary["evaluated"] = sum(m["evaluated"] for m in ms)
    summary["verified"] = sum(m["verified"] for m in ms)
    summary["evaluations_per_second"] = summary["evaluated"] / max(sum(m["eval_seconds"] for m in ms), 1e-9)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{len(ms)} matrices, {summary['evaluated']} candidates evaluated ({summary['verified']} verified), "
          f"{summary['evaluations_per_second']:.1f}/s, {sum(m['complete'] for m in ms)} complete; "
          f"{summary['seconds']:.0f} s in all -> {path}")
    return 0


def import_templates_speed(files: list[Path], out: Path) -> int:
    """templates_speed.py results -> measurements (see the module docstring)."""
    from library_speed import LARGE

    specs = {name: (fam, rows, params) for name, fam, rows, params in LARGE}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "measurements.jsonl"
    n = 0
    with path.open("w") as fh:
        for f in files:
            d = json.loads(f.read_text())
            if d.get("compile_only") or d.get("op") != "spmv":
                raise SystemExit(f"{f}: not a timed SpMV templates_speed result")
            for m in d["matrices"]:
                if "results" not in m or "cold" not in m:
                    log.info("%s: %s has no per-candidate cold times; skipped", f.name, m["matrix"])
                    continue
                if m["matrix"] not in specs:
                    raise SystemExit(f"{f}: {m['matrix']} is not a library_speed.LARGE matrix (cannot make it again)")
                fam, rows, params = specs[m["matrix"]]
                t = time.perf_counter()
                A = generate(fam, rows, seed=1, **params)
                card, feats = card_and_features(A)
                if (card.rows, card.cols, card.nnz) != (m["rows"], m["cols"], m["nnz"]):
                    raise SystemExit(f"{m['matrix']}: made {card.rows} x {card.cols}, {card.nnz} nonzeros, but the "
                                     f"file measured {m['rows']} x {m['cols']}, {m['nnz']}: another generator version")
                del A
                times, failed = {}, {}
                for r in m["results"]:
                    if r["ok"] and r.get("cold_us"):
                        times.setdefault(r["id"], r["cold_us"])
                    elif not r["ok"]:
                        failed.setdefault(r["id"], r["error_kind"])
                mm = MatrixMeasurements(name=m["matrix"], family=m["family"], op="spmv", k=None, arch=H200_ARCH,
                                        regime="cold", card=card, features=feats,
                                        cusparse_us=m["cold"]["cusparse_us"], times=times, failed=failed,
                                        source=f"{f.parent.name}/{f.name}")
                fh.write(json.dumps(mm.to_json() | {"gpu": d.get("gpu"), "complete": True}) + "\n")
                fh.flush()
                n += 1
                log.info("%s: %d verified, %d not (card in %.1f s)", m["matrix"], len(times), len(failed),
                         time.perf_counter() - t)
    print(f"{n} matrices -> {path}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="sizes 10k, 100k, 1M; 12 mutations; --seconds 200")
    ap.add_argument("--sizes", default="", help="comma-separated row counts [default: 10k,30k,100k,300k,1M]")
    ap.add_argument("--families", default="", help="comma-separated trainable families [default: all of them]")
    ap.add_argument("--mutations", type=int, default=None, help="mutation points per matrix [default: 12 quick, 48]")
    ap.add_argument("--seconds", type=float, default=None,
                    help="wall limit of the measuring [default: 200 with --quick, else none]")
    ap.add_argument("--held-out", action="store_true",
                    help="measure the held-out families (circuit, kkt, fem_mixed, road) instead: for scoring only")
    ap.add_argument("--suitesparse", type=Path, default=None,
                    help="measure every matrix file in this folder instead (real matrices, for scoring)")
    ap.add_argument("--op", choices=("spmv", "spmm"), default="spmv", help="the operator measured [default: spmv]")
    ap.add_argument("--ks", default="", help="SpMM: comma-separated dense widths, each measured on every matrix "
                                             "[default: 64]")
    ap.add_argument("--seed", type=int, default=0, help="seed of the mutation sample and the order")
    ap.add_argument("--resume", action="store_true", help="keep the matrices already in OUT, measure the rest")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile the candidates, time nothing")
    ap.add_argument("--import-templates-speed", type=Path, nargs="+", default=None,
                    help="templates_speed.py JSON files to turn into measurements (CPU)")
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.mutations is not None and args.mutations < 0:
        raise SystemExit("--mutations must be >= 0")
    if args.import_templates_speed:
        return import_templates_speed(args.import_templates_speed, args.out)
    return collect(args)


if __name__ == "__main__":
    raise SystemExit(main())
