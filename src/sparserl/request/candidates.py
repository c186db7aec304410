"""The candidates of one kernel request and the choice among them.

A candidate is a kernel text with its harness verdict, whatever proposed it: a sample of the
policy, a search's candidate, the rule-based selector's library pick or another library variant
(:class:`Origin`). ``generate`` and ``search`` put every candidate they have into one
:class:`CandidatePool`, which picks the kernel to hand back the same way for both:

* on a GPU, the fastest verified correct one (by its speedup against cuSPARSE; the first one in
  on a tie);
* without one (compile-only), where nothing was run or timed, the first that compiled and whose
  FORMAT line converts the matrix, in the order the candidates came in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from sparserl.harness.extract import Extracted, extract
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.request.context import MatrixContext

if TYPE_CHECKING:
    from sparserl.harness.evaluator import Evaluator


class Origin(str, Enum):
    """What proposed a candidate."""

    MODEL = "model"
    """A sample of the policy."""
    MODEL_FILLED = "model, facts from the card"
    """A sample of the policy whose block of specialised facts was written from the matrix card
    (:func:`sparserl.eval.library_match.fill_facts`; ``--fill-facts``): the model chose the template and
    its numbers, the card its facts."""
    SEARCH = "search"
    """A candidate of a search (its provenance and id in :attr:`Candidate.detail`)."""
    SELECTOR = "selector"
    """The rule-based selector's library variant."""
    LIBRARY = "library"
    """Another library variant."""


@dataclass(frozen=True)
class Candidate:
    """One kernel text for a request, with its harness verdict."""

    text: str
    """The completion as the harness read it (chatter and fences dropped where it could extract it)."""
    origin: Origin
    result: EvalResult
    detail: str = ""
    """A search candidate's provenance and id ('seed spmv/csr_vector/...'); empty for the others."""

    @property
    def source(self) -> str:
        """Where it came from, in the report's words: 'model', 'selector', 'library' or 'search: DETAIL'."""
        return f"search: {self.detail}" if self.origin is Origin.SEARCH else self.origin.value

    @property
    def verdict(self) -> str:
        """'correct', 'compiled' (compile-only) or the harness's error kind."""
        kind = self.result.error_kind
        return "correct" if self.result.correct else "compiled" if kind is ErrorKind.NO_GPU else kind.value


@dataclass(frozen=True)
class RunnerUp:
    """A distinct kernel after the one handed back, as the report lists it."""

    source: str
    format: str | None
    verdict: str
    error_kind: str
    speedup: float | None

    @classmethod
    def of(cls, c: Candidate, dropped: str | None = None) -> RunnerUp:
        """``dropped``: why a second look dropped it (its verdict then says so)."""
        verdict = c.verdict if dropped is None else f"{c.verdict} once, then dropped: {dropped}"
        return cls(c.source, c.result.format, verdict, c.result.error_kind.value, c.result.speedup)


def normalised(text: str) -> str:
    """The text with whitespace runs collapsed (two kernels that differ only in layout are one)."""
    return " ".join(text.split())


class CandidatePool:
    """Every candidate of one request (see the module docstring); ``timed``: whether the harness ran
    and timed them (False: compile-only)."""

    def __init__(self, ctx: MatrixContext, timed: bool):
        self.ctx, self.timed = ctx, timed
        self.candidates: list[Candidate] = []
        self.dropped: dict[str, str] = {}
        """Kernels (their normalised text) a second look dropped, and why: never handed back."""
        self.found_wrong: list[Candidate] = []
        """The dropped candidates that failed an evaluation by their own doing (not the machine's)."""

    def drop(self, candidate: Candidate, why: str, wrong: bool = False) -> None:
        """Never hand ``candidate``'s kernel back (:mod:`sparserl.request.second_look`); ``wrong``: it failed an
        evaluation by its own doing."""
        self.dropped[normalised(candidate.text)] = why
        if wrong:
            self.found_wrong.append(candidate)

    def __len__(self) -> int:
        return len(self.candidates)

    def add(self, candidates: list[Candidate]) -> list[Candidate]:
        """Add candidates evaluated elsewhere (a search's); returns them."""
        self.candidates += candidates
        return candidates

    def evaluate(self, evaluator: Evaluator, texts: list[tuple[str, Origin]]) -> list[Candidate]:
        """Evaluate ``(text, origin)`` pairs on the request's matrix through the harness and add them;
        returns them."""
        ctx = self.ctx
        results = evaluator.evaluate_many([(t, ctx.ref(evaluator), ctx.op, ctx.k) for t, _ in texts])
        out = []
        for (t, origin), r in zip(texts, results):
            ex = extract(t, ctx.op)
            out.append(Candidate(ex.text if isinstance(ex, Extracted) else t, origin, r))
        return self.add(out)

    def usable(self, candidates: list[Candidate] | None = None) -> list[Candidate]:
        """The usable candidates (of ``candidates``, default all), best first: verified correct ones
        fastest first; compile-only, the compiled ones whose format converts the matrix, in order."""
        cands = self.candidates if candidates is None else candidates
        if not self.timed:
            return [c for c in cands if c.result.error_kind is ErrorKind.NO_GPU and self.ctx.converts(c.text)]
        return sorted((c for c in cands if c.result.ok and c.result.speedup is not None
                       and normalised(c.text) not in self.dropped),
                      key=lambda c: c.result.speedup, reverse=True)

    def best(self) -> Candidate | None:
        """The candidate to hand back (None: nothing usable)."""
        good = self.usable()
        return good[0] if good else None

    def runners_up(self, best: Candidate, n: int = 5) -> list[RunnerUp]:
        """Up to ``n`` distinct kernels after ``best`` (samples often repeat), fastest first when timed."""
        key = (lambda c: c.result.speedup or 0.0) if self.timed else (lambda c: 0.0)
        out, seen = [], {normalised(best.text)}
        for c in sorted(self.candidates, key=key, reverse=True):
            norm = normalised(c.text)
            if norm not in seen:
                seen.add(norm)
                out.append(RunnerUp.of(c, self.dropped.get(norm)))
                if len(out) == n:
                    break
        return out

    def kinds(self) -> str:
        """The verdicts the candidates got, for a message when none is usable."""
        return ", ".join(sorted({c.result.error_kind.value for c in self.candidates})) or "no candidates"
