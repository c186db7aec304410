"""Recompute an evaluation's summary and report from its saved files, with this version's metrics.

``sparserl evaluate`` writes ``eval.json`` (per-matrix records of every system) and
``completions.jsonl`` (every policy sample with its verdict and speedup). A metric added after
a run (such as speedup@1, which needs each sample's speedup, or where the samples come from
against the library) can be computed from these two
files without a GPU: per-sample speedups come from ``completions.jsonl`` for the policies, and
the baselines' single pick is their best. ``eval.json`` and ``eval.md`` are rewritten in place.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind
from sparserl.eval.compare import summarize
from sparserl.eval.library_match import library_match_table
from sparserl.eval.report import markdown


def rescore(folder: str | Path) -> dict:
    """Recompute ``folder``'s summary (eval.json + completions.jsonl); returns the new result."""
    folder = Path(folder)
    ej, cj = folder / "eval.json", folder / "completions.jsonl"
    if not ej.exists():
        raise SparseRLError(f"{folder}: no eval.json (not a 'sparserl evaluate' output folder)")
    result = json.loads(ej.read_text())
    if "per_matrix" not in result:
        raise SparseRLError(f"{ej} holds a summary only ({result.get('trimmed', 'no per-matrix records')}): "
                            "rerun the evaluation to rescore it")
    samples: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    drawn: list[tuple[str, str, bool, str]] = []
    if cj.exists():
        for line in cj.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                verified = ErrorKind(r["verdict"]).verified  # none, or slow (stopped early, its time measured)
                ok = verified and r.get("speedup")
                samples[r["system"]][r["matrix"]].append(r["speedup"] if ok else None)
                if "completion" in r:  # files of older runs kept only the verdicts
                    drawn.append((r["system"], r["completion"], verified, r["verdict"], r.get("message", "")))
    n = result["config"]["samples"]
    for name, recs in result["per_matrix"].items():
        for mname, rec in recs.items():
            if name in samples:
                got = samples[name].get(mname, [])
                if len(got) != rec["n"]:
                    raise SparseRLError(f"{cj}: {len(got)} samples of {name} on {mname}, eval.json counts {rec['n']}")
                rec["sample_speedups"] = got
            elif "sample_speedups" not in rec:
                if rec["n"] != 1:
                    raise SparseRLError(f"{cj}: no samples of {name} (it has {rec['n']} per matrix)")
                rec["sample_speedups"] = [rec["best_speedup"]]  # a baseline: its one pick
    timed = not result.get("compile_only")
    result["summary"] = {name: summarize(recs, n, timed) for name, recs in result["per_matrix"].items()}
    if drawn:
        result["library_match"] = library_match_table(drawn, result["op"])
    ej.write_text(json.dumps(result, indent=1, default=str))
    (folder / "eval.md").write_text(markdown(result))
    return result
