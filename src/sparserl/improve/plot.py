"""A plot of ``sparserl improve``'s rounds: validation speed against the library oracle, and the
correct share of the validation samples, per round (kept rounds filled, rejected ones hollow).

``sparserl improve`` draws ``OUT/rounds.png`` after every round when matplotlib is installed. To
draw several runs on one figure from their ``rounds.json``::

    python -m sparserl.improve.plot rounds.png "run A=runs/imp/improve/rounds.json" runs/imp2/improve/rounds.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from sparserl.eval.report import pyplot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundPoint:
    """One validated round of a run."""

    round: int
    vs_oracle: float | None
    """Best-of-k speedup geomean over the library oracle's, on the validation matrices."""
    correct: float | None
    """Correct share of the validation samples."""
    kept: bool


def round_points(rounds: dict) -> list[RoundPoint]:
    """The validated rounds of one run's ``rounds.json`` (or its state), in order (pure)."""
    out = []
    for rec in sorted(rounds.get("rounds", []), key=lambda r: r["round"]):
        val = rec.get("val") or {}
        if not val:
            continue
        out.append(RoundPoint(rec["round"], val.get("vs_oracle"), val.get("correct_rate"), bool(rec.get("kept"))))
    return out


def plot_rounds(runs: dict[str, dict], path: str | Path) -> Path | None:
    """Draw each run's rounds (label -> rounds.json content) into ``path``; None without matplotlib
    or without a validated round."""
    series = {label: round_points(r) for label, r in runs.items()}
    if not any(series.values()):
        return None
    plt = pyplot()
    if plt is None:
        return None
    fig, (ax_speed, ax_ok) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (label, pts) in enumerate(series.items()):
        color = f"C{i}"
        for ax, key in ((ax_speed, "vs_oracle"), (ax_ok, "correct")):
            xs = [p.round for p in pts if getattr(p, key) is not None]
            ys = [getattr(p, key) for p in pts if getattr(p, key) is not None]
            ax.plot(xs, ys, color=color, lw=1, label=label)
            for p in pts:
                if getattr(p, key) is not None:
                    ax.plot(p.round, getattr(p, key), "o", color=color, mfc=color if p.kept else "white", ms=6)
    ax_speed.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax_speed.set_ylabel("best-of-k speedup / library oracle's")
    ax_ok.set_ylabel("correct share of samples")
    ax_ok.set_ylim(0, 1.02)
    rounds = sorted({p.round for pts in series.values() for p in pts})
    for ax, title in ((ax_speed, "validation speed against the library oracle"), (ax_ok, "validation correctness")):
        ax.set_xlabel("round (0: the starting model; filled: kept)")
        ax.set_xticks(rounds)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparserl.improve.plot", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("runs", nargs="+", help="LABEL=PATH or PATH of a run's rounds.json (or its improve folder)")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        p = Path(path)
        p = p / "rounds.json" if p.is_dir() else p
        if not p.is_file():
            print(f"error: {p}: no such rounds.json (sparserl improve writes it in its --out folder)", file=sys.stderr)
            return 2
        try:
            runs[label or str(p.parent)] = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            print(f"error: {p} is not JSON ({e})", file=sys.stderr)
            return 2
    made = plot_rounds(runs, args.out)
    if made is None:
        print("error: nothing drawn (no validated round, or matplotlib is not installed)", file=sys.stderr)
        return 1
    print(f"wrote {made}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
