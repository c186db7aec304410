"""The farm's GPU path on the CPU: GPU actors on logical GPUs of a real local Ray cluster, each
holding the pool's CPU stand-in worker (:mod:`tests.harness.fake_worker`) instead of a GPU worker.

Real compile tasks hand real jobs to the actors, as on a GPU cluster; only what the worker does
with a job is the stand-in's. Mutations these tests kill: the best time known not sent with the
job (the farm's searches then never stop a hopeless candidate early: ``best_us=None`` comes back),
``note_best`` missing from the farm's evaluator (the search's early stop silently off), the best
time read only at submit (a job that waited for a slot misses a best found meanwhile), a ``fresh`` job
given the best noted (a retimed pick stopped early after a few runs), a memo that
answers with a ``slow`` verdict the best time known now would not give, a job whose actor died
coming back as ``internal_error`` instead of being run again, and the rerun not counted.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from sparserl.harness.compile import find_nvcc
from sparserl.harness.evaluator import HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from tests.harness.fake_worker import fake_worker_main

pytestmark = [pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found"), pytest.mark.slow(seconds=18)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    """A head (no CPUs) and one worker node of two CPUs; each node declares two logical GPUs."""
    pytest.importorskip("ray", reason="the farm needs Ray: pip install -e '.[farm]'")
    from sparserl.farm.local_cluster import LocalCluster

    with pytest.MonkeyPatch.context() as env:  # the actors import the stand-in worker from tests/
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        c = LocalCluster.start(workers=1, cpus_per_worker=2, head_cpus=0, gpus=2,
                               cache=tmp_path_factory.mktemp("ray_gpu_cache"))
    with c:
        yield c


def _texts() -> list[str]:
    return [v.render() for v in variants("spmv", "CSR", None)[:3]]


def test_gpu_actors_run_the_jobs_with_the_best_time_known(gpu_cluster, tmp_path: Path) -> None:
    from sparserl.farm.ray_evaluator import RayEvaluator

    target = functools.partial(fake_worker_main, echo=True)
    with RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver"), memo=0), gpu_cluster.address,
                      worker_target=target) as ev:
        assert ev.has_gpu and len(ev.actors) == 4  # two logical GPUs on each of the two nodes
        ref = ev.register(generate("banded", 2000, seed=0, bands=5), "banded")
        first = ev.evaluate_many([(t, ref, "spmv", None) for t in _texts()])
        ev.note_best(ref, "spmv", None, 12.5)
        ev.note_best(ref, "spmv", None, 30.0)  # a slower note keeps the best
        noted = ev.evaluate_many([(t, ref, "spmv", None) for t in _texts()])
        given = ev.evaluate(_texts()[0], ref, "spmv", best_us=7.0)
        fresh = [ev.submit(_texts()[0], ref, "spmv", fresh=True).result(),
                 ev.submit(_texts()[0], ref, "spmv", best_us=20.0, fresh=True).result()]
        ev.release(ref.key)  # a farm's search of the matrix ended: its bytes leave the object store ...
        assert ref.key not in ev._blobs
        again = ev.submit(_texts()[1], ref, "spmv", fresh=True).result()  # ... and a later job puts them again
        assert again.error_kind is ErrorKind.NONE and ref.key in ev._blobs
        stats = ev.worker_stats()
    assert [r.message for r in fresh] == ["best_us=None", "best_us=20.0"], "a fresh job: the caller's best only"
    assert [r.error_kind for r in first + noted + [given]] == [ErrorKind.NONE] * 7
    assert [r.message for r in first] == ["best_us=None"] * 3
    assert [r.message for r in noted] == ["best_us=12.5"] * 3
    assert given.message == "best_us=7.0"  # the lower of the caller's and the noted
    assert sum(s["jobs"] for s in stats) == 10 and ev.reruns == 0


def test_a_job_waiting_for_its_gpu_takes_the_best_time_noted_meanwhile(gpu_cluster, tmp_path: Path) -> None:
    """One GPU actor (two slots), jobs of 2 s each: a third job, compiled once the two slots are
    taken, waits in the driver for a slot while a better time is noted, and leaves with it. Kills:
    the best time read only when the candidate was submitted (the third would say ``best_us=None``)."""
    import time

    from sparserl.farm.ray_evaluator import RayEvaluator

    target = functools.partial(fake_worker_main, echo=True, job_seconds=2.0)
    with RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver"), memo=0), gpu_cluster.address, gpus=1,
                      worker_target=target) as ev:
        ref = ev.register(generate("banded", 2000, seed=0, bands=5), "banded")
        first, second = _texts()[:2]

        def compiled(n: int) -> None:
            deadline = time.monotonic() + 120
            while sum(ev.compiles.values()) < n and time.monotonic() < deadline:
                time.sleep(0.02)

        futures = [ev.submit(first, ref, "spmv"), ev.submit(second, ref, "spmv")]
        compiled(2)  # both slots taken for 2 s each
        futures.append(ev.submit(first, ref, "spmv"))  # compiled already: ready for a GPU at once
        compiled(3)
        ev.note_best(ref, "spmv", None, 3.0)
        results = [f.result() for f in futures]
        assert len(ev.actors) == 1 and ev.worker_stats()[0]["jobs"] == 3
    assert results[2].message == "best_us=3.0"


def test_a_remembered_slow_verdict_answers_only_while_it_is_still_slow(gpu_cluster, tmp_path: Path) -> None:
    """The farm's memo (on): a kernel stopped early as ``slow`` (400 us; cuSPARSE 200 us) is
    remembered for a submission whose best time still stops it (50 us: over 3x), and evaluated
    again for one that no longer would (no best: 3x cuSPARSE is 600 us). Kills a memo that answers
    every repeat with the remembered ``slow``."""
    from sparserl.farm.ray_evaluator import RayEvaluator

    target = functools.partial(fake_worker_main, slow_us=(400.0, 200.0))
    with RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver"), memo=16), gpu_cluster.address, gpus=1,
                      worker_target=target) as ev:
        ref = ev.register(generate("banded", 2000, seed=0, bands=5), "banded")
        text = _texts()[0]
        kinds = [ev.evaluate(text, ref, "spmv", best_us=b).error_kind for b in (10.0, 50.0, None)]
        hits, jobs = ev.memo_hits, ev.worker_stats()[0]["jobs"]
    assert kinds == [ErrorKind.SLOW] * 3
    assert hits == 1 and jobs == 2


def test_a_job_still_running_is_shared_only_where_its_verdict_holds(gpu_cluster, tmp_path: Path) -> None:
    """A job sent with a low best time (10 us) comes back ``slow`` (400 us; cuSPARSE 200 us); a second
    submission of the same kernel while it runs, with no best (3x cuSPARSE: 600 us would not stop it), gets
    the kernel evaluated again instead of the first job's 5-run verdict; a third, with a best that still
    stops it (50 us), shares the running job. Kills: a running job shared with every later submission (one
    job for all three)."""
    from sparserl.farm.ray_evaluator import RayEvaluator

    target = functools.partial(fake_worker_main, slow_us=(400.0, 200.0), job_seconds=1.0)
    with RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver"), memo=16), gpu_cluster.address, gpus=1,
                      worker_target=target) as ev:
        ref = ev.register(generate("banded", 2000, seed=0, bands=5), "banded")
        text = _texts()[0]
        futures = [ev.submit(text, ref, "spmv", best_us=b) for b in (10.0, None, 50.0)]
        kinds = [f.result().error_kind for f in futures]
        jobs = ev.worker_stats()[0]["jobs"]
    assert kinds == [ErrorKind.SLOW] * 3 and jobs == 2


def test_a_gpu_actor_killed_mid_job_reruns_it_elsewhere(gpu_cluster, tmp_path: Path) -> None:
    from sparserl.farm.ray_evaluator import RayEvaluator

    flag = tmp_path / "killed"
    target = functools.partial(fake_worker_main, kill_parent_once=str(flag))
    with RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver"), memo=0), gpu_cluster.address,
                      worker_target=target) as ev:
        ref = ev.register(generate("banded", 2000, seed=0, bands=5), "banded")
        results = ev.evaluate_many([(t, ref, "spmv", None) for t in _texts() * 2])
        reruns, stats = ev.reruns, ev.worker_stats()
    assert flag.exists()  # an actor died under a job
    assert [r.error_kind for r in results] == [ErrorKind.NONE] * 6  # nothing lost to it
    assert reruns >= 1 and sum(s["lost"] for s in stats) == 1
    assert sum(s["jobs"] for s in stats) == 6
