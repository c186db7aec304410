"""How fast the harness judges a kernel, and the rules that let it stop early: pure functions.

:class:`SpeedConfig` picks the evaluation path (``HarnessConfig.speed``):

* **batched** (default): verification launches run back to back and the timed runs are enqueued
  ahead, each followed by its checks as GPU kernels that write into a board of counters
  (:mod:`~sparserl.harness.gpucheck`); the host synchronises once per batch and replays the
  verdict in the order the checks would have run one at a time. Every check of the sequential
  path runs, on every launch it covered.
* **sequential** (``SpeedConfig.classic()``): the earlier path, one launch, one synchronisation
  and one host-side check at a time. Kept so a benchmark can time both side by side in one run.

The rules, each a pure function tested on the CPU:

* :func:`median_ci` and :func:`enough_runs` - the adaptive number of cold timed runs: stop once the
  distribution-free 95% confidence interval of the median lies within ``±ci`` of it, never before
  ``min_cold_trials`` runs and never after ``HarnessConfig.cold_trials``;
* :func:`slow_threshold_us` and :func:`is_slow` - early stopping: a verified kernel whose median over
  its first ``early_stop_runs`` checked cold runs is over ``early_stop`` times the best known time for
  the matrix (or cuSPARSE's, if that is faster) stops there, reported ``slow`` with that time;
* :func:`scaled_limit` - the time limit of the candidate's own phases scales with cuSPARSE's time on
  the matrix, so a pathological kernel costs seconds, not minutes;
* :func:`predicted_overrun` - a verification whose first launch shows that the remaining launches
  would run past that limit stops there, ``timeout``, instead of running until the worker is killed
  and restarted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sparserl.errors import SparseRLError

STAGING_CAP_BYTES = 2 << 30
"""The page-locked staging buffer's default cap (``SpeedConfig.staging_bytes``, ``staging.CAP_BYTES``)."""

PREDICT_MIN_S = 0.05
"""A first launch shorter than this never predicts a time-out (:func:`predicted_overrun`)."""


@dataclass(frozen=True)
class SpeedConfig:
    """The evaluation path and its early-stopping rules (module docstring)."""

    batched: bool = True
    """Verification launches back to back and timed runs enqueued ahead, every check a GPU kernel
    writing into a board of counters read once per batch; False: one launch, one synchronisation
    and one host-side check at a time (the earlier path)."""
    min_cold_trials: int = 11
    """Adaptive cold timing: at least this many timed runs (each checked)."""
    ci: float = 0.01
    """Adaptive cold timing: stop once the median's 95% confidence interval lies within ±ci of the
    median (0.01: ±1%); 0 always runs ``HarnessConfig.cold_trials``."""
    batch: int = 10
    """Cold timed runs between two looks at the times (after the first look)."""
    runs_ahead: int = 1
    """Timed runs (cold) or samples (warm) enqueued, each with its checks, before the host waits for
    the GPU. 1: every run starts on an idle GPU with nothing queued behind it, as on the sequential
    path. Runs enqueued back to back measured 0.3-1.0 us slower than the sequential path's (cuSPARSE
    1-6% on 1M-row and small matrices, one H200); ``benchmarks/harness_speed.py --modes`` times both
    loops side by side. A wait per run costs the host's enqueueing of the next run."""
    early_stop: float = 3.0
    """A verified kernel slower than this many times min(best known, cuSPARSE) after its first
    ``early_stop_runs`` checked timed runs stops there: ``slow``. 0 turns early stopping off."""
    early_stop_runs: int = 5
    """Checked timed runs (in the reward regime) before the early-stop decision."""
    limit_scale: float = 1000.0
    """The candidate's phases may take ``limit_scale`` x cuSPARSE's time on the matrix per launch of
    the candidate (plus the harness's own work), never more than ``PhaseLimits`` allow; 0 keeps the
    fixed ``PhaseLimits``."""
    limit_floor_s: float = 2.0
    """A scaled limit is never below this (first-launch module loading, a GPU shared with training)."""
    limit_floor_granted_s: float = 0.5
    """The floor of the verify limit that the prediction after the first launch compares with
    (:func:`predicted_overrun`) in a job that has the GPU whole (no trainer shares it: the pool grants
    the job the GPU's lease before sending it). The kill deadline keeps ``limit_floor_s``. Verifying
    at 1M rows takes about 7 ms of the harness's own work (docs/harness.md), 70 times less; a kernel
    whose first launch shows it hopeless then stops after that launch instead of running on."""

    staging_bytes: int = STAGING_CAP_BYTES
    """Page-locked host buffer a worker keeps for uploading conversions, at most this many bytes
    (:mod:`sparserl.harness.staging`; 2 GiB by default: 33.7 against 26.5 evaluations a second on the
    families at 1M rows, verdicts and timings unchanged, benchmarks/results/2026-12-07/staging-buffer/);
    0: every upload through CuPy's pinned pool, as ``cupy.asarray`` does (a page-locked block per new
    size, kept)."""

    contender_scale: float = 100.0
    """In a job that asks only whether a kernel could be the fastest (``contender``: the library
    oracle, which reports its fastest verified variant and nothing else), verification also stops
    after the first launch when that launch predicts more than ``contender_scale`` x min(best known,
    cuSPARSE) per launch (:func:`contender_limit`), and only where the job has the GPU whole. Such a
    kernel is over 30 times past the early-stop factor: it cannot be the oracle's pick. 0 turns it off."""
    contender_min_s: float = 0.01
    """Where the contender limit is the one that binds, the shortest first launch that may predict a
    time-out (``predicted_overrun``'s floor; elsewhere ``PREDICT_MIN_S``, 50 ms). It guards against a
    fast kernel judged by one-time costs on its first launch: on the library variants at 1M rows
    (five families, one H200), a first launch exceeded the median of the kernel's timed runs by 1.6 ms
    at most, six times under 10 ms. A contender job gives no reward, so a lower floor can cost the
    oracle its pick at worst: at 10 ms none was lost on arrow, circuit, lp, random and powerlaw at 1M
    rows, and arrow's oracle took 7.8 s instead of 15.9 s (lp 5.1 instead of 11.4;
    benchmarks/results/2026-12-04/oracle-contender-floor, ``benchmarks/oracle_time.py
    --contender-min``)."""

    def __post_init__(self) -> None:
        if self.staging_bytes < 0:
            raise SparseRLError(f"staging_bytes must be at least 0 (0: no staging buffer), got {self.staging_bytes}")
        if self.contender_scale != 0.0 and self.contender_scale <= self.early_stop:
            raise SparseRLError(f"contender_scale must be 0 (off) or above early_stop ({self.early_stop:g}), got "
                                f"{self.contender_scale:g}: a kernel it stops must be one early stopping would too")
        if not 0.0 < self.contender_min_s <= PREDICT_MIN_S:
            raise SparseRLError(f"contender_min_s must lie in (0, {PREDICT_MIN_S:g}] (a contender job never "
                                f"waits for a longer first launch than an ordinary one), got {self.contender_min_s:g}")
        if self.min_cold_trials < 3 or self.batch < 1 or self.early_stop_runs < 1 or self.runs_ahead < 1:
            raise SparseRLError("need min_cold_trials >= 3, batch >= 1, early_stop_runs >= 1 and runs_ahead >= 1")
        if not 0.0 <= self.ci < 1.0:
            raise SparseRLError(f"ci must lie in [0, 1), got {self.ci}")
        if self.early_stop != 0.0 and self.early_stop <= 1.0:
            raise SparseRLError(f"early_stop must be 0 (off) or above 1, got {self.early_stop}: a factor of "
                                "1 or less would stop kernels as fast as the best known")
        if self.limit_scale < 0 or self.limit_floor_s <= 0 or self.limit_floor_granted_s <= 0:
            raise SparseRLError("need limit_scale >= 0, limit_floor_s > 0 and limit_floor_granted_s > 0")
        if not self.batched and (self.ci or self.early_stop):
            raise SparseRLError("adaptive timing (ci) and early stopping need the batched path: set ci=0 and "
                                "early_stop=0 with batched=False, or use SpeedConfig.classic()")

    @classmethod
    def classic(cls) -> "SpeedConfig":
        """The earlier harness: sequential checks, fixed run counts, fixed time limits."""
        return cls(batched=False, ci=0.0, early_stop=0.0, limit_scale=0.0, contender_scale=0.0, staging_bytes=0)


# -- adaptive number of timed runs -------------------------------------------------------------


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """1-based ranks (lo, hi) of the order statistics bracketing the median of ``n`` samples with at
    least ``confidence`` coverage, distribution-free: the largest ``lo`` with
    P(Binomial(n, 1/2) < lo) <= (1 - confidence) / 2, and ``hi = n + 1 - lo``. (1, n) when ``n`` is
    too small for that coverage."""
    if n < 1:
        raise ValueError("need at least one sample")
    tail = (1.0 - confidence) / 2.0
    cdf, lo = 0.0, 1
    for j in range(n + 1):  # cdf = P(B <= j) = P(B < j + 1): rank j + 1 keeps the lower tail within bounds
        cdf += math.comb(n, j) / 2.0 ** n
        if cdf > tail:
            break
        lo = j + 1
    lo = min(lo, (n + 1) // 2)
    return lo, n + 1 - lo


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, lower, upper): the median and its distribution-free confidence interval."""
    s = sorted(samples)
    n = len(s)
    lo, hi = median_ci_ranks(n, confidence)
    return _median(s), s[lo - 1], s[hi - 1]


def enough_runs(samples: Sequence[float], ci: float, floor: int, ceiling: int) -> bool:
    """Whether cold timing may stop: ``ceiling`` runs done, or at least ``floor`` and the median's
    95% interval within ``±ci`` of the median (``ci`` 0: only at the ceiling)."""
    n = len(samples)
    if n >= ceiling:
        return True
    if ci <= 0 or n < floor:
        return False
    mid, lo, hi = median_ci(samples)
    return mid > 0 and hi <= mid * (1.0 + ci) and lo >= mid * (1.0 - ci)


# -- early stopping ----------------------------------------------------------------------------


def slow_threshold_us(factor: float, best_us: float | None, cusparse_us: float | None) -> float | None:
    """The median time above which a verified kernel stops early: ``factor`` times the faster of the
    best known time and cuSPARSE's; None when early stopping is off or nothing is known."""
    known = [t for t in (best_us, cusparse_us) if t is not None and t > 0 and math.isfinite(t)]
    if factor <= 0 or not known:
        return None
    return factor * min(known)


def is_slow(median_us: float, threshold_us: float | None) -> bool:
    """Whether a kernel whose first checked runs have this median stops early."""
    return threshold_us is not None and median_us > threshold_us


def look(samples_us: Sequence[float], messages: Sequence[str | None], *, early_runs: int,
         slow_above_us: float | None, ci: float, floor: int, ceiling: int) -> tuple[str, str]:
    """What cold timing does at a look (after a batch of checked runs): ``("wrong", message)`` for
    the first wrong timed output, whatever the times (a kernel slow *and* wrong is wrong);
    ``("slow", "")`` when exactly ``early_runs`` runs are done (fewer than ``ceiling``) and their
    median is over ``slow_above_us``; ``("enough", "")`` when :func:`enough_runs` says so; else
    ``("more", "")``. ``messages[i]`` is run i's failure message or None."""
    for msg in messages:
        if msg is not None:
            return "wrong", msg
    n = len(samples_us)
    if slow_above_us is not None and n == early_runs < ceiling and is_slow(_median(samples_us), slow_above_us):
        return "slow", ""
    if enough_runs(samples_us, ci, floor, ceiling):
        return "enough", ""
    return "more", ""


def look_points(early_runs: int, early_stop: bool, floor: int, ci: float, batch: int, ceiling: int) -> list[int]:
    """Run counts at which cold timing looks at its times: ``early_runs`` (early stopping on), then
    ``floor`` (adaptive), then every ``batch`` runs, and ``ceiling``; only ``ceiling`` when neither
    early stopping nor the adaptive rule is on (one batch)."""
    points = {ceiling}
    if early_stop and 0 < early_runs < ceiling:
        points.add(early_runs)
    if ci > 0:
        points.update(range(min(floor, ceiling), ceiling, batch))
    return sorted(points)


def _median(v: Sequence[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def timed_verdict(wrong: str | None, modified: Sequence[str], flush_intact: bool,
                  slow: bool) -> tuple[str, str] | None:
    """The verdict after the timed runs, in the order the harness checks: a wrong timed output
    (``incorrect``), then matrix arrays written during timed runs (``input_modified``), then a write
    into the L2 flush buffer (``incorrect``), then ``slow``; None for a kernel timed in full. So a
    kernel stopped early is reported slow only when it passed every check."""
    if wrong is not None:
        return "incorrect", wrong
    if modified:
        return "input_modified", f"the kernel wrote to the matrix arrays {', '.join(modified)} during timed runs"
    if not flush_intact:
        return "incorrect", "the kernel wrote far outside its buffers (into the harness's L2 flush buffer)"
    if slow:
        return "slow", ""
    return None


# -- time limits -------------------------------------------------------------------------------


def scaled_limit(cusparse_us: float | None, launches: int, cfg: SpeedConfig, allowance_s: float = 0.0,
                 granted: bool = False) -> float | None:
    """Seconds a phase that runs the candidate ``launches`` times may take: ``allowance_s`` (the
    harness's own work in it) plus ``limit_scale`` x cuSPARSE's time per launch, and never less than
    ``limit_floor_s`` (``limit_floor_granted_s`` when ``granted``: the job has the GPU whole). None
    when scaling is off or cuSPARSE's time is unknown (the fixed ``PhaseLimits`` apply). The pool
    never lets it exceed the configured limit."""
    if cfg.limit_scale <= 0 or cusparse_us is None or not cusparse_us > 0:
        return None
    floor = min(cfg.limit_floor_granted_s, cfg.limit_floor_s) if granted else cfg.limit_floor_s
    return max(floor, allowance_s + max(1, launches) * cfg.limit_scale * cusparse_us * 1e-6)


def contender_limit(best_us: float | None, cusparse_us: float | None, launches: int, cfg: SpeedConfig,
                    allowance_s: float = 0.0) -> float | None:
    """Seconds ``launches`` verification launches may take in a ``contender`` job (see
    ``SpeedConfig.contender_scale``): ``allowance_s`` plus ``contender_scale`` x the faster of the
    best known time and cuSPARSE's, per launch; None when it is off or neither time is known.
    :func:`predicted_overrun` compares the first launch with it, under the floor
    ``SpeedConfig.contender_min_s`` (``PREDICT_MIN_S`` unless set lower): a launch that short never
    stops a verification, whatever it predicts."""
    known = [t for t in (best_us, cusparse_us) if t is not None and t > 0]
    if cfg.contender_scale <= 0 or not known:
        return None
    return allowance_s + max(1, launches) * cfg.contender_scale * min(known) * 1e-6


@dataclass
class VerifyLimit:
    """What the batched verifier's prediction after the first launch compares with: called with a
    number of launches, the seconds they may take (None: not scaled).

    ``ordinary(launches)`` is the scaled limit (:func:`scaled_limit`); ``contend(launches)``, in a
    job that asks only whether the kernel could be the fastest, the :func:`contender_limit` (None
    where it does not apply, e.g. a GPU shared with a trainer). The lower of the two binds. After
    each call ``contender`` says whether the contender limit was the one that bound, and
    ``min_first_s`` (the prediction's floor on the first launch) follows from it:
    ``contender_min_s`` there, ``PREDICT_MIN_S`` everywhere else, so no ordinary job, whose verdict
    may be a reward, is ever judged by a first launch under 50 ms."""

    ordinary: Callable[[int], float | None] = lambda launches: None
    contend: Callable[[int], float | None] | None = None
    contender_min_s: float = PREDICT_MIN_S
    contender_scale: float = 0.0
    contender: bool = field(default=False, init=False)

    def __call__(self, launches: int) -> float | None:
        ordinary = self.ordinary(launches)
        contend = self.contend(launches) if self.contend is not None else None
        self.contender = contend is not None and (ordinary is None or contend < ordinary)
        return contend if self.contender else ordinary

    @property
    def min_first_s(self) -> float:
        return self.contender_min_s if self.contender else PREDICT_MIN_S

    def explain(self, outcome):
        """The verifier's outcome, its time-out saying so when the contender limit was the one it met."""
        from sparserl.harness.result import ErrorKind

        if outcome.kind is not ErrorKind.TIMEOUT or not self.contender:
            return outcome
        return replace(outcome, message=f"{outcome.message}: {self.contender_scale:g} x the best known time a "
                                        "launch, in a job that asks only whether the kernel could be the "
                                        "fastest (not a contender)")


PREDICT_MARGIN = 1.25
"""The remaining launches must be predicted to take this many times their limit."""


def predicted_overrun(first_s: float, remaining: int, limit_s: float | None, min_s: float = PREDICT_MIN_S) -> bool:
    """Whether ``remaining`` verification launches, each taking as long as the first one did
    (``first_s``: host wall time from its enqueue to the end of its checks), would run past
    ``limit_s``, the limit the worker asks for them; False when no limit is known (None: scaling off).

    Over only when ``first_s * remaining > PREDICT_MARGIN * limit_s`` (strictly) and ``first_s >=
    PREDICT_MIN_S``. The margin keeps noise from stopping a kernel that would have finished: a
    launch this long (50 ms and more) varies by a few percent from run to run, and each remaining
    launch also pays fresh buffers and its checks as the first did; a kernel within 25% of the
    limit is left to run, and killed as before if it overruns. The floor keeps a fast kernel, whose
    first launch may carry one-time host costs (the lazy load of its module, the memory pool), from
    ever being judged by it: 50 ms is far above such costs and far below any limit (0.5 s at least:
    ``limit_floor_granted_s`` where the job has the GPU whole, else 2 s).

    Why it cannot be played: the verifier asks only after the first launch was judged (a kernel
    wrong on it is reported wrong, never timed out), and the answer can only turn a verification
    that would have gone on into a ``timeout`` verdict, which is a failure scored as a wrong kernel
    and never remembered. So no kernel gains a reward by it. A kernel slower on its first launch
    than on the others loses a verification it might have finished within the limit, but such a
    kernel takes at least ``limit / (PREDICT_MARGIN * remaining)`` on one launch (0.16 s at the
    2 s floor and 10 remaining launches, 50 ms at the granted 0.5 s floor; over 1000x cuSPARSE's time
    when scaled), far past the early-stop factor, so the most it could have earned is the slowest
    correct rung. A kernel wrong
    on a later input that would have been reported ``incorrect`` may now be ``timeout``: both score
    the wrong rung (and a later hang already gave the same).

    ``min_s``: the floor; a contender job passes ``SpeedConfig.contender_min_s`` where its limit binds."""
    if limit_s is None or remaining < 1 or first_s < min_s:
        return False
    return first_s * remaining > PREDICT_MARGIN * limit_s
