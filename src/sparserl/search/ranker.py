"""The order a search tries candidates in: today's order, or the one a cost model predicts.

A :class:`Ranker` answers two questions for the search loop (:mod:`.loop`):

* :meth:`~Ranker.best_points`: the points of the whole space it would try first, best first,
  one per template (the loop takes the first few that the matrix accepts, right after the
  store's best and the selector's choice): the best predicted point of each template, templates
  by their best prediction. Points whose storage the card already shows the converter will
  refuse (DIA with too many diagonals, ELL with too long a row, BSR blocks too empty, by the
  converters' fill limit) are not picked: the model never sees refusals, so it cannot know;
* :meth:`~Ranker.order`: a permutation of a list of points (seeds of a template, a parent's
  neighbours and switches), best first.

The base class is the null ranker: no picks, every list kept as given, so a search with it
proposes exactly what it proposed before there was a cost model. :class:`ModelRanker` asks a
:class:`~.cost_model.CostModel`. :func:`make_ranker` turns a search's ``cost_model`` setting
into one, falling back to the null ranker with one logged line when the model cannot be used
(missing lightgbm, a file of another version or feature layout, an op or a GPU architecture it was
not trained on), and quietly (an info line) for a matrix far outside the sizes the model was trained on.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from sparserl.kernels.contract import Op
from sparserl.matrices.card import MatrixCard
from sparserl.matrices.features import MatrixFeatures

log = logging.getLogger(__name__)

Point = tuple[str | None, Mapping[str, int] | None]
"""(template name, parameters); (None, None) for free text, which no ranker scores."""


class Ranker:
    """The null ranker: today's order (see the module docstring)."""

    name = "none"

    def best_points(self, space) -> Iterator[tuple[str, dict[str, int]]]:
        """Points of ``space`` (a :class:`~.space.CandidateSpace`) to try first, best first."""
        return iter(())

    def order(self, points: Sequence[Point]) -> list[int]:
        """Indices of ``points``, best first (stable: ties keep their given order)."""
        return list(range(len(points)))

    def note(self, template: str, params: Mapping[str, int]) -> str:
        """What the ranker predicts for a point, for the trace."""
        return ""


class ModelRanker(Ranker):
    """Orders by a cost model's predicted time for one matrix, op and k (scores cached per point)."""

    name = "cost-model"

    def __init__(self, model, card: MatrixCard, features: MatrixFeatures | None, op: Op | str, k: int | None):
        self.model, self.card, self.features, self.op, self.k = model, card, features, Op(op), k
        self._scores: dict[tuple, float] = {}

    @staticmethod
    def _key(template: str, params: Mapping[str, int]) -> tuple:
        return template, tuple(sorted(params.items()))

    def scores(self, points: Sequence[Point]) -> np.ndarray:
        """The model's score of each point (lower is faster, see :meth:`.CostModel.predict`); +inf for free text.
        One batch for the points not scored before."""
        todo = [(t, p) for t, p in points if t is not None and self._key(t, p) not in self._scores]
        todo = list({self._key(t, p): (t, dict(p)) for t, p in todo}.values())
        if todo:
            pred = self.model.predict_points(self.card, self.features, self.op, self.k, todo)
            for (t, p), v in zip(todo, pred):
                self._scores[self._key(t, p)] = float(v)
        return np.array([self._scores[self._key(t, p)] if t is not None else math.inf for t, p in points])

    def best_points(self, space) -> Iterator[tuple[str, dict[str, int]]]:
        best: dict[str, tuple[float, dict[str, int]]] = {}
        for t in space.templates:
            pts = []
            for values in itertools.product(*(p.values for p in t.space)):
                q = dict(zip((p.name for p in t.space), values))
                if t.check(q, space.card, space.k) is None and not self.refused(t.format, q):
                    pts.append((t.name, q))
            if pts:
                s = self.scores(pts)
                i = int(np.argmin(s))
                best[t.name] = (float(s[i]), pts[i][1])
        for name in sorted(best, key=lambda n: best[n][0]):
            yield name, best[name][1]

    def refused(self, fmt: str, params: Mapping[str, int]) -> bool:
        """Whether the card shows that the converter refuses this storage (see the module docstring)."""
        from sparserl.formats import ConversionLimits

        c, limit = self.card, ConversionLimits().max_fill * max(self.card.nnz, 1)
        if fmt == "DIA":
            return c.num_diagonals * c.rows > limit
        if fmt == "ELL":
            return c.row_len_max * c.rows > limit
        if fmt == "BSR" and self.features is not None and params.get("R") == params.get("C"):
            density = {2: self.features.block_density_2, 4: self.features.block_density_4,
                       8: self.features.block_density_8}.get(params.get("R"))
            return density is not None and c.nnz / max(density, 1e-12) > limit
        return False

    def order(self, points: Sequence[Point]) -> list[int]:
        """Best predicted first; points the card shows will be refused last (in their given order)."""
        from sparserl.kernels.templates import get_template

        s = self.scores(points)
        for i, (t, p) in enumerate(points):
            if t is not None and self.refused(get_template(self.op, t).format, p):
                s[i] = math.inf
        return [int(i) for i in np.argsort(s, kind="stable")]

    def note(self, template: str, params: Mapping[str, int]) -> str:
        v = float(self.scores([(template, params)])[0])
        if self.model.target == "ratio":
            return f"cost model: predicted {math.exp(-v):.2f}x cuSPARSE"
        if self.model.target == "rank":
            return f"cost model: ranking score {-v:.2f}"
        if self.model.target == "gap":
            return f"cost model: predicted {math.exp(v):.2f}x the fastest"
        if self.model.target == "blend":
            return f"cost model: score {v:.2f} (lower is faster)"
        return f"cost model: predicted {math.exp(v):.2f} us"


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int):
    from sparserl.search.cost_model import CostModel

    return CostModel.load(path)


def load_model(spec: str, op: Op | str = Op.SPMV):
    """The model a ``cost_model`` setting names: ``default`` (the user's own model for ``op`` under
    the harness cache root when there is one, else the packaged one) or a file path. Loaded once
    per file version (searches in one process share it)."""
    from sparserl.search.cost_model import CostModelError, default_model_path

    path = default_model_path(op) if spec == "default" else Path(spec)
    if not path.is_file():
        if spec == "default":
            raise CostModelError(f"no cost model for {Op(op).value} (neither {path.name} under the harness cache "
                                 f"root nor a packaged one; 'sparserl best cost-model' fits one on your store)")
        raise CostModelError(f"no cost model file at {path}")
    return _load(str(path.resolve()), path.stat().st_mtime_ns), path


def check_cost_model_option(spec: str | None, flag: str = "--cost-model") -> None:
    """A command's cost-model option, checked before any work: a file it names must exist and be a cost model
    file (a model that cannot be used here, from another version or feature layout say, is a logged line later
    and the selector's order, as documented; a file that is no cost model at all, a matrix given by mistake,
    is refused)."""
    if spec in (None, "default", "none"):
        return
    from sparserl.errors import SparseRLError
    from sparserl.search.cost_model import CostModelError, read_model_file

    hint = "give a model file from 'sparserl best cost-model', 'default' or 'none'"
    if not Path(spec).is_file():
        raise SparseRLError(f"{flag} {spec}: no such file ({hint})")
    try:
        read_model_file(spec)
    except CostModelError:
        raise SparseRLError(f"{flag} {spec}: not a cost model file ({hint})") from None


def make_ranker(spec: str | None, card: MatrixCard, features: MatrixFeatures | None, op: Op | str,
                k: int | None, arch: str | None = None) -> Ranker:
    """The ranker a search's ``cost_model`` setting asks for (``none``: the null ranker); the
    null ranker, with one logged line, when the model cannot be used. ``arch``: the GPU architecture
    the search times on (sm_XY), whose times a model must have been fitted on (None: unknown, as
    without a GPU; any model then); under ``default``, a user's own model of another architecture
    gives way to the packaged one where that was fitted on this one."""
    from sparserl.search.cost_model import CostModelError, packaged_model_path

    if spec is None or spec == "none":
        return Ranker()
    op = Op(op)
    try:
        model, path = load_model(spec, op)
    except CostModelError as exc:
        log.warning("%s; the search keeps the selector's order", exc)
        return Ranker()
    if op.value not in model.meta.get("ops", ()):
        log.warning("%s: the cost model was trained on %s only, not %s; the search keeps the selector's order",
                    path, ", ".join(model.meta.get("ops", ())) or "nothing", op.value)
        return Ranker()
    why = model.other_arch(arch)
    if why is not None and spec == "default" and path != packaged_model_path(op):
        try:  # the user's own model is of another GPU: the packaged one, where it was fitted on this one's times
            packaged, packaged_path = load_model(str(packaged_model_path(op)), op)
        except CostModelError:
            packaged = None
        if packaged is not None and op.value in packaged.meta.get("ops", ()) and packaged.other_arch(arch) is None:
            log.info("%s: %s; the packaged cost model instead", path, why)
            model, path, why = packaged, packaged_path, None
    if why is not None:
        log.warning("%s: %s; the search keeps the selector's order", path, why)
        return Ranker()
    why = model.outside(card)
    if why is not None:
        log.info("%s: %s; the search keeps the selector's order", path, why)
        return Ranker()
    log.info("search order: %s from %s", model.describe(), path)
    return ModelRanker(model, card, features, op, k)
