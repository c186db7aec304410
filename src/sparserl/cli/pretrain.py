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
    corpus: Path = typer.Option(None, help="a built corpus (sparserl corpus build) or its pack (sparserl corpus "
                                           "pack) [default: the toolkit headers and kernel library on this machine]"),
    preset: str = typer.Option("default", help="shape of a model trained from scratch: default (about 29M "
                                               "parameters) or base (about 210M, for a GPU)"),
    minutes: float = typer.Option(None, help="wall-clock budget of the training loop: stop after it with a "
                                             "checkpoint and an evaluation [default: none, --steps decides]"),
    warmup_steps: int = typer.Option(D.warmup_steps, help="steps of linear learning-rate warm-up"),
    eval_every: int = typer.Option(D.eval_every, help="steps between held-out evaluations"),
    heldout_tokens: int = typer.Option(D.heldout_tokens, help="held-out tokens scored per held-out package "
                                                              "(at most)"),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the model (CUDA only)"),
    peak_tflops: float = typer.Option(None, help="peak dense bf16 TFLOP/s for MFU [default: from the GPU's name, "
                                                 "H100/H200: 989]"),
) -> None:
    """Stage 1: pre-train on a CUDA corpus: the one built from the package index (--corpus), or the toolkit
    headers and kernel library found on this machine."""
    from sparserl.train.pretrain import pretrain  # torch

    check_output(out, "pretrain", force, resume)
    cfg = PretrainConfig(out=str(out), model=str(model) if model else None, steps=steps, batch_size=batch_size,
                         seq_len=seq_len, lr=lr, vocab_size=vocab_size, device=device, resume=resume, seed=seed,
                         corpus_dir=str(corpus) if corpus else None, preset=preset, minutes=minutes,
                         warmup_steps=warmup_steps, eval_every=eval_every, heldout_tokens=heldout_tokens,
                         compile=compile, peak_tflops=peak_tflops)
    typer.echo(json.dumps(pretrain(cfg), indent=1))
