"""The learning curve of an RL run: reward and held-out metrics against the step.

Read from the run's ``metrics.jsonl`` (one JSON object per logged step, ``step`` plus
namespaced scalars); the plot is optional (matplotlib), the series are not.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.eval.report import pyplot

SERIES = ("reward/mean", "reward/compile_rate", "reward/correct_rate", "heldout/compile_rate", "heldout/correct_rate",
          "heldout/speedup_geomean_correct")
"""What is drawn; a compile-only run logs no correct rates, so its curve shows compile rates only."""


def read_curve(metrics_path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` for the metrics in :data:`SERIES`; later lines for a
    step replace earlier ones (a resumed run logs some steps again)."""
    by_step: dict[str, dict[int, float]] = {k: {} for k in SERIES}
    path = Path(metrics_path)
    if not path.exists():
        return {k: [] for k in SERIES}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        for k in SERIES:
            if isinstance(rec.get(k), (int, float)):
                by_step[k][int(rec["step"])] = float(rec[k])
    return {k: sorted(v.items()) for k, v in by_step.items()}


def plot_learning_curve(metrics_path: str | Path, out_png: str | Path) -> str | None:
    """Two panels (training reward, compile and correct rates; held-out speedup, compile and
    correct rates) saved as ``out_png``; returns its path, or None when matplotlib is missing or
    nothing was logged."""
    curve = read_curve(metrics_path)
    if not any(curve.values()):
        return None
    plt = pyplot()
    if plt is None:
        return None
    fig = curve_figure(curve, plt)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return str(out_png)


def curve_figure(curve: dict[str, list[tuple[int, float]]], plt):
    """The two panels as a matplotlib figure: every series drawn with markers (a run of one
    step is one point, which a line alone does not show), and a panel with nothing logged says
    so instead of drawing an empty legend."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for k, ax in (("reward/mean", a), ("reward/compile_rate", a), ("reward/correct_rate", a),
                  ("heldout/speedup_geomean_correct", b), ("heldout/compile_rate", b), ("heldout/correct_rate", b)):
        if curve[k]:
            xs, ys = zip(*curve[k])
            ax.plot(xs, ys, marker="o" if k.startswith("heldout") else ".", label=k)
    a.set_title("training rollouts")
    b.set_title("held-out matrices (one sample each)")
    b.axhline(1.0, color="grey", lw=0.8, ls="--")
    for ax in (a, b):
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:  # nothing logged for this panel (no held-out matrices, say): say so instead of an empty legend
            ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
