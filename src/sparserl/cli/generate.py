"""``sparserl generate``: the main job (the defaults are :class:`~sparserl.generate.GenerateConfig`'s)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from sparserl.cli.common import FILL_FACTS_HELP, HEADER_GRAMMAR_HELP, RETIME_HELP, defaults, fallback
from sparserl.errors import SparseRLError
from sparserl.generate import GenerateConfig, generate_kernel, has_model

D = defaults(GenerateConfig)


def generate_cmd(
    matrix: Path = typer.Argument(..., help=".mtx, .mtx.gz or .npz"),
    op: str = typer.Option(D.op, help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
    model: Path = typer.Option(None, help="policy checkpoint or HF model folder; without one, the best library "
                                          "kernel is returned [default: runs/ppo/checkpoint, else the policy trained "
                                          "last under runs/]"),
    samples: int = typer.Option(D.samples, help="completions to sample and evaluate"),
    temperature: float = typer.Option(D.temperature, help="sampling temperature (> 0)"),
    header_grammar: bool = typer.Option(D.header_grammar, "--header-grammar", help=HEADER_GRAMMAR_HELP),
    fill_facts: bool = typer.Option(D.fill_facts, "--fill-facts/--no-fill-facts", help=FILL_FACTS_HELP),
    max_new_tokens: int = typer.Option(D.max_new_tokens, help="longest completion, in tokens [default: the longest library "
                                                       "kernel in the policy's tokens, plus a margin]"),
    out: Path = typer.Option(None, help="output folder [default: runs/generate/<matrix name>]"),
    no_library_fallback: bool = typer.Option(False, "--no-library-fallback",
                                             help="fail instead of returning a library kernel"),
    compile_only: bool = typer.Option(False, "--compile-only", help="the best compiling kernel, unverified; "
                                                                    "the default without a GPU"),
    device: str = typer.Option(D.device, help="auto, cpu or cuda[:N] (for the model)"),
    seed: int = typer.Option(D.seed, help="random seed"),
    search: int = typer.Option(D.search, "--search-budget", "--search",
                               help="then search N more candidates (templates, mutations, refinements) and return "
                                    "the best of all (0: no search)"),
    store: str = typer.Option(None, help="best-known store for the search: a file or postgresql:// URL "
                                         "[default: under the harness cache root]"),
    retime: int = typer.Option(D.retime, help=RETIME_HELP),
) -> None:
    """The main job: sample kernels for a matrix, verify and time them, write the best one and a report."""
    if model is not None:
        check_model_given(model)
    cfg = GenerateConfig(matrix=str(matrix), op=op, k=k, model=str(model) if model else None, samples=samples,
                         temperature=temperature, header_grammar=header_grammar, fill_facts=fill_facts,
                         max_new_tokens=max_new_tokens,
                         out=str(out) if out else None,
                         library_fallback=not no_library_fallback, device=device, seed=seed,
                         compile_only=compile_only, search=search, store=store or None, retime=retime)
    rep = generate_kernel(dataclasses.replace(cfg, compile_only=fallback(compile_only)))
    typer.echo(f"{rep.verdict} [{rep.source}]")
    for line in rep.notes:
        typer.echo(f"note: {line}")
    typer.echo(f"wrote {rep.out}/kernel.cu, launch.json, report.md, report.json in {rep.seconds:.1f} s")


def check_model_given(model: Path) -> None:
    """A ``--model`` given that holds no model is an error, not the library's kernel in silence (that is what
    leaving ``--model`` out asks for)."""
    if has_model(str(model)):
        return
    inside = [p.parent for p in (model / "checkpoint" / "policy.json", model / "best" / "policy.json") if p.exists()]
    hint = (f": did you mean {inside[0]}?" if inside else
            ": give a policy checkpoint (a folder with policy.json) or a Hugging Face model folder (config.json), "
            "or leave --model out for the best library kernel")
    where = "no such folder" if not model.exists() else "no model there"
    raise SparseRLError(f"--model {model}: {where}{hint}")

