"""A learned cost model: a candidate's predicted time on a matrix, from the matrix's card and
features and the candidate's template and parameters (:mod:`.cost_features`).

What it predicts: ``log(t / t_cuSPARSE)``, the log of the candidate's time over cuSPARSE's time
on the same matrix, op, k, GPU and regime. Within one matrix this orders candidates exactly as
their log time does (cuSPARSE's time is one constant per matrix), which is all a search needs;
across matrices it takes away what the size of the matrix alone explains, so the trees spend
their splits on what differs between candidates, and measurements from 10k-row and 4M-row
matrices, or from two GPUs, sit on one scale. ``benchmarks/cost_model_quality.py`` measures the
other choice (log time) beside it.

How: gradient-boosted trees (LightGBM, the ``search`` extra), fitted on the verified times of
the best-known store (:func:`store_measurements`) and of benchmark files
(:func:`load_measurements`, written by ``benchmarks/cost_model_data.py``). Matrices of the
held-out generator families (:data:`~sparserl.matrices.generators.HELD_OUT_FAMILIES`) are always
left out. Each matrix weighs the same in the fit, however many of its candidates were measured.

A model file is gzipped JSON: the booster's text, the feature layout it was trained on (names
and :data:`~.cost_features.FEATURE_LAYOUT`), its categories, and what it was trained on. A file
of another format version or another layout is refused with a one-line :class:`CostModelError`
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
FORMAT_VERSION = 1
"""Version of the model file's layout (the JSON around the booster)."""

TARGETS = ("ratio", "absolute", "rank")
"""``ratio``: log(t / t_cuSPARSE) (the default, see the module docstring); ``absolute``: log(t);
``rank``: a learning-to-rank fit (LambdaRank, one group per matrix) of :func:`rank_grade`, whose
score says only which candidate of a matrix is faster, not by how much."""

RANK_STEP = 1.03
"""One grade of :func:`rank_grade` per 3% slower than the matrix's fastest candidate."""
RANK_GRADES = 10
"""Grades 9 (within 3% of the fastest) down to 0 (about 31% slower, or more)."""

MIN_MEASUREMENTS = 200
"""Verified measurements a training set needs at least."""
MIN_MATRICES = 4
"""Matrices a training set needs at least (a model of fewer has seen too few structures)."""

NNZ_MARGIN = 4.0
"""A model applies to matrices of at most this factor fewer or more nonzeros than it was trained
on (a tree model does not extrapolate: past the sizes it saw, it predicts as at the nearest)."""

PACKAGED_MODEL = Path(__file__).resolve().parent / "data" / "cost_model.json.gz"
"""The model shipped with the package (trained from benchmark measurements)."""
USER_MODEL_FILE = "cost_model.json.gz"
"""File name of a user's own model under the harness cache root (``sparserl best cost-model``'s default)."""


class CostModelError(SparseRLError):
    """A cost model that cannot be used or trained (one line: what is wrong and what to do)."""


def user_model_path() -> Path:
    """``<harness cache root>/cost_model.json.gz`` ($SPARSERL_CACHE_DIR or ~/.cache/sparserl)."""
    from sparserl.harness.evaluator import HarnessConfig

    return HarnessConfig().root / USER_MODEL_FILE


def default_model_path() -> Path:
    """The user's own model when there is one, else the packaged one."""
    user = user_model_path()
    return user if user.is_file() else PACKAGED_MODEL


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
        times, failed = {}, {}
        for c in d["candidates"]:
            if c.get("ok") and c.get("time_us") is not None and c["time_us"] > 0:
                times[c["id"]] = float(c["time_us"])
            elif not c.get("ok"):
                failed[c["id"]] = str(c.get("verdict") or c.get("error_kind") or "failed")
        return cls(name=d["matrix"], family=d.get("family") or "unknown", op=d.get("op", "spmv"), k=d.get("k"),
                   arch=d.get("arch"), regime=d.get("regime", "cold"), card=MatrixCard.from_dict(d["card"]),
                   features=MatrixFeatures.from_dict(d["features"]) if d.get("features") else None,
                   cusparse_us=float(d["cusparse_us"]), times=times, failed=failed,
                   source=d.get("source") or source)


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
                if d is not None and d.get("cusparse_us") is not None:  # None: nothing verified (compile-only)
                    out.append(MatrixMeasurements.from_json(d, source=str(p)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CostModelError(f"{p}: not a measurements file (line {i}: {type(exc).__name__} {exc})") from None
    return out


def store_measurements(store, regime: str = "cold") -> list[MatrixMeasurements]:
    """The store's verified results in ``regime``, one entry per (matrix, op, k, arch, harness
    version); a candidate measured several times keeps its median, cuSPARSE its median too."""
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
        for r in rs:
            times.setdefault(r.candidate_id, []).append(r.time_us)
        from sparserl.matrices.generators import FAMILIES

        family = next((f for f in FAMILIES if m.name == f or m.name.startswith(f + "_")), "store")
        out.append(MatrixMeasurements(
            name=m.name, family=family, op=op, k=k, arch=arch, regime=regime, card=MatrixCard.from_dict(m.card),
            features=MatrixFeatures.from_dict(m.features) if m.features else None,
            cusparse_us=float(np.median([r.cusparse_us for r in rs])),
            times={c: float(np.median(v)) for c, v in times.items()}, source=str(store.path)))
    return out


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
    target: str = "ratio"
    """What is predicted: 'ratio' (log time over cuSPARSE's) or 'absolute' (log time)."""
    balance: bool = True
    """Weigh every matrix the same (else every measurement the same)."""
    seed: int = 0
    """Seed of the fit's random choices."""
    min_measurements: int = MIN_MEASUREMENTS
    """Refuse to train on fewer verified measurements."""
    min_matrices: int = MIN_MATRICES
    """Refuse to train on fewer matrices."""

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise SparseRLError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.trees < 1 or self.leaves < 2 or not self.learning_rate > 0 or self.min_child_samples < 1:
            raise SparseRLError("need trees >= 1, leaves >= 2, learning_rate > 0 and min_child_samples >= 1")
        if not 0.0 < self.feature_fraction <= 1.0:
            raise SparseRLError(f"feature_fraction must lie in (0, 1], got {self.feature_fraction}")


def target_of(m: MatrixMeasurements, t_us: float, target: str) -> float:
    return math.log(t_us / m.cusparse_us) if target == "ratio" else math.log(t_us)


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
        if target == "rank":
            best = min(t for *_, t in pts)
            ys.append([rank_grade(t, best) for *_, t in pts])
        else:
            ys.append([target_of(m, t, target) for *_, t in pts])
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
    """Fit a cost model on ``data`` (held-out families left out; too little data is a one-line error)."""
    lgb = _lightgbm()
    data, dropped = trainable(data)
    check_enough(data, cfg, where)
    vocab = cf.vocabulary()
    X, y, w = design(data, vocab, cfg.target, cfg.balance)
    names = list(cf.feature_names())
    params = {"objective": "regression", "num_leaves": cfg.leaves, "learning_rate": cfg.learning_rate,
              "min_child_samples": cfg.min_child_samples, "feature_fraction": cfg.feature_fraction,
              "seed": cfg.seed, "deterministic": True, "num_threads": 1, "verbose": -1,
              "min_data_per_group": 5, "cat_smooth": 5.0}
    ranking = {}
    if cfg.target == "rank":  # one query per matrix; every matrix counts once by construction
        params |= {"objective": "lambdarank", "lambdarank_truncation_level": 10, "label_gain": list(range(RANK_GRADES))}
        ranking = {"group": [len(m.points()) for m in data if m.points()]}
        w = None
    ds = lgb.Dataset(X, label=y, weight=w, feature_name=names, **ranking,
                     categorical_feature=[names.index(c) for c in cf.CATEGORICAL], free_raw_data=False)
    booster = lgb.train(params, ds, num_boost_round=cfg.trees)
    archs = sorted({m.arch for m in data if m.arch})
    meta = {"format": MODEL_FORMAT, "format_version": FORMAT_VERSION, "layout": cf.FEATURE_LAYOUT,
            "feature_names": names, "vocab": vocab, "target": cfg.target, "ops": sorted({m.op for m in data}),
            "archs": archs, "regimes": sorted({m.regime for m in data}),
            "trained_on": {"matrices": len(data), "measurements": int(y.size), "held_out_left_out": dropped,
                           "families": sorted({m.family for m in data}), "sources": list(sources),
                           "nnz_range": [min(m.card.nnz for m in data), max(m.card.nnz for m in data)]},
            "config": {k: getattr(cfg, k) for k in ("trees", "leaves", "learning_rate", "min_child_samples",
                                                    "feature_fraction", "balance", "seed")},
            "sparserl_version": _version(), "lightgbm_version": lgb.__version__}
    return CostModel(booster.model_to_string(), meta, booster)


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
    template point of one matrix, the predicted log time over cuSPARSE's (lower is faster)."""

    def __init__(self, booster_text: str, meta: dict[str, Any], booster=None):
        self.booster_text, self.meta = booster_text, meta
        self._booster = booster

    @property
    def booster(self):
        if self._booster is None:
            self._booster = _lightgbm().Booster(model_str=self.booster_text)
        return self._booster

    @property
    def target(self) -> str:
        return self.meta["target"]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Per row, lower is faster: the predicted log time (over cuSPARSE's, for ``ratio``), or for
        ``rank`` the negated ranking score."""
        if X.shape[0] == 0:
            return np.zeros(0)
        out = np.asarray(self.booster.predict(X, num_threads=1), dtype=np.float64)
        return -out if self.target == "rank" else out

    def predict_points(self, card: MatrixCard, features: MatrixFeatures | None, op: Op | str, k: int | None,
                       points: Sequence[tuple[str, Mapping[str, int]]]) -> np.ndarray:
        return self.predict(cf.rows(card, features, op, k, points, self.meta["vocab"]))

    def outside(self, card: MatrixCard) -> str | None:
        """Why the model does not apply to this matrix (its size lies more than
        :data:`NNZ_MARGIN` times outside the sizes it was trained on), or None when it does."""
        lo, hi = self.meta.get("trained_on", {}).get("nnz_range") or (0, math.inf)
        if lo / NNZ_MARGIN <= card.nnz <= hi * NNZ_MARGIN:
            return None
        return f"the cost model was trained on matrices of {lo}-{hi} nonzeros, this one has {card.nnz}"

    def describe(self) -> str:
        t = self.meta.get("trained_on", {})
        return (f"cost model ({self.meta['target']} target, {t.get('measurements', '?')} measurements on "
                f"{t.get('matrices', '?')} matrices, {', '.join(self.meta.get('archs') or ['?'])})")

    # -- files -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model (gzipped JSON when the name ends in .gz); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        blob = json.dumps(self.meta | {"booster": self.booster_text}, sort_keys=True)
        tmp = p.with_name(p.name + ".tmp")
        if p.suffix == ".gz":
            with open(tmp, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) as gz:
                gz.write(blob.encode())
        else:
            tmp.write_text(blob)
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a model file; another format version or feature layout, or no lightgbm, is a
        one-line :class:`CostModelError`."""
        p = Path(path)
        if not p.is_file():
            raise CostModelError(f"no cost model file at {p}")
        try:
            raw = p.read_bytes()
            blob = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except (OSError, ValueError, EOFError) as exc:
            raise CostModelError(f"{p}: not a cost model file ({type(exc).__name__})") from None
        if not isinstance(blob, dict) or blob.get("format") != MODEL_FORMAT or "booster" not in blob:
            raise CostModelError(f"{p}: not a cost model file")
        if blob.get("format_version") != FORMAT_VERSION:
            raise CostModelError(f"{p}: a cost model of another version (file format {blob.get('format_version')}, "
                                 f"this one reads {FORMAT_VERSION}): rebuild it with 'sparserl best cost-model'")
        names = list(cf.feature_names())
        if blob.get("layout") != cf.FEATURE_LAYOUT or blob.get("feature_names") != names:
            raise CostModelError(
                f"{p}: a cost model of another feature layout (layout {blob.get('layout')}, "
                f"{len(blob.get('feature_names') or [])} features; this version has layout {cf.FEATURE_LAYOUT}, "
                f"{len(names)}): rebuild it with 'sparserl best cost-model'")
        if blob.get("target") not in TARGETS:
            raise CostModelError(f"{p}: unknown cost model target {blob.get('target')!r}")
        booster_text = blob.pop("booster")
        model = cls(booster_text, blob)
        try:
            model.booster  # noqa: B018 (parse now: a damaged booster is this file's error, not the search's)
        except CostModelError:
            raise
        except Exception as exc:  # lightgbm's own parse errors
            raise CostModelError(f"{p}: the booster does not load ({type(exc).__name__})") from None
        return model
