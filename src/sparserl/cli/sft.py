"""``sparserl sft``: stage 2 (the defaults are :class:`~sparserl.train.config.SFTConfig`'s)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sparserl.cli.common import defaults, fallback
from sparserl.runs import check_output
from sparserl.train.config import SFTConfig

D = defaults(SFTConfig)


def sft_cmd(
    data: Path = typer.Option(Path(D.data), help="data folder (train.jsonl, val.jsonl) or a .jsonl file"),
    model: Path = typer.Option(Path(D.model), help="HF model folder or policy checkpoint"),
    out: Path = typer.Option(Path(D.out), help="output folder (checkpoint/, metrics.jsonl)"),
    steps: int = typer.Option(D.steps, help="optimizer steps"),
    batch_size: int = typer.Option(D.batch_size, help="(matrix, kernel) pairs per step"),
    lr: float = typer.Option(D.lr, help="peak learning rate (warm-up, then cosine decay)"),
    lora: bool = typer.Option(False, "--lora", help="LoRA adapters on a frozen base (for large models)"),
    lora_r: int = typer.Option(D.lora_r, help="LoRA rank (with --lora)"),
    max_nnz: int = typer.Option(D.max_nnz, help="coordinate tokens per matrix"),
    no_text_prompt: bool = typer.Option(False, "--no-text-prompt",
                                        help="leave shape and nonzeros out of the prompt text (soft tokens only)"),
    card: bool | None = typer.Option(None, "--card/--no-card",
                                     help="put the matrix card (exact structure facts) in the prompt; default: on "
                                          "for a new model, as trained for a policy checkpoint"),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing",
                                                help="recompute activations in the backward pass (less memory)"),
    max_batch_tokens: int = typer.Option(D.max_batch_tokens, help="most padded tokens per forward pass: a step's "
                                         "rows are split into micro-batches under it, gradients summed"),
    eval_every: int = typer.Option(D.eval_every, help="steps between validation checks through the harness"),
    eval_samples: int = typer.Option(D.eval_samples, help="validation rows sampled and checked at each validation"),
    eval_temperature: float = typer.Option(D.eval_temperature, help="sampling temperature of the validation (> 0)"),
    max_new_tokens: int = typer.Option(D.max_new_tokens, help="longest validation completion, in tokens [default: the longest library "
                                                       "kernel in the policy's tokens, plus a margin]"),
    save_every: int = typer.Option(D.save_every, help="steps between checkpoints"),
    snapshot: list[int] = typer.Option([], "--snapshot", help="also keep the policy after step N as "
                                       "OUT/checkpoint-stepN, to evaluate a shorter SFT beside the full one "
                                       "(repeatable; the learning rate still decays over --steps)"),
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/state.pt"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
    device: str = typer.Option(D.device, help="auto, cpu or cuda[:N]"),
    compile_only: bool = typer.Option(False, "--compile-only",
                                      help="validate by compiling only; the default without a GPU"),
    seed: int = typer.Option(D.seed, help="random seed"),
) -> None:
    """Stage 2: supervised fine-tuning on (matrix, kernel) pairs; validation through the harness."""
    from sparserl.train.sft import sft  # torch

    check_output(out, "sft", force, resume)
    cfg = SFTConfig(data=str(data), model=str(model), out=str(out), steps=steps, batch_size=batch_size, lr=lr,
                    lora=lora, lora_r=lora_r, max_nnz=max_nnz, text_prompt=not no_text_prompt, card=card,
                    gradient_checkpointing=gradient_checkpointing, max_batch_tokens=max_batch_tokens,
                    eval_every=eval_every, eval_samples=eval_samples,
                    eval_temperature=eval_temperature, max_new_tokens=max_new_tokens, save_every=save_every,
                    snapshots=tuple(snapshot), resume=resume, device=device, compile_only=fallback(compile_only),
                    seed=seed)
    typer.echo(json.dumps(sft(cfg), indent=1, default=str))
