"""How well a cost model ranks the candidates of matrices it was not fitted on.

Per matrix, over its verified candidates (the candidates a search could have tried first):

* ``recall@k``: whether the fastest measured candidate is among the model's ``k`` best predicted;
* ``near@k``: whether one of the ``k`` is within ``tol`` (2%) of the fastest (timing noise makes
  near-ties common: two block sizes of one kernel often differ by less than the run-to-run spread);
* ``regret@k``: the fastest time among the ``k`` over the fastest time (1.0: found it);
* Kendall's tau (tau-b) between predicted and measured times (1: the same order).

:func:`leave_one_family_out` fits on every family but one and scores that one, for each
family; :func:`score_split` fits on one set and scores another (the held-out families, SuiteSparse);
:func:`cross_fit` scores every matrix of a set (SuiteSparse) by a model fitted on the training set
plus the set's other folds (:func:`grouped_folds`: related matrices, named alike, share a fold).
The same figures for the order a search without a model tries (the selector's choice, then each
template's first seed, :func:`null_order`) are the baseline a model has to beat.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from sparserl.kernels.contract import Op
from sparserl.search.cost_model import CostModel, MatrixMeasurements, TrainConfig, train, trainable

K = 5
"""The k of recall@k (the issue's top-5)."""
NEAR = 0.02
"""A candidate within this fraction of the fastest counts for near@k."""


@dataclass(frozen=True)
class RankScore:
    """One matrix's ranking figures (see the module docstring)."""

    matrix: str
    family: str
    candidates: int
    recall: bool
    near: bool
    regret: float
    tau: float | None
    best_id: str
    picked: tuple[str, ...]
    """The ``k`` candidates ranked first."""


def rank_score(m: MatrixMeasurements, order: Sequence[str], k: int = K, tol: float = NEAR,
               predicted: Sequence[float] | None = None) -> RankScore:
    """Score an order (candidate ids, best first) of ``m``'s verified candidates; ``predicted``:
    the predicted times in the same order as ``order`` (for Kendall's tau)."""
    from scipy.stats import kendalltau

    times = {cid: t for cid, t in m.times.items() if cid in set(order)}
    best_id = min(times, key=times.get)
    best = times[best_id]
    top = tuple(order[:k])
    tau = None
    if predicted is not None and len(order) >= 2:
        res = kendalltau(np.asarray(predicted), np.array([times[c] for c in order]))
        tau = None if math.isnan(res.statistic) else float(res.statistic)
    return RankScore(matrix=m.name, family=m.family, candidates=len(order), recall=best_id in top,
                     near=any(times[c] <= best * (1 + tol) for c in top), regret=min(times[c] for c in top) / best,
                     tau=tau, best_id=best_id, picked=top)


def model_order(model: CostModel, m: MatrixMeasurements) -> tuple[list[str], list[float]]:
    """``m``'s verified template points, best predicted first, with their predictions."""
    pts = m.points()
    pred = model.predict_points(m.card, m.features, m.op, m.k, [(t, p) for _, t, p, _ in pts])
    idx = np.argsort(pred, kind="stable")
    return [pts[i][0] for i in idx], [float(pred[i]) for i in idx]


def null_order(m: MatrixMeasurements) -> list[str]:
    """``m``'s verified template points in the order a search without a cost model proposes them
    (:func:`null_sequence`)."""
    return null_sequence(m.card, m.features, m.op, m.k, [cid for cid, *_ in m.points()])


def null_sequence(card, features, op: Op | str, k: int | None, ids: Sequence[str]) -> list[str]:
    """``ids`` in the order a search without a cost model proposes them: the selector's choice,
    then every template's first seed, then the other seeds (the search loop's own code, null
    ranker); ids it never proposes as seeds follow in their given order."""
    from sparserl.kernels.templates.library import variant_point
    from sparserl.request.library import select_variant
    from sparserl.search.loop import SearchConfig, _Search
    from sparserl.search.ranker import Ranker
    from sparserl.search.space import CandidateSpace, select_templates

    op = Op(op)
    space = CandidateSpace(card, op, k, select_templates(op))
    state = _Search(SearchConfig(budget=10_000, seed_share=1.0), space, None, set(), Ranker())
    sel = None
    if features is not None:
        sel = (*variant_point(select_variant(features, op, k)), "selector")
    state.start([], sel)
    wanted, order = set(ids), []
    while True:
        p = state._next_seed()
        if p is None:
            break
        if p.id in wanted and p.id not in order:
            order.append(p.id)
    seen = set(order)
    return order + [cid for cid in ids if cid not in seen]


def score_model(model: CostModel, data: Sequence[MatrixMeasurements], k: int = K) -> list[RankScore]:
    out = []
    for m in data:
        if len(m.points()) >= 2:
            order, pred = model_order(model, m)
            out.append(rank_score(m, order, k, predicted=pred))
    return out


def score_null(data: Sequence[MatrixMeasurements], k: int = K) -> list[RankScore]:
    return [rank_score(m, null_order(m), k) for m in data if len(m.points()) >= 2]


def summary(scores: Sequence[RankScore]) -> dict:
    """Means over matrices: recall@k, near@k, regret@k (geometric), Kendall's tau."""
    if not scores:
        return {"matrices": 0}
    taus = [s.tau for s in scores if s.tau is not None]
    return {"matrices": len(scores), "recall": float(np.mean([s.recall for s in scores])),
            "near": float(np.mean([s.near for s in scores])),
            "regret_geomean": float(np.exp(np.mean([math.log(s.regret) for s in scores]))),
            "regret_max": float(max(s.regret for s in scores)),
            "kendall_tau": float(np.mean(taus)) if taus else None}


def leave_one_family_out(data: Sequence[MatrixMeasurements], cfg: TrainConfig,
                         fit: Callable = train, k: int = K) -> dict[str, list[RankScore]]:
    """Per trainable family: a model fitted on every other family's matrices, scored on this one's."""
    data, _ = trainable(data)
    out: dict[str, list[RankScore]] = {}
    for fam in sorted({m.family for m in data}):
        rest = [m for m in data if m.family != fam]
        model = fit(rest, cfg, where=f"every family but {fam}")
        out[fam] = score_model(model, [m for m in data if m.family == fam], k)
    return out


def score_split(train_on: Sequence[MatrixMeasurements], test_on: Sequence[MatrixMeasurements], cfg: TrainConfig,
                fit: Callable = train, k: int = K) -> list[RankScore]:
    """A model fitted on ``train_on`` (held-out families left out), scored on ``test_on``."""
    return score_model(fit(train_on, cfg, where="the training set"), test_on, k)


def as_json(scores: Sequence[RankScore]) -> list[dict]:
    return [asdict(s) for s in scores]


def name_group(name: str) -> str:
    """The group a matrix's name puts it in: its leading letters, lower-cased (``bcsstk29`` and
    ``bcsstk33`` -> ``bcsstk``; SuiteSparse names a collection's matrices alike), or the whole name
    when it starts with none (``1138_bus``)."""
    m = re.match(r"[A-Za-z]+", name)
    return m.group(0).lower() if m else name


def grouped_folds(names: Sequence[str], k: int) -> list[int]:
    """A fold in ``range(k)`` for each name, every group (:func:`name_group`) in one fold; groups go
    largest first, each to the fold with the fewest names so far (the lowest index on a tie), so the
    folds differ in size by at most the largest group and the split is the same on every run (pure)."""
    if k < 2:
        raise ValueError(f"need at least 2 folds, got {k}")
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        groups.setdefault(name_group(n), []).append(i)
    fold = [0] * len(names)
    sizes = [0] * k
    for _, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        f = min(range(k), key=lambda j: (sizes[j], j))
        for i in members:
            fold[i] = f
        sizes[f] += len(members)
    return fold


def cross_fit(train_on: Sequence[MatrixMeasurements], test_on: Sequence[MatrixMeasurements], folds: int,
              cfg: TrainConfig, fit: Callable = train, k: int = K,
              on_model: Callable[[int, object, list[str]], None] | None = None) -> list[RankScore]:
    """Each matrix of ``test_on`` scored by a model fitted on ``train_on`` and the other folds of
    ``test_on`` (:func:`grouped_folds`), never on its own fold: what fitting on real matrices gives
    on real matrices it has not seen. ``on_model(fold, model, names)`` is called with each fold's
    model and the names of the matrices it scores (to keep the models: a search on those matrices
    must use theirs)."""
    fold = grouped_folds([m.name for m in test_on], folds)
    scored_names = {m.name for m in test_on}
    train_on = [m for m in train_on if m.name not in scored_names]  # a scored matrix is never in its own fit
    out: list[RankScore] = []
    for f in range(folds):
        scored = [m for m, g in zip(test_on, fold) if g == f]
        if scored:
            rest = [m for m, g in zip(test_on, fold) if g != f]
            model = fit(list(train_on) + rest, cfg, where=f"the training set and {folds - 1} of {folds} folds")
            out += score_model(model, scored, k)
            if on_model is not None:
                on_model(f, model, [m.name for m in scored])
    return out
