"""Ablation of the matrix card in the prompt: does the card help?

SFT runs twice on the same data, with the same model, seed, steps and batches: once with the
matrix card in the prompt (``--card``) and once without (``--no-card``). Both checkpoints are
then evaluated side by side on the same held-out split, in one harness run, by ``sparserl
evaluate``'s code (compile rate, correctness, pass@k, best-of-n and speedup@1 against cuSPARSE,
with cuSPARSE and the library oracle beside them on a GPU). Writes ``OUT/card_ablation.json``
and prints a table; the two SFT runs keep their checkpoints (``OUT/card``, ``OUT/no_card``) and
resume after a kill (run the same command again; a finished arm is not re-trained).

On one H200 (real numbers), with the data and pre-trained model of the at-scale recipe
(``bash scripts/train_at_scale.sh runs/scale``: data about 11 min, pre-training 1.5 min) and
that recipe's SFT settings (600 steps of 16 pairs, about 3 min per arm), evaluated on its test
split with 8 samples per matrix, cuSPARSE and the library oracle beside them::

    python benchmarks/card_ablation.py --data runs/scale/data --model runs/scale/pretrain/model \
        --out runs/card_ablation --steps 600 --batch-size 16 --samples 8 --split test

Run it detached (``nohup ... > runs/card_ablation.log 2>&1 &``); if the GPU lease ends, the same
command resumes the unfinished arm and redoes only the evaluation. ``--baselines ''`` skips the
oracle's timings (the evaluation's slowest part) when only the two arms are wanted.

CPU smoke test (a tiny data set and a tiny random model built on the spot, compile-only):

    python benchmarks/card_ablation.py --tiny --compile-only --out /tmp/card_ablation
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from sparserl.model.config import POLICY_TEMPERATURE  # light: no torch

log = logging.getLogger("card_ablation")

ARMS = {"card": True, "no card": False}
"""Evaluation name of each arm -> the SFT card setting."""
ROWS = ("compile_rate", "correct_rate", "pass@1", "coverage", "geomean_speedup", "geomean_speedup_covered",
        "speedup@1", "fast_1.0", "fast_1.2", "roofline_mean")


def arm_dir(out: Path, arm: str) -> Path:
    return out / arm.replace(" ", "_")


def tiny_setup(out: Path, seed: int) -> tuple[Path, Path]:
    """A tiny SFT data set (compile-only) and a tiny random model folder, for the CPU smoke test."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparserl.data.corpus import library_texts
    from sparserl.data.sft_build import SFTDataConfig, build_sft_data
    from sparserl.model.config import TinyModelConfig, hf_config
    from sparserl.model.tokenizer import train_tokenizer

    data, model = out / "tiny_data", out / "tiny_model"
    if not (data / "train.jsonl").exists():
        build_sft_data(SFTDataConfig(out=str(data), families=("banded", "random", "block"), matrices_per_family=4,
                                     min_rows=200, max_rows=600, compile_only=True, targets_per_matrix=1,
                                     variants_per_matrix=3, val_fraction=0.25, test_fraction=0.25, seed=seed))
    if not (model / "config.json").exists():
        tok = train_tokenizer(library_texts(), vocab_size=600)
        shape = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1, head_dim=32, max_position_embeddings=2048)
        cfg = hf_config(len(tok), shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(model)
        tok.save_pretrained(model)
    return data, model


def train_arm(args, data: Path, model: Path, arm: str) -> dict:
    """SFT with the card on or off (resumes a killed run; a finished one is read back)."""
    from sparserl.train.sft import SFTConfig, sft

    out = arm_dir(args.out, arm)
    done = out / "result.json"
    if done.exists() and json.loads(done.read_text()).get("steps") == args.steps:
        log.info("%s: SFT already finished (%s)", arm, done)
        return json.loads(done.read_text())
    cfg = SFTConfig(data=str(data), model=str(model), out=str(out), steps=args.steps, batch_size=args.batch_size,
                    lr=args.lr, max_nnz=args.max_nnz, card=ARMS[arm], eval_every=args.steps,
                    eval_samples=args.sft_eval_samples, eval_temperature=args.temperature,
                    max_new_tokens=args.max_new_tokens,
                    save_every=args.save_every, resume=True, device=args.device, compile_only=args.compile_only,
                    seed=args.seed)
    log.info("%s: SFT for %d steps", arm, args.steps)
    return sft(cfg)


def prompt_tokens(data: Path, split: str, checkpoint: Path) -> dict:
    """Mean and max prompt tokens (text after the soft tokens) over the split's matrices."""
    from sparserl.data.rows import read_rows
    from sparserl.model.policy import Policy, prompt_text
    from sparserl.train.dataset import SFTDataset

    policy = Policy.load(checkpoint)
    rows = {(r.matrix, r.op, r.k): r for r in read_rows(data / f"{split}.jsonl")}
    inputs = SFTDataset(list(rows.values()), policy.config)
    n = [len(policy.tokenizer(prompt_text(inputs.sample(r), policy.config.text_prompt,
                                          policy.config.card), add_special_tokens=False)["input_ids"])
         for r in rows.values()]
    return {"mean": sum(n) / len(n), "max": max(n)} if n else {}


def table(summary: dict[str, dict], systems: list[str]) -> str:
    """The metrics side by side (pure)."""
    def cell(v) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    head = f"{'metric':<24}" + "".join(f"{s:>18}" for s in systems)
    lines = [head, "-" * len(head)]
    keys = [k for k in ROWS if any(summary.get(s, {}).get(k) is not None for s in systems)]
    keys += sorted({k for s in systems for k in summary.get(s, {}) if k.startswith("pass@") and k != "pass@1"})
    for k in keys:
        lines.append(f"{k:<24}" + "".join(f"{cell(summary.get(s, {}).get(k)):>18}" for s in systems))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("runs/data"), help="SFT data folder (train/val/test.jsonl)")
    ap.add_argument("--model", type=Path, default=Path("runs/pretrain/model"),
                    help="HF model folder both arms start from (or a policy checkpoint: its card setting is overridden)")
    ap.add_argument("--out", type=Path, default=Path("runs/card_ablation"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-nnz", type=int, default=128)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--sft-eval-samples", type=int, default=32, help="validation rows checked at the end of each SFT")
    ap.add_argument("--split", default="test", help="held-out split both arms are evaluated on")
    ap.add_argument("--samples", type=int, default=8, help="completions per matrix per arm")
    ap.add_argument("--temperature", type=float, default=POLICY_TEMPERATURE,
                    help="sampling temperature of the held-out evaluation (SFT's validation samples at the same)")
    ap.add_argument("--max-new-tokens", type=int, default=1536)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--baselines", default="cusparse,oracle",
                    help="baselines timed beside the arms on a GPU (comma-separated: cusparse, oracle, selector)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile rates only")
    ap.add_argument("--tiny", action="store_true",
                    help="build a tiny data set and a tiny random model under OUT (CPU smoke test); small sizes")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    data, model = args.data, args.model
    if args.tiny:
        data, model = tiny_setup(args.out, args.seed)
        args.steps, args.batch_size, args.max_nnz, args.save_every = min(args.steps, 4), 2, 16, 4
        args.sft_eval_samples, args.samples, args.max_new_tokens, args.gen_batch = 2, 2, 16, 8
    from sparserl.eval.compare import EvalConfig, evaluate

    sft_results = {arm: train_arm(args, data, model, arm) for arm in ARMS}
    ckpts = {arm: arm_dir(args.out, arm) / "checkpoint" for arm in ARMS}
    ecfg = EvalConfig(matrices=str(data), split=args.split, checkpoints=tuple(f"{a}={p}" for a, p in ckpts.items()),
                      samples=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                      gen_batch=args.gen_batch, out=str(args.out / "eval"), compile_only=args.compile_only,
                      baselines=tuple(filter(None, args.baselines.split(","))), plots=False, seed=args.seed)
    ev = evaluate(ecfg)
    systems = list(ARMS) + [s for s in ("library oracle", "rule-based selector", "cuSPARSE") if s in ev["summary"]]
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "data": str(data), "model": str(model), "eval_config": asdict(ecfg),
              "sft": {arm: {k: v for k, v in r.items() if not isinstance(v, dict)} for arm, r in sft_results.items()},
              "prompt_tokens": {arm: prompt_tokens(data, args.split, p) for arm, p in ckpts.items()},
              "summary": {s: ev["summary"][s] for s in systems}, "compile_only": args.compile_only,
              "seconds_eval": ev["seconds"]}
    (args.out / "card_ablation.json").write_text(json.dumps(result, indent=1, default=str))
    print(table(result["summary"], systems))
    for arm in ARMS:
        t = result["prompt_tokens"][arm]
        print(f"{arm}: final SFT loss {result['sft'][arm].get('losses/sft', float('nan')):.3f}; prompt tokens "
              f"mean {t.get('mean', 0):.0f}, max {t.get('max', 0)}")
    print(f"wrote {args.out / 'card_ablation.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
