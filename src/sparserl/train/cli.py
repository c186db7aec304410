"""``sparserl pretrain``: stage 1 from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def pretrain_cmd(
    out: Path = typer.Option(Path("runs/pretrain"), help="output folder (model/, state.pt, metrics.jsonl)"),
    model: Path = typer.Option(None, help="continue pre-training this local HF model (default: train the "
                                          "embedded default model and its tokenizer from scratch)"),
    steps: int = typer.Option(2000, help="optimizer steps"),
    batch_size: int = typer.Option(32, help="sequences per step"),
    seq_len: int = typer.Option(512, help="tokens per sequence"),
    lr: float = typer.Option(1e-3, help="peak learning rate (warm-up, then cosine decay)"),
    vocab_size: int = typer.Option(8192, help="BPE vocabulary when training the tokenizer from scratch"),
    device: str = typer.Option("auto", help="auto, cpu or cuda[:N]"),
    resume: bool = typer.Option(False, help="continue from OUT/state.pt"),
    seed: int = typer.Option(0),
) -> None:
    """Stage 1: pre-train on the CUDA corpus found on this machine (toolkit headers + kernel library)."""
    from sparserl.train.pretrain import PretrainConfig, pretrain

    cfg = PretrainConfig(out=str(out), model=str(model) if model else None, steps=steps, batch_size=batch_size,
                         seq_len=seq_len, lr=lr, vocab_size=vocab_size, device=device, resume=resume, seed=seed)
    result = pretrain(cfg)
    typer.echo(json.dumps(result, indent=1))
