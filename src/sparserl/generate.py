"""The main job: give SparseRL a matrix, get back a verified kernel and a report.

``generate_kernel`` samples N completions from the policy for the matrix, evaluates all of
them with the harness (verified against fp64, timed against cuSPARSE), and writes:

* ``kernel.cu``: the best correct kernel, as a contract completion (FORMAT/LAUNCH header + code);
* ``launch.json``: format and parameters, the LAUNCH lines, the kernel argument order, and
  the launch geometry evaluated for this matrix;
* ``report.json`` / ``report.md``: verdict, times, speedup vs cuSPARSE, roofline fraction,
  conversion cost and break-even call count, sample statistics, the runners-up.

Every user gets a kernel:

* If no sample is usable, the reference library is searched instead: every variant is
  evaluated on the matrix and the fastest verified one returned, labelled as such.
* With no trained model (nothing at ``model``), no model is used: the library alone, with a
  note that says how to train one.
* Without a GPU nothing can be verified: ``compile_only`` returns the best *compiling*
  candidate (the model's, else the rule-based selector's library choice), marked unverified,
  with the one command that verifies it on a GPU.

Samples, a search's candidates (``search``, :mod:`sparserl.search`) and library variants are
candidates of one kind in one :class:`~sparserl.request.candidates.CandidatePool`, which chooses
the kernel as ``sparserl search`` does; another source of kernel texts adds candidates there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparserl.checks import check_device, check_op, require
from sparserl.devices import pick_device
from sparserl.errors import SparseRLError
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.model.config import POLICY_TEMPERATURE
from sparserl.request.candidates import Candidate, CandidatePool, Origin
from sparserl.request.context import MatrixContext
from sparserl.request.library import library_texts
from sparserl.request.report import KernelReport, prepare_out
from sparserl.request.second_look import PASSES, SecondLook, SecondLookFailed, dropped_note, look_again
from sparserl.search.loop import SearchConfig, SearchResult, search_summary
from sparserl.search.run import (SearchJob, open_proposer, retract_found_wrong, retracting_found_wrong,
                                 search_after_sampling, search_candidates)
from sparserl.search.store import open_store

if TYPE_CHECKING:
    from sparserl.model.policy import Policy

log = logging.getLogger(__name__)

TRAIN_HINT = ("train one with 'sparserl demo' (every stage, small), or 'sparserl pretrain', 'sparserl data build', "
              "'sparserl sft' and 'sparserl ppo' (see the README), then pass --model")


@dataclass(frozen=True)
class GenerateConfig:
    """One generate run."""

    matrix: str
    """.mtx, .mtx.gz or .npz file."""
    op: str = "spmv"
    """'spmv' or 'spmm'."""
    k: int | None = None
    """SpMM columns (required for spmm, refused for spmv)."""
    model: str | None = None
    """Policy checkpoint (or HF model folder); None: runs/ppo/checkpoint, else the policy trained last
    under runs/ (:func:`find_model`); when there is none, the library's kernel is returned."""
    samples: int = 16
    """Completions sampled from the policy."""
    temperature: float = POLICY_TEMPERATURE
    """Sampling temperature (> 0; :data:`sparserl.model.config.POLICY_TEMPERATURE` by default)."""
    header_grammar: bool = False
    """Sample each kernel's header within the contract's grammar (:mod:`sparserl.model.header_grammar`)."""
    fill_facts: bool = True
    """Write the matrix card's facts into a sample that is a specialised template's kernel wrong only in its
    block of facts (:func:`sparserl.eval.library_match.fill_facts`); such a kernel is judged like any other
    and reported as the model's with the card's facts. On by default: the policy writes a specialised body
    right and its facts from memory (the results of 2026-12-06, policy-full-preset-t0.7: 28 of the families'
    36 failures); measurements of the policy as itself turn it off. Only the template that spells its facts
    (``csr_adaptive_spec``) has a block to fill: the others name theirs (:mod:`sparserl.harness.matrix_facts`)."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens (None: the longest library kernel in the policy's tokens plus a margin,
    :mod:`sparserl.model.budget`)."""
    out: str | None = None
    """Output folder (default runs/generate/<matrix name>)."""
    library_fallback: bool = True
    """When no sample is usable (or there is no model), return the best library variant (labelled)."""
    regime: str = "cold"
    """L2 regime the speedup refers to: 'cold' (flushed) or 'warm'."""
    device: str = "auto"
    """Device of the model: auto, cpu or cuda[:N]."""
    compile_only: bool = False
    """No GPU: the best compiling kernel, unverified."""
    seed: int = 0
    """Sampling seed."""
    search: int = 0
    """After sampling, search this many more candidates (templates, mutations, policy refinements;
    see sparserl.search) and return the overall best; 0: no search."""
    store: str | None = None
    """Best-known store the search reads and updates (default: under the harness cache root)."""
    retime: int = PASSES
    """Passes of a second look before the kernel is handed back: the fastest distinct correct candidates
    evaluated again, fresh, this many times each, the lowest median chosen and reported
    (:mod:`sparserl.request.second_look`); 0: the fastest first timing, as measured."""

    def __post_init__(self) -> None:
        check_op(self.op, self.k)
        require(self.samples >= 1, "--samples", ">= 1", self.samples)
        require(self.temperature > 0, "--temperature", "> 0 (1.0: the policy as trained)", self.temperature)
        require(self.max_new_tokens is None or self.max_new_tokens >= 1, "--max-new-tokens", ">= 1",
                self.max_new_tokens)
        require(self.regime in ("cold", "warm"), "--regime", "cold or warm", self.regime)
        require(self.search >= 0, "--search-budget", ">= 0 candidates", self.search)
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
        require(self.retime >= 0, "--retime", ">= 0 (0: no second look)", self.retime)
        check_device(self.device)

    def search_job(self, model: str) -> SearchJob:
        """The search ``search`` asks for after the samples, with this run's ``model`` and sampling."""
        return SearchJob(matrix=self.matrix, op=self.op, k=self.k,
                         search=SearchConfig(budget=max(self.search, 1), regime=self.regime, seed=self.seed),
                         model=model, temperature=self.temperature, header_grammar=self.header_grammar,
                         fill_facts=self.fill_facts,
                         max_new_tokens=self.max_new_tokens,
                         device=self.device, store=self.store, compile_only=self.compile_only)


@dataclass(frozen=True)
class Choice:
    """What ``generate`` chose, and from what."""

    best: Candidate
    pool: CandidatePool
    """Every candidate: samples, the search's, library variants."""
    samples: tuple[Candidate, ...]
    """The model's samples (none without a model)."""
    search: SearchResult | None
    """The search after the samples (None: none asked for)."""
    notes: tuple[str, ...]
    """What the user should know about how the kernel was found."""
    look: SecondLook | None = None
    """The second look that chose ``best`` among the fastest (None: none, compile-only or ``retime`` 0)."""


def has_model(path: str) -> bool:
    """Whether ``path`` holds a policy checkpoint or a Hugging Face model folder."""
    return (Path(path) / "policy.json").exists() or (Path(path) / "config.json").exists()


DEFAULT_MODEL = "runs/ppo/checkpoint"
"""Where ``sparserl ppo`` writes its policy with the default settings."""


def find_model(given: str | None, runs: Path = Path("runs")) -> tuple[str, str | None]:
    """(the model to sample, a note when it was looked for rather than given). Not given:
    :data:`DEFAULT_MODEL`, else the policy checkpoint trained last under ``runs`` (``runs/demo/ppo``
    after ``sparserl demo``, say), else :data:`DEFAULT_MODEL` all the same (no model there)."""
    if given is not None or has_model(DEFAULT_MODEL):
        return given or DEFAULT_MODEL, None
    found = [p.parent for pattern in ("*/checkpoint/policy.json", "*/*/checkpoint/policy.json", "*/best/policy.json")
             for p in runs.glob(pattern)]
    if not found:
        return DEFAULT_MODEL, None
    latest = max(found, key=lambda p: (p / "policy.json").stat().st_mtime)
    return str(latest), (f"no model at {DEFAULT_MODEL}: used {latest}, the policy trained last under {runs}/ "
                         "(pass --model to choose another)")


def open_policy(model: str, device: str, policy: Policy | None = None) -> Policy | None:
    """The policy to sample: the one given, else ``model`` opened, else None (no model there)."""
    if policy is not None or not has_model(model):
        return policy
    from sparserl.model.policy import Policy  # torch

    return Policy.open(model, device=str(pick_device(device)))


def _library_fallback(ctx: MatrixContext, ev: Evaluator, pool: CandidatePool) -> None:
    """The library's candidates, when nothing else was usable: every variant (the fastest verified one
    wins); compile-only, where nothing is timed, the selector's pick, and the rest only if it fails."""
    texts = [(t, Origin.SELECTOR if pick else Origin.LIBRARY) for t, pick in library_texts(ctx)]
    if not pool.timed:
        if pool.usable(pool.evaluate(ev, texts[:1])):
            return
        texts = texts[1:]
    pool.evaluate(ev, texts)


def _look(cfg: GenerateConfig, ctx: MatrixContext, ev: Evaluator, pool: CandidatePool, notes: list[str]
          ) -> tuple[Candidate, SecondLook | None]:
    """The kernel to hand back and its second look: the pool's fastest, else the library's (when nothing is
    usable, or every kernel looked at again was dropped); raises SparseRLError when there is none."""
    library_tried = False
    while True:
        if pool.best() is None and cfg.library_fallback and not library_tried:
            _library_fallback(ctx, ev, pool)
            library_tried = True
        best = pool.best()
        if best is None:
            dropped = f", {len(pool.dropped)} dropped by a second look" if pool.dropped else ""
            raise SparseRLError(f"no {'correct' if pool.timed else 'compiling'} kernel for {ctx.name}: "
                                f"{pool.kinds()}{dropped}")
        try:
            return look_again(pool, ev, best, cfg.regime, cfg.retime)
        except SecondLookFailed as exc:  # every kernel looked at was dropped: the library's, if not tried yet
            if library_tried or not cfg.library_fallback:
                raise
            notes.append(f"{exc}; the library's kernels were evaluated next")
            for c in pool.usable():  # what is left unlooked among the samples is no likelier to hold
                pool.drop(c, "not looked at again: the kernels before it were all dropped")


def _choose(cfg: GenerateConfig, ctx: MatrixContext, ev: Evaluator, policy: Policy | None, out: Path) -> Choice:
    """Samples, then (if asked) a search, then (if nothing is usable) the library; the best of all."""
    model, found = find_model(cfg.model) if policy is None else (cfg.model or DEFAULT_MODEL, None)
    notes = [found] if found else []
    policy = open_policy(model, cfg.device, policy)
    job = cfg.search_job(model)
    pool = CandidatePool(ctx, timed=not cfg.compile_only)
    proposer = open_proposer(job, ctx, ev, policy) if policy is not None else None
    if proposer is None:
        if not cfg.library_fallback and not cfg.search:
            raise SparseRLError(f"no model at {model} and --no-library-fallback given: {TRAIN_HINT}")
        notes.append(f"no model was used (nothing at {model}): this kernel was not written for your matrix "
                     f"by a model; to get one that is, {TRAIN_HINT}")
        log.info("no model at %s: %s", model, "the search proposes without one" if cfg.search
                 else "the library's kernel is returned")
    texts = proposer.sample(cfg.samples, show=True) if proposer is not None else []
    filled = proposer.last_filled if proposer is not None else ()
    samples = pool.evaluate(ev, [(t, Origin.MODEL_FILLED if f else Origin.MODEL)
                                 for t, f in zip(texts, filled, strict=True)])
    if any(filled):
        notes.append(f"{sum(filled)} of {len(texts)} samples had their block of specialised facts written from "
                     f"the matrix card (--fill-facts)")
    searched = None
    if cfg.search:  # more candidates from a search (the samples enter it as evaluated)
        searched = search_after_sampling(ctx, job, ev, proposer, samples, out, asdict(cfg))
        pool.add(search_candidates(searched))

    def retract() -> int:  # the search after the samples wrote to a store: the kernels found wrong leave it
        with open_store(job.store) as store:
            return retract_found_wrong(store, ctx, pool, cfg.regime, searched)

    with retracting_found_wrong(pool, retract if cfg.search else None):
        best, look = _look(cfg, ctx, ev, pool, notes)
    if pool.dropped:
        notes.append(dropped_note(pool))
    return Choice(best, pool, tuple(samples), searched, tuple(notes), look)


def generate_kernel(cfg: GenerateConfig, evaluator: Evaluator | None = None,
                    policy: Policy | None = None, context: MatrixContext | None = None) -> KernelReport:
    """Run the main job; returns the report (also written to the output folder). ``context``: the
    request's matrix loaded already (its card and features kept), for a caller that runs several
    jobs on one matrix."""
    t0 = time.perf_counter()
    ctx = MatrixContext.reuse_or_load(context, cfg.matrix, cfg.op, cfg.k)
    out = Path(cfg.out or f"runs/generate/{ctx.name}")
    prepare_out(out)
    ev = evaluator or Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold", "warm"),
                                              reward_regime=cfg.regime))
    try:
        if not cfg.compile_only and not ev.has_gpu:
            raise SparseRLError("no GPU visible: a kernel can only be verified and timed on a GPU "
                                "(use --compile-only to see what the model writes, unverified)")
        choice = _choose(cfg, ctx, ev, policy, out)
    finally:
        if evaluator is None:
            ev.close()
    notes = list(choice.notes)
    if cfg.compile_only:
        notes.append(f"unverified: without a GPU nothing is run or timed; verify it on a GPU with: "
                     f"sparserl check-kernel {out / 'kernel.cu'} {cfg.matrix}"
                     + (f" --op spmm --k {ctx.k}" if ctx.k else ""))
    rep = KernelReport.of(ctx, choice.best, choice.pool, [c.result for c in choice.samples], "samples drawn",
                          asdict(cfg), time.perf_counter() - t0, used_model=bool(choice.samples), notes=notes,
                          search=search_summary(choice.search) if choice.search is not None else None,
                          second_look=choice.look)
    rep.write(out, ctx)
    return rep
