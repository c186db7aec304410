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


def test_cheat_over_control_pairs_each_matrix_cheat_with_its_own_control() -> None:
    """The cheat's median over its control's on the same matrix, each side with and without the scrub. Kills the
    ratio the wrong way up, a control taken from another matrix, the two sides swapped."""
    mod = load_benchmark("scrub_cost")
    s = mod.summarize([
        {"matrix": "a", "kernel": "cheat", "adversarial": True, "scrub_us": [10.0], "plain_us": [4.0]},
        {"matrix": "a", "kernel": "cheat_control", "adversarial": True, "scrub_us": [10.0], "plain_us": [8.0]},
        {"matrix": "b", "kernel": "cheat", "adversarial": True, "scrub_us": [3.0], "plain_us": [3.0]},
        {"matrix": "b", "kernel": "cheat_control", "adversarial": True, "scrub_us": [2.0], "plain_us": [6.0]},
        {"matrix": "c", "kernel": "cheat", "adversarial": True, "scrub_us": [1.0], "plain_us": [1.0]},
    ])
    assert mod.cheat_over_control(s) == {"a": {"with_scrub": 1.0, "without_scrub": 0.5},
                                         "b": {"with_scrub": 1.5, "without_scrub": 0.5}}
