"""``sparserl search`` (the defaults are :class:`~sparserl.search.loop.SearchConfig`'s and
:class:`~sparserl.search.run.SearchJob`'s)."""

from __future__ import annotations

from pathlib import Path

import typer

from sparserl.cli.common import FILL_FACTS_HELP, HEADER_GRAMMAR_HELP, RETIME_HELP, defaults, names
from sparserl.search.loop import SearchConfig
from sparserl.search.ranker import check_cost_model_option
from sparserl.search.run import SearchJob, search_matrix, store_line

D, J = defaults(SearchConfig), defaults(SearchJob)


def search_cmd(
    matrix: Path = typer.Argument(..., help=".mtx, .mtx.gz or .npz"),
    budget: int = typer.Option(D.budget, "--budget", "--search-budget",
                               help="candidates to evaluate (each through the harness)"),
    seconds: float = typer.Option(None, help="stop submitting candidates after this many seconds "
                                             "[default: no time limit]"),
    op: str = typer.Option(J.op, help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
    templates: str = typer.Option("", help="comma-separated template names to search [default: all of the op's]"),
    model: Path = typer.Option(None, help="policy checkpoint or HF model folder: it proposes too (samples and "
                                          "refinements of the best so far) [default: none, no model]"),
    store: str = typer.Option(None, help="best-known store: a file (SQLite) or postgresql://user@host/dbname "
                                         "[default: best_known.sqlite under the harness cache root, "
                                         "$SPARSERL_CACHE_DIR or ~/.cache/sparserl]"),
    out: Path = typer.Option(None, help="output folder [default: runs/search/<matrix name>]"),
    regime: str = typer.Option(D.regime, help="L2 regime candidates are ranked in: cold (flushed) or warm"),
    parallel: int = typer.Option(D.parallel, help="candidates in flight (0: four per GPU)"),
    temperature: float = typer.Option(J.temperature, help="the policy's sampling temperature"),
    header_grammar: bool = typer.Option(J.header_grammar, "--header-grammar", help=HEADER_GRAMMAR_HELP),
    fill_facts: bool = typer.Option(J.fill_facts, "--fill-facts/--no-fill-facts", help=FILL_FACTS_HELP),
    max_new_tokens: int = typer.Option(J.max_new_tokens, help="the policy's longest completion, in tokens [default: the longest library "
                                                       "kernel in the policy's tokens, plus a margin]"),
    device: str = typer.Option(J.device, help="the model's device: auto, cpu or cuda[:N]"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile only, even on a GPU (no GPU: always)"),
    seed: int = typer.Option(D.seed, help="seed of the search's random choices"),
    cost_model: str = typer.Option(D.cost_model, help="the order candidates are tried in: 'default' (your model "
                                   "from 'sparserl best cost-model' if you built one, else the packaged one), 'none' "
                                   "(the selector's and templates' order) or a model file"),
    retime: int = typer.Option(J.retime, help=RETIME_HELP),
) -> None:
    """Search the kernel space for one matrix: library seeds, mutations, policy proposals.

    Every candidate is verified and timed by the harness; the best kernel, its report and the
    trace are written, and the best-known store is updated."""
    check_cost_model_option(cost_model)
    scfg = SearchConfig(budget=budget, seconds=seconds, templates=names(templates),
                        regime=regime, parallel=parallel, seed=seed, cost_model=cost_model)
    job = SearchJob(matrix=str(matrix), op=op, k=k, search=scfg, model=str(model) if model else None,
                    temperature=temperature, header_grammar=header_grammar, fill_facts=fill_facts,
                    max_new_tokens=max_new_tokens,
                    device=device, store=store or None,
                    out=str(out) if out else None, compile_only=compile_only, retime=retime)
    rep, res = search_matrix(job)
    typer.echo(f"{res.evaluated} candidates in {res.seconds:.1f} s (stopped: {res.stopped})")
    typer.echo(f"{rep.verdict} [{rep.source}]")
    if not res.timed:
        typer.echo("nothing was timed (no GPU): the best-known store was not updated "
                   "(only verified kernels enter it)")
    else:
        typer.echo("store: " + store_line(res))
    typer.echo(f"wrote {rep.out}/kernel.cu, launch.json, report.md, report.json, trace.jsonl")
