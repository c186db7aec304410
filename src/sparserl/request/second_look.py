"""A second look before a kernel is handed back: the fastest candidates evaluated again, fresh.

The fastest of a request's candidates is the luckiest of many timings: 16 samples, or a search's 64
candidates, many of them near-identical, each timed once. Its time is biased low (by about 0.4% on the
search's picks measured on 2026-12-05, more where many kernels tie), and it may even be a kernel that
passed once and fails on other values. So before ``generate`` or ``search`` hands a kernel back, the
fastest distinct correct candidates (at most ``top``, those within ``within`` of the fastest) are
evaluated again ``passes`` times each, fresh (new inputs, every check, never answered from the
harness's memo), one at a time and every other pass in the reverse order.

* A candidate that fails one of those evaluations by its own doing (wrong, crashed, hung: anything but
  :func:`sparserl.rewards.infrastructure_failure`) is dropped from the pool (:meth:`CandidatePool.drop`),
  and so is one whose every evaluation failed for the machine's reasons (unconfirmed). A pass that
  failed for the machine's reasons is left out of the median.
* Among the rest, the lowest median is handed back; the report's time, speedup, roofline fraction and
  break-even are that median's (:class:`SecondLook`), the first timing beside them.
* When every candidate of a look is dropped, the next fastest are looked at, up to ``most`` kernels in
  all; then :class:`SecondLookFailed` (``generate`` tries the library's kernels next, when it may).

A kernel dropped as wrong on fresh inputs is retracted from the best-known store the request wrote to
(:func:`sparserl.search.run.retract_found_wrong`): its results on the matrix go under every key, and the store
remembers it found wrong there, with this look's verdict, so that it is neither recorded for the matrix again
nor offered for it (:meth:`sparserl.search.store.BestStore.retract`). The search's trace and summary keep the
first evaluations. When the look fails, a store that fails to retract beside it is logged, and the look's error
is the one raised.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from sparserl.errors import SparseRLError
from sparserl.eval.retime import evaluate_again
from sparserl.harness.result import EvalResult
from sparserl.request.candidates import Candidate, CandidatePool, normalised
from sparserl.rewards import infrastructure_failure

PASSES = 3
"""Evaluations of each candidate in the second look."""
TOP = 3
"""Distinct candidates looked at again, at most (more only to replace ones that were dropped)."""
WITHIN = 0.05
"""Candidates whose first timing is within this fraction of the fastest one's are looked at again."""
MOST = 3 * TOP
"""Distinct candidates looked at in all before the look gives up (a GPU in trouble fails every one)."""


class SecondLookFailed(SparseRLError):
    """Every candidate a second look evaluated again was dropped. ``machine``: none of them by its own doing (every
    evaluation of each failed for the machine's reasons), so a later look may well confirm one."""

    def __init__(self, message: str, machine: bool = False):
        super().__init__(message)
        self.machine = machine


@dataclass(frozen=True)
class SecondLook:
    """What the second look measured: the kernel handed back's times and the rivals it was chosen among."""

    passes: int
    regime: str
    times_us: list[float]
    """The chosen kernel's times in the second look (us; a pass that failed for the machine's reasons left out)."""
    median_us: float
    first_us: float
    """Its time in the first look (its evaluation among the request's candidates)."""
    speedup: float | None
    """cuSPARSE's time (measured once for the matrix, as for every candidate) / ``median_us``."""
    first_speedup: float | None
    roofline: float | None
    """The roofline fraction at ``median_us`` (the first evaluation's, scaled by the two times)."""
    break_even_calls: float | None
    """Calls after which the conversion pays for itself at ``median_us`` (None: never)."""
    looked_at: int
    """Distinct candidates evaluated again."""
    dropped: int
    """Of those, how many were dropped (failed a pass, or no pass confirmed them)."""
    changed: bool
    """Whether the kernel handed back is another than the fastest by the first timings."""
    seconds: float
    """Wall time of the second look."""

    @property
    def median_speedup(self) -> float | None:
        """The speedup at ``median_us``: ``speedup`` where cuSPARSE was timed in the regime, else the first
        evaluation's speedup scaled by the two times (None where there is neither)."""
        if self.speedup is not None:
            return self.speedup
        if not self.first_speedup or not self.median_us > 0:
            return None
        return self.first_speedup * self.first_us / self.median_us

    def line(self) -> str:
        """One line for the report."""
        sp = f", {self.speedup:.2f}x cuSPARSE" if self.speedup else ""
        first = f" (first timing {self.first_us:.2f} us{f', {self.first_speedup:.2f}x' if self.first_speedup else ''})"
        rivals = (f"the fastest of {self.looked_at} distinct kernels evaluated again" if self.looked_at > 1
                  else "evaluated again")
        extra = "; ".join(x for x in (
            f"{self.dropped} {'was' if self.dropped == 1 else 'were'} dropped (see the runners-up)" if self.dropped
            else "", "not the fastest by the first timings" if self.changed else "") if x)
        return (f"second look: median {self.median_us:.2f} us over {len(self.times_us)} fresh evaluations{sp}{first}, "
                f"{rivals}" + (f"; {extra}" if extra else "") + f"; {self.seconds:.1f} s")

    def to_dict(self) -> dict:
        return asdict(self)


def _distinct(cands: list[Candidate]) -> list[Candidate]:
    out, seen = [], set()
    for c in cands:
        key = normalised(c.text)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _first_us(c: Candidate, regime: str) -> float | None:
    t = c.result.timings.get(regime)
    return t.median_us if t is not None else None


def _judge(results: list[EvalResult], regime: str) -> tuple[list[float], str | None, bool]:
    """A candidate's times in its second look, why it is dropped (None: kept), and whether it failed by its own
    doing (wrong, crashed, hung)."""
    own = [r for r in results if not r.ok and not infrastructure_failure(r)]
    if own:
        r = own[0]
        return [], f"{r.error_kind.value} when evaluated again ({' '.join(r.message.split())[:160]})", True
    times = [r.timings[regime].median_us for r in results if r.ok and regime in r.timings]
    if not times:
        kinds = sorted({r.error_kind.value for r in results})
        return [], f"not confirmed: every evaluation again failed for the machine's reasons ({', '.join(kinds)})", False
    return times, None, False


def second_look(pool: CandidatePool, evaluator, regime: str, passes: int = PASSES, top: int = TOP,
                within: float = WITHIN, most: int = MOST, stop=None) -> tuple[Candidate, SecondLook] | None:
    """The kernel to hand back after a second look (see the module docstring) and what it measured; None
    when there is nothing to look at (compile-only, no verified candidate, ``passes`` 0). Raises
    :class:`SecondLookFailed` when every candidate looked at was dropped (they stay dropped in ``pool``), and
    :class:`~sparserl.eval.retime.EvaluationsStopped` once ``stop`` (a ``threading.Event``) is set."""
    if passes < 1 or not pool.timed:
        return None
    ranked = [c for c in _distinct(pool.usable()) if _first_us(c, regime) is not None]  # fastest first
    if not ranked:
        return None
    ctx = pool.ctx
    ref = ctx.ref(evaluator)
    t0 = time.perf_counter()

    def rivals(start: int) -> list[Candidate]:  # the fastest from ``start`` on, and those within the bar of it
        if start >= min(len(ranked), most):
            return []
        bar = ranked[start].result.speedup / (1.0 + within)
        return [c for c in ranked[start:min(start + top, most)] if c.result.speedup >= bar]

    batch = rivals(0)
    looked = dropped = 0
    while batch:
        results = evaluate_again(evaluator, ref, ctx.op, ctx.k, [c.text for c in batch], passes, stop)
        kept = []
        for i, (c, rs) in enumerate(zip(batch, results)):
            times, why, wrong = _judge(rs, regime)
            if why is None:
                kept.append((statistics.median(times), i, c, times))
            else:
                pool.drop(c, why, wrong)
                dropped += 1
        looked += len(batch)
        if kept:
            med, _, pick, times = min(kept, key=lambda t: (t[0], t[1]))
            base = pick.result.baseline.get(regime)
            first = _first_us(pick, regime)
            r = pick.result
            return pick, SecondLook(
                passes=passes, regime=regime, times_us=[float(t) for t in times], median_us=float(med),
                first_us=float(first), speedup=base.median_us / med if base is not None and med > 0 else None,
                first_speedup=r.speedup, roofline=r.roofline * first / med if r.roofline and med > 0 else None,
                break_even_calls=(r.conversion_seconds / ((base.median_us - med) * 1e-6)
                                  if base is not None and med < base.median_us else None),
                looked_at=looked, dropped=dropped, changed=normalised(pick.text) != normalised(ranked[0].text),
                seconds=time.perf_counter() - t0)
        batch = rivals(looked)  # every one was dropped: the next fastest take their place
    raise SecondLookFailed(f"every verified kernel looked at again for {ctx.name} was dropped ({looked} kernels, "
                           f"--retime {passes}): "
                           + "; ".join(sorted(set(pool.dropped.values())))[:400], machine=not pool.found_wrong)


def look_again(pool: CandidatePool, evaluator, best: Candidate, regime: str, passes: int, stop=None
               ) -> tuple[Candidate, SecondLook | None]:
    """``best`` (the pool's fastest by its first timing) or the kernel a second look chooses instead, and the
    second look (None where there was nothing to look at)."""
    return second_look(pool, evaluator, regime, passes, stop=stop) or (best, None)


def dropped_note(pool: CandidatePool) -> str:
    """The report's note on the kernels a second look dropped."""
    n = len(pool.dropped)
    wrong = len(pool.found_wrong)
    return (f"{n} kernel{'s' if n != 1 else ''} verified once {'were' if n != 1 else 'was'} dropped by the second "
            f"look (the runners-up say why); {wrong} of them failed by their own doing and left the best-known "
            "store, if a search had put them there (the search's trace keeps its first evaluations)")
