"""The evaluation's ``NAME=...`` specs, parsed in one place: checkpoints (``NAME=PATH`` or ``PATH``) and per-system
temperatures (``NAME=T``). Light (no torch, no harness): the report and the benchmarks that read a saved
``eval.json`` use it too."""

from __future__ import annotations

from pathlib import Path

from sparserl.errors import SparseRLError


def checkpoint_specs(specs) -> list[tuple[str, str]]:
    """(name, path) of each checkpoint given as NAME=PATH, or PATH (named by its folder)."""
    out = []
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else (Path(spec).name, "", spec)
        out.append((name, path))
    return out


def system_temperatures(specs) -> dict[str, float]:
    """NAME -> T of each ``NAME=T`` (:attr:`sparserl.eval.compare.EvalConfig.system_temperatures`); a spec without
    a name or with a T that is not a positive number is an error that names it."""
    out = {}
    for spec in specs:
        name, eq, value = spec.rpartition("=")
        try:
            t = float(value) if eq else 0.0
        except ValueError:
            t = 0.0
        if not name or not t > 0:
            raise SparseRLError(f"--system-temperature {spec!r}: give NAME=T with T > 0")
        out[name] = t
    return out
