"""``benchmarks/guided_search.py`` on the CPU: its ratios point the right way, its summary counts only
matrices where both arms were timed, and a compile-only run goes through all three arms (the search
without a model, generate with the model and a search after its samples, the search with the model)
on the tests' tiny model and writes its JSON. Mutations killed: a ratio inverted (a slower guided arm
reported as faster), an untimed arm counted in a geometric mean, an arm left out of the run, a search
cut by its time cap shown as if it had run its budget, a missing model or matrix that is not a one-line
error, an arm that takes the commands' default of writing the card's facts into the policy's samples, the text arm
searching with the policy's kernels read as points (or another arm without), the headroom arm run at the
search's budget or with the model, its ratio inverted, or a headroom budget at or below the search's accepted."""

from __future__ import annotations

import json

import pytest

from sparserl.eval.retime import median_us, retime_distinct
from sparserl.harness.compile import find_nvcc
from tests.conftest import load_benchmark

bench = load_benchmark("guided_search")


def test_ratios_are_the_search_time_over_the_guided_time() -> None:
    assert bench.ratio({"us": 120.0}, {"us": 100.0}) == pytest.approx(1.2)  # guided faster: above 1
    assert bench.ratio({"us": 100.0}, {"us": 125.0}) == pytest.approx(0.8)
    assert bench.ratio({"us": None}, {"us": 100.0}) is None and bench.ratio(None, {"us": 1.0}) is None
    rows = [{"generate_over_search": 1.2, "model_over_search": 1.1},
            {"generate_over_search": 0.8, "model_over_search": None},  # the model arm found nothing verified
            {"generate_over_search": None, "model_over_search": None}]
    s = bench.summarise(rows)
    assert s["matrices"] == 3 and s["compared_generate"] == 2 and s["compared_model"] == 1
    assert s["generate_over_search"] == pytest.approx((1.2 * 0.8) ** 0.5) and s["generate_over_search_min"] == 0.8
    assert s["model_over_search"] == pytest.approx(1.1)


def test_the_text_arm_is_compared_with_the_model_search_and_said_in_the_table() -> None:
    """``points_over_text`` is the text arm's time over search+model's (above 1: reading the policy's kernels as
    points was faster); only rows that have it count; the table says it. Kills: the ratio inverted, rows without
    the arm counted, the line left out."""
    arms = {"search": {"us": 10.0, "speedup": 2.0}, "search+model": {"us": 8.0, "speedup": 2.5},
            bench.TEXT_ARM: {"us": 9.0, "speedup": 2.2}}
    row = {"matrix": "m", "arms": arms, "generate_over_search": None, "model_over_search": 1.25,
           "points_over_text": bench.ratio(arms[bench.TEXT_ARM], arms["search+model"])}
    assert row["points_over_text"] == pytest.approx(9.0 / 8.0)
    rows = [row, {"matrix": "n", "arms": {}, "generate_over_search": None, "model_over_search": None}]
    s = bench.summarise(rows)
    assert s["compared_points"] == 1 and s["points_over_text"] == pytest.approx(1.125)
    assert "search+model over it, geomean over 1: 1.125" in bench.table(rows, s)
    assert "free text" not in bench.table(rows[1:], bench.summarise(rows[1:]))


def test_headroom_is_the_search_time_over_the_longer_search_time_and_said_in_the_table(capsys) -> None:
    """``headroom`` is the search's time over ``search@N``'s (above 1: the longer search found a faster kernel);
    only rows that have it count; the table says it; a headroom budget not above the search's is refused. Kills:
    the ratio inverted, rows without the arm counted, the line left out, a shorter "longer" search accepted."""
    rows = [{"matrix": "m", "arms": {}, "generate_over_search": None, "model_over_search": None, "headroom": 1.04},
            {"matrix": "n", "arms": {}, "generate_over_search": None, "model_over_search": None, "headroom": 1.0},
            {"matrix": "o", "arms": {}, "generate_over_search": None, "model_over_search": None, "headroom": None}]
    assert bench.ratio({"us": 10.4}, {"us": 10.0}) == pytest.approx(1.04)  # the longer search faster: above 1
    s = bench.summarise(rows)
    assert s["compared_headroom"] == 2 and s["headroom"] == pytest.approx(1.04 ** 0.5) and s["headroom_max"] == 1.04
    assert "geomean over 2: 1.020, at most 1.040" in bench.table(rows, s)
    assert "headroom" not in bench.table(rows[2:], bench.summarise(rows[2:]))
    assert bench.headroom_arm(256) == "search@256"
    with pytest.raises(SystemExit):
        bench.main(["m.npz", "--model", "x", "--budget", "64", "--headroom-budget", "64", "--out", "g.json"])
    assert "--headroom-budget is above --budget (64), got 64" in capsys.readouterr().err


class _Ev:
    """An evaluator that answers each fresh evaluation with the next of a kernel's times (None: a failure)."""

    def __init__(self, times: dict[str, list]) -> None:
        self.times, self.calls = {k: list(v) for k, v in times.items()}, []

    def submit(self, text, ref, op, k, fresh=False):
        from concurrent.futures import Future
        from types import SimpleNamespace

        self.calls.append((text, fresh))
        t = self.times[text.split()[0]].pop(0)
        timing = {"cold": SimpleNamespace(median_us=t)} if t is not None else {}
        f = Future()
        f.set_result(SimpleNamespace(ok=t is not None, timings=timing))
        return f


def test_the_second_look_times_each_kernel_fresh_in_alternating_order_and_shares_equal_kernels() -> None:
    """Kills: a memo answer (not fresh), one order every pass, the same kernel timed against itself (two arms with
    one text get one measurement each pass), a failed pass taken as a time, the median replaced by the minimum."""
    ev = _Ev({"A": [10.0, 12.0, 11.0], "B": [9.0, 9.5, 30.0]})
    texts = {"search": "A kernel", "search+model": "B kernel", "generate": "A   kernel"}
    got = retime_distinct(ev, None, "spmv", None, texts, 3, "cold")
    assert [c[0].split()[0] for c in ev.calls] == ["A", "B", "B", "A", "A", "B"] and all(c[1] for c in ev.calls)
    assert got == {"search": [10.0, 12.0, 11.0], "search+model": [9.0, 9.5, 30.0],
                   "generate": [10.0, 12.0, 11.0]}
    assert median_us(got["search"]) == 11.0 and median_us(got["search+model"]) == 9.5
    assert median_us([9.0, None, 9.0]) is None and median_us([]) is None
    rows = [{"matrix": "m", "arms": {}, **{f"{k}_retimed": None for k in bench.RATIOS},
             "model_over_search_retimed": 11.0 / 9.5, "generate_over_search": None, "model_over_search": 1.0}]
    s = bench.summarise(rows)
    assert s["model_over_search_retimed"] == pytest.approx(11.0 / 9.5) and s["compared_model_over_search_retimed"] == 1
    assert s["compared_generate_over_search_retimed"] == 0 and s["model_over_search"] == 1.0
    assert "geomean - / 1.158" in bench.table(rows, s)


def test_a_matrix_with_timed_arms_gets_its_ratios_both_ways(tmp_path, monkeypatch) -> None:
    """``run_matrix`` with every arm timed (the reports and the harness are doubles): the first-timing ratios point
    the right way, the second look times the arms' kernels fresh and its ratios come from the passes' medians, two
    arms with one kernel read 1.0 retimed, and no kernel text is left in the row. Kills: a ratio inverted in
    ``ratios`` (headroom, model over search), the retimed ratios taken from the first timing or stored under
    other keys, the second look skipped, the kernels left in the JSON."""
    import argparse
    from types import SimpleNamespace

    import sparserl.generate as gen
    import sparserl.search.run as search_run
    from sparserl.matrices import generate, save_matrix

    m = tmp_path / "banded_300.npz"
    save_matrix(generate("banded", 300, seed=0), m)
    first = {"search": 10.0, "generate": 9.0, "search+model": 8.0, bench.TEXT_ARM: 9.6, "search@8": 9.5}
    kernel = {"search": "K1", "generate": "K2", "search+model": "K3", bench.TEXT_ARM: "K3  ", "search@8": "K4"}
    again = {"K1": [10.0, 10.2, 9.9], "K2": [9.9, 10.0, 10.1], "K3": [9.0, 9.2, 9.1], "K4": [10.0, 10.0, 10.0]}

    def report(arm):
        timing = SimpleNamespace(median_us=first[arm])
        best = SimpleNamespace(timings={"cold": timing}, speedup=2.0)
        return SimpleNamespace(best=best, verified=True, kernel=kernel[arm], source=arm, verdict="correct",
                               search={"evaluated": 4, "stopped": "budget"})

    def which(job) -> str:
        if job.search.budget == 8:
            return "search@8"
        if job.model is None:
            return "search"
        return "search+model" if job.search.policy_points else bench.TEXT_ARM

    monkeypatch.setattr(search_run, "search_matrix", lambda job, **kw: (report(which(job)), None))
    monkeypatch.setattr(gen, "generate_kernel", lambda cfg, **kw: report("generate"))
    ev = _Ev({k: list(v) for k, v in again.items()})
    ev.register = lambda A, name: None
    evs = {arm: ev for arm in first}
    args = argparse.Namespace(op="spmv", k=None, compile_only=False, max_new_tokens=None, budget=4, seconds=10.0,
                              regime="cold", seed=0, model="M", samples=1, search=1, temperature=0.7,
                              headroom_budget=8, retime=3)
    row = bench.run_matrix(str(m), evs, None, args, tmp_path / "scratch")
    assert row["model_over_search"] == pytest.approx(10.0 / 8.0) and row["generate_over_search"] == pytest.approx(10 / 9)
    assert row["headroom"] == pytest.approx(10.0 / 9.5) and row["points_over_text"] == pytest.approx(9.6 / 8.0)
    assert row["model_over_search_retimed"] == pytest.approx(10.0 / 9.1)  # medians: 10.0 over 9.1
    assert row["generate_over_search_retimed"] == pytest.approx(1.0) and row["headroom_retimed"] == pytest.approx(1.0)
    assert row["points_over_text_retimed"] == 1.0  # one kernel in both arms: timed once a pass, the same times
    assert all(c[1] for c in ev.calls) and len(ev.calls) == 4 * 3  # four distinct kernels, three fresh passes each
    assert all("kernel" not in a and len(a["retimed"]) == 3 for a in row["arms"].values())


def test_a_search_cut_before_its_budget_is_flagged_in_the_table() -> None:
    """Kills: a comparison whose search arms ran unequal budgets shown as if they were equal."""
    arms = {"search": {"speedup": 2.0, "stopped": "seconds", "searched": 40},
            "generate": {"speedup": 2.2, "stopped": "budget", "searched": 16},
            "search+model": {"speedup": 2.1, "stopped": "budget", "searched": 64}}
    rows = [{"matrix": "m", "arms": arms, "generate_over_search": 1.1, "model_over_search": 1.05}]
    text = bench.table(rows, bench.summarise(rows))
    assert "| m | 2.000 (stopped: seconds, 40 searched) | 2.200 | 2.100 | 1.100 | 1.050 |" in text


def test_missing_model_or_matrix_is_one_line(tmp_path, capsys) -> None:
    assert bench.main([str(tmp_path / "none.npz"), "--model", str(tmp_path), "--out", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no matrix file") and "\n" not in err
    m = tmp_path / "m.npz"
    m.write_bytes(b"")
    assert bench.main([str(m), "--model", str(tmp_path / "nothing"), "--out", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no model at") and "\n" not in err
    assert not (tmp_path / "g.json").exists()


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (compile-only arms)")
def test_compile_only_runs_every_arm(tmp_path, tiny_model_dir, monkeypatch) -> None:
    import sparserl.request.context as context
    from sparserl.matrices import generate, save_matrix

    m = tmp_path / "banded_400.npz"
    save_matrix(generate("banded", 400, seed=0), m)
    out = tmp_path / "g.json"
    loads: list[str] = []  # the three arms share one loaded matrix (and its card): loaded once
    real = context.load_matrix
    monkeypatch.setattr(context, "load_matrix", lambda p: loads.append(str(p)) or real(p))
    fills = []  # every arm measures the policy as itself: no card's facts written in (the commands' default)
    import sparserl.generate as gen
    import sparserl.search.run as search_run

    points = []  # each search arm's policy_points: the text arm's off, every other arm's on
    for module, name in ((gen, "generate_kernel"), (search_run, "search_matrix")):
        monkeypatch.setattr(module, name, lambda cfg, *a, _f=getattr(module, name), **kw: fills.append(cfg.fill_facts)
                            or points.append((cfg.model is not None, cfg.search.policy_points)
                                             if hasattr(cfg, "search") and not isinstance(cfg.search, int) else None)
                            or _f(cfg, *a, **kw))
    rc = bench.main([str(m), "--model", str(tiny_model_dir), "--budget", "2", "--samples", "1", "--search", "1",
                     "--max-new-tokens", "32", "--device", "cpu", "--compile-only", "--text-arm",
                     "--headroom-budget", "3", "--out", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    row = d["rows"][0]
    assert d["compile_only"] and row["matrix"] == "banded_400"
    assert set(row["arms"]) == {"search", "generate", "search+model", bench.TEXT_ARM, "search@3"} and not row["errors"]
    assert [p for p in points if p is not None] == [(False, True), (True, True), (True, False), (False, True)]
    assert row["arms"]["search@3"]["searched"] == 3 and row["arms"]["search"]["searched"] == 2  # its own budget
    assert all(a["us"] is None for a in row["arms"].values())  # compile-only: nothing timed, no ratio made
    assert row["arms"]["search"]["searched"] >= 1 and row["arms"]["generate"]["searched"] >= 1
    assert row["generate_over_search"] is None and d["summary"]["compared_generate"] == 0
    assert loads == [str(m)] and row["prepare_seconds"] >= 0 and fills == [False] * 5
    assert row["headroom"] is None and d["summary"]["compared_headroom"] == 0
    # compile-only: no arm timed, so no second look, and no kernel text left in the JSON
    assert all("retimed" not in a and "kernel" not in a for a in row["arms"].values())
    assert row.get("model_over_search_retimed") is None
    from sparserl.model.config import POLICY_TEMPERATURE

    assert d["config"]["temperature"] == POLICY_TEMPERATURE  # the model arms sample at the policy's temperature
