"""The farm's summary: every matrix's best kernel against cuSPARSE, as ``summary.md`` and ``summary.json``."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path


def _f(x, fmt: str) -> str:
    return format(x, fmt) if x is not None else "-"


def summary_markdown(rows: list, snap: dict, timed: bool) -> str:
    """The table (one line per matrix) and what the farm saw (throughput, failures, GPU health)."""
    done = [r for r in rows if r.status == "done"]
    faster = [r for r in done if r.speedup and r.speedup > 1.0]
    lines = ["# Farm summary", ""]
    if timed:
        lines.append(f"{len(done)} of {len(rows)} matrices with a verified kernel; {len(faster)} faster than "
                     "cuSPARSE.")
    else:
        lines.append(f"Compile-only (no GPU): {len(done)} of {len(rows)} matrices with a compiling kernel; nothing "
                     "was verified or timed.")
    lines += ["", "| matrix | rows | nnz | status | best kernel | format | kernel us | cuSPARSE us | speedup | "
              "candidates | s |", "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.name} | {_f(r.rows, 'd')} | {_f(r.nnz, 'd')} | {r.status} | {r.best_id or '-'} | "
                     f"{r.best_format or '-'} | {_f(r.time_us, '.2f')} | {_f(r.cusparse_us, '.2f')} | "
                     f"{_f(r.speedup, '.2f')}{'x' if r.speedup else ''} | {r.evaluated} | {r.seconds:.0f} |")
    skipped = [r for r in rows if r.status in ("unreadable", "too large", "failed", "interrupted", "no kernel")]
    if skipped:
        lines += ["", "## Not tuned", ""] + [f"- {r.name} ({r.path}): {r.status}: {r.message}" for r in skipped]
    lines += ["", "## The farm", "", f"- {snap['candidates']} candidates in {snap['elapsed']:.0f} s "
              f"({snap['rate']:.2f}/s)" + (f"; {snap['looks']} evaluations again in second looks"
                                           if snap.get("looks") else "")]
    if snap["machine_failures"]:
        lines.append("- failures of the machine (re-run or left out of the results): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(snap["machine_failures"].items())))
    for w in snap["workers"]:
        lines.append(f"- {w['name']} ({w.get('gpu') or '?'}): {w['jobs']} evaluations, {w['rate']:.2f}/s"
                     + ("" if w.get("alive", True) else ", lost"))
    if snap.get("compiles"):
        lines.append("- compile tasks per host: " + ", ".join(f"{h} {n}" for h, n in sorted(snap["compiles"].items())))
    for name, probs in sorted(snap["health"].items()):
        lines.append(f"- {name}: {'; '.join(probs)} (its times may be slower than the GPU's own)")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, cfg, rows: list, snap: dict, timed: bool) -> dict:
    """Write summary.md and summary.json in ``out``; returns the JSON's content."""
    doc = {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "timed": timed, "config": asdict(cfg),
           "matrices": [asdict(r) for r in rows],
           "skipped": [{"name": r.name, "path": r.path, "why": r.message} for r in rows
                       if r.status in ("unreadable", "too large")],
           "totals": {s: sum(r.status == s for r in rows) for s in sorted({r.status for r in rows})},
           "farm": snap}
    (out / "summary.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(summary_markdown(rows, snap, timed))
    return doc
