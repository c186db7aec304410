"""Rewards: pure functions of an :class:`~sparserl.harness.result.EvalResult`, registered by name.

Every reward keeps one ladder: a kernel that did not compile < one that compiled but is wrong
(or did not run) < a correct one **at any speed**. The correct rung sits above the whole range
of the speed term, so a slow correct kernel never scores below a wrong one (the earlier
``1 + clip(log2 s)`` put a correct kernel under a wrong one below 0.5x, and under a compile
failure below 0.35x: on large power-law matrices, where the best sample ran at about 0.4x,
wrong kernels got positive advantages). The ladder holds between results with the same
``over_resource_limit`` flag; the resource penalty is a separate term.

* ``clipped_log`` (the default): a correct kernel scores the speed term
  ``r_eff * clip(log2(t_cusparse / t), -clip, +clip)``, in ``[-c, +c]`` with ``c = r_eff * clip``
  (parity with cuSPARSE = 0, a 2x speedup +r_eff, a 2x slowdown -r_eff; no lucky timing can
  dominate a batch the way ``t_base / t - 1`` can). Below that band: a compiled but wrong
  kernel scores ``-c - step``, one that did not compile ``-c - 2 step``.
* ``relative_best``: the same ladder with the speed term relative to the best known kernel for
  the matrix, ``r_eff * clip(log2(t_best / t))``: matching the best known earns 0, beating it
  earns a positive reward. ``t_best`` comes from the caller (a best-known store); without one
  the best known is cuSPARSE and the reward equals ``clipped_log``.
* ``paper`` (the paper's hierarchical preset, unchanged)::

      R = ±0.5 (compiles) + 1[compiles] * ±0.5 (correct)
          + r_eff * (t_base / t - 1) * 1[correct] - r_pen * 1[over resource limit]

  A correct kernel scores ``1 + r_eff (s - 1) > 1 - r_eff``, above a wrong one (0) at every
  speedup only when ``r_eff <= 1``; larger values are rejected.

A kernel the harness stopped early as hopeless (``error_kind = slow``) passed every check: it is
``correct``, and every reward scores it by the speed it measured, exactly as a correct kernel.

In compile-only mode (no GPU) nothing is run: a result with ``error_kind = no_gpu`` scores the
compiled-but-not-correct rung (``paper``: +0.5, the compile step only).

Infrastructure failures (:func:`infrastructure_failure`) are not the policy's fault: RL drops
them from the update and from the baselines instead of scoring them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind, EvalResult


@dataclass(frozen=True)
class RewardConfig:
    """Which reward and its coefficients."""

    name: str = "clipped_log"
    """'clipped_log' (default), 'relative_best' or 'paper'."""
    r_eff: float = 1.0
    """Weight of the speed term (per doubling of speed for clipped_log / relative_best)."""
    r_pen: float = 0.5
    """Penalty for exceeding a resource limit (shared memory, registers)."""
    clip: float = 3.0
    """clipped_log, relative_best: bound on |log2 speed ratio| (3 = between 1/8x and 8x)."""
    step: float = 0.5
    """clipped_log, relative_best: distance between the ladder's rungs (the slowest correct
    kernel scores ``step`` above a wrong one, which scores ``step`` above a compile failure)."""

    def __post_init__(self) -> None:
        if self.name not in REWARDS:
            raise SparseRLError(f"unknown reward {self.name!r}; rewards: {', '.join(REWARDS)}")
        if self.clip <= 0 or self.r_eff < 0 or self.r_pen < 0 or self.step <= 0:
            raise SparseRLError("clip and step must be > 0, r_eff and r_pen >= 0")
        if self.name == "paper" and self.r_eff > 1:
            raise SparseRLError(f"paper reward with r_eff = {self.r_eff} > 1 scores a correct kernel below "
                                f"{1 - 1 / self.r_eff:.2f}x under a wrong one; use r_eff <= 1 or clipped_log")


def kernel_us(r: EvalResult) -> float | None:
    """The kernel's median time in the result's regime (None when it was not timed)."""
    t = r.timings.get(r.regime)
    return t.median_us if t is not None else None


def _speed_ratio(r: EvalResult, best_us: float | None) -> float | None:
    """t_ref / t_kernel: against ``best_us`` when given, else against cuSPARSE (``r.speedup``)."""
    if best_us is None:
        return r.speedup
    t = kernel_us(r)
    if t is None:
        raise SparseRLError(f"{r.matrix}: a relative reward needs the kernel's time in regime {r.regime!r}")
    return best_us / t


def _log_ladder(r: EvalResult, cfg: RewardConfig, best_us: float | None) -> float:
    """The clipped log-speed ladder (see the module docstring); ``best_us`` None = cuSPARSE."""
    c = cfg.r_eff * cfg.clip
    if not r.compiled:
        R = -c - 2 * cfg.step
    elif not r.correct:
        R = -c - cfg.step
    else:
        ratio = _speed_ratio(r, best_us)  # None: correct but not timed, scored as parity
        if ratio is None:
            R = 0.0
        else:
            R = cfg.r_eff * max(-cfg.clip, min(cfg.clip, math.log2(ratio))) if ratio > 0 else -c
    return R - (cfg.r_pen if r.over_resource_limit else 0.0)


def clipped_log_reward(r: EvalResult, cfg: RewardConfig, best_us: float | None = None) -> float:
    """Log2 speedup over cuSPARSE, clipped, above the compile/correct ladder (``best_us`` is ignored)."""
    return _log_ladder(r, cfg, None)


def relative_best_reward(r: EvalResult, cfg: RewardConfig, best_us: float | None = None) -> float:
    """Log2 of (best known time / this kernel's time), clipped, above the compile/correct ladder.

    ``best_us``: the best known kernel's time for this matrix, op and k in the result's regime,
    in microseconds (None: nothing better than cuSPARSE is known, the reward is clipped_log's)."""
    return _log_ladder(r, cfg, best_us)


def _paper_ladder(r: EvalResult) -> float:
    """±0.5 for compiling, then ±0.5 for correctness if it compiled (0 when it was not run)."""
    if not r.compiled:
        return -0.5
    if r.error_kind is ErrorKind.NO_GPU:
        return 0.5
    return 0.5 + (0.5 if r.correct else -0.5)


def paper_reward(r: EvalResult, cfg: RewardConfig, best_us: float | None = None) -> float:
    """The paper's preset (``best_us`` is ignored)."""
    R = _paper_ladder(r)
    if r.correct and r.speedup is not None:
        R += cfg.r_eff * (r.speedup - 1.0)
    if r.over_resource_limit:
        R -= cfg.r_pen
    return R


REWARDS: dict[str, Callable[..., float]] = {
    "clipped_log": clipped_log_reward,
    "relative_best": relative_best_reward,
    "paper": paper_reward,
}


def reward(r: EvalResult, cfg: RewardConfig | None = None, best_us: float | None = None) -> float:
    """The configured reward of ``r`` (``best_us``: the best known time, for relative_best)."""
    cfg = cfg or RewardConfig()
    return REWARDS[cfg.name](r, cfg, best_us)


# -- infrastructure failures -------------------------------------------------------------------

_PHASE = re.compile(r"did not finish the (\w+) phase")
_HARNESS_PHASES = ("prepare", "check", "startup")
"""Worker phases with no candidate kernel running (pool.PhaseLimits): loading and converting the
matrix and timing cuSPARSE, the fp64 comparison of an output, a new worker's start-up."""


def infrastructure_failure(r: EvalResult) -> bool:
    """Whether ``r`` failed for a reason of the machine or the harness, not of the completion.

    Decided per kind (the harness cannot always tell, so the rule is the likelier cause):

    * ``internal_error``: always (a harness bug, our compiler failing to run, a worker that could
      not start or lost its job).
    * ``compile_timeout``: yes. A device-only kernel of this contract compiles in about a second;
      60 s is parallel compiles on a loaded host (the compiler cache does not keep time-outs either,
      "not the source's fault").
    * ``timeout``: only when the worker was in a harness phase (``prepare``, ``check``, ``startup``);
      a time-out while the candidate ran (``verify``, ``time``) is a hang the kernel caused.
    * ``crashed``: no. An illegal address or trap poisons the context; that is the kernel's doing.
    """
    if r.error_kind in (ErrorKind.INTERNAL, ErrorKind.COMPILE_TIMEOUT):
        return True
    if r.error_kind is ErrorKind.TIMEOUT:
        m = _PHASE.search(r.message)
        return bool(m) and m.group(1) in _HARNESS_PHASES
    return False
