"""The farm on the GPUs present (a local Ray instance holding every visible GPU): verdicts and
times as the in-process evaluator gives them, one actor per GPU, the farm command verifying and
storing kernels. Needs a GPU, CuPy and Ray (skipped without any of them)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="the farm needs Ray: pip install -e '.[farm]'")
    from sparserl.devices import visible_gpus

    ray.init(num_gpus=len(visible_gpus()), logging_level=logging.WARNING, include_dashboard=False)
    yield len(visible_gpus())
    ray.shutdown()


def test_the_farm_verifies_and_times_like_the_in_process_evaluator(local_ray, tmp_path: Path) -> None:
    from sparserl.farm.ray_evaluator import RayEvaluator

    A = generate("banded", 200_000, seed=0, bands=9)
    good = [v.render() for v in variants("spmv", "CSR", None)[:2]]
    wrong = good[0].replace("y[row] = sum;", "y[row] = 2.0f * sum;")
    assert wrong != good[0]
    cfg = HarnessConfig(regimes=("cold",), memo=0, cache_dir=str(tmp_path))
    with RayEvaluator(cfg, "auto") as ev:
        assert ev.has_gpu and len(ev.worker_stats()) == local_ray
        ref = ev.register(A, "banded")
        farm = ev.evaluate_many([(t, ref, "spmv", None) for t in good + [wrong]])
        assert sum(w["jobs"] for w in ev.worker_stats()) == 3
        assert set(ev.health()) <= {w["name"] for w in ev.worker_stats()}
    with Evaluator(cfg) as local:
        here = local.evaluate_many([(t, local.register(A, "banded"), "spmv", None) for t in good + [wrong]])
    assert [r.error_kind for r in farm] == [r.error_kind for r in here]
    assert farm[0].ok and farm[0].host and farm[0].arch == here[0].arch
    assert farm[2].error_kind is ErrorKind.INCORRECT
    for f, h in zip(farm[:2], here[:2]):  # same GPU model, same timing rules: within 25%
        assert f.timings["cold"].median_us == pytest.approx(h.timings["cold"].median_us, rel=0.25)


def test_farm_command_on_the_gpus(cli, local_ray, tmp_path: Path, monkeypatch) -> None:
    import ray

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "m"
    d.mkdir()
    save_matrix(generate("banded", 100_000, seed=0, bands=7), d / "banded.mtx")
    save_matrix(generate("random", 80_000, seed=1, nnz_per_row=8), d / "random.mtx")
    address = ray.get_runtime_context().gcs_address
    res = cli("farm", d, "--ray", address, "--budget", "12", "--store", tmp_path / "s.db", "--out", tmp_path / "f")
    assert res.rc == 0, res.err[-2000:]
    s = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert s["timed"] and all(r["status"] == "done" and r["speedup"] for r in s["matrices"])
    from sparserl.search.store import BestStore

    with BestStore(tmp_path / "s.db") as st:
        assert len(st.best()) == 2 and st.counts()["results"] >= 2
