"""The root ``sparserl`` command: its command groups, its help, and how it ends.

Each group of commands is a module of this package; :data:`app` registers them (the model-side
ones only where torch is installed, the ``train`` extra). Library code raises
:class:`sparserl.errors.SparseRLError` for bad input; :func:`main` turns that into a one-line
``error: ...`` message and exit status 2.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import sys

import typer

from sparserl import __version__, interrupts
from sparserl.cli import (
    best,
    check,
    corpus,
    data,
    demo,
    evaluate,
    farm,
    generate,
    improve,
    library,
    matrix,
    pretrain,
    rl,
    search,
    sft,
)
from sparserl.errors import SparseRLError
from sparserl.progress import quiet_foreign_bars

app = typer.Typer(
    name="sparserl",
    help=(
        "SparseRL: train language models to write sparse CUDA kernels (SpMV, SpMM) specialised "
        "to one matrix, and hand back a verified kernel that beats cuSPARSE on it.\n\n"
        "Stages available now: 'matrix' (load, inspect, generate sparse matrices), 'library' "
        "(the reference kernel library: list, render, compile), 'check-kernel' (the evaluation "
        "harness: compile, verify, time against cuSPARSE), 'baseline' (cuSPARSE's time), 'pretrain' "
        "(stage 1: tokenizer and model pre-trained on the CUDA corpus), 'data build' (SFT pairs from the "
        "library, checked by the harness), 'sft' (stage 2), 'ppo' / 'grpo' (stage 3), 'improve' (expert "
        "iteration: search, fine-tune on the kernels found, keep what validates better), 'generate' (the main "
        "job: a verified kernel for your matrix), 'search' (a budgeted search of the kernel space for one "
        "matrix), 'best' (the best-known kernels: list, show, export as SFT pairs), 'evaluate' (systems side "
        "by side), 'rescore' (recompute a saved evaluation), 'corpus' (the CUDA pre-training corpus: build, pack), "
        "'farm' (searches of many matrices over Ray) and 'demo' (all of it, small)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
app.add_typer(matrix.app, name="matrix")
app.add_typer(library.app, name="library")
app.command("check-kernel")(check.check_kernel)
app.command("baseline")(check.baseline)
app.command("search")(search.search_cmd)
app.add_typer(best.app, name="best")
app.command("farm")(farm.farm_cmd)
app.add_typer(corpus.app, name="corpus")


def _add_model_commands() -> None:
    """The commands that need torch (the train extra) to run."""
    app.command("demo")(demo.demo_cmd)
    app.command("generate")(generate.generate_cmd)
    app.command("evaluate")(evaluate.evaluate_cmd)
    app.command("rescore")(evaluate.rescore_cmd)
    app.command("pretrain")(pretrain.pretrain_cmd)
    app.add_typer(data.app, name="data")
    app.command("sft")(sft.sft_cmd)
    app.command("ppo", cls=rl.RLCommand)(rl.ppo_cmd)
    app.command("grpo", cls=rl.RLCommand)(rl.grpo_cmd)
    app.command("improve")(improve.improve_cmd)


if importlib.util.find_spec("torch") is not None:  # the [train] extra; the rest of the CLI does not need it
    _add_model_commands()
else:
    @app.command("pretrain")
    def _pretrain_missing() -> None:
        """Stage 1: pre-train (needs the train extra: pip install -e '.[train]')."""
        raise SparseRLError("the training stages need torch and transformers: pip install -e '.[train]'")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"sparserl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show debug logging."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                 help="Print the version and exit."),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=log_format(os.environ),
                        datefmt="%H:%M:%S")
    quiet_foreign_bars()


LOG_TIME = "SPARSERL_LOG_TIME"
"""Set (to anything but empty or 0) to begin each log line with its wall-clock time: long scripts'
logs then show where their time went."""


def log_format(env) -> str:
    """The log lines' format: level, logger and message, after the time when ``env`` sets LOG_TIME."""
    timed = env.get(LOG_TIME, "") not in ("", "0")
    return ("%(asctime)s " if timed else "") + "%(levelname)s %(name)s: %(message)s"


def command():
    """The click command behind ``sparserl``, with its help tidied: no type placeholder
    (``<bool>``) beside on/off flags (``--help`` included), no "[default: False]" on a flag
    that is off unless given, and a default written into an option's help text (an option
    whose default is not a plain value) shown as text rather than read as rich markup, and each
    command's summary in a list of commands on one line (wrapped to the terminal, not where its
    docstring's lines broke)."""
    cmd = typer.main.get_command(app)
    _tidy_help(cmd)
    return cmd


def _tidy_help(cmd) -> None:
    for param in cmd.params:
        help_text = getattr(param, "help", None)
        if help_text and "[default:" in help_text and "\\[default:" not in help_text:
            param.help = help_text.replace("[default:", "\\[default:")  # a default written in the text, not markup
        if getattr(param, "is_flag", False):
            param.metavar = ""
            if not param.secondary_opts and not param.default:
                param.show_default = False
    help_option = cmd.get_help_option(cmd.context_class(cmd))
    if help_option is not None:
        help_option.metavar = ""
    for sub in getattr(cmd, "commands", {}).values():
        if sub.short_help is None and sub.help:  # the list of commands keeps a docstring's line breaks:
            first = inspect.cleandoc(sub.help).split("\n\n")[0]  # its first paragraph, as one line
            sub.short_help = " ".join(first.split())
        _tidy_help(sub)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the command; user errors, usage errors, Ctrl-C and a kill
    (SIGTERM) print one ``error: ...`` line (exit status 2; 130 when interrupted), never a
    traceback, and leave no partial file behind. An interrupt that something swallowed where it
    landed still ends the command as interrupted (:mod:`sparserl.interrupts`)."""
    with interrupts.watch():
        _run(argv)


def _run(argv: list[str] | None) -> None:
    try:
        # click returns a command's exit code instead of raising in non-standalone mode
        rc = command()(args=argv, prog_name="sparserl", standalone_mode=False)
        if rc == 130 or interrupts.seen():  # newer typer turns Ctrl-C into this exit status, silently
            typer.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(rc if isinstance(rc, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors come through here in non-standalone mode
        if interrupts.seen():  # the interrupt, turned into another error where it landed (a C extension's
            typer.echo("error: interrupted", err=True)  # import fails with "initialization failed")
            sys.exit(130)
        if isinstance(exc, SparseRLError):
            typer.echo(f"error: {exc}", err=True)
            sys.exit(2)
        if type(exc).__name__ == "NoArgsIsHelpError":  # 'sparserl' or 'sparserl matrix' alone: the help, shown
            sys.exit(0)
        if isinstance(exc, _click_errors()):
            typer.echo(f"error: {_usage_message(exc)}", err=True)
            sys.exit(exc.exit_code)
        if isinstance(exc, OSError):  # a path the machine refuses (not a folder, no permission, disk full)
            typer.echo(f"error: {_os_message(exc)}", err=True)
            sys.exit(2)
        raise


def _os_message(exc: OSError) -> str:
    """An operating-system error as one line: the path(s) it names and the system's words."""
    what = exc.strerror or " ".join(str(exc).split())
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    return f"{': '.join(str(p) for p in paths)}: {what}" if paths else what


def _usage_message(exc) -> str:
    """A click usage error as one line, with where to read the command's help."""
    msg = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        msg += f" (see '{ctx.command_path} --help')"
    return msg


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
