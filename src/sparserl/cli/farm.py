"""``sparserl farm``: tune a collection of matrices on this host's GPUs or a Ray cluster's."""

from __future__ import annotations

from pathlib import Path

import typer

from sparserl.errors import SparseRLError


def farm_cmd(
    matrices: list[Path] = typer.Argument(..., help="matrix files (.mtx, .mtx.gz, .npz) and folders of them"),
    ray: str = typer.Option(None, "--ray", help="Ray cluster address (host:port, ray://host:port or auto) "
                                                "[default: none, this host's GPUs]"),
    store: str = typer.Option(None, help="best-known store: a file (SQLite) or postgresql://user@host/dbname, "
                                         "shared by every farm [default: best_known.sqlite under the cache root]"),
    out: Path = typer.Option(Path("runs/farm"), help="output folder: summary.md, summary.json, one folder per matrix"),
    budget: int = typer.Option(64, help="candidates to evaluate per matrix"),
    seconds: float = typer.Option(None, help="stop submitting a matrix's candidates after this many seconds "
                                             "[default: no time limit]"),
    op: str = typer.Option("spmv", help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X [default: none]"),
    templates: str = typer.Option("", help="comma-separated template names [default: all of the op's]"),
    regime: str = typer.Option("cold", help="L2 regime candidates are ranked in: cold or warm"),
    at_once: int = typer.Option(0, help="matrices searched at the same time (0: one more than the GPUs)"),
    parallel: int = typer.Option(0, help="candidates in flight per matrix (0: four on GPUs, else the CPUs)"),
    gpus: int = typer.Option(None, help="use at most this many GPUs [default: all]"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile only, even with GPUs"),
    resume: bool = typer.Option(False, "--resume", help="continue the farm in --out: finished matrices are "
                                "skipped; failed ones are searched again, and so are those finished compile-only "
                                "where a GPU can time"),
    seed: int = typer.Option(0, help="seed of the searches' random choices"),
    cost_model: str = typer.Option("default", help="the order candidates are tried in: 'default' (your model from "
                                   "'sparserl best cost-model' if you built one, else the packaged one), 'none' "
                                   "(the selector's and templates' order) or a model file"),
    retime: int = typer.Option(3, help="before a matrix's kernel is written, its search's fastest are evaluated "
                               "this many times again, fresh, and the lowest median is written; one found wrong "
                               "there leaves the store (0: the first timings decide)"),
) -> None:
    """Tune a collection of matrices: one budgeted search per matrix, across the GPUs of this host or a
    Ray cluster; every verified kernel goes to the best-known store; a summary table of each matrix's
    best kernel against cuSPARSE is written. Ctrl-C stops cleanly; --resume continues."""
    from sparserl.farm.run import FarmConfig, run_farm
    from sparserl.search.loop import SearchConfig
    from sparserl.search.ranker import check_cost_model_option

    if op == "spmv" and k is not None:
        raise SparseRLError("--k is the column count of X for --op spmm; leave it out for spmv")
    check_cost_model_option(cost_model)
    scfg = SearchConfig(budget=budget, seconds=seconds, templates=tuple(filter(None, templates.split(","))),
                        regime=regime, parallel=parallel, seed=seed, cost_model=cost_model)
    cfg = FarmConfig(matrices=tuple(map(str, matrices)), out=str(out), op=op, k=k, search=scfg, store=store or None,
                     ray=ray or None, gpus=gpus, at_once=at_once, compile_only=compile_only, resume=resume,
                     retime=retime)
    summary = run_farm(cfg)
    t = summary["totals"]
    rows = summary["matrices"]
    faster = sum(1 for r in rows if r["status"] == "done" and (r["speedup"] or 0) > 1.0)
    typer.echo(f"{len(rows)} matrices: " + ", ".join(f"{n} {s}" for s, n in t.items())
               + (f"; {faster} faster than cuSPARSE" if summary["timed"] else "; compile-only, nothing timed"))
    for s in summary["skipped"]:
        typer.echo(f"skipped {s['name']} ({s['path']}): {s['why']}")
    typer.echo(f"wrote {out}/summary.md, summary.json")
