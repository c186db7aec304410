"""The ``sparserl`` command line: one module per command group (``matrix``, ``library``, ``check``
(check-kernel, baseline), ``search``, ``best``, ``farm``, ``corpus``, ``pretrain``, ``data``,
``sft``, ``rl``, ``generate``, ``evaluate``, ``demo``, ``improve``; ``paper`` holds the paper's
script-style entry points), registered on the root command in :mod:`.root`.

This module stays light: :func:`main` loads the command line inside its own Ctrl-C handling, so an
interrupt while the libraries load (seconds on a busy machine) ends with the same one line as one
during a command."""

from __future__ import annotations

import signal
import sys

__all__ = ["app", "command", "main"]


def main(argv: list[str] | None = None) -> None:
    """The console entry point (``sparserl``): :func:`sparserl.cli.root.main`."""
    try:
        from sparserl.cli import root
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    try:
        root.main(argv)
    finally:
        if argv is None:  # the program itself (not a caller in this process): a Ctrl-C while it exits is moot
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def __getattr__(name: str):
    """``app`` (the root Typer command) and ``command()`` (its click command), loaded when asked for."""
    if name in ("app", "command"):
        from sparserl.cli import root

        return getattr(root, name)
    raise AttributeError(f"module 'sparserl.cli' has no attribute {name!r}")
