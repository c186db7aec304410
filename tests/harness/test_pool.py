"""The worker pool's limits and restarts, with a CPU stand-in worker (no GPU needed)."""

from __future__ import annotations

import time

import pytest

from sparserl.harness.pool import PhaseLimits, WorkerPool
from tests.harness.fake_worker import fake_worker_main

LIMITS = PhaseLimits(prepare=5.0, verify=0.5, check=3.0, time=3.0, startup=60.0)


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool([0], {}, LIMITS, target=fake_worker_main)
    yield p
    p.close()


def test_normal_job(pool) -> None:
    out = pool.run("eval", {"steps": [["phase", "verify"], ["phase", "check"]]})
    assert out["error_kind"] == "none"


def test_hang_in_verify_is_killed_and_worker_replaced(pool) -> None:
    before, pid = pool.restarts, pool.workers[0].info["pid"]
    t0 = time.monotonic()
    out = pool.run("eval", {"steps": [["phase", "verify"], ["sleep", 30]]})
    assert out["error_kind"] == "timeout" and "verify" in out["message"]
    assert time.monotonic() - t0 < 10
    assert pool.restarts == before + 1 and pool.workers[0].info["pid"] != pid
    assert pool.run("eval", {"steps": []})["error_kind"] == "none"


def test_slow_harness_checks_are_not_a_hang(pool) -> None:
    """Time spent in the 'check' phase (the harness's own work) gets the check limit."""
    before = pool.restarts
    out = pool.run("eval", {"steps": [["phase", "verify"], ["phase", "check"], ["sleep", 1.5],
                                      ["phase", "verify"], ["phase", "check"]]})
    assert out["error_kind"] == "none" and pool.restarts == before


def test_each_phase_gets_a_fresh_deadline(pool) -> None:
    steps = [["phase", "verify"], ["sleep", 0.3], ["phase", "check"], ["phase", "verify"], ["sleep", 0.3]]
    assert pool.run("eval", {"steps": steps})["error_kind"] == "none"


def test_death_and_fatal_are_crashes(pool) -> None:
    before = pool.restarts
    out = pool.run("eval", {"steps": [["phase", "verify"], ["exit", 9]]})
    assert out["error_kind"] == "crashed" and "died" in out["message"]
    out = pool.run("eval", {"steps": [["phase", "verify"], ["fatal"]]})
    assert out["error_kind"] == "crashed" and out["message"] == "poisoned context"
    assert pool.restarts == before + 2
    assert pool.run("eval", {"steps": []})["error_kind"] == "none"


def test_submit_is_asynchronous_and_loses_nothing(pool) -> None:
    jobs = [{"steps": [["phase", "verify"], ["sleep", 5]]} if i % 5 == 0 else {"steps": []} for i in range(15)]
    futures = [pool.submit("eval", j) for j in jobs]
    kinds = [f.result()["error_kind"] for f in futures]
    assert kinds.count("timeout") == 3 and kinds.count("none") == 12


def _locked_at(p: WorkerPool, job: dict, at: list[float]) -> tuple[list[bool], dict]:
    """Whether GPU 0's lease is held at each of the times ``at`` (seconds after ``job`` is sent)."""
    t0 = time.monotonic()
    fut = p.submit("eval", job)
    seen = []
    for t in at:
        time.sleep(max(0.0, t0 + t - time.monotonic()))
        seen.append(p.gpu_locks[0].locked())
    return seen, fut.result(timeout=30)


def test_a_gpu_nobody_else_uses_is_leased_for_each_whole_job() -> None:
    """No trainer has asked for the lease: the pool takes it before sending a job and keeps it to
    the job's end, whatever the worker announces meanwhile (the worker then times with no round
    trip). Kills: the lease not taken for the job (free at 0.15 s), given back at the worker's
    next phase message as an asked-for lease is (free at 0.45 s and 0.75 s), or kept after it."""
    p = WorkerPool([0], {}, LIMITS, target=fake_worker_main)
    try:
        job = {"steps": [["phase", "verify"], ["sleep", 0.3], ["phase", "time"], ["lease"], ["sleep", 0.3],
                         ["phase", "check"], ["sleep", 0.3]]}
        seen, out = _locked_at(p, job, [0.15, 0.45, 0.75])
        assert out["error_kind"] == "none" and seen == [True, True, True]
        assert not p.gpu_locks[0].locked()
        out = p.run("eval", {"steps": [["phase", "verify"], ["sleep", 30]]})  # killed holding it: given back
        assert out["error_kind"] == "timeout" and not p.gpu_locks[0].locked()
    finally:
        p.close()


def test_a_lease_wanted_during_a_granted_job_waits_for_its_end_and_later_jobs_ask() -> None:
    """The trainer's first lease, taken while a job runs with the whole-job lease, waits for that
    job's end (never overlaps its timing); from then on jobs hold the lease only to time. Kills:
    ``gpu_lease`` not marking the GPU shared (the later job holds the lease while it verifies)."""
    p = WorkerPool([0], {}, LIMITS, target=fake_worker_main)
    try:
        fut = p.submit("eval", {"steps": [["phase", "time"], ["lease"], ["sleep", 0.6]]})
        time.sleep(0.1)
        t = time.monotonic()
        with p.gpu_lease(0):
            waited = time.monotonic() - t
            assert fut.done(), "the trainer took the GPU while a job was timing"
        assert waited > 0.3 and fut.result()["error_kind"] == "none"
        seen, out = _locked_at(p, {"steps": [["phase", "verify"], ["sleep", 0.4], ["phase", "time"], ["lease"],
                                             ["sleep", 0.4], ["phase", "check"]]}, [0.2, 0.6])
        assert out["error_kind"] == "none" and seen == [False, True]
    finally:
        p.close()


def test_a_job_run_again_after_a_machine_fault_holds_the_whole_job_lease_again(tmp_path) -> None:
    """A granted job whose worker dies in a harness phase runs again on a fresh worker, granted
    again, even when a trainer appeared between the two attempts (the job still says it is granted,
    so the pool must hold the lease for it). Kills: the lease taken for the first attempt only, or
    the grant decided again per attempt while the job sent keeps saying granted."""
    p = WorkerPool([0], {}, LIMITS, target=fake_worker_main)
    try:
        job = {"steps": [["phase", "prepare"], ["sleep", 0.6], ["exit_once", str(tmp_path / "once"), 9],
                         ["phase", "time"], ["lease"], ["sleep", 2.0]]}  # dies after the trainer's arrival
        fut = p.submit("eval", job)
        time.sleep(0.3)
        p.gpu_lease(0)  # the trainer's first lease is asked for now (taken only once the job ends)
        deadline = time.monotonic() + 20
        while p.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.8)
        assert p.gpu_locks[0].locked(), "the job's second attempt timed without the GPU's lease"
        assert fut.result(timeout=30)["error_kind"] == "none" and p.restarts == 1
        assert not p.gpu_locks[0].locked()
    finally:
        p.close()


def test_timing_waits_for_the_gpu_lease(pool) -> None:
    """While the trainer holds the GPU's lease a job that wants to time waits, without being
    charged for the wait; the lease comes back once the job moves on."""
    job = {"steps": [["phase", "verify"], ["phase", "time"], ["lease"], ["sleep", 0.2]]}
    with pool.gpu_lease(0):
        fut = pool.submit("eval", job)
        time.sleep(4.0)  # longer than the 'time' phase's limit: waiting for the lease is not timing
        assert not fut.done(), "the job timed while the GPU was leased to someone else"
    out = fut.result(timeout=10)
    assert out["error_kind"] == "none"
    assert pool.gpu_locks[0].acquire(timeout=1.0), "the lease was not given back"
    pool.gpu_locks[0].release()


def test_a_worker_that_dies_holding_the_lease_gives_it_back(pool) -> None:
    out = pool.run("eval", {"steps": [["phase", "time"], ["lease"], ["exit", 9]]})
    assert out["error_kind"] == "crashed"
    out = pool.run("eval", {"steps": [["phase", "time"], ["lease"], ["sleep", 30]]})
    assert out["error_kind"] == "timeout"
    assert pool.gpu_locks[0].acquire(timeout=1.0), "a dead worker kept the GPU's lease"
    pool.gpu_locks[0].release()
    assert pool.gpu_lease(7) is not None  # a GPU the pool does not use: a no-op context
    with pool.gpu_lease(7):
        pass


def test_repeated_lease_requests_do_not_extend_the_time_limit(pool) -> None:
    """Only time spent *waiting* for the lease is forgiven; asking again while holding it is not."""
    out = pool.run("eval", {"steps": [["phase", "time"], ["lease"], ["sleep", 2.0], ["lease"], ["sleep", 2.0]]})
    assert out["error_kind"] == "timeout", out  # 4 s of work against the 3 s time limit


def test_a_restarted_worker_warms_up_under_the_lease(pool) -> None:
    """Warm-up times kernels, so a (re)starting worker takes the lease: while it is held elsewhere,
    the restart waits."""
    import threading

    w = pool.workers[0]
    with pool.gpu_lease(0):
        t = threading.Thread(target=w.restart)
        t.start()
        t.join(timeout=2.0)
        assert t.is_alive(), "the worker restarted while the GPU was leased to someone else"
    t.join(timeout=60)
    assert not t.is_alive() and pool.run("eval", {"steps": []})["error_kind"] == "none"


def test_a_death_in_a_harness_phase_is_the_machines_fault_not_the_kernels(pool) -> None:
    """Kills the mutation that scored a worker dying in prepare or check (no candidate running)
    as the kernel's crash: such a job is run again on a fresh worker, and a second death comes
    back as internal_error (which rewards leave out), never as crashed."""
    from sparserl.harness.result import ErrorKind, EvalResult
    from sparserl.rewards import infrastructure_failure

    for phase, steps in (("prepare", [["exit", 9]]),  # the worker's first phase, before it names one
                         ("prepare", [["phase", "prepare"], ["fatal"]]),
                         ("check", [["phase", "verify"], ["phase", "check"], ["exit", 9]])):
        before = pool.restarts
        out = pool.run("eval", {"steps": steps})
        assert out["error_kind"] == "internal_error", (steps, out)
        assert f"in the {phase} phase" in out["message"], out
        assert pool.restarts == before + 2, "run once more on a fresh worker before giving up"
        assert infrastructure_failure(EvalResult.failure("spmv", None, "m", ErrorKind(out["error_kind"]), out["message"]))
    assert pool.run("eval", {"steps": []})["error_kind"] == "none"


def test_a_transient_death_in_prepare_is_retried_and_the_kernel_judged(pool, tmp_path) -> None:
    marker = str(tmp_path / "died-once")
    before = pool.restarts
    out = pool.run("eval", {"steps": [["phase", "prepare"], ["exit_once", marker, 9], ["phase", "verify"]]})
    assert out["error_kind"] == "none" and pool.restarts == before + 1


def test_a_worker_that_cannot_start_again_is_an_internal_error(tmp_path) -> None:
    """A kernel's crash keeps its verdict though no new worker starts; the jobs after it come back
    as internal_error (startup) instead of raising, and the pool serves again once workers start."""
    flag = tmp_path / "no-start"
    p = WorkerPool([0], {"no_start": str(flag)}, LIMITS, target=fake_worker_main)
    try:
        flag.touch()
        out = p.run("eval", {"steps": [["phase", "verify"], ["exit", 9]]})
        assert out["error_kind"] == "crashed"
        out = p.run("eval", {"steps": []})
        assert out["error_kind"] == "internal_error" and "startup" in out["message"]
        flag.unlink()
        assert p.run("eval", {"steps": []})["error_kind"] == "none"
    finally:
        p.close()


def test_a_scaled_limit_applies_but_never_beyond_the_configured_one(pool) -> None:
    """The batched worker asks for a limit scaled to the matrix: a tighter one is used (a hang costs
    that long, not the configured limit); a looser one is capped by the configured limit, which for
    ``verify`` is per launch of the candidate. Kills a pool that ignores the ask, or lets it win."""
    out = pool.run("eval", {"steps": [["phase", "verify", 1, 0.2], ["sleep", 1.0]]})
    assert out["error_kind"] == "timeout" and "within 0.2 s" in out["message"], out
    out = pool.run("eval", {"steps": [["phase", "verify", 1, 30.0], ["sleep", 1.5]]})
    assert out["error_kind"] == "timeout" and "within 0.5 s" in out["message"], out
    out = pool.run("eval", {"steps": [["phase", "verify", 4, None], ["sleep", 1.2], ["phase", "check"]]})
    assert out["error_kind"] == "none", out  # four launches: 4 x 0.5 s
