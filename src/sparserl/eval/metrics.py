"""Evaluation metrics as pure functions.

* ``pass_at_k(n, c, k)``: the unbiased estimator of Chen et al. (2021): the probability that
  at least one of k samples drawn without replacement from n (c of them correct) is correct,
  ``1 - C(n-c, k) / C(n, k)``, computed as a stable product.
* ``fast_p(speedups, p)``: the share of problems whose best *correct* kernel is faster than
  ``p`` times the baseline (KernelBench's fast_p); problems with no correct kernel count as not fast.
* ``kept_speedup(s)``: what one kernel is worth to a user who verifies and times it before using
  it: its speedup when it is correct and faster than the baseline, else 1.0 (they keep cuSPARSE).
  Every speed figure below that counts a missing kernel as 1.0 counts a correct slower one the
  same way, so an incorrect sample can never rank above a correct one: at best they tie at 1.0
  (counting the incorrect one as 1.0 and a correct 0.8x one at 0.8 rewarded failing over writing
  a slow kernel). The raw speeds stay in the per-sample records and the "covered" geomean.
* ``speedup_at_1(samples)``: the speedup one sampled kernel gives, in expectation: per problem
  the geometric mean over its samples of :func:`kept_speedup`, then the geometric mean over
  problems. It is the n = 1 case of the best-of-n geomean, estimated from all n samples, so
  systems sampled n times compare at one sample too. It never falls when a sample turns from
  incorrect to correct, at any speed, and never rises when one turns from correct to incorrect.
* ``geomean``: geometric mean of positive ratios.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"k={k} is larger than the n={n} samples drawn")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k averaged over problems given (n, c) per problem."""
    vals = [pass_at_k(n, c, k) for n, c in counts]
    return sum(vals) / len(vals) if vals else float("nan")


def fast_p(best_speedups: Sequence[float | None], p: float) -> float:
    """Share of problems whose best correct kernel beats ``p`` x the baseline (None = no correct kernel)."""
    if not best_speedups:
        return float("nan")
    return sum(1 for s in best_speedups if s is not None and s > p) / len(best_speedups)


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (nan when empty)."""
    vals = list(values)
    if not vals:
        return float("nan")
    if any(v <= 0 for v in vals):
        raise ValueError("geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def kept_speedup(s: float | None) -> float:
    """The speedup a user keeps from one kernel (None = not correct): ``max(s, 1)``, or 1.0."""
    return 1.0 if s is None else max(s, 1.0)


def speedup_at_1(samples: Sequence[Sequence[float | None]]) -> float:
    """Expected single-sample speedup: one list per problem of its samples' speedups (None = not
    correct); each sample counts at :func:`kept_speedup`, geomean within each problem, then geomean
    over problems."""
    per = []
    for s in samples:
        if not s:
            raise ValueError("a problem with no samples")
        per.append(math.exp(sum(math.log(kept_speedup(v)) for v in s) / len(s)))
    return geomean(per)
