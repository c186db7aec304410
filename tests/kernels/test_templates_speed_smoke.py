"""benchmarks/templates_speed.py runs end to end on a CPU in compile-only mode: it builds the
matrices, renders every library variant and template seed for each, and compiles them all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparserl.harness.compile import CompileOptions, available_backend
from tests.conftest import load_benchmark

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(available_backend(CompileOptions()) is None, reason="no CUDA compiler")


def test_templates_speed_compile_only(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}")
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "templates_speed.py"), "--rows", "2000",
                        "--only", "skewed_2k,block8_1k", "--compile-only", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    res = json.loads(out.read_text())
    assert res["compile_only"] and [r["matrix"] for r in res["matrices"]] == ["block8_1k", "skewed_2k"]
    for r in res["matrices"]:
        assert r["compile_failures"] == []
        assert r["unique_texts"] > 70 and r["candidates"] > r["unique_texts"]  # library points shared with seeds
    assert "0 failed" in p.stdout


def _load_script():
    return load_benchmark("templates_speed")


class _FakeEvaluator:
    """Stands in for the GPU evaluator: every kernel 'runs' in a time drawn from its text."""

    def register(self, A, name):
        return name

    def evaluate_many(self, items, contenders=False):
        import zlib

        from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming

        out = []
        for text, _, op, k in items:
            h = zlib.crc32(text.encode())
            t = lambda us, reg: KernelTiming(reg, us, us, us, 0.0)
            if h % 17 == 0:
                out.append(EvalResult.failure("spmv", None, "m", ErrorKind.INCORRECT, "wrong", compiled=True))
                continue
            us = 10.0 + h % 1000 / 10
            out.append(EvalResult(op="spmv", k=None, matrix="m", error_kind=ErrorKind.NONE, compiled=True,
                                  correct=True, timings={"cold": t(us, "cold"), "warm": t(us / 2, "warm")},
                                  baseline={"cold": t(60.0, "cold"), "warm": t(30.0, "warm")}, baseline_alg="alg"))
        return out


def test_templates_speed_bookkeeping_on_fake_timings(capsys) -> None:
    """The GPU path's tables, oracles and specialisation gains, on a fake evaluator (no GPU)."""
    from sparserl.matrices import generate

    mod = _load_script()
    rows = []
    for name, fam, A, core in mod.generated(2000, {"random16_2k", "banded9_4k", "skewed_2k"}):
        rows.append(mod.evaluate_matrix(_FakeEvaluator(), name, fam, A, "cold", False) | {"core": core})
    A = generate("block", 512, seed=1, block=8, blocks_per_row=4)
    rows.append(mod.evaluate_matrix(_FakeEvaluator(), "blocks", "suitesparse", A, "cold", False) | {"core": False})
    summary = mod.report(rows, "cold", "fake")
    text = capsys.readouterr().out
    assert "Gain of specialising" in text and "families_11" in summary and "suitesparse" in summary
    for r in rows:
        h = r["cold"]
        assert h["cusparse_us"] == 60.0
        assert h["with_templates"]["us"] <= h["library"]["us"] <= h["old_library"]["us"]
        assert h["with_templates"]["speedup"] == pytest.approx(60.0 / h["with_templates"]["us"])
        assert not h["old_library"]["id"].split("/")[1] in ("csr_adaptive", "csr_lanes")
        for name, g in h["specialisation"].items():
            if g is not None:
                assert g["gain"] == pytest.approx(g["generic_us"] / g["spec_us"])
                assert g["spec_id"].endswith("/spec") and name in g["spec_id"]
    by = {r["matrix"]: r["cold"]["specialisation"] for r in rows}
    assert by["banded9_4k"]["dia_window_spec"] is not None and by["skewed_2k"]["dia_window_spec"] is None
    assert by["random16_2k"]["csr_lanes_spec"] is not None and by["blocks"]["bsr_stream_spec"] is not None
    assert summary["irregular_targets"].keys() == {"random16_2k", "skewed_2k"}


def test_points_are_parsed_timed_beside_the_rest_and_kept_out_of_the_oracles(capsys) -> None:
    """``--points``: complete points only (kills accepting a missing, unknown or out-of-domain
    parameter), listed with kind ``point`` where the template's check accepts them (kills timing a
    refused point), printed, and never the oracle (kills a point counted into ``with_templates``)."""
    from sparserl.matrices import generate

    mod = _load_script()
    assert mod.parse_points(["coo_segmented:batches=2,block=512"]) == [("coo_segmented", {"batches": 2, "block": 512})]
    for bad in ("coo_segmented:batches=2", "coo_segmented:batches=2,block=512,tpr=4", "coo_segmented:batches=3,block=512",
                "no_such:batches=1", "coo_segmented:batches=x,block=512"):
        with pytest.raises(SystemExit, match="--points"):
            mod.parse_points([bad])
    points = mod.parse_points(["coo_segmented:batches=2,block=512", "csr_lanes_spec:" + ",".join(
        f"{p.name}={p.values[0]}" for p in mod.get_template("spmv", "csr_lanes_spec").space),
        "csr_adaptive:rpw=128,items=4,long_len=1024,seg=1024,block=128"])  # the generic of a specialised one
    A = generate("powerlaw", 3000, seed=1)
    from sparserl.matrices.card import matrix_card

    fast = {c["text"] for c in mod.candidates(matrix_card(A), points) if c["kind"] == "point"}
    row = mod.evaluate_matrix(_FastPointsEvaluator(fast), "pl", "suitesparse", A, "cold", False, points) | {"core": False}
    mine = [x for x in row["results"] if x["kind"] == "point"]
    assert [x["id"] for x in mine] == ["spmv/coo_segmented/-/batches=2,block=512",  # csr_lanes_spec: uniform rows
                                       "spmv/csr_adaptive/-/rpw=128,items=4,long_len=1024,seg=1024,block=128"]  # only
    assert all(x["ok"] and x["cold_us"] == 0.001 for x in mine)
    assert row["cold"]["with_templates"]["us"] > 0.001  # the fastest kernel of all, and not the oracle
    assert row["cold"]["best_template"]["us"] > 0.001  # nor the best template
    gains = row["cold"]["specialisation"]
    assert gains["csr_adaptive_spec"] is not None  # a gain is computed where the point's template is the generic
    assert all(g is None or g["spec_us"] > 0.001 and g["generic_us"] > 0.001
               for g in gains.values())  # nor a specialised or generic best
    summary = mod.report([row], "cold", "fake")
    assert all(summary["points_over_oracle"][x["id"]]["matrices"] == 1 for x in mine)
    assert "The --points" in capsys.readouterr().out


class _FastPointsEvaluator(_FakeEvaluator):
    """The fake evaluator, with the given texts correct and faster than anything else."""

    def __init__(self, fast: set[str]) -> None:
        self.fast = fast

    def evaluate_many(self, items, contenders=False):
        import dataclasses

        from sparserl.harness.result import ErrorKind, KernelTiming

        out = super().evaluate_many(items, contenders)
        fast = {reg: KernelTiming(reg, 0.001, 0.001, 0.001, 0.0) for reg in ("cold", "warm")}
        base = next(r for r in out if r.correct).baseline
        return [dataclasses.replace(r, error_kind=ErrorKind.NONE, correct=True, timings=fast, baseline=base)
                if text in self.fast else r for (text, *_), r in zip(items, out)]


class _ColdOnlyEvaluator(_FakeEvaluator):
    """As the harness does: only the regimes its config names are timed (here the cold one); with
    ``warm_baseline`` cuSPARSE still carries a warm time (so only the kernels lack one)."""

    def __init__(self, warm_baseline: bool = False) -> None:
        self.warm_baseline = warm_baseline

    def evaluate_many(self, items, contenders=False):
        out = super().evaluate_many(items, contenders)
        for r in out:
            r.timings.pop("warm", None)
            if r.baseline and not self.warm_baseline:
                r.baseline.pop("warm", None)
        return out


@pytest.mark.parametrize("warm_baseline", [False, True])
def test_a_harness_that_times_one_regime_gives_that_regime_alone(warm_baseline: bool) -> None:
    """Kills reading the warm regime's timing unconditionally, of cuSPARSE (the regime loop) or of a
    kernel (``_best``): a KeyError on the GPU, where the harness times only the regimes its config names."""
    from sparserl.matrices import generate

    mod = _load_script()
    A = generate("powerlaw", 2000, seed=1)
    row = mod.evaluate_matrix(_ColdOnlyEvaluator(warm_baseline), "pl", "suitesparse", A, "cold", False)
    assert "cold" in row and row["cold"]["with_templates"]["us"] > 0
    if warm_baseline:
        assert row["warm"]["with_templates"] is None and row["warm"]["library"] is None
    else:
        assert "warm" not in row
