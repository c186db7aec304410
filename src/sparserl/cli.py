"""The ``sparserl`` command: one thin subcommand per pipeline stage.

Library code raises :class:`sparserl.errors.SparseRLError` for bad input; :func:`main`
turns that into a one-line ``error: ...`` message and exit status 2.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

import typer

from sparserl.errors import SparseRLError
from sparserl.harness.cli import baseline, check_kernel
from sparserl.kernels.cli import app as library_app
from sparserl.matrices.cli import app as matrix_app
from sparserl.search.cli import best_app, search_cmd

app = typer.Typer(
    name="sparserl",
    help=(
        "SparseRL: train language models to write sparse CUDA kernels (SpMV, SpMM) specialised "
        "to one matrix, and hand back a verified kernel that beats cuSPARSE on it.\n\n"
        "Stages available now: 'matrix' (load, inspect, generate sparse matrices), 'library' "
        "(the reference kernel library: list, render, compile), 'check-kernel' (the evaluation "
        "harness: compile, verify, time against cuSPARSE), 'baseline' (cuSPARSE's time), 'pretrain' "
        "(stage 1: tokenizer and model pre-trained on the CUDA corpus), 'data build' (SFT pairs from the "
        "library, checked by the harness), 'sft' (stage 2), 'ppo' / 'grpo' (stage 3) and 'generate' (the main job: a verified kernel for your matrix), 'search' (a budgeted search of the kernel space for one matrix), 'best' (the best-known kernels: list, show, export as SFT pairs), 'evaluate' (systems side by side) and 'demo' (all of it, small)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(matrix_app, name="matrix")
app.add_typer(library_app, name="library")
app.command("check-kernel")(check_kernel)
app.command("baseline")(baseline)
app.command("search")(search_cmd)
app.add_typer(best_app, name="best")


if importlib.util.find_spec("torch") is not None:  # the [train] extra; the rest of the CLI does not need it
    from sparserl.train.cli import (
        data_app,
        demo_cmd,
        evaluate_cmd,
        generate_cmd,
        grpo_cmd,
        ppo_cmd,
        pretrain_cmd,
        rescore_cmd,
        sft_cmd,
    )

    app.command("demo")(demo_cmd)
    app.command("generate")(generate_cmd)
    app.command("evaluate")(evaluate_cmd)
    app.command("rescore")(rescore_cmd)
    app.command("pretrain")(pretrain_cmd)
    app.add_typer(data_app, name="data")
    app.command("sft")(sft_cmd)
    app.command("ppo")(ppo_cmd)
    app.command("grpo")(grpo_cmd)
else:
    @app.command("pretrain")
    def _pretrain_missing() -> None:
        """Stage 1: pre-train (needs the train extra: pip install -e '.[train]')."""
        raise SparseRLError("the training stages need torch and transformers: pip install -e '.[train]'")


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show debug logging.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )


def main() -> None:
    """Console entry point: run the Typer app, print user errors as one line."""
    try:
        rc = app(standalone_mode=False)  # click returns a command's exit code instead of raising
        sys.exit(rc if isinstance(rc, int) else 0)
    except SparseRLError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except Exception as exc:  # click usage errors come through here in non-standalone mode
        if isinstance(exc, _click_errors()):
            exc.show()
            sys.exit(exc.exit_code)
        raise


def _click_errors() -> tuple[type, ...]:
    """Click's usage-error class, and the copy of click that newer typer releases vendor
    (``typer._click``): a missing file argument raises the latter, which is not a subclass."""
    types: list[type] = []
    try:
        import click

        types.append(click.ClickException)
    except ImportError:
        pass
    try:
        from typer._click.exceptions import ClickException

        types.append(ClickException)
    except ImportError:
        pass
    return tuple(types)


if __name__ == "__main__":
    main()
