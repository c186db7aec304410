"""The ``sparserl`` command line: one module per command group (``search``, ``best``, ``pretrain``,
``data``, ``sft``, ``rl``, ``generate``, ``evaluate``, ``demo``, ``improve``; ``paper`` holds the
paper's script-style entry points), registered on the root command in :mod:`.app`."""

from sparserl.cli.app import app, command, main

__all__ = ["app", "command", "main"]
