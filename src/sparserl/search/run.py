"""``sparserl search``: one matrix in, the best verified kernel of a budgeted search out.

:func:`search_matrix` loads the matrix (a :class:`~sparserl.request.context.MatrixContext`), checks
that it fits on the GPU, opens the best-known store, runs :func:`~sparserl.search.loop.run_search`
(with the policy when a model is given) and hands its candidates to a
:class:`~sparserl.request.candidates.CandidatePool`, which chooses the kernel as ``generate`` does.
The output folder holds the kernel and its :class:`~sparserl.request.report.KernelReport`
(``kernel.cu``, ``launch.json``, ``report.json``, ``report.md``) plus ``trace.jsonl`` (every
candidate: provenance, parent, verdict, times, speedup, text).

:func:`search_after_sampling` is ``generate --search N``: the model's samples enter the search as
already evaluated, N more candidates are searched, and generate chooses among all of them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparserl.checks import check_device, check_op, require
from sparserl.devices import pick_device
from sparserl.errors import SparseRLError
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.kernels.contract import Op
from sparserl.kernels.templates.library import variant_point
from sparserl.matrices.io import check_matrix_path
from sparserl.model.config import POLICY_TEMPERATURE
from sparserl.request.candidates import Candidate, CandidatePool, Origin, normalised
from sparserl.request.context import MatrixContext
from sparserl.request.library import select_variant
from sparserl.request.report import KernelReport, prepare_out
from sparserl.request.second_look import PASSES, SecondLook, dropped_note, look_again
from sparserl.search.footprint import check_fits
from sparserl.search.loop import (
    FILLED_NOTE,
    SearchConfig,
    SearchResult,
    StoreSink,
    TraceEntry,
    run_search,
    search_summary,
)
from sparserl.search.policy import PolicyProposer
from sparserl.search.ranker import make_ranker
from sparserl.search.space import select_templates
from sparserl.search.store import COORDS, BestStore, harness_version, open_store, store_exists

if TYPE_CHECKING:
    from sparserl.model.policy import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchJob:
    """One ``sparserl search`` run."""

    matrix: str
    """.mtx, .mtx.gz or .npz file."""
    op: str = "spmv"
    k: int | None = None
    """SpMM columns."""
    search: SearchConfig = field(default_factory=SearchConfig)
    model: str | None = None
    """Policy checkpoint or HF model folder that proposes too (None: templates only)."""
    temperature: float = POLICY_TEMPERATURE
    """Sampling temperature of the policy's proposals (:data:`sparserl.model.config.POLICY_TEMPERATURE`)."""
    header_grammar: bool = False
    """Sample each proposal's header within the contract's grammar (:mod:`sparserl.model.header_grammar`)."""
    fill_facts: bool = True
    """Write the matrix card's facts into a proposal that is a specialised template's kernel wrong only in
    its block of facts (:func:`sparserl.eval.library_match.fill_facts`); judged like any other. On by default
    (as in :class:`~sparserl.generate.GenerateConfig`); ``improve`` turns it off (its searches teach the policy)."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens (None: the longest library kernel in the policy's tokens plus a margin,
    :mod:`sparserl.model.budget`)."""
    device: str = "auto"
    """Device of the model: auto, cpu or cuda[:N]."""
    store: str | None = None
    """Best-known store: a file (SQLite) or a postgresql:// URL (default: best_known.sqlite under the
    harness cache root)."""
    out: str | None = None
    """Output folder (default runs/search/<matrix name>)."""
    compile_only: bool = False
    """Compile only, even with a GPU (without one, the search is compile-only anyway)."""
    retime: int = PASSES
    """Passes of a second look before the kernel is handed back (:mod:`sparserl.request.second_look`): the
    fastest distinct candidates evaluated again, fresh; 0: the fastest first timing, as measured."""

    def __post_init__(self) -> None:
        check_op(self.op, self.k)
        require(self.temperature > 0, "--temperature", "> 0", self.temperature)
        require(self.retime >= 0, "--retime", ">= 0 (0: no second look)", self.retime)
        check_device(self.device)
        require(self.max_new_tokens is None or self.max_new_tokens >= 1, "--max-new-tokens", ">= 1",
                self.max_new_tokens)


def open_proposer(job: SearchJob, ctx: MatrixContext, evaluator, policy: Policy | None = None) -> PolicyProposer:
    """The policy's proposer for a search job: proposals from ``policy``, else from the model at
    ``job.model``; it holds the evaluator's GPU lease while it writes."""
    if policy is None:
        from sparserl.model.policy import Policy  # torch

        policy = Policy.open(job.model, device=str(pick_device(job.device)))
    return PolicyProposer(policy, ctx, name=str(job.model), temperature=job.temperature,
                          max_new_tokens=job.max_new_tokens, seed=job.search.seed, lease=evaluator.gpu_lease,
                          header_grammar=job.header_grammar, fill_facts=job.fill_facts)


def search_candidates(res: SearchResult) -> list[Candidate]:
    """A search's own candidates (not the samples it was given) as a request's, in the order they
    were proposed."""
    return [Candidate(e.proposal.text, Origin.SEARCH, e.result, f"{e.proposal.provenance.value} {e.proposal.id}"
                      + (f" ({FILLED_NOTE})" if e.proposal.note == FILLED_NOTE else ""))
            for e in sorted(res.entries, key=lambda e: e.order) if e.counted]


def search_entry(res: SearchResult, result) -> TraceEntry:
    """The search's entry whose evaluation ``result`` is (the inverse of :func:`search_candidates`: a candidate's
    ``result`` is its entry's own object)."""
    return next(e for e in res.entries if e.result is result)


def _selector_point(ctx: MatrixContext) -> tuple[str, dict, str]:
    """The rule-based selector's library variant as a template point (tried first among the seeds)."""
    name, params = variant_point(select_variant(ctx.features, ctx.op, ctx.k))
    return name, params, "selector"


def coords_later(A):
    """A function giving the SFT data's sampled coordinates of ``A`` (None without the train extra's
    encoding module), computed on first call: what a store records with a matrix."""
    def compute():
        try:
            from sparserl.encoding import sample_nonzeros
        except ImportError:
            log.info("torch is not installed: the store keeps no sampled coordinates for %s", "the matrix")
            return None
        r, c = sample_nonzeros(A, COORDS, 0)
        return r.tolist(), c.tolist()
    return compute


def _known(store: BestStore, fingerprint: str, op: Op, k: int | None, regime: str,
           arch: str | None = None) -> tuple[Any, list]:
    """The store's best row for this matrix (this GPU architecture, harness version and regime preferred: the
    report quotes its speedup as the best known) and the (id, text) seeds it gives: its best kernel on every
    architecture, those first, fastest first. A kernel found wrong on this matrix (:meth:`BestStore.retract`) is
    neither, under any key (``best`` never returns one)."""
    rows = store.best(fingerprint=fingerprint, op=op.value, k=k)
    if not rows:
        return None, []
    hv = harness_version()
    rows.sort(key=lambda r: (arch is not None and r.arch != arch, r.harness_version != hv, r.regime != regime,
                             r.time_us))
    seen, seeds = set(), []
    for r in rows:
        if r.kernel_sha not in seen:
            seen.add(r.kernel_sha)
            seeds.append((r.candidate_id or f"store/{r.kernel_sha[:16]}", r.text))
    return rows[0], seeds


def search_array(ctx: MatrixContext, cfg: SearchConfig, ev, store: BestStore | None, *,
                 run_config: dict | None = None, proposer: PolicyProposer | None = None, model: str | None = None,
                 prior: list[Candidate] = (), trace: Path | None = None, accepts=None, progress: bool = True,
                 journal=None, stop=None, ranker=None) -> SearchResult:
    """Search the request's matrix with an open evaluator and store: what ``search``, ``generate
    --search``, ``improve``, the farm and the benchmark share. ``proposer``: the policy's (None:
    templates only); ``prior``: the model's samples, already evaluated. ``journal``, ``stop``: see
    :class:`~.loop.StoreSink` and :func:`~.loop.run_search`. ``ranker``: the candidates' order (None:
    what ``cfg.cost_model`` names, for the evaluator's GPU architecture, see :func:`~.ranker.make_ranker`).

    ``accepts``: the host check of formats; default none on a GPU (converting a large matrix on the
    host for every format costs as much as the worker's own conversion, minutes at 10^7 nonzeros:
    the search learns refusals from the harness instead), and :meth:`MatrixContext.accepts` without one."""
    t = time.perf_counter()
    card, features = ctx.card, ctx.features
    log.info("%s: %d x %d, %d nonzeros; card in %.1f s", ctx.name, *ctx.shape, ctx.nnz, time.perf_counter() - t)
    arch = ev.arch if ev.has_gpu else None  # the architecture the search times on (None: nothing is timed)
    if ranker is None:
        ranker = make_ranker(cfg.cost_model, card, features, ctx.op, ctx.k, arch)
    known_row, known = _known(store, card.fingerprint, ctx.op, ctx.k, cfg.regime, arch) if store is not None else (
        None, [])
    if known_row is not None:
        log.info("the store knows %s for this matrix: %s", ctx.name, known_row.candidate_id or known_row.kernel_sha[:12])
    avoid = store.found_wrong_texts(card.fingerprint, ctx.op.value, ctx.k) if store is not None else []
    if avoid:
        log.info("%d kernel(s) found wrong on %s before are not proposed again", len(avoid), ctx.name)
    sink = None
    if store is not None:
        coords = coords_later(ctx.A)
        if ev.has_gpu:  # results will come: sample the coordinates meanwhile (seconds at 10^7 nonzeros)
            pool = ThreadPoolExecutor(1, thread_name_prefix="coords")
            coords = pool.submit(coords).result
            pool.shutdown(wait=False)  # the task runs on; its result is asked for at the first write
        source = str(Path(ctx.path).resolve()) if ctx.path else None
        sink = StoreSink(store, card, ctx.name, source, coords, run_config or {"search": asdict(cfg)}, model=model,
                         journal=journal, features=features)
    if accepts is None and not ev.has_gpu:  # nothing converts the matrix without a GPU: the host checks
        accepts = ctx.accepts
    res = run_search(ctx.A, ctx.name, ctx.op, ctx.k, cfg, ev, card=card, selector_point=_selector_point(ctx),
                     known=known, proposer=proposer, sink=sink,
                     prior=[(c.text, c.result, c.origin is Origin.MODEL_FILLED) for c in prior],
                     accepts=accepts, trace=trace, progress=progress, stop=stop, ranker=ranker, avoid=avoid)
    res.known_best = known_row
    return res


def search_matrix(job: SearchJob, evaluator=None, policy: Policy | None = None,
                  context: MatrixContext | None = None) -> tuple[KernelReport, SearchResult]:
    """Run one search; returns (report, search result). Writes to the output folder and the store.
    ``context``: the job's matrix loaded already (its card and features kept), for a caller that
    runs several jobs on one matrix."""
    select_templates(Op(job.op), job.search.templates)  # an unknown name fails before any work
    if context is None:
        check_matrix_path(job.matrix)  # so does a missing matrix file, before the store is opened
    # and a store from a newer version; a store that is not there yet is made only once results can come
    store = open_store(job.store) if store_exists(job.store) else None
    try:
        ctx = MatrixContext.reuse_or_load(context, job.matrix, job.op, job.k)
        out = Path(job.out or f"runs/search/{ctx.name}")
        prepare_out(out)  # a folder that is a file, or cannot be written, fails before the search
        regime = job.search.regime
        ev = evaluator or Evaluator(HarnessConfig(compile_only=job.compile_only, regimes=(regime,),
                                                  reward_regime=regime))
        try:
            if ev.has_gpu:
                check_fits(ctx.name, *ctx.shape, ctx.nnz, ctx.k)
                store = store or open_store(job.store)
            else:
                log.warning("no GPU: the search compiles its candidates only; nothing is timed and the store "
                            "is not updated")
            proposer = open_proposer(job, ctx, ev, policy) if job.model or policy is not None else None
            res = search_array(ctx, job.search, ev, store, run_config=asdict(job), proposer=proposer,
                               model=str(job.model) if job.model else None, trace=out / "trace.jsonl")
            return write_report(ctx, res, out, asdict(job), evaluator=ev, retime=job.retime, store=store), res
        finally:
            if evaluator is None:
                ev.close()
    finally:
        if store is not None:
            store.close()


def retract_found_wrong(store, ctx: MatrixContext, pool: CandidatePool, regime: str,
                        res: SearchResult | None = None) -> int:
    """Take the kernels a second look found wrong on fresh inputs out of ``store`` (:meth:`BestStore.retract`: their
    results on the matrix, op and k under every architecture, regime and harness version, and the found-wrong
    record that keeps them out, with the architecture, regime and harness version they were verified with and the
    second look's verdict); returns how many results went. A kernel the store never held (a sample a search did
    not record) leaves no result, but is remembered as found wrong all the same. ``res``: the search that wrote
    the store, whose ``store_improved`` is then read again from the store (``best_after_retraction``)."""
    n = 0
    for c in pool.found_wrong:
        r = c.result
        key = normalised(c.text)
        reason = pool.dropped.get(key, "found wrong when evaluated again")
        layouts = {c.text} | {o.text for o in pool.candidates if normalised(o.text) == key}  # one kernel to the pool
        for text in sorted(layouts):
            n += store.retract(ctx.card.fingerprint, ctx.op.value, ctx.k, r.arch or "unknown", regime,
                               str(r.harness_version), text, reason=reason)
    if n:
        log.warning("%d result(s) of kernels found wrong when evaluated again were taken out of the best-known store",
                    n)
    if res is not None and pool.found_wrong:
        res.best_after_retraction = any(
            b.run_id == res.run_id for b in store.best(fingerprint=ctx.card.fingerprint, op=ctx.op.value, k=ctx.k,
                                                       regime=regime, harness_version=harness_version()))
    return n


@contextlib.contextmanager
def retracting_found_wrong(pool: CandidatePool, retract: Callable[[], Any] | None):
    """Around a second look: afterwards, when ``pool`` holds kernels found wrong, ``retract()`` (which takes them
    out of the store the request wrote to, :func:`retract_found_wrong`; None: no store was written), whether or
    not the look raised: found wrong is found wrong, whether or not a kernel is handed back. When the look
    raised (every kernel dropped, an interrupt), its exception is the one that propagates, and a retraction
    that fails beside it (a store that cannot be reached) is logged and kept on it as ``retraction_failed`` (a
    caller that must not call the matrix finished then can tell); after a look that returned, a failed
    retraction is the request's error."""
    try:
        yield
    except BaseException as exc:
        if retract is not None and pool.found_wrong:
            try:
                retract()
            except Exception as err:  # the store's error (or an unwrapped one of its driver) beside the look's
                log.error("the kernels found wrong when evaluated again may stay in the best-known store (not "
                          "retracted: %s)", err)
                exc.retraction_failed = err
        raise
    if retract is not None and pool.found_wrong:
        retract()


def choose_after_search(ctx: MatrixContext, res: SearchResult, evaluator=None, retime: int = 0, store=None,
                        stop=None) -> tuple[CandidatePool, Candidate | None, SecondLook | None]:
    """The search's candidates as a pool, the kernel to hand back (None: none usable) and the second look that
    chose it. With an ``evaluator`` and ``retime`` passes, the kernel is chosen by a second look
    (:mod:`sparserl.request.second_look`), and the kernels it finds wrong leave ``store``
    (:func:`retracting_found_wrong`: when the look fails, its error, :class:`SecondLookFailed`, is raised and the
    store's, if any, logged; the store's error is kept on the look's as ``retraction_failed``). ``stop``: see
    :func:`~sparserl.request.second_look.second_look`. What ``search``'s report, ``tune`` and the farm share."""
    pool = CandidatePool(ctx, timed=res.timed)
    pool.add(search_candidates(res))
    best = pool.best()
    if best is None:
        return pool, None, None
    with retracting_found_wrong(pool, partial(retract_found_wrong, store, ctx, pool, res.regime, res)
                                if store is not None else None):
        best, look = (look_again(pool, evaluator, best, res.regime, retime, stop) if evaluator is not None
                      else (best, None))
    return pool, best, look


def write_report(ctx: MatrixContext, res: SearchResult, out: Path, config: dict, evaluator=None,
                 retime: int = 0, store=None, stop=None) -> KernelReport:
    """The search's kernel and its report (``config``: the run's settings, recorded), written to
    ``out`` (the trace is there already); raises SparseRLError when no candidate is usable. The kernel is
    :func:`choose_after_search`'s (a second look with an ``evaluator`` and ``retime`` passes)."""
    pool, best, look = choose_after_search(ctx, res, evaluator, retime, store, stop)
    if best is None:
        what = "correct" if res.timed else "compiling"
        raise SparseRLError(f"no {what} kernel among the {len(res.entries)} candidates for {ctx.name} "
                            f"({pool.kinds()}); the trace is in {out / 'trace.jsonl'}")
    rep = KernelReport.of(ctx, best, pool, [c.result for c in pool.candidates], "candidates evaluated", config,
                          res.seconds + (look.seconds if look is not None else 0.0), search=search_summary(res),
                          second_look=look, notes=[dropped_note(pool)] if pool.dropped else [])
    rep.write(out, ctx, search_markdown(res))
    return rep


def search_after_sampling(ctx: MatrixContext, job: SearchJob, ev, proposer: PolicyProposer | None,
                          samples: list[Candidate], out: Path, config: dict[str, Any]) -> SearchResult:
    """``generate --search N``: search ``job.search.budget`` candidates after the model's ``samples``
    (which enter the search as evaluated, spending no budget). The trace goes to
    out/search_trace.jsonl; ``config``: the run's settings, recorded in the store (a store that is not there yet
    is made only where results can come)."""
    store = open_store(job.store) if ev.has_gpu or store_exists(job.store) else None
    try:
        out.mkdir(parents=True, exist_ok=True)
        return search_array(ctx, job.search, ev, store, run_config=config, proposer=proposer, model=str(job.model),
                            prior=samples, trace=out / "search_trace.jsonl")
    finally:
        if store is not None:
            store.close()


def search_markdown(res: SearchResult) -> str:
    """The report's search section: how the budget went and what each kind of proposal found."""
    lines = ["", "## Search", "",
             f"- {res.evaluated} candidates evaluated in {res.seconds:.1f} s (stopped: {res.stopped}); "
             f"regime {res.regime}; trace in trace.jsonl",
             "- store: " + store_line(res)]
    if res.refused:
        lines.append("- not proposed (the matrix refuses the format, checked on the host): "
                     + ", ".join(f"{k} ({v})" for k, v in sorted(res.refused.items())))
    if res.render_errors:
        lines.append("- not proposed (the template failed to render the point, a template bug): "
                     + "; ".join(f"{k} ({v})" for k, v in sorted(res.render_errors.items())))
    lines += ["", "| provenance | candidates | correct | best time (us) |", "| --- | --- | --- | --- |"]
    for prov, d in sorted(res.by_provenance().items()):
        t = f"{d['best_us']:.2f}" if d["best_us"] is not None else "-"
        lines.append(f"| {prov} | {d['n']} | {d['correct']} | {t} |")
    return "\n".join(lines) + "\n"


def store_line(res: SearchResult) -> str:
    if not res.timed:
        return "not updated: nothing was timed without a GPU (only verified kernels enter the store)"
    refused = (f" ({res.store_refused} refused: their kernel had been found wrong on this matrix)"
               if res.store_refused else "")
    if res.store_writes == 0:
        return ("not updated: no candidate was verified correct" if not refused
                else f"not updated: no verified result written{refused}")
    kb = res.known_best
    was = f" (it was {kb.speedup:.2f}x)" if kb is not None else ""
    if res.store_improved:
        return (f"{res.store_writes} verified results written{refused}; this run set the best known for the "
                f"matrix{was}")
    return f"{res.store_writes} verified results written{refused}; the best known stays faster{was}"
