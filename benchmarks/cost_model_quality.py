"""The cost model's ranking quality on matrices it was not fitted on: top-5 recall of the fastest
candidate, near-recall (within 2%), regret and Kendall's tau, per matrix set, beside the order a
search without a model tries (the selector's choice, then every template's first seed).

Sets (each where the data has it):

* ``leave-one-family-out``: for each trainable family, a model fitted on every other family,
  scored on this one's matrices (every size);
* ``held-out families``: a model fitted on every trainable matrix, scored on the matrices of
  circuit, kkt, fem_mixed and road (measured with ``cost_model_data.py --held-out``);
* ``suitesparse``: the same, scored on SuiteSparse matrices measured with ``cost_model_data.py
  --suitesparse DIR`` (``--suitesparse-data``);
* ``suitesparse, K folds`` (``--suitesparse-folds K``): each SuiteSparse matrix scored by a model
  fitted on every trainable matrix and the other K-1 folds of SuiteSparse (matrices named alike
  share a fold: ``cost_quality.grouped_folds``), never on its own: what fitting on real matrices gives
  (a fit on both real and generated matrices has a real part: ``TrainConfig.real_part``); and
  ``held-out families, fitted with suitesparse``: the held-out families scored by a model fitted on
  every trainable matrix and all of SuiteSparse;
* ``suitesparse (best only)``: a model fitted on every trainable matrix, scored on the SuiteSparse
  matrices of a ``search_bench.py`` result, where only the library oracle's fastest candidate is
  known: the model ranks the oracle's candidate set (the formats the matrix converts to, checked
  on the host) and recall is whether the oracle's pick is in its top 5 (near-recall, regret and
  tau need every time and are not given).

Every target of the cost model is measured (``lightgbm/<target>``, the default ``blend`` among
them), and ``lightgbm/rank-v1``: the ranking fit as the model of file format 1 was fitted
(truncation level 10, linear gains), the model shipped before ``blend``. ``--xgboost`` fits
XGBoost on the same rows when it is installed.

    python benchmarks/cost_model_quality.py --data DIR/measurements.jsonl --out quality.json
    python benchmarks/cost_model_quality.py --data train.jsonl --held-out heldout.jsonl --suitesparse-data ss.jsonl \\
        --suitesparse-best search_suitesparse.json --suitesparse DIR --out quality.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from sparserl.kernels.contract import Op
from sparserl.search import cost_quality as cq
from sparserl.search.cost_model import TARGETS, TrainConfig, load_measurements, train, trainable

log = logging.getLogger("cost_model_quality")

RANK_V1 = {"rank_truncation": 10, "rank_gain": "linear"}
"""The ranking fit's settings in the model of file format 1 (shipped before the ``blend`` target)."""


def fmt(d: dict) -> str:
    if not d.get("matrices"):
        return "no matrices"
    parts = [f"{d['matrices']:>3} matrices", f"recall@5 {d['recall']:.2f}"]
    if "near" in d:
        parts += [f"near@5 {d['near']:.2f}", f"regret {d['regret_geomean']:.3f} (max {d['regret_max']:.2f})",
                  f"tau {d['kendall_tau']:.2f}" if d.get("kendall_tau") is not None else "tau -"]
    return ", ".join(parts)


def xgboost_fit():
    """A ``train``-shaped function that fits XGBoost on the same rows (for the comparison)."""
    import xgboost as xgb

    from sparserl.search import cost_features as cf
    from sparserl.search.cost_model import check_enough, design

    from sparserl.search.cost_model import CostModel

    class XgbModel:
        outside = CostModel.outside  # the same size range rule as a LightGBM model
        real_part = None  # one model for every size

        def part_for(self, card):
            return self

        def __init__(self, booster, vocab, target, nnz_range):
            self.booster = booster
            self.meta = {"vocab": vocab, "target": target, "trained_on": {"nnz_range": nnz_range}}

        def predict_points(self, card, features, op, k, points):
            X = cf.rows(card, features, op, k, points, self.meta["vocab"])
            return self.booster.predict(matrix(X))

    names = list(cf.feature_names())
    types = ["c" if n in cf.CATEGORICAL else "q" for n in names]

    def matrix(X, **kw):  # the template and format columns as categories, as LightGBM takes them
        return xgb.DMatrix(X, missing=np.nan, feature_names=names, feature_types=types, enable_categorical=True, **kw)

    def fit(data, cfg: TrainConfig, where: str = "") -> XgbModel:
        data, _ = trainable(data)
        check_enough(data, cfg, where)
        vocab = cf.vocabulary()
        X, y, w = design(data, vocab, cfg.target, cfg.balance)
        params = {"max_leaves": cfg.leaves, "grow_policy": "lossguide", "eta": cfg.learning_rate,
                  "colsample_bytree": cfg.feature_fraction, "seed": cfg.seed, "nthread": 1, "tree_method": "hist"}
        b = xgb.train(params, matrix(X, label=y, weight=w), num_boost_round=cfg.trees)
        return XgbModel(b, vocab, cfg.target, [min(m.card.nnz for m in data), max(m.card.nnz for m in data)])

    return fit


def suitesparse_best_only(fit, cfg: TrainConfig, train_on, best_json: Path, folder: Path) -> dict:
    """See the module docstring; the card and features of each matrix are computed here."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from search_bench import oracle_texts

    from sparserl.formats import accepts
    from sparserl.harness.extract import Extracted, extract
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import card_and_features

    model = fit(train_on, cfg, where="the training set")
    rows = json.loads(best_json.read_text())["matrices"]
    per, null = [], []
    for r in rows:
        if not r.get("oracle_id"):
            continue
        f = next((p for p in folder.iterdir() if p.name.split(".")[0] == r["matrix"]), None)
        if f is None:
            log.warning("%s: not in %s; skipped", r["matrix"], folder)
            continue
        A = load_matrix(f)
        card, feats = card_and_features(A)
        ids = []
        for cid, text, _ in oracle_texts(Op.SPMV, None, card):
            ex = extract(text, Op.SPMV)
            if isinstance(ex, Extracted) and accepts(A, ex.header.format, ex.header.params):
                ids.append(cid)
        from sparserl.search.space import parse_candidate_id

        pts = [(c, parse_candidate_id(c)) for c in ids]
        pts = [(c, p[1], p[2]) for c, p in pts if p is not None]
        pred = model.predict_points(card, feats, Op.SPMV, None, [(t, p) for _, t, p in pts])
        order = [pts[i][0] for i in np.argsort(pred, kind="stable")]
        nord = cq.null_sequence(card, feats, Op.SPMV, None, [c for c, _, _ in pts])
        best = r["oracle_id"]
        if best not in ids:
            log.warning("%s: the oracle's pick %s is not in the host-checked set; skipped", r["matrix"], best)
            continue
        outside = model.outside(card)
        per.append({"matrix": r["matrix"], "best_id": best, "candidates": len(ids), "recall": best in order[:cq.K],
                    "rank": order.index(best) + 1, "picked": order[:cq.K], "in_size_range": outside is None})
        null.append({"matrix": r["matrix"], "recall": best in nord[:cq.K], "rank": nord.index(best) + 1})
    return {"model": {"matrices": len(per), "recall": float(np.mean([p["recall"] for p in per])) if per else None,
                      "median_rank": float(np.median([p["rank"] for p in per])) if per else None,
                      "in_size_range": sum(p["in_size_range"] for p in per)},
            "null": {"matrices": len(null), "recall": float(np.mean([p["recall"] for p in null])) if null else None,
                     "median_rank": float(np.median([p["rank"] for p in null])) if null else None},
            "matrices": per}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="measurements files (training families)")
    ap.add_argument("--held-out", type=Path, nargs="*", default=[], help="measurements of the held-out families")
    ap.add_argument("--suitesparse-data", type=Path, nargs="*", default=[],
                    help="measurements of SuiteSparse matrices (cost_model_data.py --suitesparse)")
    ap.add_argument("--suitesparse-best", type=Path, help="a search_bench.py result on SuiteSparse (oracle ids)")
    ap.add_argument("--suitesparse", type=Path, help="the folder of those SuiteSparse matrices")
    ap.add_argument("--suitesparse-folds", type=int, default=0,
                    help="also score SuiteSparse by K-fold fits that add the other folds to the training set")
    ap.add_argument("--fold-models", type=Path,
                    help="with --suitesparse-folds: write each fold's model (of the one target of --targets, "
                         "blend by default) to "
                         "DIR/fold_I.json.gz and DIR/by_matrix.json (matrix name -> its fold's model), for "
                         "search_bench.py --cost-model-by-matrix")
    ap.add_argument("--targets", default="",
                    help=f"comma-separated cost-model targets to fit (default: every one, {', '.join(TARGETS)}, and rank-v1)")
    ap.add_argument("--trees", type=int, default=TrainConfig.trees)
    ap.add_argument("--min-measurements", type=int, default=TrainConfig.min_measurements,
                    help="lower it to fit folds of a small data set")
    ap.add_argument("--xgboost", action="store_true", help="also fit XGBoost on the same rows (if installed)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    wanted = {t for t in args.targets.split(",") if t}
    if unknown := wanted - {*TARGETS, "rank-v1"}:
        ap.error(f"unknown target(s) {', '.join(sorted(unknown))}: choose among {', '.join(TARGETS)}, rank-v1")
    if args.suitesparse_folds == 1 or args.suitesparse_folds < 0:
        ap.error("--suitesparse-folds is 0 (off) or at least 2")
    if args.suitesparse_folds and not args.suitesparse_data:
        ap.error("--suitesparse-folds needs --suitesparse-data")
    if args.fold_models and not args.suitesparse_folds:
        ap.error("--fold-models needs --suitesparse-folds")
    if args.fold_models:  # the models a search will use: of one target, LightGBM's
        wanted = wanted or {TrainConfig().target}
        if len(wanted) != 1 or args.xgboost:
            ap.error("--fold-models writes the models of one LightGBM target: give --targets with one (default: "
                     f"{TrainConfig().target}) and no --xgboost")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    data = [m for f in args.data for m in load_measurements(f)]
    held = [m for f in args.held_out for m in load_measurements(f)]
    train_set, dropped = trainable(data)
    held += [m for m in data if m not in train_set]
    real = [m for f in args.suitesparse_data for m in load_measurements(f)]
    train_set = [m for m in train_set if m.family != "suitesparse"]  # scored, never fitted on, here
    base = TrainConfig(trees=args.trees, min_measurements=args.min_measurements, min_matrices=2)
    fits = {"lightgbm": train}
    if args.xgboost:
        try:
            fits["xgboost"] = xgboost_fit()
        except ImportError:
            print("xgboost is not installed: its comparison is left out")
    report: dict = {"data": [str(f) for f in args.data], "held_out": [str(f) for f in args.held_out],
                    "train_matrices": len(train_set), "families": sorted({m.family for m in train_set}),
                    "measurements": sum(len(m.points()) for m in train_set), "k": cq.K, "near": cq.NEAR, "runs": {}}
    print(f"{len(train_set)} trainable matrices ({report['measurements']} verified measurements, families "
          f"{', '.join(report['families'])}); {len(held)} held-out matrices")
    null_lofo = cq.summary(cq.score_null(train_set))
    report["null"] = {"all trainable matrices": null_lofo}
    print(f"\nno model (selector, then each template's first seed): {fmt(null_lofo)}")
    for name, ms in (("held-out families", held), ("suitesparse", real)):
        if ms:
            report["null"][name] = cq.summary(cq.score_null(ms))
            print(f"no model, {name}: {fmt(report['null'][name])}")
    by_matrix: dict[str, str] = {}

    def keep_fold(fold: int, model, names: list[str]) -> None:
        path = model.save(args.fold_models / f"fold_{fold}.json.gz")
        by_matrix.update(dict.fromkeys(names, path.name))
        (args.fold_models / "by_matrix.json").write_text(json.dumps(by_matrix, indent=1, sort_keys=True))

    for lib, fit in fits.items():
        targets = TARGETS if lib == "lightgbm" else ("ratio", "absolute")
        runs = [(f"{lib}/{t}", replace(base, target=t)) for t in targets]
        if lib == "lightgbm":
            runs.append((f"{lib}/rank-v1", replace(base, target="rank", **RANK_V1)))
        if wanted:
            runs = [(key, cfg) for key, cfg in runs if key.split("/")[1] in wanted]
        for key, cfg in runs:
            t0 = time.perf_counter()
            run: dict = {}
            if len({m.family for m in train_set}) >= 2:
                lofo = cq.leave_one_family_out(train_set, cfg, fit)
                flat = [s for v in lofo.values() for s in v]
                run["leave-one-family-out"] = cq.summary(flat) | {
                    "per_family": {f: cq.summary(v) for f, v in lofo.items()}, "per_matrix": cq.as_json(flat)}
            for name, ms in (("held-out families", held), ("suitesparse", real)):
                if ms:
                    sc = cq.score_split(train_set, ms, cfg, fit)
                    run[name] = cq.summary(sc) | {"per_matrix": cq.as_json(sc)}
            if real and args.suitesparse_folds:
                sc = cq.cross_fit(train_set, real, args.suitesparse_folds, cfg, fit,
                                  on_model=keep_fold if args.fold_models else None)
                run[f"suitesparse, {args.suitesparse_folds} folds"] = cq.summary(sc) | {"per_matrix": cq.as_json(sc)}
                if held:  # what the real matrices in the fit do to the generated ones it has not seen
                    sc = cq.score_split(train_set + real, held, cfg, fit)
                    run["held-out families, fitted with suitesparse"] = cq.summary(sc) | {"per_matrix": cq.as_json(sc)}
            if args.suitesparse_best and args.suitesparse:
                run["suitesparse (best only)"] = suitesparse_best_only(fit, cfg, train_set, args.suitesparse_best,
                                                                       args.suitesparse)
            run["seconds"] = time.perf_counter() - t0
            report["runs"][key] = run
            print(f"\n{key}:")
            for name, d in run.items():
                if name == "seconds":
                    continue
                if name == "suitesparse (best only)":
                    m, n = d["model"], d["null"]
                    print(f"  {name:26} model: {m['matrices']} matrices, recall@5 {m['recall']:.2f}, median rank of "
                          f"the oracle's pick {m['median_rank']:.0f}; no model: recall@5 {n['recall']:.2f}, median "
                          f"rank {n['median_rank']:.0f}; {m['in_size_range']} matrices inside the model's size "
                          f"range (a search uses the model on those only)")
                    continue
                print(f"  {name:26} {fmt(d)}")
                for fam, fd in d.get("per_family", {}).items():
                    print(f"    {fam:24} {fmt(fd)}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=lambda o: list(o) if isinstance(o, tuple) else str(o)))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
