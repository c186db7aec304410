"""``sparserl pretrain``: stage 1 (the defaults are :class:`~sparserl.train.config.PretrainConfig`'s)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sparserl.cli.common import defaults
from sparserl.runs import check_output
from sparserl.train.config import PretrainConfig

D = defaults(PretrainConfig)


def pretrain_cmd(
    out: Path = typer.Option(Path(D.out), help="output folder (model/, state.pt, metrics.jsonl)"),
    model: Path = typer.Option(None, help="continue pre-training this local HF model [default: train the "
                                          "embedded default model and its tokenizer from scratch]"),
    steps: int = typer.Option(D.steps, help="optimizer steps (on a CPU try 200: see the README)"),
    batch_size: int = typer.Option(D.batch_size, help="sequences per step"),
    seq_len: int = typer.Option(D.seq_len, help="tokens per sequence"),
    lr: float = typer.Option(D.lr, help="peak learning rate (warm-up, then cosine decay)"),
    vocab_size: int = typer.Option(D.vocab_size, help="BPE vocabulary when training the tokenizer from scratch"),
    device: str = typer.Option(D.device, help="auto, cpu or cuda[:N]"),
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/state.pt"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
    seed: int = typer.Option(D.seed, help="random seed"),
) -> None:
    """Stage 1: pre-train on the CUDA corpus found on this machine (toolkit headers + kernel library)."""
    from sparserl.train.pretrain import pretrain  # torch

    check_output(out, "pretrain", force, resume)
    cfg = PretrainConfig(out=str(out), model=str(model) if model else None, steps=steps, batch_size=batch_size,
                         seq_len=seq_len, lr=lr, vocab_size=vocab_size, device=device, resume=resume, seed=seed)
    typer.echo(json.dumps(pretrain(cfg), indent=1))
