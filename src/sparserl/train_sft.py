"""Compatibility with the paper's release: ``python -m sparserl.train_sft``.

    python -m sparserl.train_sft --dataset-dir DIR --max-nnz 128 --steps 2   # from .mtx files
    python -m sparserl.train_sft --data FILE.jsonl --steps 2                   # paper's JSONL schema

``--dataset-dir`` builds SFT data from the matrices in DIR with the reference library
(verified on a GPU, compile-only without one), then fine-tunes. The model is
``--model-path`` (default: ``runs/pretrain/model``); when there is none yet, the embedded
default is initialised from scratch (random weights, a tokenizer trained on the corpus),
with a warning that ``sparserl pretrain`` gives a useful model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sparserl.errors import SparseRLError

log = logging.getLogger("sparserl.train_sft")


def init_default_model(folder: Path) -> Path:
    """The embedded default model with random weights and a corpus-trained tokenizer, saved to ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparserl.data.corpus import CorpusConfig, build_corpus
    from sparserl.model.config import hf_config
    from sparserl.model.tokenizer import train_tokenizer

    if (folder / "config.json").exists():
        return folder
    corpus = build_corpus(CorpusConfig(max_bytes=4 << 20))
    tok = train_tokenizer(corpus.train, vocab_size=8192)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(len(tok), bos_token_id=tok.bos_token_id,
                                                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


class HelpFormat(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and every option's default in its help (an on/off flag
    is off unless given; a help text that names its default already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparserl.train_sft", description=__doc__, formatter_class=HelpFormat)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset-dir", type=Path, help="folder of .mtx/.mtx.gz/.npz matrices (this or --data)")
    src.add_argument("--data", type=Path, help="SFT JSONL (rows, cols, shape, format, code)")
    ap.add_argument("--max-nnz", type=int, default=128, help="coordinate tokens per matrix")
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=8, help="(matrix, kernel) pairs per step")
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    ap.add_argument("--model-path", type=Path, default=Path("runs/pretrain/model"),
                    help="HF model folder or policy checkpoint (nothing there: the embedded model, untrained)")
    ap.add_argument("--out", type=Path, default=Path("runs/sft"), help="output folder")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    ap.add_argument("--compile-only", action="store_true", help="compile-only checks (the default without a GPU)")
    ap.add_argument("--eval-samples", type=int, default=8, help="validation rows checked at the end")
    ap.add_argument("--force", action="store_true", help="overwrite an earlier run in --out")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from sparserl.progress import quiet_foreign_bars

    quiet_foreign_bars()
    try:
        from sparserl.devices import compile_only_or_fallback
        from sparserl.runs import check_output
        from sparserl.train.sft import SFTConfig, sft

        check_output(args.out, "sft", args.force)
        compile_only, note = compile_only_or_fallback(args.compile_only)
        if note:
            print(f"note: {note}", file=sys.stderr)
        model = args.model_path
        if not (model / "config.json").exists() and not (model / "policy.json").exists():
            log.warning("no model at %s: initialising the embedded default from scratch "
                        "(run 'sparserl pretrain' for a useful model)", model)
            model = init_default_model(args.out / "init_model")
        data = args.data
        if args.dataset_dir is not None:
            from sparserl.data.sft_build import SFTDataConfig, build_sft_data

            build_sft_data(SFTDataConfig(out=str(args.out / "data"), matrices_per_family=0,
                                         real_dir=str(args.dataset_dir), real_split="mixed", compile_only=compile_only,
                                         test_fraction=0.0, val_fraction=0.2, coords=args.max_nnz))
            data = args.out / "data"
        cfg = SFTConfig(data=str(data), model=str(model), out=str(args.out), steps=args.steps,
                        batch_size=args.batch_size, lr=args.lr, max_nnz=args.max_nnz, device=args.device,
                        compile_only=compile_only, eval_samples=args.eval_samples,
                        eval_every=max(args.steps, 1), save_every=max(args.steps, 1))
        print(json.dumps(sft(cfg), indent=1, default=str))
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
