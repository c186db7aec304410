"""The farm on a real local Ray cluster (a head and two worker nodes, compile-only: no GPU).

Candidates compile as CPU tasks on the worker nodes and come back with the verdicts the
in-process evaluator gives; ``sparserl farm --ray`` tunes a folder and says once that the
cluster has no GPU; a worker node killed while the farm runs loses no result and the farm
finishes. The cluster is shared by the session (``ray_cluster``); the node-killing test runs last.

Mutations these tests kill: compile tasks without retries (the killed node's candidates come back
as internal errors), the matrix shipped to a node without saving it there (host plans fail), the
compile-only note logged per matrix instead of once, the GPU path taken on a cluster without GPUs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from sparserl.harness.compile import find_nvcc
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.library import variants
from sparserl.matrices import load_matrix
from sparserl.search.loop import SearchConfig

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


def _verdicts(results) -> list[tuple]:
    return [(r.error_kind.value, r.format, r.compiled, r.message.split(":")[0]) for r in results]


@pytest.mark.slow(seconds=30)
def test_compile_tasks_on_the_cluster_match_the_in_process_evaluator(ray_cluster, farm_matrices: Path,
                                                                     tmp_path: Path, caplog) -> None:
    from sparserl.farm.ray_evaluator import NO_GPU_NOTE, RayEvaluator
    from sparserl.harness.interface import KernelEvaluator

    A = load_matrix(str(farm_matrices / "banded.mtx"))
    texts = [v.render() for v in variants("spmv", "CSR", None)[:3]] + \
            [v.render() for v in variants("spmv", "ELL", None)[:2]] + \
            [variants("spmv", "CSR", None)[0].render().replace("__global__", "__global__ int x = ;"), "no kernel here"]
    with caplog.at_level(logging.WARNING):
        with RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver")), ray_cluster.address) as ev:
            assert isinstance(ev, KernelEvaluator) and not ev.has_gpu and ev.cpus == 2 and len(ev.nodes) == 3
            ref = ev.register(A, "banded")
            farm = ev.evaluate_many([(t, ref, "spmv", None) for t in texts])
            assert sum(ev.compiles.values()) == len(texts)
    assert caplog.text.count(NO_GPU_NOTE) == 1
    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path / "local"))) as local:
        here = local.evaluate_many([(t, local.register(A, "banded"), "spmv", None) for t in texts])
    assert _verdicts(farm) == _verdicts(here)
    kinds = [r.error_kind for r in farm]
    assert kinds[:5] == [ErrorKind.NO_GPU] * 5 and ErrorKind.NO_GPU not in kinds[5:]  # the broken two fail
    assert all(r.host for r in farm[:5])


def test_farm_command_on_the_cluster(cli, ray_cluster, farm_matrices: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    res = cli("farm", farm_matrices, "--ray", ray_cluster.address, "--budget", "4", "--store", tmp_path / "s.db",
              "--out", tmp_path / "farm")
    assert res.rc == 0, res.err[-2000:]
    assert "3 done, 1 unreadable; compile-only, nothing timed" in res.out
    s = json.loads((tmp_path / "farm" / "summary.json").read_text())
    assert sum(s["farm"]["compiles"].values()) == 12 and s["farm"]["candidates"] == 12


@pytest.mark.slow(seconds=24)
def test_a_worker_node_killed_mid_farm_loses_nothing(ray_cluster, farm_matrices: Path, tmp_path: Path) -> None:
    """Kills one of the two worker nodes (its whole process tree) while compile tasks run on it."""
    from sparserl.farm.ray_evaluator import RayEvaluator
    from sparserl.farm.run import FarmConfig, run_farm

    budget = 12
    mats = tuple(str(farm_matrices / f) for f in ("banded.mtx", "random.mtx", "powerlaw.mtx"))
    cfg = FarmConfig(matrices=mats, out=str(tmp_path / "farm"), store=str(tmp_path / "s.db"),
                     search=SearchConfig(budget=budget, parallel=2), at_once=2, progress=False)
    ev = RayEvaluator(HarnessConfig(cache_dir=str(tmp_path / "driver"), memo=0), ray_cluster.address)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(summary=run_farm(cfg, evaluator=ev)))
    t.start()
    deadline = time.monotonic() + 180
    while sum(ev.compiles.values()) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = ray_cluster.nodes[1]
    ray_cluster.kill(victim)
    killed_after = sum(ev.compiles.values())
    t.join(600)
    assert not t.is_alive()
    assert ev._blobs == {}, "each matrix's bytes leave the object store when its search ends"
    ev.close()
    assert killed_after < 3 * budget  # the node died while the farm still had work
    rows = out["summary"]["matrices"]
    assert [r["status"] for r in rows] == ["done"] * 3 and all(r["evaluated"] == budget for r in rows)
    traces = [json.loads(x) for n in ("banded", "random", "powerlaw")
              for x in (tmp_path / "farm" / n / "trace.jsonl").read_text().splitlines()]
    assert len(traces) == 3 * budget
    assert not [x for x in traces if x["verdict"] == ErrorKind.INTERNAL.value]  # 0 results lost to the death
    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path / "local"), memo=0)) as local:
        refs = {n: local.register(load_matrix(str(farm_matrices / f"{n}.mtx")), n)
                for n in ("banded", "random", "powerlaw")}
        names = [n for n in ("banded", "random", "powerlaw") for _ in range(budget)]
        again = local.evaluate_many([(x["text"], refs[n], "spmv", None) for x, n in zip(traces, names)])
    assert [x["verdict"] for x in traces] == [r.error_kind.value for r in again]  # the same verdicts


def test_the_probe_sees_that_the_cluster_wants_a_token(ray_cluster) -> None:
    """The real probe against the session's cluster, which wants a token (kills a probe that never
    says True: the farm would then join without its token and be refused)."""
    import subprocess
    import sys

    from sparserl.farm.auth import cluster_wants_token

    env = {k: v for k, v in ray_cluster.env.items() if k != "RAY_AUTH_MODE"}  # a fresh driver's view
    code = f"from sparserl.farm.auth import cluster_wants_token as w; print(w({ray_cluster.address!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-800:]
    assert cluster_wants_token("auto") is None and cluster_wants_token(f"ray://{ray_cluster.address}") is None
