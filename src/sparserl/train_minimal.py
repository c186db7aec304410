"""Compatibility with the paper's release: ``python -m sparserl.train_minimal``.

    python -m sparserl.train_minimal --steps 1 --max-nnz 128 --model-path P --tokenizer-path P

Runs PPO as the release does: the policy at ``--model-path`` (a HF model folder or a
policy checkpoint; the tokenizer must live in the same folder, as ``--tokenizer-path``
says), on matrices from ``--matrices`` (default: 8 generated ones), rewards from the
harness (compile-only without a GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sparserl.errors import SparseRLError


def main(argv: list[str] | None = None) -> int:
    from sparserl.train_sft import HelpFormat

    ap = argparse.ArgumentParser(prog="python -m sparserl.train_minimal", description=__doc__,
                                 formatter_class=HelpFormat)
    ap.add_argument("--steps", type=int, default=1, help="PPO steps")
    ap.add_argument("--max-nnz", type=int, default=128, help="coordinate tokens per matrix")
    ap.add_argument("--model-path", type=Path, required=True, help="HF model folder or policy checkpoint")
    ap.add_argument("--tokenizer-path", type=Path, default=None, help="must be --model-path (the tokenizer is "
                                                                      "saved with the model; default: the same)")
    ap.add_argument("--matrices", type=Path, default=None, help="folder of matrices (default: generate 8)")
    ap.add_argument("--out", type=Path, default=Path("runs/train_minimal"), help="output folder")
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="longest completion, in tokens")
    ap.add_argument("--compile-only", action="store_true", help="compile rewards only (the default without a GPU)")
    ap.add_argument("--force", action="store_true", help="overwrite an earlier run in --out")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from sparserl.progress import quiet_foreign_bars

    quiet_foreign_bars()
    try:
        from sparserl.devices import compile_only_or_fallback
        from sparserl.matrices import generate, save_matrix
        from sparserl.rl.trainer import RLConfig, train_rl
        from sparserl.runs import check_output

        if args.tokenizer_path and args.tokenizer_path.resolve() != args.model_path.resolve():
            raise SparseRLError("--tokenizer-path must be the model folder (the tokenizer is saved with the model)")
        check_output(args.out, "ppo", args.force)
        compile_only, note = compile_only_or_fallback(args.compile_only)
        if note:
            print(f"note: {note}", file=sys.stderr)
        mats = args.matrices
        if mats is None:
            mats = args.out / "matrices"
            mats.mkdir(parents=True, exist_ok=True)
            for i, fam in enumerate(("banded", "stencil2d", "random", "block", "powerlaw", "diagonal",
                                     "skewed", "empty_rows")):
                f = mats / f"{fam}.npz"
                if not f.exists():
                    save_matrix(generate(fam, 20_000, seed=i), f)
        cfg = RLConfig(algo="ppo", model=str(args.model_path), matrices=str(mats), out=str(args.out),
                       steps=args.steps, max_nnz=args.max_nnz, matrices_per_step=4, samples_per_matrix=2, minibatch=4,
                       max_new_tokens=args.max_new_tokens, eval_every=max(args.steps, 1), save_every=max(args.steps, 1),
                       compile_only=compile_only)
        print(json.dumps(train_rl(cfg), indent=1, default=str))
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
