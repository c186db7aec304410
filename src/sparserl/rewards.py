"""Rewards: pure functions of an :class:`~sparserl.harness.result.EvalResult`, registered by name.

* ``paper`` (the paper's hierarchical preset)::

      R = ±0.5 (compiles) + 1[compiles] * ±0.5 (correct)
          + r_eff * (t_base / t - 1) * 1[correct] - r_pen * 1[over resource limit]

* ``clipped_log`` (the default, stabler for PPO): the same compile/correct ladder, then
  ``r_eff * clip(log2(t_base / t), -clip, +clip)`` for a correct kernel. A 2x speedup
  earns +1 (r_eff = 1), a 2x slowdown -1, and no single lucky timing can dominate a
  batch the way ``t_base / t - 1`` can (a 30x outlier is worth 29 there, 2 here).

In compile-only mode (no GPU) there is no correctness or time: a result with
``error_kind = no_gpu`` scores the compile step only (``+0.5``), the rest is 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind, EvalResult


@dataclass(frozen=True)
class RewardConfig:
    """Which reward and its coefficients."""

    name: str = "clipped_log"
    """'clipped_log' (default) or 'paper'."""
    r_eff: float = 1.0
    """Weight of the speed term."""
    r_pen: float = 0.5
    """Penalty for exceeding a resource limit (shared memory, registers)."""
    clip: float = 3.0
    """clipped_log: bound on |log2 speedup| (3 = between 1/8x and 8x)."""

    def __post_init__(self) -> None:
        if self.name not in REWARDS:
            raise SparseRLError(f"unknown reward {self.name!r}; rewards: {', '.join(REWARDS)}")
        if self.clip <= 0 or self.r_eff < 0 or self.r_pen < 0:
            raise SparseRLError("clip must be > 0 and r_eff, r_pen >= 0")


def _ladder(r: EvalResult) -> float:
    """±0.5 for compiling, then ±0.5 for correctness if it compiled (0 when it was not run)."""
    if not r.compiled:
        return -0.5
    if r.error_kind is ErrorKind.NO_GPU:
        return 0.5
    return 0.5 + (0.5 if r.correct else -0.5)


def paper_reward(r: EvalResult, cfg: RewardConfig) -> float:
    R = _ladder(r)
    if r.correct and r.speedup is not None:
        R += cfg.r_eff * (r.speedup - 1.0)
    if r.over_resource_limit:
        R -= cfg.r_pen
    return R


def clipped_log_reward(r: EvalResult, cfg: RewardConfig) -> float:
    R = _ladder(r)
    if r.correct and r.speedup is not None and r.speedup > 0:
        R += cfg.r_eff * max(-cfg.clip, min(cfg.clip, math.log2(r.speedup)))
    if r.over_resource_limit:
        R -= cfg.r_pen
    return R


REWARDS: dict[str, Callable[[EvalResult, RewardConfig], float]] = {
    "clipped_log": clipped_log_reward,
    "paper": paper_reward,
}


def reward(r: EvalResult, cfg: RewardConfig | None = None) -> float:
    """The configured reward of ``r``."""
    cfg = cfg or RewardConfig()
    return REWARDS[cfg.name](r, cfg)
