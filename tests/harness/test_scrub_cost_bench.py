"""benchmarks/scrub_cost.py on a CPU: its summary (medians, ratios, the geometric mean over honest kernels
only) and its kernels (one library variant per strategy, the cheat and its control, each statically legal).
Kills a mean over every row (cuSPARSE and the cheat counted as honest kernels), a ratio the wrong way up, a
mean instead of a median, a row missing one side counted."""

from __future__ import annotations

import pytest

from sparserl.harness.static_check import static_check
from sparserl.kernels.contract import Op, split_completion
from tests.conftest import load_benchmark


def test_summary() -> None:
    s = load_benchmark("scrub_cost").summarize([
        {"matrix": "a", "kernel": "k1", "scrub_us": [2.0, 1.0, 9.0], "plain_us": [1.0, 1.0, 1.0]},
        {"matrix": "a", "kernel": "k2", "scrub_us": [3.0], "plain_us": [6.0]},
        {"matrix": "a", "kernel": "cusparse", "scrub_us": [4.0], "plain_us": [2.0]},
        {"matrix": "a", "kernel": "cheat", "adversarial": True, "scrub_us": [10.0], "plain_us": [1.0]},
        {"matrix": "a", "kernel": "k3", "scrub_us": [1.0], "plain_us": []},
    ])
    ratios = {r["kernel"]: r["ratio"] for r in s["rows"]}
    assert ratios == {"k1": 2.0, "k2": 0.5, "cusparse": 2.0, "cheat": 10.0, "k3": None}
    assert s["honest_geomean"] == pytest.approx(1.0) and s["honest_range"] == [0.5, 2.0]
    assert s["cusparse_geomean"] == pytest.approx(2.0)


def test_kernels_are_one_per_strategy_and_legal() -> None:
    mod = load_benchmark("scrub_cost")
    texts = mod.kernels()
    strategies = [k.split("/")[1] for k in texts if k.startswith("spmv/")]
    assert sorted(strategies) == sorted(mod.STRATEGIES)
    assert {"cheat", "cheat_control"} <= set(texts) and texts["cheat"] != texts["cheat_control"]
    for name, text in texts.items():
        header, code = split_completion(text, Op.SPMV)
        assert static_check(code, header, Op.SPMV) is None, name
