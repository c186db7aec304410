"""Rewards: every branch of every preset, as pure functions of EvalResult, and the ladder
(compile failure < wrong < correct at any speed) for every registered reward."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
from sparserl.rewards import REWARDS, RewardConfig, infrastructure_failure, kernel_us, reward


def res(kind: ErrorKind, speedup: float | None = None, over: bool = False, t_us: float | None = None,
        message: str = "") -> EvalResult:
    timings = {"cold": KernelTiming("cold", t_us, t_us, t_us, 0.0)} if t_us is not None else {}
    return EvalResult(op="spmv", k=None, matrix="m", error_kind=kind, message=message, compiled=kind.compiled,
                      correct=kind is ErrorKind.NONE, speedup=speedup, over_resource_limit=over, timings=timings)


PAPER = RewardConfig(name="paper", r_eff=1.0, r_pen=0.5)
LOG = RewardConfig(name="clipped_log", r_eff=1.0, r_pen=0.5, clip=3.0)
REL = RewardConfig(name="relative_best", r_eff=1.0, r_pen=0.5, clip=3.0)
NOT_COMPILED = [ErrorKind.EXTRACT, ErrorKind.CONTRACT, ErrorKind.STATIC, ErrorKind.COMPILE, ErrorKind.COMPILE_TIMEOUT]
WRONG = [ErrorKind.INCORRECT, ErrorKind.CRASHED, ErrorKind.TIMEOUT, ErrorKind.FORMAT_REFUSED, ErrorKind.INPUT_MODIFIED,
         ErrorKind.NONDETERMINISTIC, ErrorKind.LAUNCH, ErrorKind.RESOURCE]
# NO_GPU (compile-only runs: nothing is run, so no result is correct) is tested on its own below
SPEEDS = np.geomspace(1e-4, 1e4, 161)  # far past every clip, both ways


@pytest.mark.parametrize("kind", NOT_COMPILED)
def test_not_compiled(kind: ErrorKind) -> None:
    assert reward(res(kind), PAPER) == -0.5
    assert reward(res(kind), LOG) == -3.0 - 1.0  # -c - 2 step
    assert reward(res(kind), REL, best_us=5.0) == -4.0


@pytest.mark.parametrize("kind", WRONG)
def test_compiled_but_wrong(kind: ErrorKind) -> None:
    assert reward(res(kind), PAPER) == 0.0
    assert reward(res(kind), LOG) == -3.5  # -c - step


def test_correct_speed_terms() -> None:
    assert reward(res(ErrorKind.NONE, 1.0), PAPER) == 1.0
    assert reward(res(ErrorKind.NONE, 3.0), PAPER) == pytest.approx(3.0)
    assert reward(res(ErrorKind.NONE, 0.5), PAPER) == pytest.approx(0.5)
    assert reward(res(ErrorKind.NONE, 2.0), RewardConfig(name="paper", r_eff=0.2)) == pytest.approx(1.2)
    assert reward(res(ErrorKind.NONE, 1.0), LOG) == 0.0  # parity with cuSPARSE earns 0
    assert reward(res(ErrorKind.NONE, 2.0), LOG) == pytest.approx(1.0)
    assert reward(res(ErrorKind.NONE, 0.5), LOG) == pytest.approx(-1.0)
    assert reward(res(ErrorKind.NONE, 1000.0), LOG) == pytest.approx(3.0)  # clipped
    assert reward(res(ErrorKind.NONE, 1e-6), LOG) == pytest.approx(-3.0)
    assert reward(res(ErrorKind.NONE, None), LOG) == 0.0  # correct, not timed: parity
    half = RewardConfig(r_eff=0.5, clip=2.0, step=0.25)
    assert reward(res(ErrorKind.NONE, 8.0), half) == pytest.approx(1.0)  # 0.5 * clip(3, 2)
    assert reward(res(ErrorKind.INCORRECT), half) == pytest.approx(-1.25)  # -(0.5 * 2) - 0.25


def test_relative_best() -> None:
    """log2(t_best / t): matching the best known kernel earns 0, beating it by 2x earns r_eff."""
    assert reward(res(ErrorKind.NONE, 3.0, t_us=10.0), REL, best_us=10.0) == pytest.approx(0.0)
    assert reward(res(ErrorKind.NONE, 3.0, t_us=5.0), REL, best_us=10.0) == pytest.approx(1.0)
    assert reward(res(ErrorKind.NONE, 3.0, t_us=40.0), REL, best_us=10.0) == pytest.approx(-2.0)
    assert reward(res(ErrorKind.NONE, 3.0, t_us=1e4), REL, best_us=10.0) == pytest.approx(-3.0)  # clipped
    # nothing known beyond cuSPARSE: the same as clipped_log
    assert reward(res(ErrorKind.NONE, 2.0, t_us=5.0), REL) == reward(res(ErrorKind.NONE, 2.0, t_us=5.0), LOG)
    assert kernel_us(res(ErrorKind.NONE, 2.0, t_us=5.0)) == 5.0 and kernel_us(res(ErrorKind.NONE, 2.0)) is None
    with pytest.raises(SparseRLError, match="time"):
        reward(res(ErrorKind.NONE, 2.0), REL, best_us=10.0)
    assert reward(res(ErrorKind.NONE, 2.0, t_us=5.0), LOG, best_us=1.0) == pytest.approx(1.0)  # ignored there


def _configs(name: str) -> list[RewardConfig]:
    if name == "paper":
        return [RewardConfig(name=name, r_eff=e) for e in (0.1, 0.5, 1.0)]
    return [RewardConfig(name=name, r_eff=e, clip=c, step=s) for e in (0.2, 1.0, 3.0) for c in (1.0, 3.0)
            for s in (0.05, 0.5)]


@pytest.mark.parametrize("name", sorted(REWARDS))
@pytest.mark.parametrize("over", [False, True])
def test_ladder_holds_across_the_speed_range(name: str, over: bool) -> None:
    """A correct kernel at any speed (1e-4x to 1e4x) scores above every wrong and every
    not-compiled result, which score above a compile failure, for every registered reward and a
    spread of coefficients, with the resource flag the same on both sides."""
    for cfg in _configs(name):
        best = 10.0 if name == "relative_best" else None
        correct = [reward(res(ErrorKind.NONE, float(s), over, t_us=10.0 / float(s)), cfg, best) for s in SPEEDS]
        wrong = [reward(res(k, over=over), cfg, best) for k in WRONG]
        failed = [reward(res(k, over=over), cfg, best) for k in NOT_COMPILED]
        assert all(math.isfinite(v) for v in correct + wrong + failed)
        assert min(correct) > max(wrong), (cfg, min(correct), max(wrong))
        assert min(wrong) > max(failed), (cfg, min(wrong), max(failed))
        assert correct == sorted(correct), "faster never scores less"


def test_resource_penalty() -> None:
    assert reward(res(ErrorKind.NONE, 1.0, over=True), PAPER) == 0.5
    assert reward(res(ErrorKind.NONE, 1.0, over=True), LOG) == -0.5
    assert reward(res(ErrorKind.RESOURCE, over=True), LOG) == pytest.approx(-4.0)


def test_compile_only_scores_the_compile() -> None:
    for name in REWARDS:
        for cfg in _configs(name):
            assert reward(res(ErrorKind.NO_GPU), cfg) > max(reward(res(k), cfg) for k in NOT_COMPILED)
    assert reward(res(ErrorKind.NO_GPU), PAPER) == 0.5
    assert reward(res(ErrorKind.NO_GPU), LOG) == -3.5


def test_config_validation() -> None:
    with pytest.raises(SparseRLError, match="unknown reward"):
        RewardConfig(name="nope")
    with pytest.raises(SparseRLError):
        RewardConfig(clip=0)
    with pytest.raises(SparseRLError):
        RewardConfig(step=0)
    with pytest.raises(SparseRLError, match="r_eff <= 1"):
        RewardConfig(name="paper", r_eff=2.0)


def test_config_messages_and_bounds() -> None:
    """Each refusal says what to do, in full; the bounds themselves are allowed (r_eff = r_pen = 0,
    a paper r_eff of exactly 1). Mutations killed: a bound made strict or dropped, a message garbled,
    the speed in the paper preset's message computed as ``1 ** 1 / r_eff`` (a cosmic-ray operator)."""
    with pytest.raises(SparseRLError) as e:
        RewardConfig(name="nope")
    assert str(e.value) == "unknown reward 'nope'; rewards: clipped_log, relative_best, paper"
    for bad in ({"clip": 0.0}, {"clip": -1.0}, {"step": 0.0}, {"r_eff": -0.1}, {"r_pen": -0.1}):
        with pytest.raises(SparseRLError) as e:
            RewardConfig(**bad)
        assert str(e.value) == "clip and step must be > 0, r_eff and r_pen >= 0", bad
    with pytest.raises(SparseRLError) as e:
        RewardConfig(name="paper", r_eff=4.0)  # at r_eff = 2, 1 - 1/r_eff and 1/r_eff are both 0.5
    assert str(e.value) == ("paper reward with r_eff = 4.0 > 1 scores a correct kernel below 0.75x under a wrong "
                            "one; use r_eff <= 1 or clipped_log")
    for ok in ({"r_eff": 0.0, "r_pen": 0.0}, {"name": "paper", "r_eff": 1.0}, {"clip": 1e-9, "step": 1e-9}):
        RewardConfig(**ok)


def test_a_degenerate_speed_ratio_scores_the_bottom_of_the_band() -> None:
    """A correct kernel whose speed ratio is 0 (a best-known time of 0, or a speedup of 0) scores -c,
    the slowest a correct kernel can score, not a math error and not +c.

    Mutations killed: the ``ratio > 0`` guard dropped or turned into ``>= 0``, ``-c`` into ``+c``."""
    assert reward(res(ErrorKind.NONE, 0.0), LOG) == -3.0
    assert reward(res(ErrorKind.NONE, 2.0, t_us=10.0), REL, best_us=0.0) == -3.0
    assert reward(res(ErrorKind.NONE, 0.0, over=True), LOG) == -3.5


def test_the_paper_speed_term_needs_a_correct_kernel() -> None:
    """An incorrect result that carries a speedup (timed, then rejected) gets no speed term.

    Mutation killed: ``r.correct and r.speedup is not None`` turned into ``or``."""
    assert reward(res(ErrorKind.INCORRECT, speedup=3.0), PAPER) == 0.0
    assert reward(res(ErrorKind.INCORRECT, speedup=3.0), LOG) == -3.5


@pytest.mark.parametrize("kind,message,infra", [
    (ErrorKind.INTERNAL, "worker could not start", True),
    (ErrorKind.COMPILE_TIMEOUT, "nvcc ran past its 60 s limit", True),
    (ErrorKind.CRASHED, "an illegal memory access was encountered", False),
    (ErrorKind.COMPILE, "error: expected a ;", False),
    (ErrorKind.INCORRECT, "", False),
    (ErrorKind.NONE, "", False),
    (ErrorKind.NO_GPU, "", False),
])
def test_infrastructure_failures(kind: ErrorKind, message: str, infra: bool) -> None:
    assert infrastructure_failure(res(kind, message=message)) is infra


def test_timeouts_are_the_kernels_only_while_it_runs() -> None:
    """With the real worker pool (a CPU stand-in worker): a hang while the candidate runs is the
    kernel's fault; running past the limit of a harness phase is the machine's."""
    from sparserl.harness.pool import PhaseLimits, WorkerPool
    from tests.harness.fake_worker import fake_worker_main

    pool = WorkerPool([0], {}, PhaseLimits(prepare=0.5, verify=0.5, check=0.5, time=0.5, startup=60.0),
                      target=fake_worker_main)
    try:
        verdicts = {}
        for phase in ("prepare", "verify", "check", "time"):
            t0 = time.monotonic()
            out = pool.run("eval", {"steps": [["phase", phase], ["sleep", 10]]})
            assert out["error_kind"] == "timeout" and time.monotonic() - t0 < 8
            verdicts[phase] = infrastructure_failure(res(ErrorKind.TIMEOUT, message=out["message"]))
    finally:
        pool.close()
    assert verdicts == {"prepare": True, "verify": False, "check": True, "time": False}
