"""A learned cost model: a candidate's predicted time on a matrix, from the matrix's card and
features and the candidate's template and parameters (:mod:`.cost_features`).

What it predicts (:data:`TARGETS`): by default (``blend``) a score whose order within one matrix
is the predicted order of its candidates' times, the sum of two fits: a learning-to-rank fit
(LambdaRank, one group per matrix) of how close each candidate comes to the matrix's fastest
(:func:`rank_grade`), and a regression of ``log(t / t_fastest)``, each over its typical spread
within a matrix, the regression weighing more (:attr:`TrainConfig.blend_rank_weight`). The
ranking fit looks at the top of each matrix's list, the regression at the whole of it; together
they put the fastest candidate of a family they were not fitted on in their top 5 more often
than either alone (``benchmarks/cost_model_quality.py``, leave one family out). The others:
``ratio``, ``log(t / t_cuSPARSE)`` (cuSPARSE's time is one constant per matrix, so within a
matrix it orders as the log time does, and measurements from 10k-row and 4M-row matrices sit on
one scale), ``absolute`` (log time), and ``rank`` and ``gap``, the two halves of ``blend``.

How: gradient-boosted trees (LightGBM, the ``search`` extra), fitted on the verified times of
the best-known store (:func:`store_measurements`) and of benchmark files
(:func:`load_measurements`, written by ``benchmarks/cost_model_data.py``). Matrices of the
held-out generator families (:data:`~sparserl.matrices.generators.HELD_OUT_FAMILIES`) are always
left out. Each matrix weighs the same in the fit, however many of its candidates were measured. A
model is fitted on the times of one GPU architecture (:func:`select_arch`; it has no feature to tell
two GPUs' times apart) and records it; a search on another GPU keeps the selector's order. A
measurements file whose lines are not measurements (not an object, a time that is not one, a
candidate listed twice) is a one-line :class:`CostModelError` naming the file and line.

Real matrices (SuiteSparse's, a store's: :data:`REAL_FAMILIES`) and generated ones pull a fit
different ways: added to the generated matrices, the 80 SuiteSparse ones lifted top-5 recall on
real matrices the fit had not seen from 0.57 to 0.90 (four folds by name) and lowered it on the
held-out generated families from 0.81 to 0.56, every loss but one on a matrix larger than any real
one (``benchmarks/results/2026-12-04/cost-model-real-folds/``). So when the data holds both, two
models are fitted (:attr:`TrainConfig.real_part`): one on every matrix, used for matrices no larger
than the largest real one (nor than the smallest generated one), and one on the generated matrices
alone for the larger ones.

A model file is gzipped JSON: the booster's text (a ``blend`` file adds the regression's booster,
the two weights and the two spreads), the feature layout it was trained on (names and
:data:`~.cost_features.FEATURE_LAYOUT`), its categories, what it was trained on, and, for a model
with a real part, that part as a nested model with the size it serves up to. Files of
format version 1 (one booster) and 2 still load. A file of another format version or another layout
is refused with a one-line :class:`CostModelError`
(the search then keeps the selector's order, see :mod:`.ranker`). The package ships one
(``search/data/cost_model.json.gz``); ``sparserl best cost-model`` rebuilds one from a user's
store, which the search then prefers.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.matrices.card import MatrixCard
from sparserl.matrices.features import MatrixFeatures
from sparserl.search import cost_features as cf

log = logging.getLogger(__name__)

MODEL_FORMAT = "sparserl-cost-model"
FORMAT_VERSION = 3
"""Version of the model file's layout (the JSON around the boosters); 2 added the ``blend`` part,
3 the real part (a nested model for matrices up to a size)."""
READS_VERSIONS = (1, 2, 3)
"""Format versions this one loads (a version 1 file is a one-booster model of any other target)."""

TARGETS = ("ratio", "absolute", "rank", "gap", "blend")
"""``ratio``: log(t / t_cuSPARSE); ``absolute``: log(t); ``rank``: a learning-to-rank fit
(LambdaRank, one group per matrix) of :func:`rank_grade`, whose score says only which candidate of
a matrix is faster, not by how much; ``gap``: log(t / t_fastest), the candidate's time over its
matrix's fastest; ``blend`` (the default): ``rank`` and ``gap`` summed (see the module docstring)."""

RANK_GAINS = ("linear", "exponential")
"""The gain of a :func:`rank_grade` g in the ranking fit's NDCG: g, or 2**g - 1 (the fastest
grades count far more than the middle ones)."""

RANK_STEP = 1.03
"""One grade of :func:`rank_grade` per 3% slower than the matrix's fastest candidate."""
RANK_GRADES = 10
"""Grades 9 (within 3% of the fastest) down to 0 (about 31% slower, or more)."""

MIN_MEASUREMENTS = 200
"""Verified measurements a training set needs at least."""
MIN_MATRICES = 4
"""Matrices a training set needs at least (a model of fewer has seen too few structures)."""

MIN_TIME_US = 0.1
"""The shortest time a measurements file may record, in us: no kernel runs on a GPU in less (a launch
alone takes about a microsecond; the shortest of the benchmark files is 4 us). A shorter one is not a
measurement."""

NNZ_MARGIN = 4.0
"""A model applies to matrices of at most this factor fewer or more nonzeros than it was trained
on (a tree model does not extrapolate: past the sizes it saw, it predicts as at the nearest)."""

REAL_FAMILIES = ("suitesparse", "store")
"""The families of real matrices (a SuiteSparse collection's, a user's store's): see :attr:`TrainConfig.real_part`."""

MODEL_FILES = {Op.SPMV: "cost_model.json.gz", Op.SPMM: "cost_model_spmm.json.gz"}
"""File name of each operator's model: one model per operator (a fit on both ranks each worse than
its own: ``benchmarks/results/2026-12-04/cost-model-spmm/``). The same names serve the packaged
models (``search/data/``) and a user's own (under the harness cache root)."""
PACKAGED_DIR = Path(__file__).resolve().parent / "data"
PACKAGED_MODEL = PACKAGED_DIR / MODEL_FILES[Op.SPMV]
"""The SpMV model shipped with the package (trained from benchmark measurements)."""
USER_MODEL_FILE = MODEL_FILES[Op.SPMV]
"""File name of a user's own SpMV model under the harness cache root (``sparserl best cost-model``'s default)."""


class CostModelError(SparseRLError):
    """A cost model that cannot be used or trained (one line: what is wrong and what to do)."""


def _check_model_blob(blob: Any, p: Path) -> None:
    """Refuse what is no cost model at all (its version and layout are the loader's to judge)."""
    if not isinstance(blob, dict) or blob.get("format") != MODEL_FORMAT or "booster" not in blob:
        raise CostModelError(f"{p}: not a cost model file")


def read_model_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A cost model file's JSON (gzipped or not); a missing file, or one that is no cost model at all, is a
    one-line :class:`CostModelError` (another version or feature layout is :meth:`CostModel.load`'s to refuse)."""
    p = Path(path)
    if not p.is_file():
        raise CostModelError(f"no cost model file at {p}")
    try:
        raw = p.read_bytes()
        blob = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, ValueError, EOFError) as exc:
        raise CostModelError(f"{p}: not a cost model file ({type(exc).__name__})") from None
    _check_model_blob(blob, p)
    return blob


def user_model_path(op: Op | str = Op.SPMV) -> Path:
    """``<harness cache root>/cost_model.json.gz`` for SpMV, ``cost_model_spmm.json.gz`` for SpMM
    ($SPARSERL_CACHE_DIR or ~/.cache/sparserl)."""
    from sparserl.harness.evaluator import HarnessConfig

    return HarnessConfig().root / MODEL_FILES[Op(op)]


def packaged_model_path(op: Op | str = Op.SPMV) -> Path:
    """Where the package keeps its model for ``op`` (the file may be absent: no model shipped)."""
    return PACKAGED_DIR / MODEL_FILES[Op(op)]


def default_model_path(op: Op | str = Op.SPMV) -> Path:
    """The user's own model for ``op`` when there is one, else the packaged one."""
    user = user_model_path(op)
    return user if user.is_file() else packaged_model_path(op)


# ---------------------------------------------------------------------------------------------
# measurements


@dataclass(frozen=True)
class MatrixMeasurements:
    """The verified times of candidates on one matrix, op, k, GPU architecture and regime."""

    name: str
    family: str
    """Generator family, ``suitesparse``, or ``store`` (a user's matrix of unknown origin)."""
    op: str
    k: int | None
    arch: str | None
    regime: str
    card: MatrixCard
    features: MatrixFeatures | None
    """None for a store matrix recorded before the store kept features (those columns are missing)."""
    cusparse_us: float
    times: dict[str, float]
    """Candidate id -> median time in us, verified candidates only."""
    failed: dict[str, str] = field(default_factory=dict)
    """Candidate id -> verdict, for candidates that were not verified (not trained on; kept for reports)."""
    source: str = ""
    """Where the measurements come from (a file or a store)."""

    def points(self) -> list[tuple[str, str, dict[str, int], float]]:
        """(id, template, params, time) of every verified template point of this op (free text left out)."""
        from sparserl.search.space import parse_candidate_id

        out = []
        for cid, t in self.times.items():
            parsed = parse_candidate_id(cid)
            if parsed is not None and parsed[0] == self.op:
                out.append((cid, parsed[1], parsed[2], t))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"matrix": self.name, "family": self.family, "op": self.op, "k": self.k, "arch": self.arch,
                "regime": self.regime, "rows": self.card.rows, "cols": self.card.cols, "nnz": self.card.nnz,
                "cusparse_us": self.cusparse_us, "card": self.card.to_dict(),
                "features": self.features.to_dict() if self.features is not None else None,
                "candidates": [{"id": c, "ok": True, "time_us": t} for c, t in self.times.items()]
                + [{"id": c, "ok": False, "verdict": v} for c, v in self.failed.items()],
                "source": self.source}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], source: str = "") -> MatrixMeasurements:
        """One matrix's record; a time that is not a measurement (not a number, or below
        :data:`MIN_TIME_US`), a verified candidate without its time, or a candidate listed twice is a
        one-line :class:`CostModelError`."""
        cusparse_us = _time_us(d["cusparse_us"], "cusparse_us")
        times, failed = {}, {}
        for c in d["candidates"]:
            if not isinstance(c, dict):
                raise CostModelError(f"a candidate that is not a JSON object: {str(c)[:60]}")
            if c["id"] in times or c["id"] in failed:
                raise CostModelError(f"candidate {c['id']} is listed twice (which time is its?)")
            if c.get("ok"):
                times[c["id"]] = _time_us(c.get("time_us"), f"time_us of {c['id']}")
            else:
                failed[c["id"]] = str(c.get("verdict") or c.get("error_kind") or "failed")
        return cls(name=d["matrix"], family=d.get("family") or "unknown", op=d.get("op", "spmv"), k=d.get("k"),
                   arch=d.get("arch"), regime=d.get("regime", "cold"), card=MatrixCard.from_dict(d["card"]),
                   features=MatrixFeatures.from_dict(d["features"]) if d.get("features") else None,
                   cusparse_us=cusparse_us, times=times, failed=failed,
                   source=d.get("source") or source)


def _time_us(v: Any, what: str) -> float:
    """``v`` as a measured time in us, or a one-line :class:`CostModelError` saying why it is not one."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < MIN_TIME_US:
        raise CostModelError(f"{what} is {v!r}, not a measured time (a number of microseconds, at least "
                             f"{MIN_TIME_US:g})")
    return float(v)


def load_measurements(path: str | os.PathLike[str]) -> list[MatrixMeasurements]:
    """The matrices of a measurements file (JSON lines, one matrix each, as
    ``benchmarks/cost_model_data.py`` writes them; ``.gz`` read as gzip)."""
    p = Path(path)
    if not p.is_file():
        raise CostModelError(f"no measurements file at {p}")
    opener = gzip.open if p.suffix == ".gz" else open
    out, i = [], 0
    try:
        with opener(p, "rt") as fh:
            for i, line in enumerate(fh, 1):
                d = json.loads(line) if line.strip() else None
                if d is not None and not isinstance(d, dict):
                    raise CostModelError(f"a {type(d).__name__}, not a JSON object (one matrix's measurements)")
                if d is not None and d.get("cusparse_us") is not None:  # None: nothing verified (compile-only)
                    out.append(MatrixMeasurements.from_json(d, source=str(p)))
    except CostModelError as exc:
        raise CostModelError(f"{p}: line {i}: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CostModelError(f"{p}: not a measurements file (line {i}: {type(exc).__name__} {exc})") from None
    return out


def _point_of_text(store, r, card: MatrixCard) -> str | None:
    """The candidate id of the point of template ``r.template`` whose kernel result ``r``'s text is on ``card``
    (:func:`sparserl.eval.library_match.template_point`), or None (no such point, a template this version
    does not know)."""
    from sparserl.eval.library_match import template_point
    from sparserl.kernels.templates import get_template

    try:
        t = get_template(r.op, r.template)
    except (SparseRLError, ValueError):
        return None
    found = template_point(store.kernel_text(r.kernel_sha), r.op, [t], card, r.k if r.op == "spmm" else None)
    return found[0].candidate(found[1]).id if found is not None else None


def store_measurements(store, regime: str = "cold") -> list[MatrixMeasurements]:
    """The store's verified results in ``regime``, one entry per (matrix, op, k, arch, harness
    version); a candidate measured several times keeps its median, cuSPARSE its median too. A free-text
    kernel that the search read as a template point's (a policy's, stored under its text's id with the
    template's name) counts under that point's id too, found again from its text and the matrix's card:
    it is that point's kernel, and its time that point's measurement."""
    groups: dict[tuple, list] = {}
    for r in store.results(regime=regime):
        if r.candidate_id:
            groups.setdefault((r.fingerprint, r.op, r.k, r.arch, r.harness_version), []).append(r)
    out = []
    for (fp, op, k, arch, _), rs in groups.items():
        m = store.matrix(fp)
        if m is None:
            continue
        times: dict[str, list[float]] = {}
        card = MatrixCard.from_dict(m.card)
        for r in rs:
            times.setdefault(r.candidate_id, []).append(r.time_us)
            point = _point_of_text(store, r, card) if r.candidate_id.startswith("text/") and r.template else None
            if point is not None:
                times.setdefault(point, []).append(r.time_us)
        from sparserl.matrices.generators import FAMILIES

        family = next((f for f in FAMILIES if m.name == f or m.name.startswith(f + "_")), "store")
        out.append(MatrixMeasurements(
            name=m.name, family=family, op=op, k=k, arch=arch, regime=regime, card=card,
            features=MatrixFeatures.from_dict(m.features) if m.features else None,
            cusparse_us=float(np.median([r.cusparse_us for r in rs])),
            times={c: float(np.median(v)) for c, v in times.items()}, source=str(store.path)))
    return out


def archs_of(data: Iterable[MatrixMeasurements]) -> list[str]:
    """The GPU architectures ``data`` was measured on, sorted (a measurement of unknown architecture: none)."""
    return sorted({m.arch for m in data if m.arch and m.arch != "unknown"})


def select_arch(data: Sequence[MatrixMeasurements], arch: str | None = None,
                where: str = "the training data") -> list[MatrixMeasurements]:
    """The measurements of ``arch`` (those of unknown architecture too); ``arch`` None: all of them,
    which must then be of one architecture. Times of one matrix on two GPUs disagree, and the model has no
    feature to tell them apart: several architectures, or none of ``arch``, is a one-line :class:`CostModelError`."""
    archs = archs_of(data)
    if arch is None:
        if len(archs) > 1:
            raise CostModelError(f"{where}: measurements of {len(archs)} GPU architectures ({', '.join(archs)}); "
                                 "a cost model is fitted on one: choose it with --arch")
        return list(data)
    if archs and arch not in archs:
        raise CostModelError(f"{where}: no measurements of {arch} (only of {', '.join(archs)})")
    return [m for m in data if m.arch in (arch, None, "unknown")]


def trainable(data: Iterable[MatrixMeasurements]) -> tuple[list[MatrixMeasurements], int]:
    """The matrices a model may be fitted on (held-out families left out), and how many were left out."""
    from sparserl.matrices.generators import is_held_out

    keep, dropped = [], 0
    for m in data:
        if is_held_out(m.name) or is_held_out(m.family):
            dropped += 1
        else:
            keep.append(m)
    return keep, dropped


# ---------------------------------------------------------------------------------------------
# training


@dataclass(frozen=True)
class TrainConfig:
    """How a cost model is fitted."""

    trees: int = 200
    """Boosting rounds."""
    leaves: int = 15
    """Leaves per tree."""
    learning_rate: float = 0.05
    """Shrinkage per round."""
    min_child_samples: int = 5
    """Fewest measurements in a leaf."""
    feature_fraction: float = 0.8
    """Share of the features each tree may split on."""
    target: str = "blend"
    """What is predicted, one of :data:`TARGETS` (see the module docstring)."""
    rank_truncation: int = 20
    """LambdaRank's truncation level: the positions of a matrix's predicted list whose swaps the
    ranking fit weighs (``rank`` and ``blend``)."""
    rank_gain: str = "exponential"
    """The gain of a grade in the ranking fit's NDCG, one of :data:`RANK_GAINS`."""
    blend_rank_weight: float = 0.3
    """``blend``: the ranking fit's weight (the regression of log(t / t_fastest) has the rest), each
    fit's score divided first by its mean spread (standard deviation) within a training matrix."""
    balance: bool = True
    """Weigh every matrix the same (else every measurement the same)."""
    seed: int = 0
    """Seed of the fit's random choices."""
    min_measurements: int = MIN_MEASUREMENTS
    """Refuse to train on fewer verified measurements."""
    min_matrices: int = MIN_MATRICES
    """Refuse to train on fewer matrices."""
    real_part: bool = True
    """When the data holds real matrices (:data:`REAL_FAMILIES`) and enough generated ones to fit on
    alone, some larger than every real one, fit a second model on every matrix for the matrices no
    larger than the largest real one (nor than the smallest generated one), the first on the generated
    ones alone for the larger (the module docstring says why); else one model on all."""

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise SparseRLError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.min_measurements < 1 or self.min_matrices < 1:
            raise SparseRLError("need min_measurements >= 1 and min_matrices >= 1")
        if self.trees < 1 or self.leaves < 2 or not self.learning_rate > 0 or self.min_child_samples < 1:
            raise SparseRLError("need trees >= 1, leaves >= 2, learning_rate > 0 and min_child_samples >= 1")
        if not 0.0 < self.feature_fraction <= 1.0:
            raise SparseRLError(f"feature_fraction must lie in (0, 1], got {self.feature_fraction}")
        if self.rank_gain not in RANK_GAINS or self.rank_truncation < 1:
            raise SparseRLError(f"need rank_gain in {RANK_GAINS} and rank_truncation >= 1")
        if not 0.0 <= self.blend_rank_weight <= 1.0:
            raise SparseRLError(f"blend_rank_weight must lie in [0, 1], got {self.blend_rank_weight}")


def target_of(m: MatrixMeasurements, t_us: float, target: str, best_us: float | None = None) -> float:
    """The regression target of a candidate of time ``t_us`` on ``m`` (``best_us``: ``m``'s fastest, for ``gap``)."""
    if target == "ratio":
        return math.log(t_us / m.cusparse_us)
    if target == "gap":
        return math.log(t_us / best_us)
    return math.log(t_us)


def rank_grade(t_us: float, best_us: float) -> int:
    """The relevance of a candidate of time ``t_us`` on a matrix whose fastest took ``best_us``:
    ``RANK_GRADES - 1`` for the fastest and anything within 3% of it, one less per further 3%, 0 at last."""
    steps = math.floor(math.log(t_us / best_us) / math.log(RANK_STEP) + 1e-9)
    return max(0, RANK_GRADES - 1 - steps)


def design(data: Sequence[MatrixMeasurements], vocab: Mapping[str, Sequence[str]], target: str,
           balance: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, targets, weights) of every verified template point of ``data``."""
    xs, ys, ws = [], [], []
    for m in data:
        pts = m.points()
        if not pts:
            continue
        xs.append(cf.rows(m.card, m.features, m.op, m.k, [(t, p) for _, t, p, _ in pts], vocab))
        best = min(t for *_, t in pts)
        if target == "rank":
            ys.append([rank_grade(t, best) for *_, t in pts])
        else:
            ys.append([target_of(m, t, target, best) for *_, t in pts])
        ws.append(np.full(len(pts), 1.0 / len(pts) if balance else 1.0))
    if not xs:
        return np.zeros((0, len(cf.feature_names()))), np.zeros(0), np.zeros(0)
    w = np.concatenate(ws)
    return np.concatenate(xs), np.concatenate(ys), w * (w.size / w.sum())


def _lightgbm():
    try:
        import lightgbm
    except ImportError:
        raise CostModelError("lightgbm is not installed (pip install 'sparserl[search]')") from None
    return lightgbm


def check_enough(data: Sequence[MatrixMeasurements], cfg: TrainConfig, where: str) -> None:
    """A one-line error when ``data`` is too small to train on (says how much is needed)."""
    n = sum(len(m.points()) for m in data)
    mats = sum(1 for m in data if m.points())
    if n < cfg.min_measurements or mats < cfg.min_matrices:
        raise CostModelError(f"{where}: {n} verified measurements on {mats} matrices; training a cost model needs "
                             f"at least {cfg.min_measurements} on {cfg.min_matrices} matrices (search more "
                             f"matrices, or add benchmark measurements with --data)")


def train(data: Sequence[MatrixMeasurements], cfg: TrainConfig = TrainConfig(), where: str = "the training data",
          sources: Sequence[str] = ()) -> CostModel:
    """Fit a cost model on ``data`` (held-out families left out; too little data, or data of several GPU
    architectures (:func:`select_arch`), is a one-line error)."""
    lgb = _lightgbm()
    data, dropped = trainable(select_arch(data, where=where))
    check_enough(data, cfg, where)
    real = [m for m in data if m.family in REAL_FAMILIES]
    generated = [m for m in data if m.family not in REAL_FAMILIES]
    real_top = max((m.card.nnz for m in real), default=0)
    if cfg.real_part and real and generated and max(m.card.nnz for m in generated) > real_top:
        try:
            check_enough(generated, cfg, f"{where} (its generated matrices)")
        except CostModelError as exc:
            log.info("one model on every matrix: %s", exc)
        else:
            # the real part ranks up to the largest real matrix, and below the generated ones' sizes
            return _train_one(lgb, generated, dropped, cfg, sources).with_real_part(
                _train_one(lgb, data, dropped, cfg, sources), max(real_top, min(m.card.nnz for m in generated)))
    return _train_one(lgb, data, dropped, cfg, sources)


def _train_one(lgb, data: Sequence[MatrixMeasurements], dropped: int, cfg: TrainConfig,
               sources: Sequence[str]) -> CostModel:
    """One model fitted on ``data`` (trainable, checked; ``dropped``: the held-out matrices left out of it)."""
    vocab = cf.vocabulary()
    blend = None
    if cfg.target == "blend":
        booster, X, groups = _fit(lgb, data, vocab, cfg, "rank")
        gap, _, _ = _fit(lgb, data, vocab, cfg, "gap")
        scales = [_spread(-booster.predict(X, num_threads=1), groups), _spread(gap.predict(X, num_threads=1), groups)]
        blend = {"weights": [cfg.blend_rank_weight, 1.0 - cfg.blend_rank_weight], "scales": scales}
    else:
        booster, X, groups = _fit(lgb, data, vocab, cfg, cfg.target)
        gap = None
    archs = archs_of(data)
    meta = {"format": MODEL_FORMAT, "format_version": FORMAT_VERSION, "layout": cf.FEATURE_LAYOUT,
            "feature_names": list(cf.feature_names()), "vocab": vocab, "target": cfg.target,
            "ops": sorted({m.op for m in data}), "archs": archs, "regimes": sorted({m.regime for m in data}),
            "trained_on": {"matrices": len(data), "measurements": int(X.shape[0]), "held_out_left_out": dropped,
                           "families": sorted({m.family for m in data}), "sources": list(sources),
                           "nnz_range": [min(m.card.nnz for m in data), max(m.card.nnz for m in data)]},
            "config": {k: getattr(cfg, k) for k in ("trees", "leaves", "learning_rate", "min_child_samples",
                                                    "feature_fraction", "balance", "seed", "rank_truncation",
                                                    "rank_gain", "blend_rank_weight")},
            "sparserl_version": _version(), "lightgbm_version": lgb.__version__}
    if blend is not None:
        meta["blend"] = blend
    return CostModel(booster.model_to_string(), meta, booster,
                     gap_text=gap.model_to_string() if gap is not None else None, gap_booster=gap)


def _fit(lgb, data: Sequence[MatrixMeasurements], vocab: Mapping[str, Sequence[str]], cfg: TrainConfig,
         target: str):
    """One booster fitted on ``data`` for one target (not ``blend``); with its rows and the number of
    rows of each matrix."""
    X, y, w = design(data, vocab, target, cfg.balance)
    names = list(cf.feature_names())
    groups = [len(m.points()) for m in data if m.points()]
    params = {"objective": "regression", "num_leaves": cfg.leaves, "learning_rate": cfg.learning_rate,
              "min_child_samples": cfg.min_child_samples, "feature_fraction": cfg.feature_fraction,
              "seed": cfg.seed, "deterministic": True, "num_threads": 1, "verbose": -1,
              "min_data_per_group": 5, "cat_smooth": 5.0}
    ranking = {}
    if target == "rank":  # one query per matrix; every matrix counts once by construction
        gains = [g if cfg.rank_gain == "linear" else 2**g - 1 for g in range(RANK_GRADES)]
        params |= {"objective": "lambdarank", "lambdarank_truncation_level": cfg.rank_truncation, "label_gain": gains}
        ranking = {"group": groups}
        w = None
    ds = lgb.Dataset(X, label=y, weight=w, feature_name=names, **ranking,
                     categorical_feature=[names.index(c) for c in cf.CATEGORICAL], free_raw_data=False)
    return lgb.train(params, ds, num_boost_round=cfg.trees), X, groups


def _spread(pred: np.ndarray, groups: Sequence[int]) -> float:
    """The mean over matrices of the standard deviation of a fit's scores within one matrix (the
    unit a ``blend`` divides that fit's score by; 1.0 where every matrix's scores tie)."""
    sds = [float(np.std(part)) for part in np.split(pred, np.cumsum(groups)[:-1]) if part.size]
    spread = float(np.mean(sds)) if sds else 0.0
    return spread if spread > 0 else 1.0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sparserl")
    except Exception:  # not installed as a distribution (a source checkout on PYTHONPATH)
        return "unknown"


# ---------------------------------------------------------------------------------------------
# the model


class CostModel:
    """A fitted cost model (see the module docstring): :meth:`predict_points` gives, per
    template point of one matrix, a score whose order is the predicted order of their times
    (lower is faster).

    ``booster_text``: the booster of the model's target (of ``rank``, for ``blend``);
    ``gap_text``: for ``blend``, the booster of ``gap``."""

    def __init__(self, booster_text: str, meta: dict[str, Any], booster=None, gap_text: str | None = None,
                 gap_booster=None, real_part: CostModel | None = None):
        self.booster_text, self.meta, self.gap_text = booster_text, meta, gap_text
        self._booster, self._gap = booster, gap_booster
        self.real_part = real_part
        """The model fitted with real matrices too, for matrices of at most ``meta["real_part_max_nnz"]``
        nonzeros (:attr:`TrainConfig.real_part`); None: this model serves every size."""

    def with_real_part(self, part: CostModel, max_nnz: int) -> CostModel:
        """This model (the generated matrices' fit) with ``part`` (every matrix's) serving the
        matrices of at most ``max_nnz`` nonzeros; returns self."""
        self.real_part = part
        self.meta["real_part_max_nnz"] = int(max_nnz)
        return self

    def part_for(self, card: MatrixCard) -> CostModel:
        """The model that ranks this matrix's candidates: the real part up to its size, else this one."""
        if self.real_part is not None and card.nnz <= self.meta["real_part_max_nnz"]:
            return self.real_part
        return self

    @property
    def booster(self):
        if self._booster is None:
            self._booster = _lightgbm().Booster(model_str=self.booster_text)
        return self._booster

    @property
    def gap_booster(self):
        if self._gap is None and self.gap_text is not None:
            self._gap = _lightgbm().Booster(model_str=self.gap_text)
        return self._gap

    @property
    def target(self) -> str:
        return self.meta["target"]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Per row, lower is faster: the predicted log time (over cuSPARSE's, for ``ratio``; over
        the matrix's fastest, for ``gap``), for ``rank`` the negated ranking score, for ``blend``
        the weighted sum of the two fits' scores, each over its spread (pointwise: a row's score
        does not depend on the other rows)."""
        if X.shape[0] == 0:
            return np.zeros(0)
        out = np.asarray(self.booster.predict(X, num_threads=1), dtype=np.float64)
        if self.target == "blend":
            (w_rank, w_gap), (s_rank, s_gap) = self.meta["blend"]["weights"], self.meta["blend"]["scales"]
            gap = np.asarray(self.gap_booster.predict(X, num_threads=1), dtype=np.float64)
            return w_rank * -out / s_rank + w_gap * gap / s_gap
        return -out if self.target == "rank" else out

    def predict_points(self, card: MatrixCard, features: MatrixFeatures | None, op: Op | str, k: int | None,
                       points: Sequence[tuple[str, Mapping[str, int]]]) -> np.ndarray:
        part = self.part_for(card)
        return part.predict(cf.rows(card, features, op, k, points, part.meta["vocab"]))

    @property
    def archs(self) -> list[str]:
        """The GPU architectures the model (and its real part) was fitted on; empty when unknown."""
        part = self.real_part.archs if self.real_part is not None else []
        return sorted(set(self.meta.get("archs") or []) | set(part))

    def other_arch(self, arch: str | None) -> str | None:
        """Why the model does not apply on a GPU of ``arch`` (it was fitted on another architecture's
        times), or None when it does, or either is unknown."""
        if arch is None or arch == "unknown" or not self.archs or arch in self.archs:
            return None
        return f"the cost model was fitted on {', '.join(self.archs)} measurements, this GPU is {arch}"

    def size(self) -> tuple[int, int, list[str]]:
        """(measurements, matrices, families) it was fitted on, its real part counted (which holds them all)."""
        parts = [self] + ([self.real_part] if self.real_part is not None else [])
        t = [p.meta.get("trained_on", {}) for p in parts]
        return (max(x.get("measurements", 0) for x in t), max(x.get("matrices", 0) for x in t),
                sorted({f for x in t for f in x.get("families", ())}))

    def outside(self, card: MatrixCard) -> str | None:
        """Why the model does not apply to this matrix (its size lies more than
        :data:`NNZ_MARGIN` times outside the sizes its part for it (:meth:`part_for`) was trained on),
        or None when it does."""
        part = self.part_for(card)
        lo, hi = part.meta.get("trained_on", {}).get("nnz_range") or (0, math.inf)
        if lo / NNZ_MARGIN <= card.nnz <= hi * NNZ_MARGIN:
            return None
        return f"the cost model was trained on matrices of {lo}-{hi} nonzeros, this one has {card.nnz}"

    def describe(self) -> str:
        t = self.meta.get("trained_on", {})
        real = ""
        if self.real_part is not None:
            r = self.real_part.meta.get("trained_on", {})
            real = (f"; up to {self.meta['real_part_max_nnz']} nonzeros, a model fitted with real matrices too "
                    f"({r.get('matrices', '?')} matrices)")
        return (f"cost model ({self.meta['target']} target, {t.get('measurements', '?')} measurements on "
                f"{t.get('matrices', '?')} matrices, {', '.join(self.meta.get('archs') or ['?'])}{real})")

    # -- files -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model (gzipped JSON when the name ends in .gz); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        blob = json.dumps(self._blob(), sort_keys=True)
        tmp = p.with_name(p.name + ".tmp")
        if p.suffix == ".gz":
            with open(tmp, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) as gz:
                gz.write(blob.encode())
        else:
            tmp.write_text(blob)
        os.replace(tmp, p)
        return p

    def _blob(self) -> dict[str, Any]:
        extra = {"gap_booster": self.gap_text} if self.gap_text is not None else {}
        if self.real_part is not None:
            extra["real_part"] = self.real_part._blob()
        return self.meta | {"booster": self.booster_text} | extra

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a model file; another format version or feature layout, or no lightgbm, is a
        one-line :class:`CostModelError`."""
        p = Path(path)
        return cls._from_blob(read_model_file(p), p)

    @classmethod
    def _from_blob(cls, blob: Any, p: Path) -> CostModel:
        """A model from a file's JSON (``p`` names the file in errors); a real part is read the same way."""
        _check_model_blob(blob, p)
        if blob.get("format_version") not in READS_VERSIONS:
            raise CostModelError(f"{p}: a cost model of another version (file format {blob.get('format_version')}, "
                                 f"this one reads {', '.join(map(str, READS_VERSIONS))}): rebuild it with "
                                 f"'sparserl best cost-model'")
        names = list(cf.feature_names())
        if blob.get("layout") != cf.FEATURE_LAYOUT or blob.get("feature_names") != names:
            raise CostModelError(
                f"{p}: a cost model of another feature layout (layout {blob.get('layout')}, "
                f"{len(blob.get('feature_names') or [])} features; this version has layout {cf.FEATURE_LAYOUT}, "
                f"{len(names)}): rebuild it with 'sparserl best cost-model'")
        if blob.get("target") not in TARGETS:
            raise CostModelError(f"{p}: unknown cost model target {blob.get('target')!r}")
        blend = blob.get("blend") if blob["target"] == "blend" else None
        if blob["target"] == "blend" and not (
                isinstance(blob.get("gap_booster"), str) and isinstance(blend, dict)
                and all(isinstance(blend.get(k), list) and len(blend[k]) == 2 for k in ("weights", "scales"))):
            raise CostModelError(f"{p}: a blend cost model without its second booster, weights or scales")
        booster_text, gap_text = blob.pop("booster"), blob.pop("gap_booster", None)
        real = blob.pop("real_part", None)
        if real is not None and not isinstance(blob.get("real_part_max_nnz"), int):
            raise CostModelError(f"{p}: a cost model with a real part but no size it serves up to")
        model = cls(booster_text, blob, gap_text=gap_text,
                    real_part=cls._from_blob(real, p) if real is not None else None)
        try:
            model.booster  # noqa: B018 (parse now: a damaged booster is this file's error, not the search's)
            model.gap_booster  # noqa: B018
        except CostModelError:
            raise
        except Exception as exc:  # lightgbm's own parse errors
            raise CostModelError(f"{p}: the booster does not load ({type(exc).__name__})") from None
        return model
