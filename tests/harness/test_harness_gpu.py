"""GPU: the adversarial suite through the real worker pool, and the pool surviving it.

Every cheat must come back with its verdict (tests/harness/adversarial), and a good kernel must
evaluate correctly right after each one (the pool keeps serving: crashed and hung workers are
replaced). Run on the device machine: python -m pytest -m gpu tests/harness
"""

from __future__ import annotations

import time

import pytest

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.pool import PhaseLimits
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import FORMAT_NAMES
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from tests.harness.adversarial import (
    ADVERSARIAL,
    FAR_WRITE,
    GOOD,
    LONG_ROW_CASES,
    OWN_SPEED,
    VALUE_CASES,
    long_row_matrix,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    cfg = HarnessConfig(limits=PhaseLimits(verify=3.0), cold_trials=7, warm_trials=3, memo=0,  # every call runs
                        cache_dir=str(tmp_path_factory.mktemp("harness")))
    e = Evaluator(cfg)
    yield e
    e.close()


@pytest.fixture(scope="module")
def mat(ev):
    return ev.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random20k")


@pytest.fixture(scope="module")
def unit(ev):
    """The same kind of matrix with every value 1 (like the pattern-only SuiteSparse files)."""
    A = generate("random", 20_000, seed=4, nnz_per_row=12)
    A.data[:] = 1.0
    return ev.register(A, "random20k_unit")


@pytest.fixture(scope="module")
def long_rows(ev):
    """Row 0 with an entry in each of 10^6 columns, 12 entries in each other row (normal values)."""
    return ev.register(long_row_matrix(), "long_row_1M")


@pytest.fixture(scope="module")
def good(ev, mat):
    res = ev.evaluate(GOOD, mat, "spmv")
    assert res.ok, res.message
    return res


def test_good_kernel(good) -> None:
    res = good
    assert res.ok and res.correct and res.compiled, res.message
    assert res.error_kind is ErrorKind.NONE, f"timed in full (not stopped early) is what this test needs: {res.message}"
    assert set(res.timings) == {"cold", "warm"} and set(res.baseline) == {"cold", "warm"}
    assert res.speedup and res.speedup > 0 and 0 < res.roofline < 1.5
    assert res.max_scaled_error is not None and res.max_scaled_error <= 1.0
    assert res.checked_timed_outputs >= 7 + 2 * 3  # every cold run; the last and a random one per warm sample


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_kernel_gets_its_kind_and_pool_keeps_serving(ev, mat, unit, long_rows, good, name: str) -> None:
    text, kind = ADVERSARIAL[name]
    res = ev.evaluate(text, unit if name in VALUE_CASES else long_rows if name in LONG_ROW_CASES else mat, "spmv")
    assert res.error_kind.value == kind, (name, res.error_kind, res.message)
    if kind == "none":
        assert res.correct and res.speedup is not None, (name, res.message)
        if name not in OWN_SPEED:  # it cannot tell timed from checked runs: it computes, gains nothing
            t, t_good = res.timings["cold"].median_us, good.timings["cold"].median_us
            assert 0.67 < t / t_good < 1.5, (name, t, t_good)
    elif kind == "slow":  # verified, stopped after the early-stop runs, scored by what they measured
        assert res.correct and res.speedup is not None and set(res.timings) == {"cold"}
        assert res.timings["cold"].trials == ev.config.speed.early_stop_runs == res.checked_timed_outputs
        assert res.timings["cold"].median_us > ev.config.speed.early_stop * res.baseline["cold"].median_us
    else:
        assert not res.correct and res.speedup is None
    if name in ("computes_only_for_known_inputs", "skips_on_timed_input_grid", "half_work_on_timed_inputs",
                "writes_guard_when_timed", "slow_and_wrong_when_timed", "zeroes_x_when_timed"):
        # caught cold, the regime every learning loop times alone, not left to the warm regime after it
        # (zeroes_x_when_timed: warm's kept repetition caught it while cold compared the x the kernel left)
        assert res.message.startswith("timed run (cold"), (name, res.message)
    if name in ("writes_matrix_when_timed", "slow_and_writes_matrix_when_timed"):
        assert res.message.endswith("during timed runs"), (name, res.message)
    if name in VALUE_CASES or name == "writes_twin_matrix_only":
        assert "fresh values" in res.message, (name, res.message)
    if name == "leaves_out_the_tail_of_long_rows":  # signed inputs pass it; the twin's rows of one sign do not
        assert res.message.startswith("with the same pattern and fresh values, input 'non_negative'"), res.message
    if name == "mean_of_x_on_long_rows_when_timed":  # honest when verified; a timed run's statistical answer
        assert res.message.startswith("timed run (cold"), res.message
    after = ev.evaluate(GOOD, mat, "spmv")
    assert after.ok, (name, after.error_kind, after.message)


def test_the_honest_warp_kernel_passes_on_the_long_row(ev, long_rows) -> None:
    """The kernel ``leaves_out_the_tail_of_long_rows`` is made from, computing every term: correct and
    timed on the matrix with a row of 10^6 entries (so that case fails for the terms it leaves out, not
    for the matrix or the summation order). Every timed output checked."""
    from tests.harness.adversarial.tolerance import HONEST_WARP

    res = ev.evaluate(HONEST_WARP, long_rows, "spmv")
    assert res.ok and res.correct and res.speedup is not None, res.message
    assert res.max_scaled_error is not None and res.max_scaled_error < 0.5, res.max_scaled_error


def test_crash_and_hang_restart_the_worker(ev, mat) -> None:
    """A hang costs the limit scaled to cuSPARSE's time on the matrix (its floor, 2 s, on this small
    matrix), not the configured 3 s per launch."""
    before = ev.pool.restarts
    assert ev.evaluate(ADVERSARIAL["illegal_address"][0], mat, "spmv").error_kind is ErrorKind.CRASHED
    hang = ev.evaluate(ADVERSARIAL["infinite_loop"][0], mat, "spmv")
    assert hang.error_kind is ErrorKind.TIMEOUT and "verify phase within 2 s" in hang.message, hang.message
    assert ev.pool.restarts == before + 2
    assert ev.evaluate(GOOD, mat, "spmv").ok


def test_a_slow_first_launch_times_out_without_a_restart(ev, mat) -> None:
    """An honest kernel whose every launch takes most of a second, on a matrix whose verify limit is
    the floor: ``timeout`` after its first launch (the 10 others would overrun), with no kill and no
    restart, in well under the limit; the same kernel writing 2x the product is ``incorrect``. The
    job has the GPU whole (no trainer here), so the prediction compares with the granted floor
    (0.5 s) while the kill deadline keeps 2 s (``test_crash_and_hang_restart_the_worker``).
    Kills a worker that does not pass the limit to the verifier (killed after 2 s and restarted), a
    prediction made before the first launch is judged (the wrong one would be ``timeout``), and a
    prediction that ignores the grant."""
    from tests.harness.adversarial.early import SLOW_FIRST_LAUNCH, SLOW_FIRST_LAUNCH_WRONG

    before = ev.pool.restarts
    first = ev.evaluate(SLOW_FIRST_LAUNCH, mat, "spmv")  # compiles it too
    assert first.error_kind is ErrorKind.TIMEOUT and first.message.startswith("the first launch took "), first.message
    assert "10 remaining launches would run past the verify limit of 0.5 s" in first.message, first.message
    assert first.profile.counts["verify_predicted_timeouts"] == 1 and first.profile.counts["verify_launches"] == 1
    t0 = time.perf_counter()
    again = ev.evaluate(SLOW_FIRST_LAUNCH, mat, "spmv")  # compiled: the evaluation alone (not remembered)
    took = time.perf_counter() - t0
    assert again.error_kind is ErrorKind.TIMEOUT and took < 1.9, (took, again.message)
    wrong = ev.evaluate(SLOW_FIRST_LAUNCH_WRONG, mat, "spmv")
    assert wrong.error_kind is ErrorKind.INCORRECT and wrong.message.startswith("input "), wrong.message
    assert ev.pool.restarts == before
    assert ev.evaluate(GOOD, mat, "spmv").ok


def test_contender_jobs_stop_only_kernels_that_cannot_be_the_fastest(tmp_path) -> None:
    """The oracle's contender jobs: a hopeless but correct kernel stops after its first launch,
    ``timeout`` saying why, where an ordinary job verifies it and stops it early as ``slow``; a
    fast kernel gets its ordinary verdict. Verify floors of 6 s (the prediction's and the kill
    deadline's) keep the ordinary limits out of the way, even with another process on the GPU (the
    kernel's 11 launches take about 1.3 s alone; beside a pre-training run they passed 2 s and the
    ordinary job was killed, ``timeout``). Mutations killed: the flag never reaching the worker (``slow`` both times) and the
    contender limit applied to ordinary jobs (``timeout`` both times). The memo's side is a CPU test
    (tests/harness/test_speed.py)."""
    from sparserl.harness.speed import SpeedConfig
    from tests.harness.adversarial.early import NOT_A_CONTENDER

    with Evaluator(HarnessConfig(speed=SpeedConfig(limit_floor_s=6.0, limit_floor_granted_s=6.0), regimes=("cold",),
                                 cache_dir=str(tmp_path))) as e:
        m = e.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random20k")
        fast, stopped = e.evaluate_many([(GOOD, m, "spmv", None), (NOT_A_CONTENDER, m, "spmv", None)],
                                        contenders=True)
        assert fast.error_kind is ErrorKind.NONE, fast.message
        assert stopped.error_kind is ErrorKind.TIMEOUT and "not a contender" in stopped.message, stopped.message
        assert stopped.profile.counts["verify_launches"] == 1
        ordinary = e.evaluate(NOT_A_CONTENDER, m, "spmv")
        assert ordinary.error_kind is ErrorKind.SLOW and ordinary.correct, ordinary.message


def test_a_contender_floor_below_50_ms_stops_a_shorter_hopeless_kernel(tmp_path) -> None:
    """``SpeedConfig.contender_min_s`` reaches the verifier: a hopeless kernel whose first launch
    takes some 16 ms runs in full in a contender job at the default floor (50 ms) and stops after
    its first launch with a 5 ms floor; an ordinary job with that setting still verifies it (the
    floor is the contender limit's alone), and a fast kernel keeps its verdict. Mutations killed:
    the verifier ignoring ``limit.min_first_s`` (``slow`` with the 5 ms floor), and the lower floor
    applied to ordinary jobs."""
    from sparserl.harness.speed import SpeedConfig
    from tests.harness.adversarial.early import SHORT_NOT_A_CONTENDER

    for floor_s, expected in ((0.05, ErrorKind.SLOW), (0.005, ErrorKind.TIMEOUT)):
        with Evaluator(HarnessConfig(speed=SpeedConfig(limit_floor_granted_s=2.0, contender_min_s=floor_s),
                                     regimes=("cold",), memo=0, cache_dir=str(tmp_path))) as e:
            m = e.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random20k")
            fast, short = e.evaluate_many([(GOOD, m, "spmv", None), (SHORT_NOT_A_CONTENDER, m, "spmv", None)],
                                          contenders=True)
            assert fast.error_kind is ErrorKind.NONE, fast.message
            assert short.error_kind is expected, (floor_s, short.message)
            assert short.profile.counts["verify_launches"] == (1 if expected is ErrorKind.TIMEOUT else 11)
            ordinary = e.evaluate(SHORT_NOT_A_CONTENDER, m, "spmv")
            assert ordinary.error_kind is ErrorKind.SLOW and ordinary.correct, ordinary.message


def test_early_stop_against_the_best_known_and_the_profile(ev, mat, good) -> None:
    """Given a best known time far below it, an honest kernel stops early: slow, verified, its time
    measured over the early-stop runs and close to its full timing; the result carries the profile
    of its steps. Kills a worker that ignores the best known time, or reports slow before checking."""
    res = ev.evaluate(GOOD, mat, "spmv", best_us=good.timings["cold"].median_us / 10)
    assert res.error_kind is ErrorKind.SLOW and res.correct and res.speedup is not None, res.message
    assert res.timings["cold"].trials == ev.config.speed.early_stop_runs
    assert 0.67 < res.timings["cold"].median_us / good.timings["cold"].median_us < 1.5
    assert "over 3x the best known time" in res.message
    p = good.profile
    assert p is not None and p.counts["verify_launches"] == 11 and p.counts["cold_runs"] >= 7
    for step in ("compile", "verify_batch", "time_runs", "time_check"):
        assert step in p.seconds, (step, p.seconds)
    assert res.profile.counts["cold_runs"] == 5  # the slow one stopped there
    # the steps account for the evaluation's wall time (the first evaluation also waited for the pool)
    assert 0.5 * res.eval_seconds < res.profile.total_s < 1.5 * res.eval_seconds + 0.05


def test_a_far_write_is_not_blamed_on_later_jobs(ev, mat) -> None:
    """A kernel that scribbles far past y (out of the guard's sight) may damage another resident
    matrix; the worker checks a matrix against its pristine copy before each job's first launch
    and rebuilds it, so a correct kernel on either matrix afterwards is still judged correct."""
    other = ev.register(generate("banded", 30_000, seed=5), "banded30k")
    assert ev.evaluate(GOOD, other, "spmv").ok  # resident in the worker from now on
    ev.evaluate(FAR_WRITE, mat, "spmv")  # its own verdict depends on what lies past y
    for m in (other, mat):
        after = ev.evaluate(GOOD, m, "spmv")
        assert after.ok, (m.name, after.error_kind, after.message)


@pytest.mark.parametrize("fmt", ["CSR", "COO", "ELL", "SELL", "HYB"])
def test_library_spmv_and_spmm(ev, mat, fmt: str) -> None:
    for op, k in (("spmv", None), ("spmm", 8)):
        v = variants(op, fmt, k)[0]
        res = ev.evaluate(v.render(), mat, op, k)
        assert res.ok, (v.id, res.error_kind, res.message)


def test_format_refused_is_typed(ev, mat) -> None:
    v = variants("spmv", "DIA")[0]
    res = ev.evaluate(v.render(), mat, "spmv")
    assert res.error_kind is ErrorKind.FORMAT_REFUSED and "would store" in res.message


def test_baseline(ev, mat) -> None:
    out = ev.baseline(mat, "spmv")
    assert set(out["baselines"]) == {"cold", "warm"}
    assert all(b["median_us"] > 0 and 0 < b["roofline"] < 1.5 for b in out["baselines"].values())


def test_a_kernel_writing_the_shared_conversion_leaves_the_next_verdict_alone(ev, mat, caplog) -> None:
    """Every CSR kernel on a matrix runs on one shared conversion. Kernels that write into it (in every
    launch, or only when timed) are input_modified, and the conversion is restored word for word: an
    honest kernel evaluated before and after them gives bit-identical outputs (the same worst error
    over the same seeded inputs, on A and on the same fresh-valued twin), and the worker never had to
    rebuild the matrix. Kills a restore skipped after the timed runs, or one that restores only the
    array it counted first."""
    honest = variants("spmv", "CSR")[1].render()  # a thread per row: no atomics, one order of additions
    before = ev.evaluate(honest, mat, "spmv")
    assert before.ok and before.max_scaled_error is not None, before.message
    caplog.set_level("WARNING", logger="sparserl.harness.evaluator")
    for name in ("modifies_matrix", "writes_matrix_when_timed", "slow_and_writes_matrix_when_timed",
                 "writes_twin_matrix_only"):
        res = ev.evaluate(ADVERSARIAL[name][0], mat, "spmv")
        assert res.error_kind is ErrorKind.INPUT_MODIFIED, (name, res.error_kind, res.message)
        after = ev.evaluate(honest, mat, "spmv")
        assert after.ok and after.max_scaled_error == before.max_scaled_error, (name, after.message)
    assert "rebuilt the matrix" not in caplog.text


def test_no_kernel_is_compiled_inside_a_job(tmp_path, monkeypatch) -> None:
    """With an empty CuPy kernel cache, a worker compiles what it needs while it starts; jobs on matrices
    whose arrays have lengths it never saw (long rows, SELL slice pointers, DIA offsets, empty HYB
    spill), in every format, compile nothing more. CuPy's own reductions compile a kernel for each new
    power of two of an array's length under 2048 words, seconds each inside a job's time limit: this
    kills any of them creeping back into a job (the fingerprints, a CuPy comparison of arrays)."""
    cache = tmp_path / "cupy_kernels"
    monkeypatch.setenv("CUPY_CACHE_DIR", str(cache))  # the spawned worker reads it
    cfg = HarnessConfig(memo=0, cold_trials=11, warm_trials=3, cache_dir=str(tmp_path / "harness"))
    with Evaluator(cfg) as fresh:
        mats = [fresh.register(generate(f, rows, seed=2, **kw), f"{f}{rows}") for f, rows, kw in
                (("random", 8_000, {"nnz_per_row": 12}), ("random", 16_000, {"nnz_per_row": 12}),
                 ("dense_lines", 20_000, {}), ("banded", 30_000, {}))]
        assert fresh.pool.gpu  # started and warmed up
        compiled = sorted(p.name for p in cache.rglob("*") if p.is_file())
        assert compiled, "the worker's start-up compiles into the cache given"
        jobs = [(v.render(), "spmv", None) for v in (variants("spmv", f)[0] for f in FORMAT_NAMES)]
        jobs.append((variants("spmm", "CSR", 8)[0].render(), "spmm", 8))
        slowest, verified = [], 0
        for m in mats:
            for text, op, k in jobs:
                res = fresh.evaluate(text, m, op, k)
                assert res.error_kind not in (ErrorKind.INTERNAL, ErrorKind.CRASHED, ErrorKind.TIMEOUT), \
                    (m.name, res.error_kind, res.message)
                verified += res.ok
                if res.profile is not None:
                    slowest.append(max(((s, v) for s, v in res.profile.seconds.items()
                                        if s not in ("compile", "queue", "ipc")), key=lambda kv: kv[1]) + (m.name,))
        new = sorted(set(p.name for p in cache.rglob("*") if p.is_file()) - set(compiled))
        assert not new, (new, sorted(slowest, key=lambda t: -t[1])[:5])
        assert verified >= 2 * len(mats), f"only {verified} jobs ran to a verified kernel: too few to tell"


def test_the_caller_converts_a_new_format_ahead_of_the_worker(ev, mat) -> None:
    """A first use of a format on the batched path: the pattern is converted in the caller's threads
    (the profile's preconvert step) and the worker loads it (load_conversion) instead of converting,
    and the kernel is verified and timed as ever. Kills a job that loses the folder on its way to the
    worker, or a worker that converts anyway."""
    v = variants("spmv", "SELL")[-1]  # C=128, sigma=1024: no other test converts it
    res = ev.evaluate(v.render(), mat, "spmv")
    assert res.ok, (v.id, res.error_kind, res.message)
    seconds = res.profile.seconds
    assert "preconvert" in seconds and "load_conversion" in seconds and "convert" not in seconds, seconds
