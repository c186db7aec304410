"""``sparserl evaluate`` and ``sparserl rescore`` (the defaults are :class:`~sparserl.eval.compare.EvalConfig`'s)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from sparserl.cli.common import HEADER_GRAMMAR_HELP, defaults, fallback, names
from sparserl.eval.compare import EvalConfig, evaluate
from sparserl.eval.rescore import rescore
from sparserl.runs import check_output

D = defaults(EvalConfig)


def evaluate_cmd(
    matrices: str = typer.Option(D.matrices, help="data folder (uses --split), a folder of matrices, or 'families'"),
    split: str = typer.Option(D.split, help="split of a data folder: train, val or test"),
    real_matrices: str = typer.Option(D.real_matrices, help="of a data folder's split: all its matrices, only "
                                      "the real ones (data build --real-dir) or none of those"),
    checkpoint: list[str] = typer.Option([], "--checkpoint", "-c", help="NAME=PATH of a policy (repeatable) "
                                                                        "[default: none, baselines only]"),
    baselines: str = typer.Option(",".join(D.baselines), help="comma-separated: cusparse, oracle, selector"),
    op: str = typer.Option(D.op, help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
    samples: int = typer.Option(D.samples, help="completions per matrix per checkpoint (pass@k uses them)"),
    temperature: float = typer.Option(D.temperature, help="sampling temperature (> 0)"),
    system_temperature: list[str] = typer.Option([], "--system-temperature", help="NAME=T: sample the checkpoint "
                                                 "named NAME at T instead (repeatable; give one checkpoint twice "
                                                 "under two names to compare temperatures side by side)"),
    header_grammar: bool = typer.Option(D.header_grammar, "--header-grammar", help=HEADER_GRAMMAR_HELP),
    max_new_tokens: int = typer.Option(D.max_new_tokens, help="longest completion, in tokens [default: the longest library "
                                                       "kernel in the policy's tokens, plus a margin]"),
    family_rows: int = typer.Option(D.family_rows, help="rows of each generated matrix with --matrices families"),
    limit: int = typer.Option(D.limit, help="at most this many matrices of a data split or folder, evenly spaced "
                                            "(0: all)"),
    gen_batch: int = typer.Option(D.gen_batch, help="completions generated together"),
    out: Path = typer.Option(Path(D.out), help="output folder (eval.md, eval.json, plots)"),
    retime: int = typer.Option(D.retime, help="passes of a second look: each system's best kernel per matrix timed "
                               "again side by side with the others', fresh (0: none; 3 is enough to read "
                               "ratios between systems within the timing noise)"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile rates only; the default without a GPU"),
    no_plots: bool = typer.Option(False, "--no-plots", help="write no plots"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier evaluation in OUT"),
    distinct_from: list[Path] = typer.Option(None, "--distinct-from", help="a folder of the policies' training "
                                             "matrices (a data folder): refuse the set if one of its matrices has "
                                             "one of their structures (repeatable) [default: none]"),
) -> None:
    """Evaluate checkpoints and baselines side by side: pass@k, fast_p, speedup, per family, plots."""
    check_output(out, "evaluate", force)
    cfg = EvalConfig(matrices=matrices, split=split, real_matrices=real_matrices, checkpoints=tuple(checkpoint),
                     baselines=names(baselines), op=op,
                     k=k, samples=samples, temperature=temperature, system_temperatures=tuple(system_temperature),
                     header_grammar=header_grammar,
                     max_new_tokens=max_new_tokens, family_rows=family_rows, limit=limit, gen_batch=gen_batch, out=str(out),
                     plots=not no_plots, distinct_from=tuple(map(str, distinct_from or ())), retime=retime)
    res = evaluate(dataclasses.replace(cfg, compile_only=fallback(compile_only)))
    typer.echo((out / "eval.md").read_text())
    typer.echo(f"wrote {out}/eval.json, eval.md" + (", plots" if res.get("plots") else ""))


def rescore_cmd(
    folder: Path = typer.Argument(..., help="a 'sparserl evaluate' output folder"),
) -> None:
    """Recompute an evaluation's summary and eval.md from its eval.json and completions.jsonl (no GPU)."""
    rescore(folder)
    typer.echo((folder / "eval.md").read_text())
