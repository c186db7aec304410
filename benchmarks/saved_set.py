"""A held-out set a policy run evaluated, read back: its ``eval.json``, its samples and its matrices made again.

Shared by the benchmarks that read a run's samples after the fact (``facts_copy.py``, ``fill_facts.py``): the
set is ``OUT/eval-SET`` (``sparserl evaluate``'s ``eval.json`` and ``completions.jsonl``), its matrices are made
again from the evaluation's own settings (seeds, rows) or loaded from where they are now (``matrices``).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.eval.compare import EvalConfig, matrix_set
from sparserl.request.context import MatrixContext


def read_saved_set(run: Path, name: str, system: str = "", matrices: str | None = None
                   ) -> tuple[dict, list[dict], dict[str, MatrixContext]]:
    """(eval.json, the samples of ``system`` or every policy's, the set's matrices by name). Raises
    :class:`SparseRLError` with a one-line reason: a file missing, no sample of ``system``, matrices not found."""
    folder = run / f"eval-{name}"
    for need in (folder / "eval.json", folder / "completions.jsonl"):
        if not need.is_file():
            raise SparseRLError(f"{need} does not exist (give a policy run folder whose set '{name}' was evaluated)")
    result = json.loads((folder / "eval.json").read_text())
    samples = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines() if line.strip()]
    samples = [s for s in samples if not system or s["system"] == system]
    if not samples:
        raise SparseRLError(f"no samples{' of ' + system if system else ''} in {folder / 'completions.jsonl'}")
    known = {f.name for f in fields(EvalConfig)}
    given = {k: v for k, v in result["config"].items() if k in known}
    given.update(distinct_from=(), checkpoints=(), system_temperatures=(), **({"matrices": matrices} if matrices else {}))
    try:  # the set as the evaluation made it (seeds, rows), read where it is now
        contexts = {ctx.name: ctx for ctx, _ in matrix_set(EvalConfig(**given))}
    except SparseRLError as e:
        raise SparseRLError(f"{e} (the set's matrices: give --matrices DIR where they are now)") from e
    return result, samples, contexts
