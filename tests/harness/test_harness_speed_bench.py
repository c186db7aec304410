"""benchmarks/harness_speed.py's tables, on hand-made rows (no GPU): evaluations per second from the
median worker time, the slowest candidate, and the agreement of the two paths."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark


def _row(path: str, matrix: str, kernel: str, verdict: str, cold_us, worker_s: float, cusparse_us=10.0) -> dict:
    return {"path": path, "set": "families", "matrix": matrix, "kernel": kernel, "verdict": verdict,
            "message": "", "cold_us": cold_us, "trials": 41 if path == "sequential" else 11,
            "cusparse_us": cusparse_us, "checked_timed_outputs": 0, "eval_s": worker_s, "worker_s": worker_s,
            "profile": {"time_runs": worker_s * 0.75, "compile": 0.01}, "counts": {"cold_runs": 41}}


def test_summary_and_agreement() -> None:
    """Kills an evals/s from the mean, a slow verdict counted as a disagreement, a ratio of old/new."""
    bench = load_benchmark("harness_speed")
    rows = [_row("sequential", "m", "a", "none", 10.0, 0.5), _row("batched", "m", "a", "none", 10.1, 0.05),
            _row("sequential", "m", "b", "none", 40.0, 2.0), _row("batched", "m", "b", "slow", 41.0, 0.04),
            _row("sequential", "m", "c", "incorrect", None, 0.1), _row("batched", "m", "c", "input_modified", None, 0.02),
            _row("sequential", "m", "d", "none", 20.0, 0.6, cusparse_us=10.0),
            _row("batched", "m", "d", "none", 19.2, 0.03, cusparse_us=10.2)]
    s = bench.summarise(rows, {("sequential", "families", "m"): 4.0, ("batched", "families", "m"): 0.5})
    seq, bat = s["sequential/families"], s["batched/families"]
    assert seq["median_worker_s"] == pytest.approx(0.55) and seq["evals_per_s_median"] == pytest.approx(1 / 0.55)
    assert bat["evals_per_s_wall"] == pytest.approx(8.0) and seq["slowest"]["kernel"] == "b"
    assert bat["verdicts"] == {"none": 2, "slow": 1, "input_modified": 1}
    a = bench.agreement(rows)
    assert a["timed_both"] == 2 and a["ratio_median"] == pytest.approx((1.01 + 0.96) / 2)
    assert a["within_2pct"] == 1 and a["within_5pct"] == 2
    assert [d["kernel"] for d in a["verdicts_differ"]] == ["c"]  # none -> slow is early stopping
    assert a["slow_count"] == 1 and a["slow_ratio_median"] == pytest.approx(41 / 40)
    assert a["cusparse_ratio"]["m"] == pytest.approx(1.02)


def test_repeats_conversions_and_the_limit() -> None:
    """The speed tables read the first pass only; the agreement takes the mean over the passes of
    kernels timed in full in all of them; each path's repeat spread is a later pass over the first;
    the speedup ratio divides each path's own cuSPARSE time. Kills a summary that counts the second
    pass (its candidates reuse every conversion), a spread taken across paths, a speedup ratio
    inverted, a conversion made in the caller left out of a candidate's own time."""
    bench = load_benchmark("harness_speed")
    rows = [_row("sequential", "m", "a", "none", 10.0, 0.5), _row("batched", "m", "a", "none", 10.4, 4.0),
            _row("sequential", "m", "b", "none", 20.0, 0.6), _row("batched", "m", "b", "none", 20.0, 0.02)]
    rows[1]["profile"] = {"convert": 3.5, "upload": 0.1}  # a new conversion, over the 3 s limit
    again = [dict(r, repeat=1) for r in rows]
    again[0]["cold_us"], again[1]["cold_us"] = 10.19, 10.6  # sequential +1.9%, batched +1.9%
    again[2]["cold_us"], again[3]["verdict"] = 20.0, "slow"  # b: not timed in full by the batched path twice
    again[1]["worker_s"] = 99.0  # a later pass never reaches the speed tables
    rows[3]["profile"] = {"preconvert": 3.1, "load_conversion": 0.01}  # converted ahead, in the caller
    s = bench.summarise(rows + again, {("batched", "families", "m"): 1.0, ("sequential", "families", "m"): 1.0})
    bat = s["batched/families"]
    assert bat["candidates"] == 2 and bat["over_limit"] == 2 and s["sequential/families"]["over_limit"] == 0
    assert bat["slowest"]["kernel"] == "a" and bat["slowest"]["own_s"] == pytest.approx(4.0)
    assert bat["median_worker_s"] == pytest.approx((4.0 + 0.02) / 2)  # the caller's conversion is not the worker's
    assert bat["new_conversion"] == {"candidates": 2, "median_worker_s": pytest.approx(2.01)}
    assert bat["reused_conversion"] == {"candidates": 0, "median_worker_s": None}
    a = bench.agreement(rows + again)
    assert a["timed_both"] == 1 and a["per_kernel"][0]["kernel"] == "a" and a["per_kernel"][0]["passes"] == 2
    assert a["ratio_median"] == pytest.approx(((10.4 + 10.6) / 2) / ((10.0 + 10.19) / 2))
    assert a["speedup_ratio_median"] == pytest.approx(((10.0 + 10.19) / 2) / ((10.4 + 10.6) / 2))  # same cuSPARSE
    rs = a["repeat_spread"]
    assert rs["sequential"]["n"] == 2 and rs["sequential"]["max_dev"] == pytest.approx(0.019)
    assert rs["sequential"]["within_2pct"] == 2 and rs["batched"]["n"] == 1
    assert rs["batched"]["median_dev"] == pytest.approx(10.6 / 10.4 - 1)
