"""The search loop: propose candidates for one matrix, judge each with the harness, keep the best.

Read top to bottom, :func:`run_search` is:

1. seeds: the best-known store's kernel for this matrix (if any), the rule-based selector's
   choice, the ranker's top picks across every template (a cost model's, see :mod:`.ranker`;
   none without one), every template's first seed, then the other seeds of the templates that
   measured fastest first; at most ``seed_share`` of the budget goes to seeds before mutations
   start (seeds left over stay available later);
2. then, from the best verified kernels so far (a beam): a neighbour (one parameter moved one
   step), now and then a switch (the parameters carried into another template or format) or a
   random point (exploration);
   with a cost model, the templates' turns in the first round (each with its own first seed),
   their other seeds and a parent's neighbours and switches come in the order of its predicted
   times (without one: the templates' own order and a random order of the moves);
3. with a policy, a share of the budget goes to it, spread over the run: samples first, then
   refinements (the best kernel so far and its measured time shown to the policy; before any
   kernel is correct, the policy's latest kernel and its error); a policy kernel that is a template
   point's (:meth:`CandidateSpace.from_text`) is a parent like the search's own points, and that
   point counts as tried;
4. every candidate goes through the harness (``Evaluator.submit``; several in flight, compiles
   cached), no candidate id or text twice; a candidate is a win only when correct
   (``EvalResult.correct``: verified, early-stopped ``slow`` ones included), ranked by its median
   time in the configured regime; the run's best time is noted with the evaluator, which stops
   later candidates far slower than it early;
5. a format the harness refuses for the matrix (``format_refused``) is remembered: no further
   point in it is proposed (without a GPU, where nothing converts, the host checks instead);
6. every verified result is written to the best-known store as it arrives, and every finished
   candidate to the trace (one JSON line each), so an interrupted search loses nothing verified.

It stops at the budget (candidates evaluated), at ``seconds`` (no new submissions; candidates
already running finish), or when the space has nothing new to offer. Without a GPU every
result is ``no_gpu``: nothing is timed, nothing ranked by speed, and nothing enters the store.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

from sparserl.devices import visible_gpus
from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op
from sparserl.matrices.card import MatrixCard
from sparserl.search.policy import Proposer
from sparserl.search.ranker import Ranker
from sparserl.search.space import (
    CandidateSpace,
    Proposal,
    Provenance,
    format_key,
    normalised,
    text_id,
    text_proposal,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchConfig:
    """How one per-matrix search spends its budget."""

    budget: int = 64
    """Candidates to evaluate through the harness (each distinct; the stopping rule)."""
    seconds: float | None = None
    """Stop submitting after this many seconds (candidates already running finish); None: no limit."""
    templates: tuple[str, ...] = ()
    """Search only these templates (names); empty: every template of the op."""
    regime: str = "cold"
    """L2 regime the candidates are ranked in ('cold': flushed before each run, or 'warm')."""
    seed_share: float = 0.5
    """At most this share of the budget goes to seeds before mutations start."""
    beam: int = 3
    """Mutate from the best this many verified kernels (the best most often)."""
    switch: float = 0.15
    """Chance that a move carries the parent's parameters into another template instead of a neighbour."""
    explore: float = 0.15
    """Chance that a move is a random point of a random template (exploration)."""
    policy_share: float = 0.25
    """With a policy: the share of the budget its proposals take, spread over the run; samples
    take half of it (less the samples already drawn before the search), refinements the rest."""
    policy_batch: int = 4
    """Completions asked of the policy at a time."""
    policy_points: bool = True
    """Read a policy kernel that is a template point's kernel as that point (:meth:`CandidateSpace.from_text`), so
    the search moves from it; False: as free text, which has no neighbours (to measure what reading it gives)."""
    parallel: int = 0
    """Candidates in flight at once (0: four per GPU, at least four)."""
    seed: int = 0
    """Seed of the search's random choices."""
    cost_model: str = "default"
    """Orders the candidates ('default': the user's model under the harness cache root, else the
    packaged one; 'none': the selector's and templates' order; or a model file). Read where the
    search is set up (:func:`~sparserl.search.run.search_array`); :func:`run_search` takes a ranker."""
    model_picks: int = 4
    """The cost model's top picks (one per template) tried right after the store's best and the selector's choice."""
    progress_every_s: float = 15.0
    """Seconds between plain progress lines when the output is not a terminal."""

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise SparseRLError(f"the budget must be at least 1 candidate, got {self.budget}")
        if self.seconds is not None and not self.seconds > 0:
            raise SparseRLError(f"--seconds must be positive, got {self.seconds}")
        if self.regime not in ("cold", "warm"):
            raise SparseRLError(f"regime must be cold or warm, got {self.regime!r}")
        for name in ("seed_share", "switch", "explore"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise SparseRLError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.policy_share < 1.0:
            raise SparseRLError(f"policy_share must lie in [0, 1), got {self.policy_share}")
        if self.parallel < 0:
            raise SparseRLError(f"--parallel must be >= 0 candidates in flight (0: four per GPU), got {self.parallel}")
        if self.beam < 1 or self.policy_batch < 1 or self.model_picks < 0:
            raise SparseRLError("need beam >= 1, policy_batch >= 1 and model_picks >= 0")


@dataclass
class TraceEntry:
    """One finished candidate of a search."""

    index: int
    proposal: Proposal
    result: EvalResult
    t: float
    """Seconds from the search's start to this result."""
    order: int = 0
    """Position in the order candidates were proposed (``index`` is the order results arrived)."""
    counted: bool = True
    """Whether it spent budget (samples drawn before the search, passed in as ``prior``, did not)."""
    new_best: bool = False
    """Whether it became this run's best when it arrived."""
    store_best: bool = False
    """Whether it became the best-known store's best for this matrix."""

    def time_us(self, regime: str) -> float | None:
        """Median kernel time in ``regime`` when verified, else None."""
        t = self.result.timings.get(regime) if self.result.correct else None  # slow ones too: verified, timed
        return t.median_us if t is not None else None

    def to_dict(self, regime: str) -> dict[str, Any]:
        r, p = self.result, self.proposal
        base = r.baseline.get(regime)
        return {
            "index": self.index, "order": self.order, "id": p.id, "provenance": p.provenance.value, "parent": p.parent,
            "template": p.template, "params": p.param_dict if p.params is not None else None, "point_id": p.point_id,
            "note": p.note,
            "verdict": "correct" if r.ok else r.error_kind.value, "message": r.message, "format": r.format,
            "stopped_early": r.error_kind is ErrorKind.SLOW,  # correct, timed only until it was clearly slow
            "time_us": self.time_us(regime), "cusparse_us": base.median_us if base else None,
            "speedup": r.speedup, "roofline": r.roofline, "regime": regime, "arch": r.arch,
            "eval_seconds": r.eval_seconds, "t": round(self.t, 3), "counted": self.counted,
            "new_best": self.new_best, "store_best": self.store_best, "text": p.text,
        }


@dataclass
class SearchResult:
    """What a search did and found."""

    matrix: str
    fingerprint: str
    op: str
    k: int | None
    regime: str
    entries: list[TraceEntry]
    best: TraceEntry | None
    """The fastest correct candidate (None: nothing verified, e.g. no GPU)."""
    evaluated: int
    """Candidates that spent budget."""
    stopped: str
    """'budget', 'seconds', 'exhausted' (the space had nothing new to offer) or 'stopped' (asked
    to stop: the candidates in flight finished, nothing new was submitted)."""
    seconds: float
    timed: bool
    """Whether kernels ran on a GPU (False: compile-only, nothing timed)."""
    run_id: str
    known_best: Any = None
    """The store's best row for this matrix before the search (a :class:`~.store.BestRow`), if any."""
    store_writes: int = 0
    """Verified results written to the store."""
    store_refused: int = 0
    """Verified results the store refused: their kernel had been found wrong on this matrix."""
    refused: dict[str, int] = field(default_factory=dict)
    """Points skipped because the matrix refuses their format (host check), per format."""
    render_errors: dict[str, int] = field(default_factory=dict)
    """Points skipped because their template failed to render them (template bugs)."""
    best_after_retraction: bool | None = None
    """Whether the store's best for the matrix is still a result of this run after a second look took kernels
    found wrong out of the store (:func:`~sparserl.search.run.retract_found_wrong`); None: nothing was taken out."""

    @property
    def store_improved(self) -> bool:
        """Whether this run set the store's best for the matrix (and, after a retraction, still holds it)."""
        if self.best_after_retraction is not None:
            return self.best_after_retraction
        return any(e.store_best for e in self.entries)

    def by_provenance(self) -> dict[str, dict[str, Any]]:
        """Per provenance: candidates, correct ones, and the best time."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.entries:
            d = out.setdefault(e.proposal.provenance.value, {"n": 0, "correct": 0, "best_us": None})
            d["n"] += 1
            d["correct"] += int(e.result.ok)
            t = e.time_us(self.regime)
            if t is not None and (d["best_us"] is None or t < d["best_us"]):
                d["best_us"] = t
        return out


class StoreSink:
    """Writes a search's verified results to a :class:`~.store.BestStore`; the matrix and the
    run are registered with the first one (a search that verifies nothing leaves no trace there).

    ``journal(kernel)``, when given, is called with each :class:`~.store.VerifiedKernel` before it
    is written: a farm keeps them on its own disk, so a store that cannot be reached loses nothing
    (they are written again, once each by their ``uid``, when the farm resumes)."""

    def __init__(self, store, card: MatrixCard, name: str, source_path: str | None, coords, run_config: dict,
                 model: str | None = None, journal=None, features=None):
        """``coords``: the sampled nonzeros (rows, cols), or a function computing them on first use.
        ``features``: the matrix's :class:`~sparserl.matrices.features.MatrixFeatures` (what the cost
        model learns from beside the card), if computed."""
        self.store, self.card, self.name, self.source_path = store, card, name, source_path
        self.coords, self.run_config, self.model, self.features = coords, run_config, model, features
        self.journal = journal
        self.started: str | None = None
        self.writes = 0
        """Results written to the store."""
        self.refused = 0
        """Results the store refused: their kernel was found wrong on this matrix (by another process's
        second look, since the search does not propose such kernels again)."""

    def write(self, run_id: str, op: Op, k: int | None, regime: str, entry: TraceEntry) -> bool:
        from sparserl.search.store import Recorded, VerifiedKernel

        r, p = entry.result, entry.proposal
        v = VerifiedKernel(
            fingerprint=self.card.fingerprint, op=op.value, k=k, arch=r.arch or "unknown", gpu=r.gpu,
            regime=regime, text=p.text, time_us=r.timings[regime].median_us,
            cusparse_us=r.baseline[regime].median_us, speedup=r.baseline[regime].median_us
            / r.timings[regime].median_us, roofline=r.roofline, format=r.format, template=p.template,
            candidate_id=p.id, provenance=p.provenance.value, parent_id=p.parent,
            model=self.model if p.provenance in (Provenance.POLICY_SAMPLE, Provenance.POLICY_REFINE) else None,
            run_id=run_id, harness_version=str(r.harness_version), **({"host": r.host} if r.host else {}))
        if self.journal is not None:
            self.journal(v)
        if self.started is None:
            coords = self.coords() if callable(self.coords) else self.coords
            self.store.add_matrix(self.card, self.name, self.source_path, coords, features=self.features)
            self.store.start_run(run_id, self.card.fingerprint, op.value, k, self.run_config)
            self.started = run_id
        outcome = self.store.record_outcome(v)
        self.writes += outcome.written
        self.refused += outcome is Recorded.REFUSED
        return outcome is Recorded.BEST

    def finish(self, status: str) -> None:
        if self.started is not None:
            self.store.finish_run(self.started, status)


class _Progress:
    """A rich progress bar with the best speedup so far; plain log lines when not a terminal."""

    def __init__(self, name: str, budget: int, every_s: float):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.name, self.every_s, self.budget = name, every_s, budget
        console = Console(stderr=True)
        self.live = console.is_terminal
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console, disable=not self.live)
        self.task = self.bar.add_task(f"search {name}", total=budget)
        self.last = time.monotonic()

    def __enter__(self) -> _Progress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, done: int, best: str, force: bool = False) -> None:
        self.bar.update(self.task, completed=done, description=f"search {self.name}: {best}")
        now = time.monotonic()
        if not self.live and (force or now - self.last >= self.every_s):
            self.last = now
            log.info("search %s: %d/%d candidates, %s", self.name, done, self.budget, best)


FILLED_NOTE = "facts from the card"
"""The note of a policy proposal whose block of facts the proposer wrote from the card (``fill_facts``)."""


def _fill_notes(proposer, n: int) -> list[str]:
    """The notes of the ``n`` texts the proposer's last call returned: :data:`FILLED_NOTE` where it wrote the
    card's facts in (its ``last_filled``, set by every call of :class:`~sparserl.search.policy.PolicyProposer`).
    A proposer without it, or whose flags are not for ``n`` texts, filled nothing."""
    flags = getattr(proposer, "last_filled", None)
    if flags is None or len(flags) != n:
        flags = (False,) * n
    return [FILLED_NOTE if f else "" for f in flags]


def _best_text(best: TraceEntry | None, regime: str, timed: bool) -> str:
    if not timed:
        return "nothing timed (no GPU)"
    if best is None:
        return "no correct kernel yet"
    sp = best.result.speedup
    return f"best {sp:.2f}x cuSPARSE ({best.time_us(regime):.2f} us, {best.proposal.id})" if sp else \
        f"best {best.time_us(regime):.2f} us ({best.proposal.id})"


def run_search(A, name: str, op: Op | str, k: int | None, cfg: SearchConfig, evaluator, *,
               card: MatrixCard | None = None, selector_point: tuple[str, dict, str] | None = None,
               known: list[tuple[str, str]] = (), proposer: Proposer | None = None,
               prior: list[tuple] = (), sink: StoreSink | None = None,
               accepts=None, trace: str | Path | IO[str] | None = None, progress: bool = True,
               run_id: str | None = None, stop=None, ranker: Ranker | None = None,
               avoid: Iterable[str] = ()) -> SearchResult:
    """Search the kernel space for matrix ``A`` (see the module docstring).

    ``evaluator``: a harness :class:`~sparserl.harness.evaluator.Evaluator` (or anything with its
    ``register``, ``submit`` and ``has_gpu``). ``selector_point``: (template, params, note) tried
    first among the seeds. ``known``: (candidate id, text) of kernels known to be good for this
    matrix (the store's best), evaluated first. ``prior``: policy samples already evaluated
    (text, result[, filled]), entered in the trace without spending budget. ``sink``: where verified
    results go (the best-known store). ``accepts(format, params)``: whether the matrix converts
    to a format, asked before proposing a point (None: yes, until the harness refuses the format;
    points in a format the harness refused are never proposed again either). ``trace``: a path or an open file for
    the JSON-lines trace. ``stop``: a :class:`threading.Event`; once set, nothing new is submitted
    and the search returns when the candidates in flight have finished (stopped 'stopped').
    ``ranker``: the order of the candidates (None: the null ranker, see :mod:`.ranker`). ``avoid``: texts
    never to propose (kernels found wrong on this matrix, the store's ``found_wrong_texts``), whitespace aside.
    """
    run = _SearchRun(A, name, op, k, cfg, evaluator, card=card, proposer=proposer, sink=sink, accepts=accepts,
                     trace=trace, run_id=run_id, ranker=ranker)
    status = "failed"
    try:
        run.enter_prior(prior)
        run.state.seen_texts |= {normalised(t) for t in avoid}  # as if proposed already: never proposed
        run.state.start(known, selector_point)
        stopped = run.submit_and_wait(progress, stop)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        run.warn_interrupted()
        raise
    finally:
        run.close(status)
    return run.result(stopped)


class _SearchRun:
    """One call of :func:`run_search`: the space and the proposal state, the trace, and the
    candidates finished so far (the run's best among them)."""

    def __init__(self, A, name: str, op: Op | str, k: int | None, cfg: SearchConfig, evaluator, *,
                 card: MatrixCard | None, proposer: Proposer | None, sink: StoreSink | None, accepts,
                 trace: str | Path | IO[str] | None, run_id: str | None, ranker: Ranker | None):
        """Sets up the space, the proposal state and the trace, and registers ``A`` with the evaluator."""
        op = Op(op)
        k = k if op is Op.SPMM else None
        if card is None:
            from sparserl.matrices.card import matrix_card

            card = matrix_card(A)
        from sparserl.search.space import select_templates

        refused: set[tuple] = set()  # (format, params) the harness refused for this matrix

        def known_to_convert(fmt: str, params: dict) -> bool:
            if (fmt, tuple(sorted(params.items()))) in refused:
                return False
            return accepts(fmt, params) if accepts is not None else True

        self.name, self.op, self.k, self.cfg, self.card, self.sink = name, op, k, cfg, card, sink
        self.evaluator = evaluator
        self.space = CandidateSpace(card, op, k, select_templates(op, cfg.templates), accepts=known_to_convert,
                                    seed=cfg.seed)
        self.state = _Search(cfg, self.space, proposer, refused, ranker or Ranker())
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.ref = evaluator.register(A, name)
        self.note_best = getattr(evaluator, "note_best", None)
        self.timed = bool(evaluator.has_gpu)
        self.own_trace = isinstance(trace, (str, Path))
        self.fh = open(trace, "w") if self.own_trace else trace  # noqa: SIM115 (closed in close)
        self.t0 = time.monotonic()
        self.entries: list[TraceEntry] = []
        self.best: TraceEntry | None = None

    @property
    def evaluated(self) -> int:
        """Candidates finished that spent budget."""
        return sum(e.counted for e in self.entries)

    def record(self, prop: Proposal, order: int, res: EvalResult, counted: bool) -> None:
        """Enter one finished candidate: ranked, the store written, observed, its trace line written
        (a store failure is raised after the trace line, so the trace keeps the verified kernel)."""
        regime = self.cfg.regime
        e = TraceEntry(len(self.entries), prop, res, time.monotonic() - self.t0, order, counted)
        t = e.time_us(regime)
        if res.correct and (t is None or regime not in res.baseline):
            log.warning("%s: verified but without its or cuSPARSE's time in the %s regime; not ranked",
                        prop.id, regime)
            t = None
        lost_store = self._rank_and_store(e, t) if t is not None else None
        self.entries.append(e)
        self.state.observe(e, t)
        if self.fh is not None:
            self.fh.write(json.dumps(e.to_dict(regime), default=str) + "\n")
            self.fh.flush()
        if lost_store is not None:
            raise lost_store

    def _rank_and_store(self, e: TraceEntry, t: float) -> SparseRLError | None:
        """A verified, timed candidate: the run's best when faster (noted with the evaluator), and
        written to the store; returns the store's failure, if it failed."""
        regime = self.cfg.regime
        if self.best is None or t < self.best.time_us(regime):
            self.best, e.new_best = e, True
            if self.note_best is not None:  # later candidates far slower than it stop early
                self.note_best(self.ref, self.op, self.k, t, regime)
        if self.sink is not None:
            try:
                e.store_best = self.sink.write(self.run_id, self.op, self.k, regime, e)
            except SparseRLError as exc:  # the store failed: the trace still keeps the verified kernel
                return exc
        return None

    def enter_prior(self, prior: list[tuple]) -> None:
        """The policy samples evaluated before the search, entered without spending budget: (text, result), or
        (text, result, filled) where ``filled`` says the card's facts were written into it (``--fill-facts``)."""
        for text, res, *filled in prior:
            note = "drawn before the search" + (f", {FILLED_NOTE}" if filled and filled[0] else "")
            prop = self.state.read(text, Provenance.POLICY_SAMPLE, note=note)
            if self.state.claim(prop):
                self.record(prop, len(self.entries), res, counted=False)
                self.state.prior_samples += 1

    def submit_and_wait(self, progress: bool, stop) -> str:
        """Submit candidates (up to ``parallel`` in flight) and enter each as it finishes, until the
        budget, the time or the space runs out or ``stop`` is set; returns why it stopped."""
        cfg = self.cfg
        in_flight: dict[Future, tuple[Proposal, int]] = {}
        first = len(self.entries)
        parallel = cfg.parallel or (4 * max(1, len(visible_gpus())) if self.timed else 8)
        submitted = 0
        with _Progress(self.name, cfg.budget, cfg.progress_every_s) if progress else _NoProgress() as bar:
            while True:
                halted = stop is not None and stop.is_set()
                out_of_time = halted or (cfg.seconds is not None and time.monotonic() - self.t0 >= cfg.seconds)
                while not out_of_time and submitted < cfg.budget and len(in_flight) < parallel:
                    prop = self.state.next(submitted)
                    if prop is None:
                        break
                    in_flight[self.evaluator.submit(prop.text, self.ref, self.op, self.k)] = (prop, first + submitted)
                    submitted += 1
                if not in_flight:
                    stopped = ("stopped" if halted else "seconds" if out_of_time else
                               "budget" if submitted >= cfg.budget else "exhausted")
                    break
                timeout = None if cfg.seconds is None else max(0.05, cfg.seconds - (time.monotonic() - self.t0))
                done, _ = wait(list(in_flight), timeout=timeout if not out_of_time else None,
                               return_when=FIRST_COMPLETED)
                for f in done:
                    self.record(*in_flight.pop(f), f.result(), counted=True)
                bar.update(self.evaluated, _best_text(self.best, cfg.regime, self.timed))
            bar.update(self.evaluated, _best_text(self.best, cfg.regime, self.timed), force=True)
        return stopped

    def warn_interrupted(self) -> None:
        writes = self.sink.writes if self.sink is not None else 0
        refused = self.sink.refused if self.sink is not None else 0
        said = (f"{writes} verified results are in the store" if writes else
                "the store is unchanged" if refused else
                "none was verified" + ("" if self.timed else " (nothing is run without a GPU)")
                + ", so the store is unchanged")
        if refused:
            said += f" ({refused} refused: their kernel had been found wrong on this matrix)"
        log.warning("search %s interrupted: %d candidates finished; %s", self.name, len(self.entries), said)

    def close(self, status: str) -> None:
        """The run's end in the store (its failure raised only for a finished run), then the trace closed."""
        if self.sink is not None:
            try:
                self.sink.finish(status)
            except SparseRLError as exc:
                if status == "finished":
                    raise
                log.warning("the run's end was not recorded in the store: %s", exc)
        if self.own_trace and self.fh is not None:
            self.fh.close()

    def result(self, stopped: str) -> SearchResult:
        return SearchResult(matrix=self.name, fingerprint=self.card.fingerprint, op=self.op.value, k=self.k,
                            regime=self.cfg.regime, entries=self.entries, best=self.best, evaluated=self.evaluated,
                            stopped=stopped, seconds=time.monotonic() - self.t0, timed=self.timed,
                            run_id=self.run_id, store_writes=self.sink.writes if self.sink is not None else 0,
                            store_refused=self.sink.refused if self.sink is not None else 0,
                            refused=dict(self.space.refused), render_errors=dict(self.space.render_errors))


class _NoProgress:
    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, *a, **kw) -> None:
        pass


class _Search:
    """The proposal policy of :func:`run_search`: what to evaluate next, given what came back."""

    MAX_DRY = 3
    """Policy batches in a row with nothing new before the policy is asked no more."""

    def __init__(self, cfg: SearchConfig, space: CandidateSpace, proposer: Proposer | None, refused: set[tuple],
                 ranker: Ranker):
        self.cfg, self.space, self.proposer, self.ranker = cfg, space, proposer, ranker
        self.read = space.from_text if cfg.policy_points else partial(text_proposal_of, space.op)
        """Free text (a policy's kernel, a stored one) -> its proposal (see ``SearchConfig.policy_points``)."""
        self.refused = refused
        """(format, params) keys the harness refused for this matrix (learned from verdicts)."""
        self.rng = space.rng
        self.seen_ids: set[str] = set()
        self.seen_texts: set[str] = set()
        self.first: deque[Proposal] = deque()
        """The store's best, the selector's choice and the ranker's picks: tried before any other seed."""
        self.seed_lists: dict[str, deque[dict]] = {}
        """Per template, its seeds not yet proposed."""
        self.round_one: deque[str] = deque()
        """Templates whose first seed is still to be proposed."""
        self.template_best: dict[str, float] = {}
        """Per template, the fastest time measured for any of its points."""
        self.seeds_used = 0
        self.ranked: list[tuple[float, TraceEntry]] = []
        """Verified entries, fastest first."""
        self.viable: list[TraceEntry] = []
        """Compile-only: entries that compiled (no times to rank them by)."""
        self.policy_last: TraceEntry | None = None
        self.policy_queue: deque[Proposal] = deque()
        self.policy_used = 0
        self.prior_samples = 0
        self.policy_samples_done = 0
        self.policy_dry = 0
        """Refinement batches in a row that held nothing new."""
        self.moves: dict[str, deque[Proposal]] = {}
        """Per parent id: its untried neighbours and switches, in the order drawn."""

    # -- bookkeeping -------------------------------------------------------------------------

    def claim(self, p: Proposal) -> bool:
        """True (and remembered) when neither ``p``'s id (nor, for free text that is a template point's
        kernel, that point's id) nor its text was proposed before."""
        key = normalised(p.text)
        ids = {p.id} | ({p.point_id} if p.point_id else set())
        if ids & self.seen_ids or key in self.seen_texts:
            return False
        self.seen_ids |= ids
        self.seen_texts.add(key)
        return True

    def start(self, known: list[tuple[str, str]], selector_point) -> None:
        for cid, text in known:  # a template point again when the template still renders that text
            note = "the store's best for this matrix"
            p = self.space.from_id(cid, Provenance.KNOWN, note=note)
            if p is None or normalised(p.text) != normalised(text):  # free text, or the template changed since
                p = dataclasses.replace(self.read(text, Provenance.KNOWN, note=f"{note} (stored as {cid})"),
                                        id=text_id(text), text=text)
            self.first.append(p)
        if selector_point is not None:
            name, params, note = selector_point
            p = self.space.point(name, params, Provenance.SEED, note=note) if name in self.space.by_name else None
            if p is not None:
                self.first.append(p)
            else:  # never silently: the selector's choice is the search's floor
                t = self.space.by_name.get(name)
                why = t.check(params, self.space.card, self.space.k) if t is not None else "no such template here"
                log.warning("the selector's choice %s %s is not a point of this search (%s); it is not tried first",
                            name, params, why or "its format is refused here")
        space, picks = self.space, 0
        for name, params in self.ranker.best_points(space) if self.cfg.model_picks else ():
            if picks >= self.cfg.model_picks:
                break
            p = space.point(name, params, Provenance.MODEL, note=self.ranker.note(name, params))
            if p is not None and all(q.id != p.id for q in self.first):
                self.first.append(p)
                picks += 1
        self.seed_lists = {}
        for t in space.templates:  # a template's own first guess stays first; its other seeds by the ranker
            first, *rest = t.seeds(space.card, space.k) or [None]
            ranked = [rest[i] for i in self.ranker.order([(t.name, q) for q in rest])]
            self.seed_lists[t.name] = deque(([first] if first is not None else []) + ranked)
        heads = [(t.name, self.seed_lists[t.name][0]) for t in space.templates if self.seed_lists[t.name]]
        self.round_one = deque([heads[i][0] for i in self.ranker.order(heads)]
                               + [t.name for t in space.templates if not self.seed_lists[t.name]])

    def observe(self, e: TraceEntry, t: float | None) -> None:
        if t is not None:
            self.ranked.append((t, e))
            self.ranked.sort(key=lambda x: x[0])
            name = e.proposal.template
            if name is not None and t < self.template_best.get(name, float("inf")):
                self.template_best[name] = t
        elif e.result.error_kind is ErrorKind.NO_GPU:
            self.viable.append(e)
        elif e.result.error_kind is ErrorKind.FORMAT_REFUSED:
            key = format_key(e.proposal.text, self.space.op)
            if key is not None and key not in self.refused:
                self.refused.add(key)
                log.info("the harness refused %s for this matrix: no more points in it", key[0])
        if e.proposal.provenance in (Provenance.POLICY_SAMPLE, Provenance.POLICY_REFINE):
            self.policy_last = e

    # -- proposals ---------------------------------------------------------------------------

    def next(self, submitted: int) -> Proposal | None:
        """The next new proposal, or None when none can be made now."""
        cfg = self.cfg
        if self.proposer is not None and self._policy_due(submitted):
            p = self._from_policy()
            if p is not None:
                self.policy_used += 1
                return p
        seed_cap = max(1, math.ceil(cfg.seed_share * cfg.budget))
        if self.seeds_used < seed_cap or not self._parents():
            p = self._next_seed()
            if p is not None:
                self.seeds_used += 1
                return p
        p = self._move()
        if p is not None:
            return p
        p = self._next_seed()  # the seeds past the cap, once the moves run dry
        if p is not None:
            self.seeds_used += 1
            return p
        return self._first_new(self.space.random())

    def _first_new(self, props) -> Proposal | None:
        for p in props:
            if self.claim(p):
                return p
        return None

    def _next_seed(self) -> Proposal | None:
        """The store's best and the selector's choice; then every template's first seed; then the
        remaining seeds of the template that has measured fastest so far (templates not measured
        yet, or never correct, after those; registry order breaks ties)."""
        while self.first:
            p = self.first.popleft()
            if self.claim(p):
                return p
        while self.round_one:
            p = self._pop_seed(self.round_one.popleft())
            if p is not None:
                return p
        index = {t.name: i for i, t in enumerate(self.space.templates)}

        def rank(name: str) -> tuple:
            t = self.template_best.get(name)
            return (0, t, index[name]) if t is not None else (1, 0.0, index[name])

        for name in sorted((n for n, q in self.seed_lists.items() if q), key=rank):
            p = self._pop_seed(name)
            if p is not None:
                return p
        return None

    def _pop_seed(self, name: str) -> Proposal | None:
        q = self.seed_lists[name]
        while q:
            p = self.space.point(name, q.popleft(), Provenance.SEED)
            if p is not None and self.claim(p):
                return p
        return None

    def _parents(self) -> list[TraceEntry]:
        if self.ranked:
            return [e for _, e in self.ranked[:self.cfg.beam]]
        return self.viable[:self.cfg.beam]

    def _move(self) -> Proposal | None:
        parents = self._parents()
        if not parents:
            return None
        roll = self.rng.random()
        if roll < self.cfg.explore:
            p = self._first_new(self.space.random())
            if p is not None:
                return p
        # the best parent most often: weights 1, 1/2, 1/4 ...
        w = [0.5 ** i for i in range(len(parents))]
        order = list(self.rng.choice(len(parents), size=len(parents), replace=False, p=[x / sum(w) for x in w]))
        switch = self.cfg.explore <= roll < self.cfg.explore + self.cfg.switch
        for i in order:
            parent = parents[i].proposal
            p = self._parent_move(parent, switch) or self._parent_move(parent, not switch)
            if p is not None:
                return p
        return None

    def _parent_move(self, parent: Proposal, switch: bool) -> Proposal | None:
        key = f"{'switch' if switch else 'step'}:{parent.id}"
        if key not in self.moves:
            moves = self.space.switches(parent) if switch else self.space.neighbours(parent)
            moves = [moves[i] for i in self.rng.permutation(len(moves))]
            ranked = self.ranker.order([(m.template, m.param_dict) for m in moves])
            self.moves[key] = deque(moves[i] for i in ranked)
        q = self.moves[key]
        while q:
            p = q.popleft()
            if self.claim(p):
                return p
        return None

    # -- the policy --------------------------------------------------------------------------

    def _quota(self) -> tuple[int, int]:
        """(samples, refinements) the policy may propose in this search."""
        total = max(1, round(self.cfg.policy_share * self.cfg.budget)) if self.cfg.policy_share > 0 else 0
        samples = max(0, math.ceil(total / 2) - self.prior_samples)  # samples drawn before count
        return samples, total - samples

    def _policy_due(self, submitted: int) -> bool:
        if self.policy_dry >= self.MAX_DRY:
            return False
        samples, refines = self._quota()
        total = samples + refines
        # spread over the run; never first, so the seeds are on their way while the policy writes
        return self.policy_used < total and self.policy_used < self.cfg.policy_share * submitted

    def _from_policy(self) -> Proposal | None:
        while self.policy_queue:
            p = self.policy_queue.popleft()
            if self.claim(p):
                return p
        samples, _ = self._quota()
        n = self.cfg.policy_batch
        refining = self.policy_samples_done >= samples
        if not refining:
            n = min(n, samples - self.policy_samples_done)
            texts = self.proposer.sample(n)
            self.policy_samples_done += n
            props = [self.read(t, Provenance.POLICY_SAMPLE, note=note)
                     for t, note in zip(texts, _fill_notes(self.proposer, len(texts)), strict=True)]
        else:
            target = self.ranked[0][1] if self.ranked else self.policy_last
            if target is None:
                return None  # nothing measured yet to refine: later
            texts = self.proposer.refine(target.proposal.text, target.result, n)
            props = [self.read(t, Provenance.POLICY_REFINE, parent=target.proposal.id, note=note)
                     for t, note in zip(texts, _fill_notes(self.proposer, len(texts)), strict=True)]
        self.policy_queue.extend(props)
        while self.policy_queue:
            p = self.policy_queue.popleft()
            if self.claim(p):
                self.policy_dry = 0
                return p
        if refining:  # samples stop at their quota anyway
            self.policy_dry += 1
            if self.policy_dry >= self.MAX_DRY:
                log.info("the policy's refinements held nothing new %d times in a row: asking it no more",
                         self.MAX_DRY)
        return None


def text_proposal_of(op: Op, text: str, provenance: Provenance, parent: str | None = None, note: str = "") -> Proposal:
    """:func:`text_proposal` with the op first: free text read as free text (``SearchConfig.policy_points`` off)."""
    return text_proposal(text, op, provenance, parent, note)


def search_summary(result: SearchResult) -> dict[str, Any]:
    """The search's summary for report.json (the trace itself is in trace.jsonl)."""
    b = result.best
    return {
        "run_id": result.run_id, "fingerprint": result.fingerprint, "evaluated": result.evaluated,
        "stopped": result.stopped, "seconds": result.seconds, "timed": result.timed, "regime": result.regime,
        "best_id": b.proposal.id if b else None, "best_provenance": b.proposal.provenance.value if b else None,
        "best_time_us": b.time_us(result.regime) if b else None, "best_speedup": b.result.speedup if b else None,
        "by_provenance": result.by_provenance(), "store_writes": result.store_writes,
        "store_refused": result.store_refused,
        "store_improved": result.store_improved, "refused_formats": result.refused,
        "render_errors": result.render_errors,
        "known_best": asdict(result.known_best) | {"text": None} if result.known_best is not None else None,
    }
