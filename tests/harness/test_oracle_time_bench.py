"""The oracle-time benchmark's CPU side: its verdict bookkeeping, its table, and its one-line exit
without a GPU. Mutations killed: a count that misses a changed verdict, a table that hides one, a
run on a machine without a GPU that writes figures."""

from __future__ import annotations

import pytest

from tests.conftest import assert_no_gpu_is_one_line, load_benchmark

bench = load_benchmark("oracle_time")


def result(differ: dict) -> dict:
    b = {"wall_s": 3.0, "kinds": {"none": 2, "timeout": 1}, "restarts": 0, "best_speedup": 1.5}
    return {"matrices": [{"matrix": "lp_1", "nnz": 9, "by_floor": {"2.0": b | {"restarts": 2}, "0.5": b},
                          "differ": {"2.0 vs 0.5": differ}}]}


def test_changes_are_counted_by_kind_and_shown_in_the_table() -> None:
    r = result({"k1": ["slow", "timeout"], "k2": ["none", "timeout"], "k3": ["slow", "timeout"]})
    assert dict(bench.verdict_changes(r)) == {"slow -> timeout": 2, "none -> timeout": 1}
    text = bench.table(r, ["2.0", "0.5"])
    assert "k2: none -> timeout" in text and "| 2 |" in text and text.count("\n") == 2
    assert dict(bench.verdict_changes(result({}))) == {} and "| - |" in bench.table(result({}), ["2.0", "0.5"])


def test_families_default_to_every_classic_and_application_one() -> None:
    from sparserl.matrices.generators import APPLICATION_FAMILIES, CLASSIC_FAMILIES

    assert bench.families(None) == [*CLASSIC_FAMILIES, *APPLICATION_FAMILIES]
    assert bench.families("lp,,arrow") == ["lp", "arrow"]


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, capsys) -> None:
    assert_no_gpu_is_one_line(bench.main, ["--families", "lp", "--rows", "1000"], tmp_path / "o.json", capsys)


def test_first_launch_excess_over_fully_verified_kernels() -> None:
    """The first launch's time less a later launch's (the later ones' mean), over kernels verified in
    full only. Mutations killed: the total of the later launches taken for one launch, a kernel
    stopped after its first launch counted (it has no later launch), and the smallest reported as the largest."""
    per = {"a": {"kind": "none", "first_launch_s": 0.010, "later_launches_s": 0.016, "verify_launches": 9},
           "b": {"kind": "slow", "first_launch_s": 0.030, "later_launches_s": 0.080, "verify_launches": 9},
           "c": {"kind": "timeout", "first_launch_s": 0.700, "later_launches_s": None, "verify_launches": 1},
           "d": {"kind": "none", "first_launch_s": 0.004, "later_launches_s": 0.024, "verify_launches": 9}}
    e = bench.first_launch_excess(per)
    assert e["kernels"] == 3 and e["max_kernel"] == "b"
    assert e["max_s"] == pytest.approx(0.030 - 0.010) and e["median_s"] == pytest.approx(0.010 - 0.002)
    assert e["longest_first_of_timed_s"] == 0.010  # 'none' only: the slow kernel's 30 ms is not a contender's
    assert bench.first_launch_excess({"c": per["c"]}) is None


def test_contender_floors_are_checked_before_any_work_and_named_in_the_table(tmp_path, capsys) -> None:
    """``--contender-min`` needs ``--contenders`` and values in (0, 0.05]; with three settings each
    changed verdict names the setting it changed in. Mutations killed: an out-of-range floor run
    anyway, the floor list silently ignored without --contenders, and a table that cannot tell two
    contender settings apart."""
    out = tmp_path / "o.json"
    assert bench.main(["--out", str(out), "--contender-min", "0.01"]) == 2
    assert "needs --contenders" in capsys.readouterr().err
    assert bench.main(["--out", str(out), "--contenders", "--contender-min", "0.2"]) == 2
    assert "contender_min_s" in capsys.readouterr().err and not out.exists()
    b = {"wall_s": 3.0, "kinds": {"none": 2}, "restarts": 0, "best_speedup": 1.5}
    labels = ["floor 0.5", "contenders", "contenders, first launch 5 ms"]
    r = {"matrices": [{"matrix": "arrow_1", "nnz": 9, "by_floor": dict.fromkeys(labels, b),
                       "differ": {"floor 0.5 vs contenders": {}, "floor 0.5 vs contenders, first launch 5 ms":
                                  {"k1": ["slow", "timeout"]}}}]}
    assert "k1: slow -> timeout (contenders, first launch 5 ms)" in bench.table(r, labels)


def test_seconds_by_step_sum_every_kernels_steps_largest_first() -> None:
    """Mutations killed: one kernel's steps only, a step of one kernel overwriting another's, and an
    order that is not by seconds."""
    per = {"a": {"steps": {"convert": 1.0, "verify_first": 0.2}}, "b": {"steps": {"convert": 0.5, "time_runs": 2.0}},
           "c": {"kind": "format_refused"}}
    assert list(bench.seconds_by_step(per).items()) == [("time_runs", 2.0), ("convert", 1.5), ("verify_first", 0.2)]
