"""The batched path's rules on the CPU: the adaptive number of cold runs, early stopping, the order of
the timed verdicts, scaled time limits, and how rewards score a kernel stopped early."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparserl.errors import SparseRLError
from sparserl.harness.pool import PhaseLimits
from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
from sparserl.harness.speed import (
    SpeedConfig,
    contender_limit,
    enough_runs,
    is_slow,
    look,
    look_points,
    median_ci,
    median_ci_ranks,
    scaled_limit,
    slow_threshold_us,
    timed_verdict,
)
from sparserl.rewards import RewardConfig, reward


def test_median_ci_ranks_by_hand_and_against_the_binomial() -> None:
    """n = 11: P(B <= 1) = 12/2048 = 0.0059 <= 0.025 < P(B <= 2) = 67/2048 = 0.0327, so the interval
    is the 2nd to the 10th order statistic. Kills an off-by-one in the rank (3, 9 or 1, 11)."""
    assert median_ci_ranks(11) == (2, 10)
    assert median_ci_ranks(41) == (14, 28)  # the textbook table's ranks for n = 41
    assert median_ci_ranks(5) == (1, 5)  # P(B = 0) = 1/32 > 0.025: no narrower interval exists
    for n in range(3, 60):
        lo, hi = median_ci_ranks(n)
        below = sum(math.comb(n, j) for j in range(lo)) / 2 ** n  # P(B < lo)
        beyond = sum(math.comb(n, j) for j in range(lo + 1)) / 2 ** n  # P(B < lo + 1)
        assert hi == n + 1 - lo and (below <= 0.025 or lo == 1) and (beyond > 0.025 or lo == (n + 1) // 2), n


def test_adaptive_stopping_rule_on_a_hand_computed_example() -> None:
    """11 samples sorted: 98.9, 99.5, 99.6, 99.8, 99.9, 100, 100.1, 100.2, 100.4, 100.6, 101.5. Median
    100, interval [x(2), x(10)] = [99.5, 100.6]: within ±1% (99, 101), so timing may stop. Swapping in
    x(10) = 101.2 (1.2% above) keeps it going; 10 samples are under the floor whatever they are."""
    s = [100.0, 99.5, 101.5, 99.9, 100.1, 98.9, 100.6, 99.6, 100.2, 99.8, 100.4]
    mid, lo, hi = median_ci(s)
    assert (mid, lo, hi) == (100.0, 99.5, 100.6)
    assert enough_runs(s, ci=0.01, floor=11, ceiling=41)
    wide = [101.2 if v == 100.6 else v for v in s]
    assert not enough_runs(wide, ci=0.01, floor=11, ceiling=41)
    assert enough_runs(wide, ci=0.02, floor=11, ceiling=41)
    assert not enough_runs(s[:10], ci=0.01, floor=11, ceiling=41)
    assert not enough_runs(s, ci=0.0, floor=11, ceiling=41)  # ci 0: only the ceiling ends it
    assert enough_runs([1.0, 50.0, 3.0], ci=0.0, floor=11, ceiling=3)


def test_look_points() -> None:
    assert look_points(5, True, 11, 0.01, 10, 41) == [5, 11, 21, 31, 41]
    assert look_points(5, False, 11, 0.01, 10, 41) == [11, 21, 31, 41]
    assert look_points(5, True, 11, 0.0, 10, 41) == [5, 41]
    assert look_points(5, False, 11, 0.0, 10, 41) == [41]  # the earlier behaviour: one run of 41
    assert look_points(5, True, 11, 0.01, 10, 7) == [5, 7]


def test_early_stop_threshold_and_decision() -> None:
    assert slow_threshold_us(3.0, 40.0, 100.0) == 120.0  # the best known is faster than cuSPARSE
    assert slow_threshold_us(3.0, 400.0, 100.0) == 300.0  # cuSPARSE is faster than the best known
    assert slow_threshold_us(3.0, None, 100.0) == 300.0
    assert slow_threshold_us(0.0, 40.0, 100.0) is None  # off
    assert slow_threshold_us(3.0, None, None) is None
    assert is_slow(121.0, 120.0) and not is_slow(120.0, 120.0) and not is_slow(1e9, None)


def test_look_decides_wrong_before_slow_before_enough() -> None:
    """A kernel slow *and* wrong is wrong: the first wrong output decides, whatever the times (kills a
    look that tests slowness first); slow only at the early-stop look; adaptive stop after that."""
    kw = dict(early_runs=5, slow_above_us=100.0, ci=0.01, floor=11, ceiling=41)
    slow5 = [500.0] * 5
    assert look(slow5, [None, None, "timed run (cold, run 3 of up to 41): wrong", None, None], **kw) == \
        ("wrong", "timed run (cold, run 3 of up to 41): wrong")
    assert look(slow5, [None] * 5, **kw) == ("slow", "")
    assert look([50.0] * 5, [None] * 5, **kw) == ("more", "")
    assert look([500.0] * 11, [None] * 11, **kw) == ("enough", "")  # past the early-stop look: timed in full
    assert look(slow5, [None] * 5, **(kw | {"slow_above_us": None})) == ("more", "")


def test_timed_verdict_order() -> None:
    """After the timed runs: wrong > matrix written > flush buffer written > slow (slow and wrong is
    wrong; slow and writing the matrix is input_modified)."""
    assert timed_verdict("msg", ["val"], False, True) == ("incorrect", "msg")
    assert timed_verdict(None, ["val", "col_idx"], False, True)[0] == "input_modified"
    assert "val, col_idx during timed runs" in timed_verdict(None, ["val", "col_idx"], True, True)[1]
    assert timed_verdict(None, [], False, True)[0] == "incorrect"
    assert timed_verdict(None, [], True, True) == ("slow", "")
    assert timed_verdict(None, [], True, False) is None


def test_the_worker_asks_for_the_granted_floor_only_in_a_granted_job() -> None:
    """Kills a worker that takes the lower floor in a job whose GPU a trainer shares (its kernels
    would be killed for the trainer's time), one that never takes it, and one that kills at it (a
    kill costs a restart: the lower floor only predicts)."""
    from types import SimpleNamespace

    from sparserl.harness.worker import Worker

    w = SimpleNamespace(speed=SpeedConfig(), channel=SimpleNamespace(granted=False))
    assert Worker._limit(w, 1, 100.0) == 2.0
    w.channel.granted = True
    assert Worker._limit(w, 1, 100.0) == 0.5  # the verifier's prediction after the first launch
    assert Worker._limit(w, 1, 100.0, kill=True) == 2.0  # the parent's kill deadline keeps the floor
    w.speed = SpeedConfig.classic()
    assert Worker._limit(w, 1, 100.0) is None


def test_the_verifier_announces_the_kill_deadline_and_predicts_with_the_granted_floor() -> None:
    """What the batched verifier is handed: the phase announced to the parent carries the 2 s kill
    deadline and the prediction's limit the granted 0.5 s. Kills a verify phase announced with the
    granted floor (kills at 0.5 s, each a restart) and a prediction that ignores the grant."""
    from types import SimpleNamespace

    from sparserl.harness.worker import Worker

    said = []
    channel = SimpleNamespace(granted=True, phase=lambda name, launches, limit: said.append((name, launches, limit)))
    w = SimpleNamespace(speed=SpeedConfig(), channel=channel)
    w._limit = lambda *a, **kw: Worker._limit(w, *a, **kw)
    announce, limit = Worker._verify_limits(w, 48.9)
    announce("verify", 9)
    announce("check")
    assert said == [("verify", 9, 2.0), ("check", 1, None)]
    assert limit(9) == 0.5  # 9 x 1000 x 48.9 us = 0.44 s, under the granted floor
    channel.granted = False
    assert limit(9) == 2.0


def test_the_contender_limit_and_where_the_worker_applies_it() -> None:
    """A contender job (the oracle's) predicts against contender_scale x min(best known, cuSPARSE) a
    launch, only where the job has the GPU whole, and says so; an ordinary job never does. Mutations
    killed: the limit taken from cuSPARSE alone when a faster best is known, the contender limit in
    an ordinary or shared-GPU job, a contender limit looser than the ordinary one chosen over it,
    and a contender_scale at or below the early-stop factor (it would stop kernels early stopping keeps)."""
    from types import SimpleNamespace

    from sparserl.harness.speed import contender_limit
    from sparserl.harness.worker import Worker

    cfg = SpeedConfig()
    assert contender_limit(None, 50.0, 8, cfg) == pytest.approx(8 * 100 * 50e-6)
    assert contender_limit(20.0, 50.0, 8, cfg) == pytest.approx(8 * 100 * 20e-6)  # the faster of the two
    assert contender_limit(90.0, 50.0, 1, cfg, allowance_s=0.01) == pytest.approx(0.01 + 100 * 50e-6)
    assert contender_limit(None, None, 8, cfg) is None
    assert contender_limit(20.0, 50.0, 8, SpeedConfig(contender_scale=0.0)) is None
    assert SpeedConfig.classic().contender_scale == 0.0
    for bad in (3.0, 2.0, -1.0):
        with pytest.raises(SparseRLError, match="contender_scale"):
            SpeedConfig(contender_scale=bad)
    channel = SimpleNamespace(granted=True, phase=lambda *a: None)
    w = SimpleNamespace(speed=cfg, channel=channel)
    w._limit = lambda *a, **kw: Worker._limit(w, *a, **kw)
    _, ordinary = Worker._verify_limits(w, 48.9)
    assert ordinary(8) == 0.5 and not ordinary.contender
    _, contend = Worker._verify_limits(w, 48.9, 30.0)
    assert contend(8) == pytest.approx(8 * 100 * 30e-6) and contend.contender
    channel.granted = False  # a trainer shares the GPU: the ordinary limit alone
    assert contend(8) == 2.0 and not contend.contender
    from sparserl.harness.verify import VerifyOutcome

    out = VerifyOutcome(ErrorKind.TIMEOUT, "the first launch took 0.1 s: ...", 0.0)
    channel.granted = True
    assert contend(8) and contend.explain(out).message.endswith("(not a contender)")
    assert contend.explain(VerifyOutcome(ErrorKind.INCORRECT, "wrong", 0.0)).message == "wrong"
    assert ordinary.explain(out) is out  # an ordinary job's time-out says nothing of contenders
    w.speed = SpeedConfig(limit_scale=10.0)  # the ordinary limit: max(0.5 s floor, 8 x 10 x 2 ms)
    _, loose = Worker._verify_limits(w, 2000.0, 2000.0)  # contender: 8 x 100 x 2 ms = 1.6 s, looser...
    assert loose(8) == 0.5 and not loose.contender  # ...so the ordinary one binds, and its message is the ordinary one
    assert loose.explain(out) is out


def test_a_contender_job_predicts_from_a_shorter_first_launch_only_where_its_limit_binds() -> None:
    """``SpeedConfig.contender_min_s`` is the prediction's floor where the contender limit binds and
    nowhere else; it lies in (0, PREDICT_MIN_S]. Mutations killed: the lower floor in an ordinary job
    (a reward path judged by a first launch that may carry one-time costs), in a shared-GPU job or
    where the ordinary limit binds, the floor ignored by ``predicted_overrun``, and a contender floor
    above the ordinary one accepted."""
    from types import SimpleNamespace

    from sparserl.harness.speed import PREDICT_MIN_S, predicted_overrun
    from sparserl.harness.worker import Worker

    assert SpeedConfig().contender_min_s == 0.01  # measured: no oracle pick lost at 10 ms, arrow's oracle halved
    for bad in (0.0, -0.01, PREDICT_MIN_S * 2):
        with pytest.raises(SparseRLError, match="contender_min_s"):
            SpeedConfig(contender_min_s=bad)
    channel = SimpleNamespace(granted=True, phase=lambda *a: None)
    w = SimpleNamespace(speed=SpeedConfig(contender_min_s=0.005), channel=channel)
    w._limit = lambda *a, **kw: Worker._limit(w, *a, **kw)
    _, ordinary = Worker._verify_limits(w, 48.9)
    _, contend = Worker._verify_limits(w, 48.9, 30.0)
    assert ordinary.min_first_s == PREDICT_MIN_S and contend.min_first_s == PREDICT_MIN_S  # none asked yet
    ordinary(8), contend(8)
    assert ordinary.min_first_s == PREDICT_MIN_S and contend.min_first_s == 0.005
    channel.granted = False  # shared GPU: the ordinary limit, and its floor
    contend(8)
    assert contend.min_first_s == PREDICT_MIN_S
    channel.granted = True
    w.speed = SpeedConfig(limit_scale=10.0, contender_min_s=0.005)
    _, loose = Worker._verify_limits(w, 2000.0, 2000.0)  # the ordinary limit binds
    loose(8)
    assert loose.min_first_s == PREDICT_MIN_S
    assert contend(8) == pytest.approx(0.024)  # 8 x 100 x 30 us
    # 10 ms first launch x 8 = 80 ms against 8 x 100 x 30 us = 24 ms: over, from a launch under 50 ms
    assert not predicted_overrun(0.010, 8, 0.024) and predicted_overrun(0.010, 8, 0.024, 0.005)
    assert not predicted_overrun(0.004, 8, 0.024, 0.005)  # under the lower floor too


def test_an_ordinary_submission_never_shares_a_contender_jobs_unknown_or_timed_out_result() -> None:
    """The memo: a contender job's time-out, or its result not known yet, never answers an ordinary
    submission of the same kernel; a contender's other verdicts do, and a contender submission takes
    any. Mutation killed: an ordinary job handed 'not a contender' (scored as a wrong kernel)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    ev = SimpleNamespace(config=HarnessConfig())

    def future(contender: bool, kind: ErrorKind | None) -> Future:
        f = Future()
        f.contender = contender
        if kind is not None:
            f.set_result(EvalResult.failure("spmv", None, "m", kind, "x"))
        return f

    valid = lambda f, contender: Evaluator._still_valid(ev, f, None, contender)  # noqa: E731
    assert not valid(future(True, None), False) and valid(future(True, None), True)
    assert not valid(future(True, ErrorKind.TIMEOUT), False) and valid(future(True, ErrorKind.TIMEOUT), True)
    assert valid(future(True, ErrorKind.INCORRECT), False)
    assert valid(future(False, None), False) and valid(future(False, None), True)


@pytest.fixture
def compile_only(tmp_path):
    """A compile-only Evaluator, a registered 300-row matrix and a library CSR kernel's text."""
    from sparserl.harness.compile import find_nvcc
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.kernels.library import variants
    from sparserl.matrices import generate

    if find_nvcc() is None:
        pytest.skip("needs nvcc (the evaluator compiles)")
    ev = Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path)))
    try:
        yield ev, ev.register(generate("random", 300, seed=0), "r"), variants("spmv", "CSR")[0].render()
    finally:
        ev.close()


def test_submit_tags_its_future_and_keeps_an_ordinary_job_off_a_pending_contender(compile_only, monkeypatch) -> None:
    """Through submit(): the evaluator's own futures say whether they are a contender's, and an
    ordinary submission made while a contender job of the same kernel is pending gets a job of its
    own (a contender submission may share any). Mutations killed: the future left untagged (every
    later ordinary submission would share a pending contender job), and the memo ignoring the tag."""
    from concurrent.futures import Future

    from sparserl.kernels.contract import Op

    ev, ref, text = compile_only
    mine, theirs = ev._submit(text, ref, Op.SPMV, None, None, True), ev._submit(text, ref, Op.SPMV, None, None)
    assert mine.contender is True and theirs.contender is False
    mine.result(), theirs.result()

    jobs = []

    def pending(text, matrix, op, k, best_us=None, contender=False, fresh=False):  # a GPU job still running
        f = Future()
        f.contender = contender
        jobs.append(f)
        return f

    monkeypatch.setattr(ev, "_submit", pending)
    other = text + "\n// another kernel"
    a = ev.submit(other, ref, contender=True)
    b = ev.submit(other, ref)
    assert b is not a and jobs == [a, b]  # its own job
    c = ev.submit(other, ref)  # shared with the next ordinary one, while it runs
    assert len(jobs) == 2 and not c.done()
    b.set_result(EvalResult.failure("spmv", None, "m", ErrorKind.INCORRECT, "wrong"))
    assert c.result() is b.result()
    assert ev.submit(other, ref, contender=True) is b  # a contender may take an ordinary job's result


def test_scaled_limits_and_the_pool_cap() -> None:
    cfg = SpeedConfig()
    assert scaled_limit(100.0, 1, cfg) == 2.0  # 1000 x 100 us = 0.1 s, under the 2 s floor
    assert scaled_limit(10_000.0, 8, cfg, allowance_s=1.0) == pytest.approx(81.0)  # 1 s + 8 x 10 s
    assert scaled_limit(None, 8, cfg) is None and scaled_limit(100.0, 8, SpeedConfig.classic()) is None
    # a job with the GPU whole (no trainer shares it) has the lower floor; the scaled part is the same
    assert scaled_limit(100.0, 1, cfg, granted=True) == 0.5
    assert scaled_limit(10_000.0, 8, cfg, allowance_s=1.0, granted=True) == pytest.approx(81.0)
    assert scaled_limit(100.0, 1, SpeedConfig(limit_floor_s=0.2), granted=True) == 0.2  # never above the floor
    limits = PhaseLimits(verify=30.0, time=120.0)
    assert limits.of("verify") == ("verify", 30.0)
    assert limits.of(("verify", 8, 2.0)) == ("verify", 2.0)
    assert limits.of(("verify", 8, 500.0)) == ("verify", 240.0)  # never above 30 s per launch
    assert limits.of(("verify", 8, None)) == ("verify", 240.0)
    assert limits.of(("time", 1, 16.6)) == ("time", 16.6)
    assert limits.of(("time", 1, 900.0)) == ("time", 120.0)


def test_speed_config_validation() -> None:
    classic = SpeedConfig.classic()
    assert not classic.batched and classic.ci == 0 and classic.early_stop == 0 and classic.limit_scale == 0
    with pytest.raises(SparseRLError, match="batched"):
        SpeedConfig(batched=False)  # adaptive timing and early stopping are on by default
    with pytest.raises(SparseRLError, match="early_stop"):
        SpeedConfig(early_stop=1.0)
    with pytest.raises(SparseRLError, match="ci"):
        SpeedConfig(ci=1.5)
    with pytest.raises(SparseRLError, match="runs_ahead"):
        SpeedConfig(runs_ahead=0)
    assert SpeedConfig().runs_ahead == 1  # each timed run starts on an idle GPU, as on the sequential path


def _timed(kind: ErrorKind, t_us: float, base_us: float = 100.0) -> EvalResult:
    kt, base = KernelTiming("cold", t_us, t_us, t_us, 0.0, 5), KernelTiming("cold", base_us, base_us, base_us, 0.0)
    return EvalResult(op="spmv", k=None, matrix="m", error_kind=kind, compiled=True, correct=kind.verified,
                      timings={"cold": kt}, baseline={"cold": base}, speedup=base_us / t_us)


@pytest.mark.parametrize("name", ["clipped_log", "relative_best", "paper"])
def test_a_slow_kernel_is_scored_by_its_measured_speed_as_a_correct_one(name: str) -> None:
    """Kills a reward that reads ``error_kind is NONE`` instead of ``correct`` (slow scored as wrong)."""
    cfg = RewardConfig(name=name, r_eff=1.0 if name != "paper" else 0.5)
    for t in (350.0, 2000.0):
        slow, full = _timed(ErrorKind.SLOW, t), _timed(ErrorKind.NONE, t)
        assert reward(slow, cfg, best_us=40.0) == reward(full, cfg, best_us=40.0)
    wrong = EvalResult.failure("spmv", None, "m", ErrorKind.INCORRECT, "wrong", compiled=True)
    assert reward(_timed(ErrorKind.SLOW, 2000.0), cfg, best_us=40.0) > reward(wrong, cfg, best_us=40.0)
    assert ErrorKind.SLOW.verified and ErrorKind.SLOW.compiled and not ErrorKind.INCORRECT.verified


def test_median_of_even_count_matches_numpy() -> None:
    s = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert median_ci(s)[0] == float(np.median(s))


def test_predicted_overrun_boundaries() -> None:
    """Over only when the first launch's time times the remaining launches is strictly above the
    margin times the limit, the first launch took at least the floor, and a limit is known. Kills
    ``>=`` for ``>`` (a kernel predicted to land exactly on the margin is stopped), a dropped margin
    (noise near the limit stops kernels that would finish), a dropped floor, and a None limit read
    as 0 (every kernel stopped when scaling is off)."""
    from sparserl.harness.speed import PREDICT_MARGIN, PREDICT_MIN_S, predicted_overrun

    assert (PREDICT_MIN_S, PREDICT_MARGIN) == (0.05, 1.25)
    assert not predicted_overrun(0.3125, 8, 2.0)  # 2.5 s: exactly the margin times the limit
    assert predicted_overrun(0.313, 8, 2.0)
    assert not predicted_overrun(0.3, 8, 2.0)  # 2.4 s: over the limit, within the margin
    assert predicted_overrun(10.0, 1, 2.0) and not predicted_overrun(2.5, 1, 2.0)
    assert not predicted_overrun(0.0499, 1000, 2.0)  # 50 s predicted, but from a launch under the floor
    assert predicted_overrun(0.05, 1000, 2.0)
    assert not predicted_overrun(100.0, 8, None)  # scaling off: today's fixed limits, no prediction
    assert not predicted_overrun(100.0, 0, 2.0)  # nothing left to run


# -- boundaries a mutation run of this module found untested (scripts/mutation.py --modules speed) -------------


def test_median_ci_ranks_at_one_sample_at_an_exact_tail_and_at_another_confidence() -> None:
    """One sample is its own interval (kills a refusal of n = 1, and a cap at (n - 1) // 2, rank 0); a
    tail that equals a binomial CDF exactly keeps its rank (n = 5, confidence 0.625: the tail 0.1875 is
    P(B <= 1), so rank 2 stays within it; kills ``>=`` for ``>``); the confidence reaches the ranks
    through median_ci (kills median_ci calling the ranks at their default); no sample is one line."""
    assert median_ci_ranks(1) == (1, 1) and median_ci([7.0]) == (7.0, 7.0, 7.0)
    assert median_ci_ranks(5, 0.625) == (2, 4)
    s = [float(v) for v in range(1, 12)]  # 11 samples: ranks (2, 10) at 95%, (3, 9) at 80%
    assert median_ci(s) == (6.0, 2.0, 10.0) and median_ci(s, 0.8) == (6.0, 3.0, 9.0)
    with pytest.raises(ValueError, match="^need at least one sample$"):
        median_ci_ranks(0)


def test_the_median_of_four_is_the_mean_of_the_middle_two() -> None:
    """Kills a parity test other than n % 2 (four samples: n % 3 == 1 would take the third)."""
    assert median_ci([4.0, 1.0, 3.0, 2.0])[0] == 2.5


def test_enough_runs_at_its_boundaries() -> None:
    """The interval may touch ±ci exactly (median 100, interval [75, 125] at ci 0.25: both bounds exact
    in binary; kills ``<`` for ``<=`` and ``>`` for ``>=``); ci 0 never stops before the ceiling, even
    on identical samples (kills ``ci < 0``); a zero median never stops (kills ``mid >= 0``); a median
    under 1 us may (kills ``mid > 1``)."""
    lo, hi = median_ci_ranks(20)
    s = [75.0] * lo + [100.0] * (20 - 2 * lo) + [125.0] * lo
    assert sorted(s)[lo - 1] == 75.0 and sorted(s)[hi - 1] == 125.0 and median_ci(s)[0] == 100.0
    assert enough_runs(s, ci=0.25, floor=11, ceiling=41)
    assert not enough_runs(s, ci=0.24, floor=11, ceiling=41)
    assert not enough_runs([5.0] * 20, ci=0.0, floor=11, ceiling=41)
    assert not enough_runs([0.0] * 20, ci=0.01, floor=11, ceiling=41)
    assert enough_runs([0.5] * 20, ci=0.01, floor=11, ceiling=41)


def test_slow_only_before_the_ceiling_and_the_early_look_at_one_run() -> None:
    """A kernel whose early look is its last run is timed in full, never stopped as slow (kills ``<=``
    for ``<`` in look); an early look after one run is a look point, after none is not (kills ``1 <``
    and ``0 <=``)."""
    kw = dict(early_runs=5, slow_above_us=100.0, ci=0.0, floor=11, ceiling=5)
    assert look([500.0] * 5, [None] * 5, **kw) == ("enough", "")
    assert look_points(1, True, 11, 0.0, 10, 41) == [1, 41]
    assert look_points(0, True, 11, 0.0, 10, 41) == [41]


def test_a_time_under_one_microsecond_counts_and_zero_does_not() -> None:
    """The best known time, cuSPARSE's, in the slow threshold and the contender limit: 0.5 us is a time
    (kills ``t > 1``), 0 is none (kills ``t >= 0``); a factor or contender scale of exactly 1 is on
    (kills ``<= 1`` for ``<= 0``); cuSPARSE at 0.5 us scales the limit (its floor), at 0 it does not."""
    assert slow_threshold_us(3.0, 0.5, 10.0) == 1.5
    assert slow_threshold_us(3.0, 0.0, 10.0) == 30.0
    assert slow_threshold_us(1.0, 2.0, None) == 2.0
    cfg = SpeedConfig(early_stop=0.0, contender_scale=1.0)
    assert contender_limit(0.5, 10.0, 1, cfg) == pytest.approx(0.5e-6)
    assert contender_limit(0.0, 10.0, 1, cfg) == pytest.approx(10e-6)
    base = SpeedConfig()
    assert scaled_limit(0.5, 4, base) == base.limit_floor_s and scaled_limit(0.0, 4, base) is None
    half = SpeedConfig(limit_scale=0.5)
    assert scaled_limit(1e7, 1, half) == pytest.approx(5.0)  # one launch: 0.5 x 10 s, above the floor
    assert scaled_limit(1e7, 0, half) == pytest.approx(5.0)  # no launch counted is one


def test_the_flush_buffer_verdict_names_it() -> None:
    """The message a user reads for a write into the L2 flush buffer."""
    assert timed_verdict(None, [], False, False) == (
        "incorrect", "the kernel wrote far outside its buffers (into the harness's L2 flush buffer)")


@pytest.mark.parametrize("kwargs, says", [
    ({"min_cold_trials": 2}, "min_cold_trials >= 3"), ({"batch": 0}, "batch >= 1"),
    ({"early_stop_runs": 0}, "early_stop_runs >= 1"), ({"runs_ahead": 0}, "runs_ahead >= 1"),
    ({"ci": 1.0}, "ci must lie in [0, 1)"), ({"early_stop": 1.0, "contender_scale": 0.0}, "as fast as the best known"),
    ({"limit_floor_s": 0.0}, "limit_floor_s > 0"), ({"limit_floor_granted_s": 0.0}, "limit_floor_granted_s > 0"),
    ({"limit_scale": -1.0}, "limit_scale >= 0"),
    ({"batched": False, "ci": 0.01, "early_stop": 0.0, "contender_scale": 0.0}, "need the batched path"),
    ({"batched": False, "ci": 0.0, "early_stop": 3.0, "contender_scale": 0.0}, "need the batched path"),
    ({"contender_min_s": 0.0}, "contender_min_s must lie in"),
])
def test_speed_config_refuses_each_bad_setting_alone(kwargs: dict, says: str) -> None:
    """Each bad setting on its own (every other one valid) is refused with a message that names it. Kills
    a condition joined by ``and`` (refused only when two settings are bad together) and a bound moved by
    one (see the next test)."""
    with pytest.raises(SparseRLError) as exc:
        SpeedConfig(**kwargs)
    assert says in str(exc.value)


def test_speed_config_accepts_each_setting_at_its_bound() -> None:
    """Kills a bound moved past its edge: 3 cold trials, batch 1, 1 early-stop run, ci just under 1, an
    early-stop factor of 1.5, the contender floor equal to the ordinary one."""
    from sparserl.harness.speed import PREDICT_MIN_S

    SpeedConfig(min_cold_trials=3, batch=1, early_stop_runs=1, runs_ahead=1, ci=0.99)
    SpeedConfig(early_stop=1.5, contender_scale=0.0)
    SpeedConfig(contender_min_s=PREDICT_MIN_S)


def test_speed_config_messages_word_for_word() -> None:
    """What a user reads for each refused setting (kills a message altered in case or text)."""
    cases = [({"batch": 0}, "need min_cold_trials >= 3, batch >= 1, early_stop_runs >= 1 and runs_ahead >= 1"),
             ({"early_stop": 1.0, "contender_scale": 0.0}, "early_stop must be 0 (off) or above 1, got 1.0: a factor "
              "of 1 or less would stop kernels as fast as the best known"),
             ({"limit_floor_s": 0.0}, "need limit_scale >= 0, limit_floor_s > 0 and limit_floor_granted_s > 0"),
             ({"batched": False, "contender_scale": 0.0}, "adaptive timing (ci) and early stopping need the batched "
              "path: set ci=0 and early_stop=0 with batched=False, or use SpeedConfig.classic()")]
    for kwargs, message in cases:
        with pytest.raises(SparseRLError) as exc:
            SpeedConfig(**kwargs)
        assert str(exc.value) == message


def test_equal_limits_leave_the_ordinary_one_binding() -> None:
    """Where the contender limit equals the ordinary one, the job is judged as an ordinary one: its first
    launch predicts only from the ordinary floor (kills ``<=`` for ``<``, which would let the lower
    contender floor judge it); a time-out under the contender limit says so, word for word."""
    from sparserl.harness.speed import PREDICT_MIN_S, VerifyLimit
    from sparserl.harness.verify import VerifyOutcome

    lim = VerifyLimit(ordinary=lambda n: 1.0, contend=lambda n: 1.0, contender_min_s=0.01, contender_scale=100.0)
    assert lim(8) == 1.0 and not lim.contender and lim.min_first_s == PREDICT_MIN_S
    lim = VerifyLimit(ordinary=lambda n: 1.0, contend=lambda n: 0.5, contender_min_s=0.01, contender_scale=100.0)
    assert lim(8) == 0.5 and lim.contender and lim.min_first_s == 0.01
    out = lim.explain(VerifyOutcome(ErrorKind.TIMEOUT, "verification past 0.5 s", 0.0))
    assert out.message == ("verification past 0.5 s: 100 x the best known time a launch, in a job that asks only "
                           "whether the kernel could be the fastest (not a contender)")


def test_a_fresh_submission_is_stopped_early_only_against_the_callers_best(compile_only, monkeypatch) -> None:
    """A second look (``fresh``, ``sparserl.eval.retime``) times every pick in full: the best noted
    for the matrix is not passed to its job, the caller's ``best_us`` is; an ordinary submission
    gets the noted best. Kills: a fresh job given the noted best (a pick more than ``early_stop``
    times slower than the other would be retimed from a few runs, not its full count)."""
    from sparserl.kernels.contract import Op

    ev, ref, text = compile_only
    ev.note_best(ref, Op.SPMV, None, 5.0)
    given = []
    real = ev._submit

    def record(text, matrix, op, k, best_us=None, contender=False, fresh=False):
        given.append(best_us)
        return real(text, matrix, op, k, best_us, contender, fresh)

    monkeypatch.setattr(ev, "_submit", record)
    ev.submit(text, ref, fresh=True).result()
    ev.submit(text, ref, best_us=8.0, fresh=True).result()
    ev.submit(text + "\n// ordinary", ref).result()
    assert given == [None, 8.0, 5.0]
