"""benchmarks/rl_harness_share.py: its pure figures, and both runs end to end compile-only on the CPU."""

from __future__ import annotations

import json

import pytest

from sparserl.harness.compile import find_nvcc
from tests.conftest import NEEDS_NVCC, load_benchmark
from tests.improve.data_folder import write_data_folder

bench = load_benchmark("rl_harness_share")


def test_the_share_leaves_the_first_step_out_and_divides_by_the_whole_step() -> None:
    """Mutations killed: the first step (compiles, first conversions) averaged in, the share taken
    over the harness's wait plus generation only, and a run of one step reported as empty."""
    step = lambda g, h: {"time/generate": g, "time/forward": 1.0, "time/harness_wait": h, "time/update": 1.0}  # noqa: E731
    s = bench.share([step(10.0, 50.0), step(2.0, 6.0), step(4.0, 8.0)])
    assert s["steps"] == 2 and s["harness_wait_s"] == 7.0 and s["step_s"] == pytest.approx(3 + 1 + 7 + 1)
    assert s["harness_share"] == pytest.approx(7 / 12)
    assert bench.share([step(1.0, 1.0)])["steps"] == 1 and bench.share([]) == {"steps": 0}


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_both_harnesses_run_and_the_json_holds_every_step(tmp_path, tiny_model_dir) -> None:
    data = write_data_folder(tmp_path / "data", {"train": (("banded", 0, 300), ("random", 1, 300))})
    out = tmp_path / "share.json"
    assert bench.main(["--model", str(tiny_model_dir), "--data", str(data), "--steps", "2", "--matrices-per-step", "2",
                       "--samples-per-matrix", "2", "--max-new-tokens", "8", "--compile-only", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["runs"]) == {"batched", "sequential"}
    assert all(len(run["per_step"]) == 2 and run["steps"] == 1 for run in r["runs"].values())
