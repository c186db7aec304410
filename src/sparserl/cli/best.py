"""``sparserl best list|show|export``: the best-known store from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from sparserl.errors import SparseRLError
from sparserl.search.export import ExportFilter, export_sft
from sparserl.search.store import default_store_path, open_store
from sparserl.search.store_backends import is_url


def _console() -> Console:
    """A console for tables: the terminal's width, or wide enough not to cut rows when piped."""
    c = Console()
    return c if c.is_terminal else Console(width=250)


app = typer.Typer(help="The best-known store: the fastest verified kernel per matrix structure, op, k and GPU "
                       "architecture (on two GPU models of one architecture, the larger speedup over cuSPARSE).",
                  no_args_is_help=True)

_STORE_HELP = ("best-known store: a file (SQLite) or postgresql://user@host/dbname [default: best_known.sqlite "
               "under the harness cache root]")


def _open(store: str | None, must_exist: bool = True):
    if store is not None and is_url(store):
        return open_store(store)
    path = Path(store) if store is not None else default_store_path()
    if must_exist and not path.exists():
        raise SparseRLError(f"no best-known store at {path} (sparserl search writes one; or give --store)")
    return open_store(path)


def _check_op(op: str | None) -> None:
    if op is not None and op not in ("spmv", "spmm"):
        raise SparseRLError(f"--op must be spmv or spmm, got {op!r}")


def _not_an_input(out: Path, store: str | None, data: list[Path] = (), reads_store: bool = True) -> None:
    """Refuse an output file that is the store read (or a data file read): writing it would destroy it."""
    stores = []
    if reads_store and (store is None or not is_url(store)):
        stores.append(Path(store) if store is not None else default_store_path())
    for f, what in [*((f, "the store") for f in stores), *((f, "a data file") for f in data)]:
        if out.resolve() == f.resolve():
            raise SparseRLError(f"{out} is {what} this command reads: writing it would destroy it; "
                                "give another output file")


@app.command("list")
def best_list(
    store: str = typer.Option(None, help=_STORE_HELP),
    matrix: str = typer.Option(None, help="only this matrix (name or fingerprint prefix) [default: every matrix]"),
    op: str = typer.Option(None, help="only spmv or spmm [default: both]"),
    arch: str = typer.Option(None, help="only this GPU architecture (e.g. sm_90) [default: every one]"),
    as_json: bool = typer.Option(False, "--json", help="print JSON lines instead of a table"),
) -> None:
    """The best verified kernel of every matrix, op, k, GPU architecture, regime and harness version."""
    _check_op(op)
    with _open(store) as st:
        rows = [r for r in st.best(op=op, arch=arch)
                if matrix is None or r.name == matrix or r.fingerprint.startswith(matrix)]
    if not rows:  # said on stderr: --json's output stays empty JSON lines
        where = f"for {matrix!r} " if matrix else ""
        typer.echo(f"no best-known kernels {where}in {store or default_store_path()} "
                   "(sparserl search writes them)", err=True)
        return
    if as_json:
        for r in rows:
            typer.echo(json.dumps({k: v for k, v in r.__dict__.items() if k != "text"}))
        return
    t = Table(title=f"best known kernels ({len(rows)})")
    for col in ("matrix", "fingerprint", "op", "k", "arch", "gpu", "regime", "harness", "speedup", "kernel us",
                "cuSPARSE us", "kernel", "provenance", "updated"):
        t.add_column(col, justify="right" if col in ("speedup", "kernel us", "cuSPARSE us", "k") else "left")
    for r in rows:
        t.add_row(r.name, r.fingerprint[:12], r.op, str(r.k or "-"), r.arch, r.gpu or "-", r.regime, r.harness_version,
                  f"{r.speedup:.2f}x", f"{r.time_us:.2f}", f"{r.cusparse_us:.2f}", r.candidate_id or "-",
                  r.provenance, r.updated_at)
    _console().print(t)


@app.command("show")
def best_show(
    key: str = typer.Argument(..., help="matrix name or fingerprint prefix"),
    store: str = typer.Option(None, help=_STORE_HELP),
    op: str = typer.Option(None, help="spmv or spmm [default: any]"),
    k: int = typer.Option(None, help="SpMM columns [default: any]"),
    arch: str = typer.Option(None, help="GPU architecture [default: any]"),
    results: bool = typer.Option(False, "--results", help="also list every verified kernel of the matrix"),
) -> None:
    """One best kernel: its facts and its text."""
    _check_op(op)
    with _open(store) as st:
        rows = [r for r in st.best(op=op, k=k, arch=arch) if r.name == key or r.fingerprint.startswith(key)]
        if not rows:
            raise SparseRLError(f"no best-known kernel for {key!r} in {st.path} (list them with 'sparserl best list')")
        keys = {(r.fingerprint, r.op, r.k, r.arch, r.regime, r.harness_version) for r in rows}
        if len(keys) > 1:
            raise SparseRLError(f"{key!r} names {len(keys)} best kernels (matrices, ops, k, architectures, regimes or "
                                "harness versions): narrow it with --op, --k, --arch or a longer fingerprint")
        r = rows[0]
        listing = st.results(r.fingerprint, r.op, r.k) if results else []
    console = _console()
    console.print(f"[bold]{r.name}[/bold] ({r.rows} x {r.cols}, {r.nnz} nonzeros), fingerprint {r.fingerprint}")
    console.print(f"{r.op}{f' k={r.k}' if r.k else ''} on {r.gpu or '?'} ({r.arch}), {r.regime} L2, "
                  f"harness {r.harness_version}")
    console.print(f"kernel {r.time_us:.2f} us, cuSPARSE {r.cusparse_us:.2f} us: [bold]{r.speedup:.2f}x[/bold]"
                  + (f"; roofline fraction {r.roofline:.2f}" if r.roofline is not None else ""))
    console.print(f"{r.candidate_id or 'free text'} (format {r.format}); {r.provenance}"
                  + (f" from {r.parent_id}" if r.parent_id else "") + (f"; model {r.model}" if r.model else "")
                  + f"; search run {r.run_id}, {r.updated_at}")
    typer.echo("")
    typer.echo(r.text)
    if listing:
        t = Table(title=f"verified kernels of {r.name} ({len(listing)})")
        for col in ("kernel us", "speedup", "arch", "regime", "harness", "kernel", "provenance", "run"):
            t.add_column(col)
        for x in listing:
            t.add_row(f"{x.time_us:.2f}", f"{x.speedup:.2f}x", x.arch, x.regime, x.harness_version,
                      x.candidate_id or "-", x.provenance, x.run_id)
        console.print(t)


@app.command("export")
def best_export(
    out: Path = typer.Argument(..., help="JSONL file to write (train with: sparserl sft --data OUT)"),
    store: str = typer.Option(None, help=_STORE_HELP),
    op: str = typer.Option(None, help="only spmv or spmm [default: both]"),
    arch: str = typer.Option(None, help="only this GPU architecture [default: every one]"),
    regime: str = typer.Option(None, help="only kernels timed in this regime [default: both]"),
    harness_version: str = typer.Option(None, help="only kernels verified under this harness version "
                                                   "[default: every one]"),
    min_speedup: float = typer.Option(0.0, help="only kernels at least this fast against cuSPARSE"),
    per_matrix: int = typer.Option(1, help="the fastest N distinct verified kernels per matrix (1: the best)"),
    within: float = typer.Option(None, help="only kernels at most this fraction slower than their matrix's best "
                                            "known (0.05: within 5%) [default: no limit]"),
    seen_only: bool = typer.Option(False, "--seen-only", help="leave out kernels that bake in structure facts the "
                                   "policy's prompt card does not show (what 'sparserl improve' teaches from)"),
    refinements: bool = typer.Option(False, "--refinements", help="also rows that teach a refinement: a searched "
                                     "kernel's parent and its measured time in the prompt, the kernel (at least 2% "
                                     "faster) as the completion"),
    max_chars: int = typer.Option(None, help="only kernels of at most this many characters without comments (the "
                                  "next fastest within it takes a longer one's place) [default: no limit]"),
) -> None:
    """SFT pairs (matrix, verified kernel) from the store, in the SFT data's JSONL format."""
    _not_an_input(out, store)
    flt = ExportFilter(op=op, arch=arch, regime=regime, harness_version=harness_version, min_speedup=min_speedup,
                       per_matrix=per_matrix, within=within, seen_only=seen_only, max_chars=max_chars)
    with _open(store) as st:
        res = export_sft(st, out, flt, refinements=refinements)
    more = f", {res['refinement_rows']} of them refinements" if refinements else ""
    typer.echo(f"wrote {res['rows']} rows ({res['matrices']} matrices{more}) to {res['path']}"
               + (f"; skipped {res['skipped']}" if any(res["skipped"].values()) else ""))


@app.command("cost-model")
def best_cost_model(
    store: str = typer.Option(None, help=_STORE_HELP + " (left out when only --data is given)"),
    data: list[Path] = typer.Option([], "--data", help="measurements file (JSON lines, from "
                                    "benchmarks/cost_model_data.py); repeat for several [default: none]"),
    out: Path = typer.Option(None, help="model file to write (one operator: give --op when the data has both) "
                                        "[default: cost_model.json.gz (SpMV) and cost_model_spmm.json.gz (SpMM) "
                                        "under the harness cache root, which searches then use]"),
    op: str = typer.Option(None, help="fit the model of this operator only: spmv or spmm [default: one model for "
                                      "each operator the data has]"),
    regime: str = typer.Option("cold", help="train on the times of this regime: cold or warm"),
    arch: str = typer.Option(None, help="train on the times of this GPU architecture only (e.g. sm_90); searches "
                                        "on other GPUs do not use the model [default: the data's one architecture]"),
    trees: int = typer.Option(200, help="boosting rounds"),
    target: str = typer.Option("blend", help="what the model learns: blend (a ranking fit and a regression of "
                                             "log time over the matrix's fastest, summed: the best top-5 when "
                                             "a family is left out), rank or gap (either half alone), ratio "
                                             "(log time over cuSPARSE's) or absolute (log time)"),
    min_measurements: int = typer.Option(200, help="refuse to train on fewer verified measurements"),
) -> None:
    """Fit the cost models that order a search's candidates, on the store's verified times (and
    benchmark measurements) of one GPU architecture: one model per operator (SpMV, SpMM), each on its
    own measurements; matrices of the held-out generator families are left out."""
    from sparserl.search.cost_model import (
        CostModelError,
        TrainConfig,
        load_measurements,
        select_arch,
        store_measurements,
        train,
        user_model_path,
    )

    if regime not in ("cold", "warm"):
        raise SparseRLError(f"--regime must be cold or warm, got {regime!r}")
    if min_measurements < 1:
        raise SparseRLError(f"--min-measurements must be at least 1, got {min_measurements}")
    _check_op(op)
    if out is not None:
        _not_an_input(out, store, data, reads_store=store is not None or not data)
    measurements, sources = [], []
    if store is not None or not data:
        with _open(store) as st:
            measurements += store_measurements(st, regime)
            sources.append(str(st.path))
    for f in data:
        measurements += [m for m in load_measurements(f) if m.regime == regime]
        sources.append(str(f))
    where = " and ".join(sources)
    measurements = select_arch(measurements, arch, where)
    ops = [op] if op is not None else sorted({m.op for m in measurements}) or ["spmv"]
    if out is not None and len(ops) > 1:
        raise SparseRLError(f"the data has measurements of {' and '.join(ops)}: a model file holds one operator; "
                            "give --op spmv or --op spmm with --out (or leave --out out to write both)")
    errors = []
    for o in ops:
        mine = [m for m in measurements if m.op == o]
        try:
            model = train(mine, TrainConfig(trees=trees, target=target, min_measurements=min_measurements),
                          where=f"the {o} measurements of {where}", sources=sources)
        except CostModelError as exc:
            if len(ops) == 1:
                raise
            errors.append(exc)  # the other operator's model may still be fitted
            typer.echo(f"no {o} model: {exc}")
            continue
        path = model.save(out if out is not None else user_model_path(o))
        t = model.meta["trained_on"]
        fams = sorted(set(t["families"]) | set(model.real_part.meta["trained_on"]["families"]
                                               if model.real_part is not None else ()))
        typer.echo(f"wrote {path}: {model.describe()}; families {', '.join(fams)}"
                   + (f"; {t['held_out_left_out']} held-out matrices left out" if t["held_out_left_out"] else ""))
        if path.resolve() == user_model_path(o).resolve():
            typer.echo(_instead_of_packaged(model, o, path))
    if len(errors) == len(ops):
        raise errors[0]


def _instead_of_packaged(model, op: str, path: Path) -> str:
    """The line that says ``op``'s searches now use ``model`` instead of the packaged one, and how their
    sizes compare (a fit on a few measurements replaces one on thousands, for every later search)."""
    from sparserl.search.cost_model import CostModel, CostModelError, packaged_model_path

    def size(m) -> str:
        n, mats, fams = m.size()
        return f"{n} measurements on {mats} matrices of {len(fams)} families, {', '.join(m.archs) or 'GPU unknown'}"

    try:
        packaged = CostModel.load(packaged_model_path(op))
    except CostModelError:  # none packaged for this operator (or one this version cannot read)
        return f"{op} searches now use this model ({size(model)}); no packaged model to compare it with"
    if model.archs and packaged.archs and not set(model.archs) & set(packaged.archs):
        return (f"{op} searches on {', '.join(model.archs)} now use this model ({size(model)}); on "
                f"{', '.join(packaged.archs)} the packaged one ({size(packaged)}) still orders them")
    return (f"{op} searches now use this model ({size(model)}) instead of the packaged one ({size(packaged)}); "
            f"delete {path} to use the packaged one again")
