"""The paper's release's script-style entry points, with its flags: ``python -m sparserl.train_sft``
(:func:`train_sft`, :data:`SFT_HELP`) and ``python -m sparserl.train_minimal`` (:func:`train_minimal`,
:data:`MINIMAL_HELP`). Both print their result as JSON, and a bad input as one ``error: ...`` line
(exit status 2), as ``sparserl`` does."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sparserl.data.sft_build import SFTDataConfig, build_sft_data
from sparserl.devices import compile_only_or_fallback
from sparserl.errors import SparseRLError
from sparserl.matrices import generate, save_matrix
from sparserl.progress import quiet_foreign_bars
from sparserl.rl.config import RLConfig
from sparserl.runs import check_output
from sparserl.train.config import SFTConfig

log = logging.getLogger(__name__)

SFT = SFTConfig()

SFT_HELP = """Compatibility with the paper's release: supervised fine-tuning.

    python -m sparserl.train_sft --dataset-dir DIR --max-nnz 128 --steps 2   # from .mtx files
    python -m sparserl.train_sft --data FILE.jsonl --steps 2                   # paper's JSONL schema

``--dataset-dir`` builds SFT data from the matrices in DIR with the reference library
(verified on a GPU, compile-only without one), then fine-tunes. The model is
``--model-path`` (default: ``runs/pretrain/model``); when there is none yet, the embedded
default is initialised from scratch (random weights, a tokenizer trained on the corpus),
with a warning that ``sparserl pretrain`` gives a useful model.
"""

MINIMAL_HELP = """Compatibility with the paper's release: PPO.

    python -m sparserl.train_minimal --steps 1 --max-nnz 128 --model-path P --tokenizer-path P

Runs PPO as the release does: the policy at ``--model-path`` (a HF model folder or a
policy checkpoint; the tokenizer must live in the same folder, as ``--tokenizer-path``
says), on matrices from ``--matrices`` (default: 8 generated ones), rewards from the
harness (compile-only without a GPU).
"""
MINIMAL_FAMILIES = ("banded", "stencil2d", "random", "block", "powerlaw", "diagonal", "skewed", "empty_rows")
"""The matrices ``train_minimal`` generates when no ``--matrices`` folder is given (20,000 rows each)."""


class HelpFormat(argparse.RawDescriptionHelpFormatter):
    """The description as written, and every option's default in its help (an on/off flag is off
    unless given; a help text that names its default already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _start(args: argparse.Namespace, stage: str) -> bool:
    """Logging, the output check and the no-GPU fallback every entry point starts with; returns compile_only."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_foreign_bars()
    check_output(args.out, stage, args.force)
    compile_only, note = compile_only_or_fallback(args.compile_only)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return compile_only


def _run(fn, args: argparse.Namespace) -> int:
    """``fn(args)``'s result printed as JSON; a SparseRLError as one line (exit status 2)."""
    try:
        print(json.dumps(fn(args), indent=1, default=str))
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _sft(args: argparse.Namespace) -> dict:
    from sparserl.train.pretrain import untrained_model  # torch
    from sparserl.train.sft import sft

    compile_only = _start(args, "sft")
    model = args.model_path
    if not (model / "config.json").exists() and not (model / "policy.json").exists():
        log.warning("no model at %s: initialising the embedded default from scratch "
                    "(run 'sparserl pretrain' for a useful model)", model)
        model = untrained_model(args.out / "init_model")
    data = args.data
    if args.dataset_dir is not None:
        build_sft_data(SFTDataConfig(out=str(args.out / "data"), matrices_per_family=0, real_dir=str(args.dataset_dir),
                                     real_split="mixed", compile_only=compile_only, test_fraction=0.0,
                                     val_fraction=0.2, coords=args.max_nnz))
        data = args.out / "data"
    return sft(SFTConfig(data=str(data), model=str(model), out=str(args.out), steps=args.steps,
                         batch_size=args.batch_size, lr=args.lr, max_nnz=args.max_nnz, device=args.device,
                         compile_only=compile_only, eval_samples=args.eval_samples,
                         eval_every=max(args.steps, 1), save_every=max(args.steps, 1)))


def train_sft(argv: list[str] | None = None) -> int:
    """``python -m sparserl.train_sft``: SFT with the paper's flags."""
    ap = argparse.ArgumentParser(prog="python -m sparserl.train_sft", description=SFT_HELP,
                                 formatter_class=HelpFormat)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset-dir", type=Path, help="folder of .mtx/.mtx.gz/.npz matrices (this or --data)")
    src.add_argument("--data", type=Path, help="SFT JSONL (rows, cols, shape, format, code)")
    ap.add_argument("--max-nnz", type=int, default=SFT.max_nnz, help="coordinate tokens per matrix")
    ap.add_argument("--steps", type=int, default=SFT.steps, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=SFT.batch_size, help="(matrix, kernel) pairs per step")
    ap.add_argument("--lr", type=float, default=SFT.lr, help="peak learning rate")
    ap.add_argument("--model-path", type=Path, default=Path(SFT.model),
                    help="HF model folder or policy checkpoint (nothing there: the embedded model, untrained)")
    ap.add_argument("--out", type=Path, default=Path(SFT.out), help="output folder")
    ap.add_argument("--device", default=SFT.device, help="auto, cpu or cuda[:N]")
    ap.add_argument("--compile-only", action="store_true", help="compile-only checks (the default without a GPU)")
    ap.add_argument("--eval-samples", type=int, default=8, help="validation rows checked at the end")
    ap.add_argument("--force", action="store_true", help="overwrite an earlier run in --out")
    return _run(_sft, ap.parse_args(argv))


def _minimal(args: argparse.Namespace) -> dict:
    from sparserl.rl.trainer import train_rl  # torch

    if args.tokenizer_path and args.tokenizer_path.resolve() != args.model_path.resolve():
        raise SparseRLError("--tokenizer-path must be the model folder (the tokenizer is saved with the model)")
    compile_only = _start(args, "ppo")
    mats = args.matrices
    if mats is None:
        mats = args.out / "matrices"
        mats.mkdir(parents=True, exist_ok=True)
        for i, fam in enumerate(MINIMAL_FAMILIES):
            f = mats / f"{fam}.npz"
            if not f.exists():
                save_matrix(generate(fam, 20_000, seed=i), f)
    return train_rl(RLConfig(algo="ppo", model=str(args.model_path), matrices=str(mats), out=str(args.out),
                             steps=args.steps, max_nnz=args.max_nnz, matrices_per_step=4, samples_per_matrix=2,
                             minibatch=4, max_new_tokens=args.max_new_tokens, eval_every=max(args.steps, 1),
                             save_every=max(args.steps, 1), compile_only=compile_only))


def train_minimal(argv: list[str] | None = None) -> int:
    """``python -m sparserl.train_minimal``: PPO with the paper's flags."""
    ap = argparse.ArgumentParser(prog="python -m sparserl.train_minimal", description=MINIMAL_HELP,
                                 formatter_class=HelpFormat)
    ap.add_argument("--steps", type=int, default=1, help="PPO steps")
    ap.add_argument("--max-nnz", type=int, default=RLConfig.max_nnz, help="coordinate tokens per matrix")
    ap.add_argument("--model-path", type=Path, required=True, help="HF model folder or policy checkpoint")
    ap.add_argument("--tokenizer-path", type=Path, default=None, help="must be --model-path (the tokenizer is "
                                                                      "saved with the model; default: the same)")
    ap.add_argument("--matrices", type=Path, default=None, help="folder of matrices (default: generate 8)")
    ap.add_argument("--out", type=Path, default=Path("runs/train_minimal"), help="output folder")
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="longest completion, in tokens")
    ap.add_argument("--compile-only", action="store_true", help="compile rewards only (the default without a GPU)")
    ap.add_argument("--force", action="store_true", help="overwrite an earlier run in --out")
    return _run(_minimal, ap.parse_args(argv))
