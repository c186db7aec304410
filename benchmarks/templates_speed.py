"""Templates against the library and cuSPARSE: every library variant and every template seed
(generic and specialised forms), verified and timed side by side in one run.

For each matrix, every SpMV library variant and every seed of every template (the points a
template proposes for this matrix's card; specialised templates bake the card into the code) go
through the full harness (verification with NaN-poisoned outputs, then timing in the cold regime,
L2 flushed, and the warm regime) in the same worker as cuSPARSE. Candidates with the same text
(a template's seed that is a library point) run once. Reported per matrix:

* cuSPARSE's time;
* the old library oracle (the fastest verified variant among the strategies the library had
  before the irregular-matrix kernels: everything but ``csr_adaptive`` and ``csr_lanes``), the
  library oracle now, and the oracle with every template seed: times and speedups;
* the fastest template candidate;
* for each specialised template, the gain of specialising: the best verified point of its generic
  form over the best verified point of the specialised form (``-`` where the specialised form does
  not apply to the matrix, e.g. a uniform-row template on a power-law matrix).

Matrices: the 11 large families of ``library_speed.py`` (sizes scaled by ``--rows / 2M``: at the
default 2M rows they are exactly library_speed's set) plus ``dense_lines`` and ``rmat`` at
``--rows``, and with ``--suitesparse DIR`` every ``*.mtx.gz`` there. Geometric means are given
over the 11 families (the target set), over all generated matrices, and over SuiteSparse.

    python benchmarks/templates_speed.py --out benchmarks/results/templates_speed.json
    python benchmarks/templates_speed.py --rows 20000 --out /tmp/templates_smoke.json
    python benchmarks/templates_speed.py --suitesparse $SPARSERL_SUITESPARSE --only none --out ss.json
    python benchmarks/templates_speed.py --rows 2000 --compile-only    # CPU: render and compile only

``--only`` takes comma-separated matrix names (``none`` skips the generated ones). ``--points``
adds template points beyond the seeds, each ``TEMPLATE:name=value,...`` (a point a template's check
refuses for a matrix is left out there): they are timed beside the rest, listed per matrix in the
JSON's ``results`` with kind ``point``, and kept out of the oracles and the specialisation gains.

    python benchmarks/templates_speed.py --suitesparse DIR --only none,wiki-Vote,rajat01 \
        --points coo_segmented:batches=1,block=256 coo_segmented:batches=1,block=512 --out points.json

``--compile-only`` needs no GPU: it renders every candidate and compiles it, and exits non-zero if
any fails to compile (the CPU smoke test runs this).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from library_speed import LARGE, matrices, timing_floor_us  # noqa: E402

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.harness.evaluator import Evaluator, HarnessConfig  # noqa: E402
from sparserl.improve.table import geomean_of  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.kernels.library import all_variants  # noqa: E402
from sparserl.kernels.library.csr_irregular import variants as irregular_variants  # noqa: E402
from sparserl.kernels.templates import get_template, templates  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from sparserl.matrices.card import matrix_card  # noqa: E402

log = logging.getLogger("templates_speed")

REFERENCE_ROWS = 2_000_000
"""library_speed's sizes correspond to --rows at this value."""
EXTRA = [("dense_lines", "dense_lines", REFERENCE_ROWS, {}), ("rmat", "rmat", REFERENCE_ROWS, {})]
"""The families added for irregular matrices, at --rows."""
NEW_LIBRARY_STRATEGIES = frozenset(v.strategy for v in irregular_variants())
"""Library strategies added with the templates (left out of the 'old library' oracle)."""
TARGET_FAMILIES = ("powerlaw", "skewed", "random", "empty_rows")
"""The per-matrix target (>= 1.3x cuSPARSE with the new kernels) applies to these."""


def _size_tag(v: int) -> str:
    for div, unit in ((1_000_000, "M"), (1_000, "k")):
        if v >= div and v % (div // 10) == 0:
            q = v / div
            return f"{q:g}{unit}"
    return str(v)


def generated(rows: int, only: set[str] | None):
    """(name, family, matrix, is one of the 11) for the scaled large set and the new families."""
    scale = rows / REFERENCE_ROWS
    for entries, core in ((LARGE, True), (EXTRA, False)):
        for name, fam, ref_rows, params in entries:
            params = dict(params)
            r = max(1, round(ref_rows * scale))
            tag = _size_tag(r)
            if "cols" in params:
                params["cols"] = max(1, round(params["cols"] * scale))
                tag += "x" + _size_tag(params["cols"])
            label = f"{name.rsplit('_', 1)[0] if core else name}_{tag}"
            if only is not None and label not in only:
                continue
            t = time.perf_counter()
            A = generate(fam, r, seed=1, **params)
            log.info("generated %s: %d x %d, %d nnz in %.1f s", label, *A.shape, A.nnz, time.perf_counter() - t)
            yield label, fam, A, core


def parse_points(specs: list[str]) -> list[tuple[str, dict[str, int]]]:
    """``TEMPLATE:name=value,...`` strings as (SpMV template, complete point); a clear error for an
    unknown template, a parameter it does not have, a missing one or a value outside its domain."""
    out = []
    for spec in specs:
        name, _, rest = spec.partition(":")
        try:
            t = get_template(Op.SPMV, name)
            point = {k: int(v) for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)}
        except (SparseRLError, ValueError) as exc:
            raise SystemExit(f"error: --points {spec!r}: {exc}") from None
        why = t.point_error(point)
        if why:
            raise SystemExit(f"error: --points {spec!r}: {why}")
        out.append((name, point))
    return out


def candidates(card, points: list[tuple[str, dict[str, int]]] = ()) -> list[dict]:
    """Every SpMV library variant and every template seed for this card, and the extra ``points``
    its template's check accepts for it: id, kind, template, text."""
    out = [{"id": v.id, "kind": "library", "template": v.strategy, "text": v.render(),
            "old": v.strategy not in NEW_LIBRARY_STRATEGIES}
           for v in all_variants() if v.op is Op.SPMV]
    for t in templates(Op.SPMV):
        for p in t.seeds(card):
            out.append({"id": t.candidate(p).id, "kind": "template", "template": t.name, "text": t.render(p, card),
                        "specialised": t.specialised, "generic": t.generic})
    for name, p in points:
        t = get_template(Op.SPMV, name)
        if t.check(p, card, None) is None:
            out.append({"id": t.candidate(p).id, "kind": "point", "template": name, "text": t.render(p, card)})
    return out


def _best(cands: list[dict], results: dict[str, object], regime: str, keep) -> tuple[str, float] | None:
    ok = [(c["id"], results[c["text"]].timings[regime].median_us) for c in cands
          if keep(c) and results[c["text"]].ok and regime in results[c["text"]].timings]
    return min(ok, key=lambda t: t[1]) if ok else None


def evaluate_matrix(ev: Evaluator, name: str, fam: str, A, regime: str, compile_only: bool,
                    points: list[tuple[str, dict[str, int]]] = ()) -> dict:
    card = matrix_card(A)
    cands = candidates(card, points)
    texts = list(dict.fromkeys(c["text"] for c in cands))
    mat = ev.register(A, name)
    t0 = time.perf_counter()
    res = dict(zip(texts, ev.evaluate_many([(t, mat, Op.SPMV, None) for t in texts])))
    row = {"matrix": name, "family": fam, "rows": int(A.shape[0]), "cols": int(A.shape[1]), "nnz": int(A.nnz),
           "card": card.render(), "candidates": len(cands), "unique_texts": len(texts),
           "eval_seconds": time.perf_counter() - t0}
    if compile_only:
        bad = list(dict.fromkeys((c["id"], res[c["text"]].error_kind.value, res[c["text"]].message)
                                 for c in cands if not res[c["text"]].compiled))
        row["compile_failures"] = bad
        return row
    row["results"] = [{"id": c["id"], "kind": c["kind"], "ok": res[c["text"]].ok,
                       "error_kind": res[c["text"]].error_kind.value,
                       "message": res[c["text"]].message[:200],
                       **{f"{r}_us": res[c["text"]].timings[r].median_us for r in res[c["text"]].timings}}
                      for c in cands]
    failed = list(dict.fromkeys((c["id"], res[c["text"]].error_kind.value, res[c["text"]].message[:160])
                                for c in cands
                                if not res[c["text"]].ok and res[c["text"]].error_kind.value != "format_refused"))
    row["failed"] = failed
    for cid, kind, msg in failed:  # a kernel that compiles but fails here is a bug to look at first
        log.warning("%s: %s: %s: %s", name, cid, kind, msg)
    ok_any = next((r for r in res.values() if r.ok), None)
    if ok_any is None:
        log.warning("%s: no candidate passed", name)
        return row
    for reg in ("cold", "warm"):
        if reg not in ok_any.baseline:  # the harness times the regimes its config names
            continue
        base = ok_any.baseline[reg].median_us
        entry = {"cusparse_us": base}
        for key, keep in (("old_library", lambda c: c["kind"] == "library" and c["old"]),
                          ("library", lambda c: c["kind"] == "library"),
                          ("with_templates", lambda c: c["kind"] != "point"),
                          ("best_template", lambda c: c["kind"] == "template")):
            best = _best(cands, res, reg, keep)
            entry[key] = None if best is None else {"id": best[0], "us": best[1], "speedup": base / best[1]}
        gains = {}
        for t in templates(Op.SPMV):
            if not t.specialised:
                continue
            spec = _best(cands, res, reg, lambda c, n=t.name: c["template"] == n and c["kind"] == "template")
            gen = _best(cands, res, reg, lambda c, n=t.generic: c["template"] == n and c["kind"] == "template")
            gains[t.name] = None if spec is None or gen is None else {
                "spec_id": spec[0], "spec_us": spec[1], "generic_id": gen[0], "generic_us": gen[1],
                "gain": gen[1] / spec[1]}
        entry["specialisation"] = gains
        row[reg] = entry
    row["cusparse_alg"] = ok_any.baseline_alg
    return row


def _fmt(e: dict | None, width: int = 8) -> str:
    return f"{e['us']:>{width}.1f} {e['speedup']:>5.2f}x" if e else f"{'-':>{width}} {'-':>6}"


def report(rows: list[dict], regime: str, gpu: str) -> dict:
    timed = [r for r in rows if regime in r]
    print(f"\nSpMV on {gpu}, regime {regime}: cuSPARSE, the library oracle before and after the irregular kernels, "
          f"and the oracle with every template seed")
    print(f"{'matrix':22} {'nnz':>10} {'cuSPARSE':>9} {'old library':>15} {'library':>15} {'+templates':>15}  best")
    for r in timed:
        h = r[regime]
        best = h["with_templates"]["id"] if h["with_templates"] else "-"
        print(f"{r['matrix']:22} {r['nnz']:>10} {h['cusparse_us']:>9.1f} {_fmt(h['old_library'])} "
              f"{_fmt(h['library'])} {_fmt(h['with_templates'])}  {best}")
    spec_names = sorted({n for r in timed for n in r[regime]["specialisation"]})
    if spec_names:
        print("\nGain of specialising (best generic point time / best specialised point time; - = not applicable)")
        print(f"{'matrix':22} " + " ".join(f"{n:>18}" for n in spec_names))
        for r in timed:
            g = r[regime]["specialisation"]
            print(f"{r['matrix']:22} " + " ".join(
                f"{g[n]['gain']:>17.3f}x" if g.get(n) else f"{'-':>18}" for n in spec_names))
    summary: dict = {}
    groups = {"families_11": [r for r in timed if r.get("core")],
              "generated": [r for r in timed if r["family"] != "suitesparse"],
              "suitesparse": [r for r in timed if r["family"] == "suitesparse"]}
    print()
    for gname, rs in groups.items():
        if not rs:
            continue
        s = {}
        for key in ("old_library", "library", "with_templates"):
            s[key] = geomean_of([r[regime][key]["speedup"] for r in rs if r[regime][key]])
        summary[gname] = s | {"matrices": len(rs)}
        print(f"{gname}: geometric-mean speedup over cuSPARSE on {len(rs)} matrices: old library "
              f"{s['old_library'] or 0:.2f}x, library {s['library'] or 0:.2f}x, with templates {s['with_templates'] or 0:.2f}x")
    failures: dict[str, list[str]] = {}
    for r in rows:
        for cid, kind, _ in r.get("failed", []):
            failures.setdefault(cid.split("/")[1], []).append(f"{r['matrix']} ({kind})")
    for strategy, where in sorted(failures.items()):
        print(f"FAILED {strategy}: {len(where)} on " + ", ".join(where[:8]) + (" ..." if len(where) > 8 else ""))
    summary["failures"] = failures
    targets = {r["matrix"]: r[regime]["with_templates"]["speedup"] for r in timed
               if r["family"] in TARGET_FAMILIES and r[regime]["with_templates"]}
    if targets:
        print("target >= 1.3x on the irregular families: " + ", ".join(
            f"{k} {v:.2f}x{'' if v >= 1.3 else ' (below)'}" for k, v in targets.items()))
    summary["irregular_targets"] = targets
    points = list(dict.fromkeys(x["id"] for r in timed for x in r.get("results", []) if x.get("kind") == "point"))
    if points:
        print(f"\nThe --points, {regime} us (- where refused or not correct), beside the oracle with every template seed")
        print(f"{'matrix':22} {'oracle':>8} " + " ".join(f"{i:>24}" for i in range(len(points))))
        over: dict[str, list[float]] = {pid: [] for pid in points}
        for r in timed:
            got = {x["id"]: x.get(f"{regime}_us") for x in r["results"] if x.get("kind") == "point" and x["ok"]}
            best = r[regime]["with_templates"]
            print(f"{r['matrix']:22} {best['us'] if best else float('nan'):>8.2f} " + " ".join(
                f"{got[pid]:>24.2f}" if got.get(pid) else f"{'-':>24}" for pid in points))
            for pid in points:
                if got.get(pid) and best:
                    over[pid].append(best["us"] / got[pid])
        for i, pid in enumerate(points):
            print(f"  {i}: {pid}: oracle / point {geomean_of(over[pid]) or 0:.3f} (geomean over {len(over[pid])})")
        summary["points_over_oracle"] = {pid: {"geomean_oracle_over_point": geomean_of(v), "matrices": len(v)}
                                         for pid, v in over.items()}
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=REFERENCE_ROWS,
                    help="rows of the irregular families (the others scale with it, as in library_speed)")
    ap.add_argument("--suitesparse", type=Path, help="also every *.mtx.gz in this folder")
    ap.add_argument("--only", default="", help="comma-separated matrix names; 'none' skips the generated set")
    ap.add_argument("--regime", choices=["cold", "warm"], default="cold", help="regime of the headline figures")
    ap.add_argument("--compile-only", action="store_true", help="render and compile every candidate (no GPU)")
    ap.add_argument("--points", nargs="*", default=[], metavar="TEMPLATE:NAME=VALUE,...",
                    help="template points to time beside the seeds (kept out of the oracles)")
    ap.add_argument("--out", type=Path, default=Path("templates_speed.json"))
    args = ap.parse_args()
    points = parse_points(args.points)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.rows < 1:
        raise SystemExit("--rows must be >= 1")
    only = set(filter(None, args.only.split(","))) or None

    rows: list[dict] = []
    cfg = HarnessConfig(reward_regime=args.regime, memo=0, compile_only=args.compile_only)
    with Evaluator(cfg) as ev:
        sources = []
        if only != {"none"}:
            sources.append(((n, f, A, core) for n, f, A, core in generated(args.rows, only)))
        if args.suitesparse is not None:
            sources.append(((n, f, A, False) for n, f, A in matrices("suitesparse", args.suitesparse, only)))
        for source in sources:
            for name, fam, A, core in source:
                row = evaluate_matrix(ev, name, fam, A, args.regime, args.compile_only, points) | {"core": core}
                rows.append(row)
                args.out.parent.mkdir(parents=True, exist_ok=True)  # what is done survives a cut-off run
                args.out.write_text(json.dumps({"partial": True, "matrices": rows}, indent=1, default=str))
                if args.compile_only:
                    log.info("%-22s %d candidates, %d distinct texts, %d failed to compile", name, row["candidates"],
                             row["unique_texts"], len(row["compile_failures"]))
                elif args.regime in row:
                    h = row[args.regime]
                    log.info("%-22s cuSPARSE %8.1f us  old library %s  with templates %s  (%s) [%.0f s]", name,
                             h["cusparse_us"], _fmt(h["old_library"]), _fmt(h["with_templates"]),
                             h["with_templates"]["id"] if h["with_templates"] else "-", row["eval_seconds"])
        gpu = ev.pool.gpu if ev.has_gpu else "no GPU (compile only)"

    out = {"op": "spmv", "rows": args.rows, "headline_regime": args.regime, "gpu": gpu,
           "compile_only": args.compile_only, "matrices": rows}
    status = 0
    if args.compile_only:
        failures = {r["matrix"]: r["compile_failures"] for r in rows if r["compile_failures"]}
        for name, bad in failures.items():
            for cid, kind, msg in bad:
                print(f"{name}: {cid}: {kind}: {msg}")
        print(f"compile only: {sum(r['unique_texts'] for r in rows)} distinct kernels on {len(rows)} matrices, "
              f"{sum(len(b) for b in failures.values())} failed")
        status = 1 if failures else 0
    else:
        from sparserl.harness.timing import measured_copy_bandwidth

        out["summary"] = report(rows, args.regime, gpu)
        out["timing_floor_us"] = timing_floor_us()
        out["copy_bandwidth_bytes_per_s"] = measured_copy_bandwidth()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    log.info("wrote %s", args.out)
    return status


if __name__ == "__main__":
    sys.exit(main())
