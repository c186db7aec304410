"""Rewards: every branch of both presets, as pure functions of EvalResult."""

from __future__ import annotations

import math

import pytest

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.rewards import RewardConfig, reward


def res(kind: ErrorKind, speedup: float | None = None, over: bool = False) -> EvalResult:
    return EvalResult(op="spmv", k=None, matrix="m", error_kind=kind, compiled=kind.compiled,
                      correct=kind is ErrorKind.NONE, speedup=speedup, over_resource_limit=over)


PAPER = RewardConfig(name="paper", r_eff=1.0, r_pen=0.5)
LOG = RewardConfig(name="clipped_log", r_eff=1.0, r_pen=0.5, clip=3.0)


@pytest.mark.parametrize("kind", [ErrorKind.EXTRACT, ErrorKind.CONTRACT, ErrorKind.STATIC, ErrorKind.COMPILE,
                                  ErrorKind.COMPILE_TIMEOUT])
def test_not_compiled(kind: ErrorKind) -> None:
    assert reward(res(kind), PAPER) == -0.5
    assert reward(res(kind), LOG) == -0.5


@pytest.mark.parametrize("kind", [ErrorKind.INCORRECT, ErrorKind.CRASHED, ErrorKind.TIMEOUT, ErrorKind.FORMAT_REFUSED,
                                  ErrorKind.INPUT_MODIFIED, ErrorKind.NONDETERMINISTIC, ErrorKind.LAUNCH])
def test_compiled_but_wrong(kind: ErrorKind) -> None:
    assert reward(res(kind), PAPER) == 0.0
    assert reward(res(kind), LOG) == 0.0


def test_correct_speed_terms() -> None:
    assert reward(res(ErrorKind.NONE, 1.0), PAPER) == 1.0
    assert reward(res(ErrorKind.NONE, 3.0), PAPER) == pytest.approx(3.0)
    assert reward(res(ErrorKind.NONE, 0.5), PAPER) == pytest.approx(0.5)
    assert reward(res(ErrorKind.NONE, 2.0), LOG) == pytest.approx(2.0)
    assert reward(res(ErrorKind.NONE, 0.5), LOG) == pytest.approx(0.0)
    assert reward(res(ErrorKind.NONE, 1000.0), LOG) == pytest.approx(1.0 + 3.0)  # clipped
    assert reward(res(ErrorKind.NONE, 1e-6), LOG) == pytest.approx(1.0 - 3.0)
    assert reward(res(ErrorKind.NONE, 2.0), RewardConfig(name="paper", r_eff=0.2)) == pytest.approx(1.2)


def test_resource_penalty() -> None:
    assert reward(res(ErrorKind.NONE, 1.0, over=True), PAPER) == 0.5
    assert reward(res(ErrorKind.RESOURCE, over=True), LOG) == pytest.approx(-0.5)


def test_compile_only_scores_the_compile() -> None:
    assert reward(res(ErrorKind.NO_GPU), PAPER) == 0.5
    assert reward(res(ErrorKind.NO_GPU), LOG) == 0.5


def test_monotone_in_speedup() -> None:
    vals = [reward(res(ErrorKind.NONE, s), LOG) for s in (0.25, 0.5, 1, 2, 4)]
    assert vals == sorted(vals) and all(math.isfinite(v) for v in vals)


def test_config_validation() -> None:
    with pytest.raises(SparseRLError, match="unknown reward"):
        RewardConfig(name="nope")
    with pytest.raises(SparseRLError):
        RewardConfig(clip=0)
