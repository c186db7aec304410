"""``sparserl search``: one matrix in, the best verified kernel of a budgeted search out.

:func:`search_matrix` loads the matrix, checks that it fits on the GPU, opens the best-known
store, runs :func:`~sparserl.search.loop.run_search` (with the policy when a model is given),
and writes to the output folder the best kernel and its report in ``generate``'s shape
(``kernel.cu``, ``launch.json``, ``report.json``, ``report.md``) plus ``trace.jsonl`` (every
candidate: provenance, parent, verdict, times, speedup, text).

:func:`search_after_sampling` is ``generate --search N``: the model's samples enter the search
as already evaluated, N more candidates are searched, and generate returns the best of all.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op
from sparserl.search.loop import (
    SearchConfig,
    SearchResult,
    StoreSink,
    TraceEntry,
    run_search,
    search_summary,
)
from sparserl.search.store import COORDS, BestStore, harness_version, open_store

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
    temperature: float = 1.0
    """Sampling temperature of the policy's proposals."""
    max_new_tokens: int = 1536
    device: str = "auto"
    """Device of the model: auto, cpu or cuda[:N]."""
    store: str | None = None
    """Best-known store: a file (SQLite) or a postgresql:// URL (default: best_known.sqlite under the
    harness cache root)."""
    out: str | None = None
    """Output folder (default runs/search/<matrix name>)."""
    compile_only: bool = False
    """Compile only, even with a GPU (without one, the search is compile-only anyway)."""

    def __post_init__(self) -> None:
        if self.op not in ("spmv", "spmm"):
            raise SparseRLError(f"--op must be spmv or spmm, got {self.op!r}")
        if self.op == "spmm" and (self.k is None or self.k < 1):
            raise SparseRLError("--op spmm needs --k K (K >= 1 columns of X)")
        if self.temperature <= 0 or self.max_new_tokens < 1:
            raise SparseRLError("need temperature > 0 and max_new_tokens >= 1")


def matrix_name(path: str) -> str:
    return Path(path).name.split(".")[0]


def _selector_point(features, op: Op) -> tuple[str, dict, str] | None:
    from sparserl.eval.selector import select_variant

    v = select_variant(features, op)
    return v.strategy, dict(v.format_params + v.tunables), "selector"


def _format_takes(text: str, op: Op, A) -> bool:
    """Whether the completion's FORMAT line converts ``A`` (template points were checked when
    proposed; free text was not)."""
    from sparserl.formats import accepts
    from sparserl.harness.extract import Extracted, extract

    ex = extract(text, op)
    return isinstance(ex, Extracted) and accepts(A, ex.header.format, ex.header.params)


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


def _known(store: BestStore, fingerprint: str, op: Op, k: int | None, regime: str) -> tuple[Any, list]:
    """The store's best row for this matrix (this harness version and regime preferred) and the
    (id, text) seeds it gives: its best kernel on every architecture, fastest first."""
    rows = store.best(fingerprint=fingerprint, op=op.value, k=k)
    if not rows:
        return None, []
    hv = harness_version()
    rows.sort(key=lambda r: (r.harness_version != hv, r.regime != regime, r.time_us))
    seen, seeds = set(), []
    for r in rows:
        if r.kernel_sha not in seen:
            seen.add(r.kernel_sha)
            seeds.append((r.candidate_id or f"store/{r.kernel_sha[:16]}", r.text))
    return rows[0], seeds


def open_proposer(job: SearchJob, A, op: Op, k, card, evaluator, policy=None):
    """The policy proposer of a search job: proposals from ``policy``, else from the model at ``job.model``."""
    from sparserl.search.policy import PolicyProposer

    if policy is None:
        from sparserl.devices import pick_device
        from sparserl.model.policy import Policy

        policy = Policy.open(job.model, device=str(pick_device(job.device)))
    return PolicyProposer(policy, A, op, k, card.prompt(), name=str(job.model), temperature=job.temperature,
                          max_new_tokens=job.max_new_tokens, seed=job.search.seed, lease=evaluator.gpu_lease)


def _verdict(best: TraceEntry | None, timed: bool) -> str:
    if not timed:
        return "compiled, NOT verified (no GPU): do not use without checking on a GPU"
    sp = best.result.speedup
    if sp is not None and sp > 1.0:
        return f"correct, {sp:.2f}x faster than cuSPARSE"
    return f"correct, but not faster than cuSPARSE ({sp or 0:.2f}x); returned the best correct kernel anyway"


def _runners_up(res: SearchResult, chosen: TraceEntry) -> list[dict]:
    from sparserl.search.space import normalised

    key = (lambda e: e.result.speedup or 0.0) if res.timed else (lambda e: 0.0)
    seen, out = {normalised(chosen.proposal.text)}, []
    for e in sorted(res.entries, key=key, reverse=True):
        norm = normalised(e.proposal.text)
        if norm in seen:
            continue
        seen.add(norm)
        out.append({"source": f"{e.proposal.provenance.value} {e.proposal.id}", "format": e.result.format,
                    "verdict": "correct" if e.result.ok else e.result.error_kind.value,
                    "error_kind": e.result.error_kind.value, "speedup": e.result.speedup})
        if len(out) == 5:
            break
    return out


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
    if res.store_writes == 0:
        return "not updated: no candidate was verified correct"
    kb = res.known_best
    was = f" (it was {kb.speedup:.2f}x)" if kb is not None else ""
    if res.store_improved:
        return f"{res.store_writes} verified results written; this run set the best known for the matrix{was}"
    return f"{res.store_writes} verified results written; the best known stays faster{was}"


def write_outputs(res: SearchResult, A, out: Path, job_config: dict, path: str) -> dict:
    """The best kernel and its report in ``out`` (generate's shape; the trace is already there)."""
    from sparserl.kernel_report import write_kernel_report

    op = Op(res.op)
    if res.timed:
        chosen = res.best
    else:  # compile-only: the first candidate that compiled and whose format takes the matrix
        chosen = next((e for e in sorted(res.entries, key=lambda e: e.order)
                       if e.result.error_kind is ErrorKind.NO_GPU and _format_takes(e.proposal.text, op, A)), None)
    kinds = sorted({e.result.error_kind.value for e in res.entries})
    summary = search_summary(res)
    if chosen is None:
        what = "correct" if res.timed else "compiling"
        raise SparseRLError(f"no {what} kernel among the {len(res.entries)} candidates for {res.matrix} "
                            f"({', '.join(kinds) or 'none evaluated'}); the trace is in {out / 'trace.jsonl'}")
    r = chosen.result
    rep = {"matrix": res.matrix, "path": path, "shape": list(A.shape), "nnz": int(A.nnz), "op": res.op, "k": res.k,
           "verdict": _verdict(chosen, res.timed),
           "source": f"search: {chosen.proposal.provenance.value} {chosen.proposal.id}",
           "verified": res.timed, "best": r.to_dict(),
           "samples": {"n": len(res.entries), "compiled": sum(e.result.compiled for e in res.entries),
                       "correct": sum(e.result.correct for e in res.entries), "label": "candidates",
                       "verb": "evaluated"},
           "runners_up": _runners_up(res, chosen), "config": job_config, "seconds": res.seconds,
           "search": summary}
    write_kernel_report(out, chosen.proposal.text, op, A, res.k, rep, search_markdown(res))
    rep["out"] = str(out)
    return rep


def cached_accepts(A):
    """``accepts(format, params)`` for ``A``, each (format, params) converted once on the host."""
    from sparserl.formats import accepts

    memo: dict[tuple, bool] = {}

    def check(fmt: str, params) -> bool:
        key = (fmt, tuple(sorted(dict(params or {}).items())))
        if key not in memo:
            memo[key] = accepts(A, fmt, dict(params or {}))
        return memo[key]
    return check


def search_array(A, name: str, op: Op, k: int | None, cfg: SearchConfig, ev, store: BestStore | None, *,
                 card=None, features=None, source_path: str | None = None, run_config: dict | None = None,
                 proposer_factory=None, model: str | None = None, prior=(), trace: Path | None = None,
                 accepts=None, progress: bool = True, journal=None, stop=None, ranker=None) -> SearchResult:
    """Search a loaded matrix with an open evaluator and store: what ``search``, ``generate --search``,
    the farm and the benchmark share. ``proposer_factory(card)``: the policy's proposer (None: templates
    only). ``journal``, ``stop``: see :class:`~.loop.StoreSink` and :func:`~.loop.run_search`.
    ``card``/``features``: the matrix's card and structure features when already computed.
    ``ranker``: the candidates' order (None: what ``cfg.cost_model`` names, see :func:`~.ranker.make_ranker`).

    ``accepts``: the host check of formats; default none on a GPU (converting a large matrix on the
    host for every format costs as much as the worker's own conversion, minutes at 10^7 nonzeros:
    the search learns refusals from the harness instead), and :func:`cached_accepts` without one."""
    from sparserl.matrices.card import card_and_features
    from sparserl.matrices.features import compute_features
    from sparserl.search.ranker import make_ranker

    t = time.perf_counter()
    if card is None:
        card, features = card_and_features(A)
    elif features is None:  # the selector needs them (it always did)
        features = compute_features(A)
    log.info("%s: %d x %d, %d nonzeros; card in %.1f s", name, *A.shape, A.nnz, time.perf_counter() - t)
    if ranker is None:
        ranker = make_ranker(cfg.cost_model, card, features, op, k)
    known_row, known = _known(store, card.fingerprint, op, k, cfg.regime) if store is not None else (None, [])
    if known_row is not None:
        log.info("the store knows %s for this matrix: %s", name, known_row.candidate_id or known_row.kernel_sha[:12])
    proposer = proposer_factory(card) if proposer_factory is not None else None
    sink = None
    if store is not None:
        coords = coords_later(A)
        if ev.has_gpu:  # results will come: sample the coordinates meanwhile (seconds at 10^7 nonzeros)
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(1, thread_name_prefix="coords")
            coords = pool.submit(coords).result
            pool.shutdown(wait=False)  # the task runs on; its result is asked for at the first write
        sink = StoreSink(store, card, name, source_path, coords, run_config or {"search": asdict(cfg)}, model=model,
                         journal=journal, features=features)
    if accepts is None and not ev.has_gpu:  # nothing converts the matrix without a GPU: the host checks
        accepts = cached_accepts(A)
    res = run_search(A, name, op, k, cfg, ev, card=card, selector_point=_selector_point(features, op), known=known,
                     proposer=proposer, prior=prior, sink=sink, accepts=accepts, trace=trace, progress=progress,
                     stop=stop, ranker=ranker)
    res.known_best = known_row
    return res


def search_matrix(job: SearchJob, evaluator=None, policy=None) -> tuple[dict, SearchResult]:
    """Run one search; returns (report, search result). Writes to the output folder and the store."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.matrices import load_matrix
    from sparserl.search.footprint import check_fits
    from sparserl.search.space import select_templates

    op = Op(job.op)
    k = job.k if op is Op.SPMM else None
    select_templates(op, job.search.templates)  # an unknown name fails before any work
    store = open_store(job.store)  # so does a store from a newer version
    try:
        A = load_matrix(job.matrix)
        name = matrix_name(job.matrix)
        out = Path(job.out or f"runs/search/{name}")
        own = evaluator is None
        regime = job.search.regime
        ev = evaluator or Evaluator(HarnessConfig(compile_only=job.compile_only, regimes=(regime,),
                                                  reward_regime=regime))
        try:
            if ev.has_gpu:
                check_fits(name, int(A.shape[0]), int(A.shape[1]), int(A.nnz), k)
            else:
                log.warning("no GPU: the search compiles its candidates only; nothing is timed and the store "
                            "is not updated")
            factory = None
            if job.model or policy is not None:
                factory = lambda card: open_proposer(job, A, op, k, card, ev, policy)  # noqa: E731
            config = asdict(job)
            out.mkdir(parents=True, exist_ok=True)
            res = search_array(A, name, op, k, job.search, ev, store, source_path=str(Path(job.matrix).resolve()),
                               run_config=config, proposer_factory=factory,
                               model=str(job.model) if job.model else None, trace=out / "trace.jsonl")
            return write_outputs(res, A, out, config, job.matrix), res
        finally:
            if own:
                ev.close()
    finally:
        store.close()


def search_after_sampling(cfg, A, name: str, ev, policy, texts: list[str], results: list[EvalResult],
                          out: Path) -> tuple[list[dict], dict]:
    """``generate --search N``: search N candidates after the model's samples (which enter the
    search as evaluated, spending no budget); returns generate's candidate records for the
    search's own candidates, and the search's summary. The trace goes to out/search_trace.jsonl."""
    from sparserl.search.policy import PolicyProposer

    op = Op(cfg.op)
    k = cfg.k if op is Op.SPMM else None
    scfg = SearchConfig(budget=cfg.search, regime=cfg.regime, seed=cfg.seed)
    factory = None
    if policy is not None:
        factory = lambda card: PolicyProposer(  # noqa: E731
            policy, A, op, k, card.prompt(), name=str(cfg.model), temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, lease=ev.gpu_lease)
    store = open_store(cfg.store)
    try:
        out.mkdir(parents=True, exist_ok=True)
        res = search_array(A, name, op, k, scfg, ev, store, source_path=str(Path(cfg.matrix).resolve()),
                           run_config=asdict(cfg), proposer_factory=factory, model=str(cfg.model),
                           prior=list(zip(texts, results)), trace=out / "search_trace.jsonl")
    finally:
        store.close()
    extra = [{"text": e.proposal.text, "result": e.result,
              "source": f"search: {e.proposal.provenance.value} {e.proposal.id}"} for e in res.entries if e.counted]
    return extra, search_summary(res)
