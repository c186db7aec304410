"""``sparserl matrix``: inspect matrix files, generate synthetic matrices, list generator families.

Commands raise :class:`sparserl.errors.MatrixError` for bad input; the root CLI prints it as one
``error: ...`` line and exits with status 2.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sparserl.errors import MatrixError
from sparserl.matrices.features import MatrixFeatures, compute_features
from sparserl.matrices.generators import FAMILIES, HELD_OUT_FAMILIES, TARGET_FAMILIES, family_names, generate
from sparserl.matrices.io import MATRIX_SUFFIXES, load_matrix, save_matrix

app = typer.Typer(
    help="Load, inspect and generate sparse matrices (.mtx, .mtx.gz, .npz).",
    no_args_is_help=True,
    rich_markup_mode="rich",
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _defaults_text(defaults: dict[str, Any]) -> str:
    return ", ".join(f"{k}={'auto' if v is None else v}" for k, v in defaults.items()) or "none"


def _families_help() -> str:
    lines = [
        f"{name}: {spec.description} (parameters: {_defaults_text(spec.defaults)})"
        for name, spec in FAMILIES.items()
    ]
    # "\b" keeps click from re-wrapping the list into one paragraph; escape() keeps rich from
    # reading brackets as markup
    return escape("\b\nFamilies:\n" + "\n".join(f"  {line}" for line in lines))


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def _features_table(title: str, feats: MatrixFeatures) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("feature")
    table.add_column("value", justify="right", overflow="fold")
    for key, value in vars(feats).items():
        table.add_row(key, _format_value(value))
    return table


@app.command()
def info(
    file: Path = typer.Argument(..., help="Matrix file: .mtx, .mtx.gz or .npz."),
    as_json: bool = typer.Option(False, "--json", help="Print the features as JSON instead of a table."),
) -> None:
    """Load FILE and print its structure features (shape, row lengths, bandwidth, diagonals, blocks, symmetry)."""
    A = load_matrix(file)
    feats = compute_features(A)
    if as_json:
        typer.echo(json.dumps({"file": str(file), **feats.to_dict()}, indent=2))
    else:
        Console().print(_features_table(escape(str(file)), feats))


def _parse_params(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict; values parse as int, else float, else ``none`` -> None."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise MatrixError(f"--param expects KEY=VALUE, got {item!r}")
        value: Any
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                if text.lower() != "none":
                    raise MatrixError(f"--param {key}: value {text!r} is not a number") from None
                value = None
        out[key] = value
    return out


@app.command(epilog=_families_help())
def gen(
    family: str = typer.Argument(
        ..., help="Generator family (see the list below or `sparserl matrix families`)."
    ),
    rows: int = typer.Option(..., "--rows", help="Number of rows (stencils round it to a grid size)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output file: .mtx, .mtx.gz or .npz."),
    cols: int | None = typer.Option(None, "--cols", help="Number of columns [default: the family's]."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same matrix)."),
    param: list[str] = typer.Option([], "--param", "-p",
                                    help="Family parameter KEY=VALUE (repeatable) [default: the family's]."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
) -> None:
    """Generate a seeded synthetic matrix of FAMILY and write it to --out."""
    if not out.name.lower().endswith(MATRIX_SUFFIXES):
        raise MatrixError(f"{out}: unknown matrix file extension; expected .mtx, .mtx.gz or .npz")
    if out.exists() and not force:
        raise MatrixError(f"{out} exists: pass --force to overwrite it, or give another --out")
    params = _parse_params(param)
    t0 = time.perf_counter()
    A = generate(family, rows, cols=cols, seed=seed, **params)
    t1 = time.perf_counter()
    save_matrix(A, out)
    t2 = time.perf_counter()
    typer.echo(
        f"wrote {out}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros ({family}, seed {seed}) "
        f"in {t2 - t0:.2f}s (generate {t1 - t0:.2f}s, save {t2 - t1:.2f}s)"
    )


@app.command()
def families() -> None:
    """List the generator families with their sets, descriptions and default parameters."""
    table = Table(show_header=True, header_style="bold")
    table.add_column("family")
    table.add_column("set")
    table.add_column("description")
    table.add_column("parameters (defaults)")
    for name, spec in FAMILIES.items():
        table.add_row(name, _family_set(name), spec.description, _defaults_text(spec.defaults))
    Console().print(table)
    Console().print("classic: what 'the families' means by default (data build, evaluate --matrices families, RL); "
                    "targets: the 11 quoted in targets; application: only when named; held out: no learned "
                    "component (cost model, SFT, RL) is fitted on them")


def _family_set(name: str) -> str:
    if name in TARGET_FAMILIES:
        return "classic, targets"
    if name in family_names():
        return "classic"
    return "application, held out" if name in HELD_OUT_FAMILIES else "application"
