"""The driver's GPU slots (farm/ray_evaluator.GpuSlots): two jobs in flight per GPU actor, a lost
actor's slots never coming back twice, busy time of overlapping jobs counted once. No Ray needed."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

from sparserl.farm.ray_evaluator import SLOTS_PER_GPU, GpuSlots, RayEvaluator, _Actor, farm_steps


def live_slots(slots: GpuSlots, a: _Actor) -> int:
    return sum(1 for x, g in list(slots._queue.queue) if x is a and g == a.gen)


def test_each_actor_gets_its_slots_and_takes_them_in_turn() -> None:
    """Kills one slot per actor (the GPU idle for the driver's round trip again)."""
    assert SLOTS_PER_GPU >= 2
    slots = GpuSlots()
    a, b = _Actor(object(), "a"), _Actor(object(), "b")
    slots.free(a)
    slots.free(b)
    taken = [slots.take([a, b]) for _ in range(2 * SLOTS_PER_GPU)]
    assert sorted(x.name for x, _ in taken) == ["a"] * SLOTS_PER_GPU + ["b"] * SLOTS_PER_GPU
    a.alive = b.alive = False
    assert slots.take([a, b], wait_s=0.01) is None


def test_a_lost_actor_comes_back_with_exactly_its_slots() -> None:
    """Kills a loss counted once per failed job, and stale slots (handed out before the loss)
    coming back as extra ones: after the restart the actor would hold more jobs than its slots."""
    slots = GpuSlots(per_actor=2)
    a = _Actor(object(), "a")
    slots.free(a)
    s1, s2 = slots.take([a]), slots.take([a])
    assert slots.lost(a, s1[1]) is True and slots.lost(a, s2[1]) is False
    assert a.lost == 1 and not a.alive and a.checking
    slots.done(a, s2[1], 0.0, 1.0)  # a job of the old generation that came back after all
    a.alive, a.checking = True, False  # Ray restarted it
    slots.free(a)
    assert live_slots(slots, a) == 2
    got = [slots.take([a], wait_s=0.01) for _ in range(2)]
    assert all(g == a.gen == 1 for _, g in got)
    a.alive = False
    assert slots.take([a], wait_s=0.01) is None  # the stale slot was dropped, not handed out


def test_busy_time_counts_overlapping_jobs_once() -> None:
    """Kills adding each job's whole round trip (two overlapping slots would count the GPU busy
    twice over, and the farm's per-GPU rate would read half)."""
    slots = GpuSlots(per_actor=2)
    a = _Actor(object(), "a")
    slots.free(a)
    (_, g1), (_, g2) = slots.take([a]), slots.take([a])
    slots.done(a, g1, 0.0, 10.0)
    slots.done(a, g2, 5.0, 12.0)  # waited in the actor's queue from 5 to 10
    assert a.jobs == 2 and a.busy_s == 12.0
    slots.done(a, g1, 20.0, 21.0)
    assert a.busy_s == 13.0


def test_farm_steps_split_the_round_trip() -> None:
    """Kills counting the harness worker's own call (or its queue) as the farm's cost."""
    steps = farm_steps(10.0, 10.5, 11.0, {"call_seconds": 0.3, "queue_seconds": 0.1, "actor_seconds": 0.45})
    assert steps == {"farm_slot_wait": 0.5, "farm_actor_own": pytest.approx(0.05),
                     "farm_actor_wait": pytest.approx(0.05)}
    assert farm_steps(1.0, 1.0, 1.2, {"call_seconds": 0.5})["farm_actor_wait"] == 0.0


def test_a_job_with_no_gpu_actor_left_fails_in_one_result() -> None:
    """When every GPU actor is gone, the job comes back ``internal_error`` with the compile task's
    steps as its profile (kills passing those steps to EvalResult as a field: a TypeError in the
    driver's thread, and a future that never resolves, so the farm would hang)."""
    pytest.importorskip("ray", reason="the farm needs Ray: pip install -e '.[farm]'")
    from sparserl.harness.evaluator import MatrixRef
    from sparserl.harness.result import ErrorKind
    from sparserl.kernels.contract import Op

    ev = object.__new__(RayEvaluator)
    ev.actors, ev._slots = [], GpuSlots()
    out: Future = Future()
    ev._run_on_gpu({}, {"front": {"compile": 0.25}, "smem_bytes": 0}, b"", MatrixRef("k", "p", "m", (4, 4), 4),
                   Op.SPMV, None, time.perf_counter(), out, time.perf_counter())
    r = out.result(timeout=10)
    assert r.error_kind is ErrorKind.INTERNAL and "no GPU actor" in r.message
    assert r.profile.seconds == {"compile": 0.25}


def test_a_cluster_of_several_gpu_models_keeps_the_largest_group() -> None:
    """A search ranks candidates by time and stops hopeless ones against its best time, so its actors must share
    a GPU model: the largest group is kept (a tie goes to the name first in order), with a warning naming them all.
    Kills: every actor kept on a mixed cluster, the smaller group kept, a warning on a cluster of one model."""
    from sparserl.farm.ray_evaluator import one_gpu_model

    assert one_gpu_model(["H200", "H200"]) == ({0, 1}, None)
    keep, note = one_gpu_model(["H100", "H200", "H200", "H100", "H200"])
    assert keep == {1, 2, 4} and "several models (H100 x2, H200 x3)" in note and "the 3 H200 actors only" in note
    assert one_gpu_model(["H200", "H100"])[0] == {1} and one_gpu_model([None, "A100", None])[0] == {0, 2}
