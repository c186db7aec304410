"""``sparserl.tune(A)``: the best known kernel for a matrix's structure, as an operator.

Read top to bottom, :func:`choose_kernel` is:

1. the structure fingerprint of ``A`` (values excluded) is looked up in the best-known store, for
   this op, k and GPU architecture; a hit is compiled (disk-cached) and used: no search;
2. otherwise :func:`_search_for` runs the search (templates, seeds, mutations; every candidate
   verified and timed by the harness) within the budget, and the store keeps its verified results;
   the fastest are evaluated again, fresh, and the lowest median wins (the second look, as ``search``
   and ``generate`` choose; one that fails there leaves the store as found wrong);
3. the kernel is used when its measured speedup over cuSPARSE is above ``min_speedup``; otherwise
   (or when nothing verified) the library, cuSPARSE itself, runs the operator.

:class:`TuneReport` says which of the three happened, on one line (logged at INFO and kept on the
operator as ``op.report``). :func:`tune` needs a GPU; :func:`choose_kernel` runs on a machine
without one too (compile-only: a store hit compiles, a search verifies nothing).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import scipy.sparse as sp

from sparserl.errors import ContractError, SparseRLError
from sparserl.kernels.contract import Header, Op
from sparserl.request.second_look import PASSES

log = logging.getLogger(__name__)

STORE, SEARCH, LIBRARY, GIVEN = "store", "search", "library", "given"


@dataclass(frozen=True)
class TuneConfig:
    """How :func:`tune` finds a kernel (kept by the operator to tune its transpose the same way)."""

    budget: int = 16
    """Candidates the search evaluates when the store has nothing for this structure."""
    store: Any = None
    """Best-known store: a file (SQLite), a postgresql:// URL, an open BestStore, or None for the
    default store under the harness cache root."""
    regime: str = "warm"
    """L2 regime candidates are ranked in: 'warm' (back to back, as in a solver or a training loop)
    or 'cold' (L2 flushed before each run)."""
    seconds: float | None = None
    """Stop submitting candidates after this many seconds (None: only the budget stops the search)."""
    min_speedup: float = 1.0
    """Use the kernel only when its measured speedup over cuSPARSE is above this; else the library."""
    evaluator: Any = None
    """An open harness Evaluator to search with (None: one is started for each search and closed).
    The operator keeps it to tune its transpose on first use: keep it open until then, or tune with
    ``backward=True``."""
    name: str = "matrix"
    """How logs, the store and the search's trace name the matrix."""
    progress: bool = False
    """Show the search's progress bar."""
    retime: int = PASSES
    """After a search, the fastest candidates are evaluated again this many times each, fresh (new inputs,
    every check), and the lowest median wins; a candidate that fails there leaves the store as found wrong
    (:mod:`sparserl.request.second_look`, as ``search`` and ``generate`` do before they hand a kernel back).
    0: the search's first timings decide, as they are."""

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise SparseRLError(f"budget must be at least 1 candidate, got {self.budget}")
        if self.retime < 0:
            raise SparseRLError(f"retime must be 0 (no second look) or more passes, got {self.retime}")
        if self.regime not in ("warm", "cold"):
            raise SparseRLError(f"regime must be warm or cold, got {self.regime!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise SparseRLError(f"seconds must be positive, got {self.seconds}")


@dataclass(frozen=True)
class TuneReport:
    """What :func:`tune` did, as one line and as fields."""

    action: str
    """'store' (found in the best-known store), 'search' (searched, a kernel won), 'library'
    (cuSPARSE runs it: no kernel beat it, or none verified) or 'given' (``from_kernel``)."""
    line: str
    """The one line that says it (logged at INFO)."""
    fingerprint: str
    op: str
    k: int | None
    searched: int = 0
    """Candidates the search evaluated (0: none, the store knew the structure)."""
    kernel: str | None = None
    """The kernel's candidate id or format (None: the library)."""
    format: str | None = None
    speedup: float | None = None
    """The kernel's (or the best rejected kernel's) measured speedup over cuSPARSE, as stored."""
    time_us: float | None = None
    cusparse_us: float | None = None
    regime: str | None = None
    seconds: float = 0.0
    """Wall time of the whole tune (lookup, search, compile, conversion, upload)."""
    search_seconds: float = 0.0


@dataclass(frozen=True)
class KernelChoice:
    """The kernel :func:`choose_kernel` picked (``text`` None: the library) and why."""

    action: str
    fingerprint: str
    text: str | None = None
    header: Header | None = None
    cubin_path: str | None = None
    searched: int = 0
    kernel: str | None = None
    speedup: float | None = None
    time_us: float | None = None
    cusparse_us: float | None = None
    regime: str | None = None
    search_seconds: float = 0.0
    why: str = ""
    """What the line says about the choice."""
    details: dict = field(default_factory=dict)

    def report(self, op: Op, k: int | None, seconds: float, fmt: str | None = None) -> TuneReport:
        return TuneReport(self.action, _line(self, seconds), self.fingerprint, op.value, k, self.searched,
                          self.kernel, fmt or (self.header.format if self.header else None), self.speedup,
                          self.time_us, self.cusparse_us, self.regime, seconds, self.search_seconds)


def _line(c: KernelChoice, seconds: float) -> str:
    where = {STORE: "found in the store", SEARCH: f"searched {c.searched} candidates", GIVEN: "no search",
             LIBRARY: f"searched {c.searched} candidates" if c.searched else "found in the store"}[c.action]
    return f"tune {c.fingerprint[:12]}: {where}; {c.why} ({seconds:.2f} s)"


@dataclass(frozen=True)
class SearchOutcome:
    """What a search returned for :func:`choose_kernel`: its best verified kernel, if any."""

    evaluated: int
    seconds: float
    timed: bool
    """Whether candidates ran on a GPU (False: compile-only, nothing verified)."""
    text: str | None = None
    kernel: str | None = None
    speedup: float | None = None
    time_us: float | None = None
    cusparse_us: float | None = None
    look: str | None = None
    """The second look's line (None: there was none)."""
    dropped: str | None = None
    """Why the second look dropped every kernel it looked at (None: it did not)."""


def _search_for(A: sp.csr_array, op: Op, k: int | None, budget: int, store, *, evaluator=None,
                regime: str = "warm", seconds: float | None = None, name: str = "matrix",
                progress: bool = False, retime: int = PASSES) -> SearchOutcome:
    """Search ``A``'s kernel space within ``budget`` candidates, writing verified results to ``store``
    (an open BestStore), then choose the kernel by a second look of ``retime`` passes; the one call into the
    search, for tune."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.request.context import MatrixContext
    from sparserl.request.second_look import SecondLookFailed
    from sparserl.search.footprint import check_fits
    from sparserl.search.loop import SearchConfig
    from sparserl.search.run import choose_after_search, search_array, search_entry

    cfg = SearchConfig(budget=budget, seconds=seconds, regime=regime)
    if evaluator is not None and regime not in evaluator.config.regimes:
        raise SparseRLError(f"the evaluator times the {'/'.join(evaluator.config.regimes)} regime, not {regime}: "
                            f"tune with regime={evaluator.config.regimes[0]!r} or give an evaluator that times {regime}")
    if evaluator is not None and evaluator.config.reward_regime != regime:  # the pool and the look rank by it
        raise SparseRLError(f"the evaluator ranks kernels by the {evaluator.config.reward_regime} regime "
                            f"(reward_regime), not {regime}: tune with regime={evaluator.config.reward_regime!r} or "
                            f"give an evaluator with reward_regime={regime!r}")
    ev = evaluator or Evaluator(HarnessConfig(regimes=(regime,), reward_regime=regime))
    try:
        if ev.has_gpu:
            check_fits(name, int(A.shape[0]), int(A.shape[1]), int(A.nnz), k)
        ctx = MatrixContext(A, name, op, k)
        res = search_array(ctx, cfg, ev, store, run_config={"tune": {"budget": budget, "regime": regime}},
                           progress=progress)
        t0 = time.perf_counter()
        try:
            _, best, look = choose_after_search(ctx, res, ev, retime, store)
        except SecondLookFailed as exc:
            return SearchOutcome(res.evaluated, res.seconds + time.perf_counter() - t0, res.timed, dropped=str(exc))
    finally:
        if evaluator is None:
            ev.close()
    seconds = res.seconds + (look.seconds if look is not None else 0.0)
    if best is None or not res.timed:
        return SearchOutcome(res.evaluated, seconds, res.timed)
    r = best.result
    base = r.baseline.get(regime)
    if look is not None:  # the second look's median decides, and is what the line quotes
        t, speedup = look.median_us, look.median_speedup
    else:
        t = r.timings[regime].median_us
        speedup = base.median_us / t if base is not None and t else r.speedup
    return SearchOutcome(res.evaluated, seconds, res.timed, best.text, search_entry(res, r).proposal.id, speedup, t,
                         base.median_us if base else None, look=_look_line(look) if look is not None else None)


def _look_line(look) -> str:
    """What tune's line says of the second look (a :class:`~sparserl.request.second_look.SecondLook`)."""
    dropped = f", {look.dropped} dropped" if look.dropped else ""
    return (f"second look: median {look.median_us:.2f} us over {len(look.times_us)} fresh evaluations (first timing "
            f"{look.first_us:.2f} us), {look.looked_at} distinct kernel{'s' if look.looked_at != 1 else ''} evaluated "
            f"again{dropped}")


def best_known(store, fingerprint: str, op: Op, k: int | None, arch: str, regime: str):
    """The store's best row for this structure, op, k and architecture, verified by this harness version:
    ``regime`` preferred, then the fastest; None when the store has none. A row of another version is not
    taken as verified (that harness checked less, or otherwise): the search then takes it as a seed and
    verifies it again. A kernel found wrong on this matrix (:meth:`~sparserl.search.store.BestStore.retract`)
    is never taken, from any regime's row (``best`` never returns one)."""
    from sparserl.search.store import harness_version

    hv = harness_version()
    rows = store.best(fingerprint=fingerprint, op=op.value, k=k, arch=arch, harness_version=hv)
    rows = [r for r in rows if r.fingerprint == fingerprint]  # the filter also matches prefixes
    if not rows:
        return None
    return min(rows, key=lambda r: (r.regime != regime, r.time_us))


def build_kernel(text: str, op: Op, options, cache_dir=None, A=None) -> tuple[Header, str] | str:
    """Extract, check and compile a kernel text for matrix ``A`` (the facts of it the text names written in:
    :mod:`sparserl.harness.matrix_facts`): (header, cubin path), or why it cannot be used."""
    from sparserl.harness.compile import compile_source
    from sparserl.harness.extract import Extracted, extract
    from sparserl.harness.matrix_facts import extract_with_facts
    from sparserl.harness.static_check import static_check
    from sparserl.matrices.card import matrix_card

    ex = extract(text, op)
    if isinstance(ex, Extracted):
        try:  # the matrix's facts the code names: their definitions written in
            ex = extract_with_facts(ex, op, (lambda: matrix_card(A)) if A is not None else None)
        except ContractError as exc:
            return str(exc)
    if not isinstance(ex, Extracted):
        return ex.message
    bad = static_check(ex.code, ex.header, op)
    if bad is not None:
        return bad.message
    built = compile_source(ex.code, options, cache_dir)
    if not built.ok:
        return f"does not compile here: {built.log.strip().splitlines()[-1] if built.log.strip() else built.error_kind}"
    if built.ptx_violation is not None:
        return built.ptx_violation
    return ex.header, built.cubin_path


@contextlib.contextmanager
def _opened(store):
    """An open BestStore for ``store`` (a path, a URL, None: the default), closed after; an open one
    is used as it is."""
    from sparserl.search.store import BestStore, open_store

    if isinstance(store, BestStore):
        yield store
        return
    st = open_store(os.fspath(store) if isinstance(store, os.PathLike) else store)
    try:
        yield st
    finally:
        st.close()


def _speed(speedup: float | None, time_us: float | None, cusparse_us: float | None, regime: str | None) -> str:
    if speedup is None:
        return ""
    return f"{speedup:.2f}x cuSPARSE ({time_us:.2f} us vs {cusparse_us:.2f} us, {regime})"


def choose_kernel(A: sp.csr_array, op: Op, k: int | None, cfg: TuneConfig, arch: str, compile_options=None,
                  cache_dir=None) -> KernelChoice:
    """The kernel for ``A`` (canonical CSR): the store's, else the search's winner, else the library.
    Runs without a GPU too (``arch`` given; a search then compiles only and verifies nothing)."""
    from sparserl.harness.compile import CompileOptions
    from sparserl.matrices.card import structure_fingerprint

    options = compile_options or CompileOptions(arch=arch)
    fp = structure_fingerprint(A)
    with _opened(cfg.store) as store:
        row = best_known(store, fp, op, k, arch, cfg.regime)
        if row is not None:
            speed = _speed(row.speedup, row.time_us, row.cusparse_us, row.regime)
            common = dict(fingerprint=fp, kernel=row.candidate_id or row.format, speedup=row.speedup,
                          time_us=row.time_us, cusparse_us=row.cusparse_us, regime=row.regime)
            if not row.speedup > cfg.min_speedup:
                return KernelChoice(LIBRARY, why=f"its best kernel is {speed}, so the library (cuSPARSE) runs it",
                                    **common)
            built = build_kernel(row.text, op, options, cache_dir, A)
            if not isinstance(built, str):
                return KernelChoice(STORE, text=row.text, header=built[0], cubin_path=built[1],
                                    why=f"{common['kernel']}: {speed}", **common)
            log.warning("the store's kernel for %s cannot be used here (%s); searching instead", cfg.name, built)
        out = _search_for(A, op, k, cfg.budget, store, evaluator=cfg.evaluator, regime=cfg.regime,
                          seconds=cfg.seconds, name=cfg.name, progress=cfg.progress, retime=cfg.retime)
    common = dict(fingerprint=fp, searched=out.evaluated, search_seconds=out.seconds, kernel=out.kernel,
                  speedup=out.speedup, time_us=out.time_us, cusparse_us=out.cusparse_us, regime=cfg.regime)
    if out.text is None:
        why = ("nothing could be verified without a GPU" if not out.timed else
               f"the second look dropped every kernel it evaluated again ({out.dropped})" if out.dropped else
               "none was verified correct")
        return KernelChoice(LIBRARY, why=f"{why}, so the library (cuSPARSE) runs it", **common)
    speed = _speed(out.speedup, out.time_us, out.cusparse_us, cfg.regime)
    if not (out.speedup or 0.0) > cfg.min_speedup:
        return KernelChoice(LIBRARY, why=f"the best, {out.kernel}, is {speed}, so the library (cuSPARSE) runs it",
                            **common)
    built = build_kernel(out.text, op, options, cache_dir, A)
    if isinstance(built, str):  # the harness compiled it a moment ago: a broken cache or toolchain
        raise SparseRLError(f"the search's winner {out.kernel} cannot be built in this process: {built}")
    return KernelChoice(SEARCH, text=out.text, header=built[0], cubin_path=built[1],
                        why=f"the winner {out.kernel} is {speed}, its results kept in the store"
                        + (f"; {out.look}" if out.look else ""), **common)


def cache_dir_of(evaluator):
    """Where kernels are compiled: the evaluator's cache (so its builds are reused), else the default."""
    if evaluator is not None and getattr(evaluator, "config", None) is not None:
        return evaluator.config.root / "cubin"
    return None


def check_request(op: str | Op, k: int | None) -> tuple[Op, int | None]:
    """The op and k of a request, or a one-line error."""
    try:
        opv = Op(op)
    except ValueError:
        raise SparseRLError(f"op must be 'spmv' or 'spmm', got {op!r}") from None
    if opv is Op.SPMM and (k is None or int(k) < 1):
        raise SparseRLError("op='spmm' needs k, the number of columns of X (k >= 1)")
    if opv is Op.SPMV and k is not None:
        raise SparseRLError("k is the column count of X for op='spmm'; SpMV multiplies one vector: leave k out")
    return opv, (int(k) if opv is Op.SPMM else None)
