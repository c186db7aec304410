"""``sparserl demo``: the whole pipeline, small (the defaults are :class:`~sparserl.demo.DemoConfig`'s)."""

from __future__ import annotations

from pathlib import Path

import typer

from sparserl.cli.common import defaults, fallback
from sparserl.demo import DemoConfig, run_demo
from sparserl.runs import check_output

D = defaults(DemoConfig)


def demo_cmd(
    out: Path = typer.Option(Path(D.out), help="output folder"),
    tiny: bool = typer.Option(False, "--tiny", help="tiny model and data (minutes on a CPU)"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile-only rewards and checks; the "
                                                                    "default without a GPU"),
    real_matrix: Path = typer.Option(None, help="matrix for the final generate step [default: a generated "
                                                "3D 27-point stencil]"),
    seed: int = typer.Option(D.seed, help="random seed"),
    resume: bool = typer.Option(False, "--resume", help="skip the stages an earlier run in OUT finished; "
                                                        "continue the interrupted one"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
) -> None:
    """The whole pipeline, small: data, pretrain, SFT, PPO, evaluate, generate (on a CPU: --tiny --compile-only)."""
    check_output(out, "demo", force, resume)
    compile_only = fallback(compile_only)
    if compile_only and not tiny:
        typer.echo("note: the default sizes are made for one H200 and take hours on a CPU; add --tiny for minutes",
                   err=True)
    rep = run_demo(DemoConfig(out=str(out), tiny=tiny, compile_only=compile_only,
                              real_matrix=str(real_matrix) if real_matrix else None, seed=seed,
                              resume=resume))
    typer.echo(f"demo finished in {rep['seconds']:.0f} s "
               f"(all stages, across resumed runs: {rep['stage_seconds']:.0f} s)")
    for name, path in rep["artefacts"].items():
        typer.echo(f"  {name:18} {path}")
    for line in rep["summary"]:
        typer.echo(line)
