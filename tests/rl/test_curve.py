"""The learning-curve reader keeps the last value logged for each step (resumed runs re-log steps)."""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.rl.curve import plot_learning_curve, read_curve


def test_read_curve_last_value_per_step_and_plot(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "heldout/correct_rate": 0.5, "heldout/speedup_geomean_correct": 1.1},
             {"step": 1, "reward/mean": -0.2}, {"step": 2, "reward/mean": 0.1},
             {"step": 2, "reward/mean": 0.3, "heldout/correct_rate": 0.75}]  # step 2 again after a resume
    m.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    c = read_curve(m)
    assert c["reward/mean"] == [(1, -0.2), (2, 0.3)]
    assert c["heldout/correct_rate"] == [(0, 0.5), (2, 0.75)]
    assert c["heldout/speedup_geomean_correct"] == [(0, 1.1)]
    png = plot_learning_curve(m, tmp_path / "curve.png")
    assert png is not None and Path(png).stat().st_size > 1000


def test_no_metrics_no_plot(tmp_path: Path) -> None:
    assert plot_learning_curve(tmp_path / "missing.jsonl", tmp_path / "c.png") is None
    assert not (tmp_path / "c.png").exists()


def test_one_step_run_draws_its_point_and_warns_of_nothing(tmp_path: Path) -> None:
    """train_minimal's run is one step and no held-out matrices: the png must show that point,
    and matplotlib must not warn about an empty legend."""
    import warnings

    from sparserl.eval.report import pyplot
    from sparserl.rl.curve import curve_figure

    m = tmp_path / "metrics.jsonl"
    m.write_text(json.dumps({"step": 1, "reward/mean": -0.5, "reward/correct_rate": 0.0}) + "\n")
    plt = pyplot()
    if plt is None:
        return
    fig = curve_figure(read_curve(m), plt)
    train, heldout = fig.axes
    assert train.lines and all(ln.get_marker() not in (None, "", "None") for ln in train.lines)
    assert [t.get_text() for t in heldout.texts] == ["nothing logged"] and heldout.get_legend() is None
    plt.close(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_learning_curve(m, tmp_path / "c.png") is not None


def test_a_compile_only_run_draws_compile_rates(tmp_path: Path) -> None:
    """A compile-only run logs compile rates and no correct rate: those are what its curve shows
    (it drew a correct rate of 0 or nothing at all)."""
    from sparserl.eval.report import pyplot
    from sparserl.rl.curve import curve_figure

    m = tmp_path / "metrics.jsonl"
    m.write_text("\n".join(json.dumps(x) for x in (
        {"step": 1, "reward/mean": -0.5, "reward/compile_rate": 0.25},
        {"step": 2, "reward/mean": -0.2, "reward/compile_rate": 0.5, "heldout/compile_rate": 0.75})) + "\n")
    c = read_curve(m)
    assert c["reward/compile_rate"] == [(1, 0.25), (2, 0.5)] and c["heldout/compile_rate"] == [(2, 0.75)]
    plt = pyplot()
    if plt is None:
        return
    fig = curve_figure(c, plt)
    train, heldout = fig.axes
    drawn = [[ln.get_label() for ln in ax.lines if not ln.get_label().startswith("_")] for ax in (train, heldout)]
    assert drawn == [["reward/mean", "reward/compile_rate"], ["heldout/compile_rate"]]
    plt.close(fig)
