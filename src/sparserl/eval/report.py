"""Reports of an evaluation: a markdown table and plots (matplotlib, optional)."""

from __future__ import annotations

import logging
from pathlib import Path

from sparserl.eval import library_match
from sparserl.eval.specs import system_temperatures

log = logging.getLogger(__name__)


def _fmt(v, pct: bool = False) -> str:
    if v is None or v != v:  # None or nan
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.2f}"


def markdown(result: dict) -> str:
    """The evaluation as a markdown page: one row per system, the paper's figures beside ours.
    A compile-only run (no GPU) shows compile rates only: nothing was verified or timed."""
    s = result["summary"]
    k = result["config"]["samples"]
    op = result["op"] + (f" (k = {result['k']})" if result.get("k") else "")
    lines = [f"# Evaluation: {op}", ""]
    if result.get("compile_only"):
        return "\n".join(lines + _compile_only_markdown(result)) + "\n"
    pass_k = [f"pass@{k}"] if k > 1 else []  # with one sample, pass@k is pass@1
    head = ["system", "compile", "correct", "pass@1", *pass_k, "coverage", "fast_1.0", "fast_1.2", "fast_1.5",
            "geomean speedup", "geomean (covered)", "speedup@1", "roofline"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    x = lambda v: _fmt(v) + "x" if v is not None else "-"  # noqa: E731
    for name, m in s.items():
        measured = [_fmt(m["correct_rate"], True), _fmt(m["pass@1"], True),
                    *([_fmt(m.get(f"pass@{k}"), True)] if pass_k else []),
                    _fmt(m["coverage"], True), _fmt(m["fast_1.0"], True), _fmt(m["fast_1.2"], True),
                    _fmt(m["fast_1.5"], True), x(m["geomean_speedup"]), x(m["geomean_speedup_covered"]),
                    x(m.get("speedup@1")), _fmt(m["roofline_mean"])]
        lines.append("| " + " | ".join([name, _fmt(m["compile_rate"], True)] + measured) + " |")
    p = result["paper"]
    lines.append(f"| paper ({p['gpu']}) | {_fmt(p['compile_rate'], True)} | - | {_fmt(p['pass_at_1'], True)} | "
                 + "- | " * (len(pass_k) + 4) + f"{_fmt(p['geomean_speedup'])}x | - | - | - |")
    lines += ["", f"Paper figures: {p['source']}. Geomean speedup is over each matrix's best correct kernel of "
              f"the {k} samples and counts a matrix with no correct kernel, or none faster than cuSPARSE, as 1.0 "
              "(the user keeps cuSPARSE); 'covered' is over the matrices with a correct kernel, at its speed; "
              "speedup@1 is what one sampled kernel gives (geomean over each matrix's samples, a sample that is "
              "not correct or slower than cuSPARSE counting as 1.0, so a wrong sample never ranks above a correct "
              "one).", ""]
    lines += _second_look_markdown(result)
    own = system_temperatures(result["config"].get("system_temperatures") or ())
    if own:
        lines += [f"Sampled at temperature {result['config']['temperature']:g}, but " + ", ".join(
            f"{name} at {t:g}" for name, t in own.items()) + ".", ""]
    fams = sorted({f for m in s.values() for f in m["per_family_geomean"]})
    if fams:
        lines += ["## Geometric-mean speedup per family", "", "| system | " + " | ".join(fams) + " |",
                  "|" + " --- |" * (len(fams) + 1)]
        for name, m in s.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(m["per_family_geomean"].get(f)) for f in fams) + " |")
    for name, conf in result.get("format_confusion_vs_oracle", {}).items():
        lines += ["", f"## Formats chosen by {name} (oracle -> chosen)", ""]
        lines += [f"- {pair}: {n}" for pair, n in sorted(conf.items(), key=lambda kv: -kv[1])]
    if result.get("library_match"):
        lines += [""] + library_match.markdown(result["library_match"])
    if result.get("phase_seconds"):
        lines += ["", f"Seconds, {result['seconds']:.0f} in all: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in result["phase_seconds"].items()) + "."]
    return "\n".join(lines) + "\n"


def _second_look_markdown(result: dict) -> list[str]:
    """The second look's table (``evaluate --retime``): each system's geomean speedup on its first timings and
    on the passes timed again side by side, and the latter over the library oracle's."""
    s = result["summary"]
    again = {name: m for name, m in s.items() if m.get("geomean_speedup_retimed") is not None}
    if not again:
        return []
    oracle = again.get("library oracle", {}).get("geomean_speedup_retimed")
    lines = [f"## Second look: each matrix's best kernels timed again side by side "
             f"({result['config']['retime']} passes)", "",
             "| system | geomean speedup, first timings | retimed | retimed over the oracle | failed again |",
             "| --- | --- | --- | --- | --- |"]
    for name, m in again.items():
        ratio = m["geomean_speedup_retimed"] / oracle if oracle else None
        lines.append(f"| {name} | {_fmt(m['geomean_speedup'])}x | {_fmt(m['geomean_speedup_retimed'])}x | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {m['retime_failed']} |")
    lines += ["", "A best of N and the oracle's pick are each the fastest of single timings; the medians of these "
              "passes, fresh and in alternating order, carry no such selection. A best kernel that failed a pass "
              "counts as 1.0 (the user keeps cuSPARSE); cuSPARSE's time is its first.", ""]
    return lines


def _compile_only_markdown(result: dict) -> list[str]:
    """Compile rates, overall and per family: all a run without a GPU measures."""
    s, p = result["summary"], result["paper"]
    lines = ["Compile-only run (no GPU): kernels were compiled and checked, not run, so this page shows "
             "compile rates only (no correctness, speedup or roofline was measured).", "",
             "| system | compiled |", "| --- | --- |"]
    lines += [f"| {name} | {_fmt(m['compile_rate'], True)} |" for name, m in s.items()]
    lines += [f"| paper ({p['gpu']}) | {_fmt(p['compile_rate'], True)} |", "",
              f"Paper figures: {p['source']}, from a pre-trained code model fine-tuned on GPUs. A small model "
              "trained for minutes on a CPU (as `sparserl demo --tiny` trains) is not expected to write kernels "
              "that compile: a rate near 0% from it is what such a run shows.", ""]
    fams = sorted({f for m in s.values() for f in m.get("per_family_compile_rate", {})})
    if fams:
        lines += ["## Compile rate per family", "", "| system | " + " | ".join(fams) + " |",
                  "|" + " --- |" * (len(fams) + 1)]
        for name, m in s.items():
            rates = m.get("per_family_compile_rate", {})
            lines.append(f"| {name} | " + " | ".join(_fmt(rates.get(f), True) for f in fams) + " |")
    return lines


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib not installed: no plots")
        return None
    return plt


def plots(result: dict, out: Path) -> list[str]:
    """speedup_sorted.png, family_bars.png and format_confusion_*.png; [] without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    made = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, recs in result["per_matrix"].items():
        sp = sorted(r["best_speedup"] or 1.0 for r in recs.values())
        ax.plot(range(len(sp)), sp, marker=".", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("matrices, sorted")
    ax.set_ylabel("speedup vs cuSPARSE (no correct kernel = 1)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "speedup_sorted.png", dpi=120)
    plt.close(fig)
    made.append(str(out / "speedup_sorted.png"))
    s = result["summary"]
    fams = sorted({f for m in s.values() for f in m["per_family_geomean"]})
    if fams:
        fig, ax = plt.subplots(figsize=(max(6, len(fams) * 0.9), 4))
        w = 0.8 / max(len(s), 1)
        for i, (name, m) in enumerate(s.items()):
            ax.bar([j + i * w for j in range(len(fams))], [m["per_family_geomean"].get(f, 0) for f in fams], w,
                   label=name)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(fams))], fams, rotation=30, ha="right", fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("geomean speedup vs cuSPARSE")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "family_bars.png", dpi=120)
        plt.close(fig)
        made.append(str(out / "family_bars.png"))
    for name, conf in result.get("format_confusion_vs_oracle", {}).items():
        pairs = [p.split(" -> ") for p in conf]
        rows = sorted({a for a, _ in pairs})
        cols = sorted({b for _, b in pairs})
        grid = [[conf.get(f"{a} -> {b}", 0) for b in cols] for a in rows]
        fig, ax = plt.subplots(figsize=(1 + len(cols) * 0.8, 1 + len(rows) * 0.6))
        ax.imshow(grid, cmap="Blues")
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel(f"format chosen by {name}")
        ax.set_ylabel("oracle's format")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
        fig.tight_layout()
        safe = "".join(c if c.isalnum() else "_" for c in name)
        fig.savefig(out / f"format_confusion_{safe}.png", dpi=120)
        plt.close(fig)
        made.append(str(out / f"format_confusion_{safe}.png"))
    return made
