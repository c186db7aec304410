"""Pre-train the base preset (about 210M parameters) and the default model (about 29M) for the same
wall-clock minutes on the same packed corpus, and write one JSON summary beside their runs:
tokens/s, MFU (6 N tokens/s over the GPU's dense bf16 peak, 989 TFLOP/s on an H100/H200), steps and
tokens trained, and held-out perplexity per held-out package (same tokenizer, so the two models'
perplexities compare directly): the packages held out whole, then the other packages' held-out shares.

Each model's run goes to OUT/<model>/ (a normal ``sparserl pretrain`` folder); the summary
OUT/pretrain_summary.json collects every run found under OUT, so the two models can be run by two
separate commands (``--models base`` then ``--models default``) and the second writes the whole table.

    python benchmarks/pretrain_base.py --pack PACK --out OUT --minutes 3
    python benchmarks/pretrain_base.py --pack PACK --out OUT --minutes 3 --models base --seq-len 4096 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sparserl.errors import SparseRLError

SUMMARY_KEYS = ("preset", "params", "steps", "tokens_trained", "seq_len", "batch_size", "tokens_per_s", "mfu",
                "peak_tflops", "device", "train_seconds", "wall_seconds", "stopped", "minutes", "losses/train",
                "eval/heldout_ppl", "eval/heldout_share_ppl", "heldout_ppl_by_package", "heldout_share_ppl_by_package",
                "heldout_whole_packages", "train_tokens")


def run_model(name: str, args) -> dict:
    from sparserl.train.pretrain import PretrainConfig, pretrain

    cfg = PretrainConfig(out=str(Path(args.out) / name), corpus_dir=args.pack, preset=name, minutes=args.minutes,
                         steps=args.max_steps, seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr,
                         warmup_steps=args.warmup_steps, eval_every=10 ** 9, save_every=10 ** 9,
                         heldout_tokens=args.heldout_tokens, device=args.device, compile=args.compile, seed=args.seed)
    return pretrain(cfg)


def summarise(out: Path) -> dict:
    runs = {}
    for res in sorted(out.glob("*/result.json")):
        r = json.loads(res.read_text())
        runs[res.parent.name] = {k: r.get(k) for k in SUMMARY_KEYS}
    whole = set().union(*(set(r["heldout_whole_packages"] or ()) for r in runs.values())) if runs else set()
    by_run = {m: {**(r["heldout_share_ppl_by_package"] or {}), **(r["heldout_ppl_by_package"] or {})}
              for m, r in runs.items()}
    packages = sorted({p for ppl in by_run.values() for p in ppl},
                      key=lambda p: (p not in whole, p))  # the packages held out whole first, then the shares
    table = {p: {m: ppl.get(p) for m, ppl in by_run.items()} for p in packages}
    return {"runs": runs, "heldout_ppl": table,
            "mfu_definition": "6 * N * tokens/s / peak; N = parameters (tied embedding once); peak = dense bf16 "
                              "(H100/H200: 989 TFLOP/s)"}


def print_table(summary: dict) -> None:
    runs = summary["runs"]
    names = list(runs)
    print(f"{'':24}" + "".join(f"{n:>14}" for n in names))
    for key, fmt in (("params", "{:>14,.0f}"), ("tokens_per_s", "{:>14,.0f}"), ("mfu", "{:>14.3f}"),
                     ("steps", "{:>14}"), ("tokens_trained", "{:>14,}"), ("losses/train", "{:>14.3f}"),
                     ("eval/heldout_ppl", "{:>14.2f}"), ("eval/heldout_share_ppl", "{:>14.2f}")):
        print(f"{key:24}" + "".join(fmt.format(runs[n][key]) if runs[n].get(key) is not None else f"{'-':>14}"
                                    for n in names))
    print("held-out perplexity by package" + (" (* held out whole; the others: their shares)" if names else ""))
    whole = set().union(*(set(r["heldout_whole_packages"] or ()) for r in runs.values())) if runs else set()
    for pkg, row in summary["heldout_ppl"].items():
        label = pkg + (" *" if pkg in whole else "")
        print(f"  {label:22}" + "".join(f"{row[n]:>14.2f}" if row.get(n) else f"{'-':>14}" for n in names))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", required=True, help="a packed corpus (sparserl corpus pack) or a built corpus")
    ap.add_argument("--out", required=True, help="output folder (one run folder per model, pretrain_summary.json)")
    ap.add_argument("--minutes", type=float, default=3.0, help="wall-clock minutes of each model's training loop")
    ap.add_argument("--models", default="base,default", help="comma-separated presets to train")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per window")
    ap.add_argument("--batch-size", type=int, default=16, help="windows per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--warmup-steps", type=int, default=100, help="learning-rate warm-up steps")
    ap.add_argument("--max-steps", type=int, default=1_000_000, help="step cap (the minutes decide first)")
    ap.add_argument("--heldout-tokens", type=int, default=100_000, help="held-out tokens scored per package")
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for name in filter(None, args.models.split(",")):
            run_model(name, args)
            summary = summarise(out)
            (out / "pretrain_summary.json").write_text(json.dumps(summary, indent=1))
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_table(summary)
    print(f"wrote {out / 'pretrain_summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
