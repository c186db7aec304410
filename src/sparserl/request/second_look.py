"""A second look before a kernel is handed back: the fastest candidates timed again, fresh.

The fastest of a request's candidates is the luckiest of many timings: 16 samples, or a search's 64
candidates, many of them near-identical, each timed once. Its time is biased low (by about 0.4% on the
search's picks measured on 2026-12-05, more where many kernels tie), and it may even be a kernel that
passed once and fails on other values. So before ``generate`` or ``search`` hands a kernel back, the
fastest distinct correct candidates (at most ``top``, those within ``within`` of the fastest) are
evaluated again ``passes`` times each, fresh (new inputs, every check, never answered from the
harness's memo), one at a time and every other pass in the reverse order
(:func:`sparserl.eval.retime.retime`). A candidate that fails any of those evaluations is dropped (when
all of them fail, the next fastest are looked at, and so on); among the rest, the one with the lowest
median is handed back, and the report's time and speedup are that median's (:class:`SecondLook`), the
first timing beside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sparserl.errors import SparseRLError
from sparserl.eval.retime import median_us, retime
from sparserl.request.candidates import Candidate, CandidatePool, normalised

PASSES = 3
"""Evaluations of each candidate in the second look (the evaluation's ``--retime`` default too)."""
TOP = 3
"""Distinct candidates looked at again, at most (more only to replace ones that failed)."""
WITHIN = 0.05
"""Candidates whose first timing is within this fraction of the fastest one's are looked at again."""


@dataclass(frozen=True)
class SecondLook:
    """What the second look measured: the kernel handed back's times and the rivals it was chosen among."""

    passes: int
    regime: str
    times_us: list[float]
    """The chosen kernel's times in the second look (us)."""
    median_us: float
    first_us: float
    """Its time in the first look (its evaluation among the request's candidates)."""
    speedup: float | None
    """cuSPARSE's time (measured once for the matrix, as for every candidate) / ``median_us``."""
    first_speedup: float | None
    looked_at: int
    """Distinct candidates evaluated again."""
    failed: int
    """Of those, how many failed an evaluation of the second look (dropped)."""
    changed: bool
    """Whether the kernel handed back is another than the fastest by the first timings."""

    def line(self) -> str:
        """One line for the report."""
        sp = f", {self.speedup:.2f}x cuSPARSE" if self.speedup else ""
        first = f" (first timing {self.first_us:.2f} us{f', {self.first_speedup:.2f}x' if self.first_speedup else ''})"
        rivals = (f"the fastest of {self.looked_at} distinct kernels timed again" if self.looked_at > 1
                  else "timed again")
        extra = "; ".join(x for x in (f"{self.failed} failed and were dropped" if self.failed else "",
                                      "not the fastest by the first timings" if self.changed else "") if x)
        return (f"second look: median {self.median_us:.2f} us over {self.passes} fresh evaluations{sp}{first}, "
                f"{rivals}" + (f"; {extra}" if extra else ""))

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


def second_look(pool: CandidatePool, evaluator, regime: str, passes: int = PASSES, top: int = TOP,
                within: float = WITHIN) -> tuple[Candidate, SecondLook] | None:
    """The kernel to hand back after a second look (see the module docstring) and what it measured;
    None when there is nothing to look at (compile-only, no verified candidate, ``passes`` 0). Raises
    SparseRLError when every verified candidate failed its second look: the request has no kernel it can
    vouch for."""
    if passes < 1 or not pool.timed:
        return None
    ranked = [c for c in _distinct(pool.usable()) if _first_us(c, regime) is not None]  # fastest first
    if not ranked:
        return None
    ctx = pool.ctx
    ref = ctx.ref(evaluator)

    def rivals(start: int) -> list[Candidate]:  # the fastest from ``start`` on, and those within the bar of it
        bar = ranked[start].result.speedup / (1.0 + within) if start < len(ranked) else 0.0
        return [c for c in ranked[start:start + top] if c.result.speedup >= bar]

    batch = rivals(0)
    looked = failed = 0
    while batch:
        times = retime(evaluator, ref, ctx.op, ctx.k, {str(i): c.text for i, c in enumerate(batch)}, passes, regime)
        kept = [(median_us(times[str(i)]), i, c) for i, c in enumerate(batch)]
        kept = [t for t in kept if t[0] is not None]
        looked += len(batch)
        failed += len(batch) - len(kept)
        if kept:
            med, i, pick = min(kept, key=lambda t: (t[0], t[1]))
            base = pick.result.baseline.get(regime)
            return pick, SecondLook(
                passes=passes, regime=regime, times_us=[float(t) for t in times[str(i)]], median_us=float(med),
                first_us=float(_first_us(pick, regime)),
                speedup=base.median_us / med if base is not None and med > 0 else None,
                first_speedup=pick.result.speedup, looked_at=looked, failed=failed,
                changed=normalised(pick.text) != normalised(ranked[0].text))
        batch = rivals(looked)  # every one failed: the next fastest take their place
    raise SparseRLError(f"every verified kernel for {ctx.name} failed when evaluated again on fresh inputs "
                        f"({looked} kernels, --retime {passes}): none can be handed back as correct; a kernel "
                        "whose output is not deterministic fails so, and so does a GPU in trouble")


def look_again(pool: CandidatePool, evaluator, best: Candidate, regime: str, passes: int
               ) -> tuple[Candidate, SecondLook | None]:
    """``best`` (the pool's fastest by its first timing) or the kernel a second look chooses instead, and the
    second look (None where there was nothing to look at)."""
    return second_look(pool, evaluator, regime, passes) or (best, None)
