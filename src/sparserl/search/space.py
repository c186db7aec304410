"""The kernel space of one matrix: every template's valid points, as proposals a search evaluates.

A :class:`Proposal` is one completion text with where it came from (:class:`Provenance`) and,
for a template point, the template and parameters, so a search can move from it. The
:class:`CandidateSpace` renders the points of the templates for one matrix (its card), op and k:

* :meth:`~CandidateSpace.seeds`: the rule-based selector's choice, then every template's own
  seeds, round-robin over templates (specialised templates first) so a budget smaller than the
  seed list still sees every strategy early;
* :meth:`~CandidateSpace.neighbours`: one parameter of a point moved one step
  (:meth:`Template.neighbours`: a vector width, a bin boundary, a block size ...);
* :meth:`~CandidateSpace.switches`: a point's parameters carried into another template (another
  strategy of the same format, or another format), keeping the values both spaces share;
* :meth:`~CandidateSpace.random`: a uniformly drawn valid point of a random template.

A point whose storage format the matrix is known to refuse (past the converters' fill limits)
is never proposed: it would spend budget on a certain ``format_refused``. Who knows is the
caller's ``accepts(format, params)``: the search learns refusals from the harness's verdicts on
a GPU, and converts on the host in compile-only runs (see :mod:`.loop`). Free text (the
policy's kernels) becomes a proposal through :func:`text_proposal`, named by a hash of its text;
:meth:`~CandidateSpace.from_text` also says which template point it is, when it is one, so that a search
moves from a policy's kernel (its neighbours and switches) as it moves from its own points.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.kernels.templates import Template, get_template, templates
from sparserl.matrices.card import MatrixCard

log = logging.getLogger(__name__)


class Provenance(str, Enum):
    """How a search came to evaluate a candidate."""

    KNOWN = "known-best"
    """The best-known store's kernel for this matrix, evaluated again in this run."""
    SEED = "seed"
    """The rule-based selector's choice or one of a template's seeds (the library's guesses)."""
    MUTATION = "mutation"
    """A parent's point with one parameter moved one step."""
    SWITCH = "switch"
    """A parent's parameters carried into another template (strategy or format)."""
    RANDOM = "random"
    """A uniformly drawn valid point of a random template (exploration)."""
    MODEL = "cost-model"
    """One of the cost model's top picks across every template (tried among the first candidates)."""
    POLICY_SAMPLE = "policy-sample"
    """Sampled from the policy for this matrix."""
    POLICY_REFINE = "policy-refine"
    """Written by the policy after seeing the best kernel so far and its measured time or error."""


@dataclass(frozen=True)
class Proposal:
    """One candidate kernel a search may evaluate."""

    id: str
    """Stable id: the template candidate's id, or ``text/<hash>`` for free text."""
    text: str
    """The completion (FORMAT/LAUNCH header + CUDA)."""
    provenance: Provenance
    parent: str | None = None
    """Id of the candidate this one was derived from (mutations, switches, refinements)."""
    template: str | None = None
    params: tuple[tuple[str, int], ...] | None = None
    note: str = ""
    """What the move was ('selector', 'tpr 8->16', 'from csr_vector' ...)."""
    point_id: str | None = None
    """For free text that is a template point's kernel (:meth:`CandidateSpace.from_text`): that point's
    candidate id, under which a search knows it as already tried."""

    @property
    def param_dict(self) -> dict[str, int]:
        return dict(self.params or ())


def normalised(text: str) -> str:
    """The text with whitespace runs collapsed (two kernels that differ only in layout are one)."""
    return " ".join(text.split())


def text_id(text: str) -> str:
    return "text/" + hashlib.sha256(normalised(text).encode()).hexdigest()[:16]


def text_proposal(text: str, op: Op, provenance: Provenance, parent: str | None = None, note: str = "") -> Proposal:
    """A proposal for free text (a policy's completion): cleaned by the harness's extractor when it
    parses (chatter and markdown fences dropped), else kept as written (the harness will say why)."""
    from sparserl.harness.extract import Extracted, extract

    ex = extract(text, op)
    clean = ex.text if isinstance(ex, Extracted) else text
    return Proposal(text_id(clean), clean, provenance, parent, None, None, note)


def format_key(text: str, op: Op) -> tuple[str, tuple[tuple[str, int], ...]] | None:
    """(format, sorted format parameters) of a completion's FORMAT line (None when it does not parse)."""
    from sparserl.harness.extract import Extracted, extract

    ex = extract(text, op)
    if not isinstance(ex, Extracted):
        return None
    return ex.header.format, tuple(sorted(ex.header.params.items()))


def select_templates(op: Op, names: tuple[str, ...] | list[str] = ()) -> list[Template]:
    """The op's templates, or only those named (a one-line error names the known ones)."""
    if not names:
        return templates(op)
    return [get_template(op, n) for n in dict.fromkeys(names)]


def parse_candidate_id(cid: str | None) -> tuple[str, str, dict[str, int]] | None:
    """(op, template, params) of a candidate id ``op/template/format params/tunables[/spec]``, or
    None when ``cid`` is not one (a free-text kernel's id, say)."""
    parts = (cid or "").split("/")
    if len(parts) < 4:
        return None
    params: dict[str, int] = {}
    try:
        for chunk in parts[2:4]:
            for kv in filter(None, chunk.split(",")) if chunk != "-" else ():
                key, _, value = kv.partition("=")
                params[key] = int(value)
    except ValueError:
        return None
    return parts[0], parts[1], params


class CandidateSpace:
    """The valid points of some templates for one matrix (card), op and k (see the module docstring)."""

    def __init__(self, card: MatrixCard, op: Op, k: int | None, tmpls: list[Template],
                 accepts: Callable[[str, Mapping[str, int]], bool] | None = None, seed: int = 0):
        """``accepts(format, format_params)``: whether the matrix converts to that format, asked
        for every point (it may learn as a search goes; None: assume it does)."""
        if not tmpls:
            raise SparseRLError(f"no {op.value} templates to search")
        bad = [t.name for t in tmpls if t.op is not op]
        if bad:
            raise SparseRLError(f"templates {bad} are not {op.value} templates")
        self.card, self.op, self.k = card, op, k
        self.templates = sorted(tmpls, key=lambda t: not t.specialised)  # stable: registry order otherwise
        self.by_name = {t.name: t for t in self.templates}
        self.accepts = accepts
        self.refused: dict[str, int] = {}
        """Points not proposed because the matrix refuses their format, per format key."""
        self.render_errors: dict[str, int] = {}
        """Points not proposed because their template failed to render them (a template bug)."""
        self.rng = np.random.default_rng(seed)

    # -- single points -----------------------------------------------------------------------

    def _format_ok(self, text: str) -> bool:
        if self.accepts is None:
            return True
        key = format_key(text, self.op)
        if key is None:  # a template bug: let the harness report it
            return True
        if self.accepts(key[0], dict(key[1])):
            return True
        name = f"{key[0]}" + "".join(f" {k}={v}" for k, v in key[1])
        if name not in self.refused:
            log.info("the matrix refuses %s: its points are skipped", name)
        self.refused[name] = self.refused.get(name, 0) + 1
        return False

    def point(self, template: Template | str, params: Mapping[str, int], provenance: Provenance,
              parent: str | None = None, note: str = "") -> Proposal | None:
        """The proposal for one point, or None when the point is invalid here or its format refused."""
        t = self.by_name.get(template) if isinstance(template, str) else template
        if t is None or t.check(params, self.card, self.k) is not None:
            return None
        try:
            text = t.render(params, self.card)
        except Exception as exc:  # a template bug (check passed, render did not): skip the point, say so
            key = f"{t.name}: {type(exc).__name__} {exc}".strip()
            if key not in self.render_errors:
                log.warning("template %s failed to render %s although its check passed (%s); such points are "
                            "skipped", t.name, dict(params), f"{type(exc).__name__} {exc}".strip())
            self.render_errors[key] = self.render_errors.get(key, 0) + 1
            return None
        if not self._format_ok(text):
            return None
        cand = t.candidate(params)
        return Proposal(cand.id, text, provenance, parent, t.name, cand.params, note)

    def from_text(self, text: str, provenance: Provenance, parent: str | None = None, note: str = "") -> Proposal:
        """:func:`text_proposal` for free text (a policy's kernel, a stored one), carrying the template and
        parameters of the point of this space whose kernel it is, when it is one
        (:func:`sparserl.eval.library_match.template_point`: the same header, the same code but for comments
        and spacing, a specialised template's facts those it bakes in for this card). The text and its id
        stay the text's own: the harness judges what was written; the point only lets a search take its
        neighbours and switches, and know the point as tried (:attr:`Proposal.point_id`)."""
        from sparserl.eval.library_match import template_point

        p = text_proposal(text, self.op, provenance, parent, note)
        found = template_point(p.text, self.op, self.templates, self.card, self.k)
        if found is None:
            return p
        t, params = found
        cand = t.candidate(params)
        return dataclasses.replace(p, template=t.name, params=cand.params, point_id=cand.id)

    def from_id(self, cid: str, provenance: Provenance, note: str = "") -> Proposal | None:
        """The proposal for a candidate id (``op/template/format params/tunables[/spec]``) of this
        space, or None when the id names no valid point here."""
        parsed = parse_candidate_id(cid)
        if parsed is None or parsed[0] != self.op.value or parsed[1] not in self.by_name:
            return None
        return self.point(parsed[1], parsed[2], provenance, note=note)

    # -- moves -------------------------------------------------------------------------------

    def seeds(self, first: list[tuple[str, Mapping[str, int], str]] = ()) -> Iterator[Proposal]:
        """``first`` (template, params, note) points, then each template's seeds round-robin."""
        for name, params, note in first:
            if name in self.by_name:
                p = self.point(name, params, Provenance.SEED, note=note)
                if p is not None:
                    yield p
        lists = [(t, t.seeds(self.card, self.k)) for t in self.templates]
        for i in range(max((len(s) for _, s in lists), default=0)):
            for t, pts in lists:
                if i < len(pts):
                    p = self.point(t, pts[i], Provenance.SEED)
                    if p is not None:
                        yield p

    def neighbours(self, parent: Proposal) -> list[Proposal]:
        """``parent``'s valid points one step away along one parameter (empty for free text)."""
        t = self.by_name.get(parent.template or "")
        if t is None:
            return []
        base = parent.param_dict
        out = []
        for q in t.neighbours(base, self.card, self.k):
            moved = [f"{n} {base[n]}->{q[n]}" for n in q if q[n] != base[n]]
            p = self.point(t, q, Provenance.MUTATION, parent.id, ", ".join(moved))
            if p is not None:
                out.append(p)
        return out

    def switches(self, parent: Proposal) -> list[Proposal]:
        """For every other template, the point nearest ``parent``'s: shared parameters keep their
        value (or the nearest in the other domain), the rest come from that template's first seed."""
        base = parent.param_dict
        out = []
        for t in self.templates:
            if t.name == parent.template:
                continue
            starts = t.seeds(self.card, self.k) or [{p.name: p.values[len(p.values) // 2] for p in t.space}]
            for start in starts:
                q = dict(start)
                for p in t.space:
                    if p.name in base:
                        q[p.name] = min(p.values, key=lambda v: (abs(v - base[p.name]), v))
                prop = self.point(t, q, Provenance.SWITCH, parent.id, f"from {parent.template or 'text'}")
                if prop is None:  # the carried values do not fit here: the seed as it is
                    prop = self.point(t, start, Provenance.SWITCH, parent.id, f"from {parent.template or 'text'}")
                if prop is not None:
                    out.append(prop)
                    break
        return out

    def random(self, tries: int = 32) -> Iterator[Proposal]:
        """Random valid points of random templates (up to ``tries`` draws)."""
        for _ in range(tries):
            t = self.templates[int(self.rng.integers(len(self.templates)))]
            q = t.random_point(self.rng, self.card, self.k)
            if q is not None:
                p = self.point(t, q, Provenance.RANDOM)
                if p is not None:
                    yield p

    def all_points(self) -> Iterator[Proposal]:
        """Every valid point of every template (the whole space; for small spaces and tests)."""
        import itertools

        for t in self.templates:
            for values in itertools.product(*(p.values for p in t.space)):
                p = self.point(t, dict(zip((p.name for p in t.space), values)), Provenance.RANDOM)
                if p is not None:
                    yield p
