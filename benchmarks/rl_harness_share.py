"""What share of an RL step the harness takes, with today's harness and the earlier sequential one, side by side.

Two short RL runs from the same policy, the same matrices (the data's train split plus one matrix of
``--large-rows`` rows per family, 1M by default: the sizes users run) and the same seed, one per
harness: ``SpeedConfig()`` (the batched path, adaptive timing, early stopping) and
``SpeedConfig.classic()`` (sequential checks, fixed run counts). Each run's ``metrics.jsonl`` gives
per step the seconds of generation, the learner's forward, the wait on the harness and the update;
the harness's share is its wait over their sum. The first step of each run is left out of the means
(compiles and the first conversions of every matrix land in it), unless it is the only one.

    python benchmarks/rl_harness_share.py --model CKPT --data DATA --steps 4 --out results/rl_harness_share.json
    python benchmarks/rl_harness_share.py --model CKPT --data DATA --steps 2 --compile-only --out share.json   # CPU smoke

Printed: a row per harness (step seconds, each part, the harness's share), and the ratio of the
two runs' harness seconds a step. Written: JSON with every step's parts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

PARTS = ("time/generate", "time/forward", "time/harness_wait", "time/update")


def step_parts(metrics_path: Path) -> list[dict]:
    """Each logged RL step's parts (seconds), from a run's metrics.jsonl (lines without them are skipped)."""
    out = []
    for line in metrics_path.read_text().splitlines():
        m = json.loads(line)
        if all(p in m for p in PARTS):
            out.append({"step": m.get("step"), **{p: float(m[p]) for p in PARTS}})
    return out


def share(steps: list[dict]) -> dict:
    """Mean seconds of each part and of the step over ``steps`` (the first left out when there are
    more), and the harness's share of the step (pure)."""
    if not steps:
        return {"steps": 0}
    used = steps[1:] if len(steps) > 1 else steps
    mean = {p: sum(s[p] for s in used) / len(used) for p in PARTS}
    total = sum(mean.values())
    return {"steps": len(used), "step_s": total, **{p.removeprefix("time/") + "_s": v for p, v in mean.items()},
            "harness_share": mean["time/harness_wait"] / total if total > 0 else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="policy checkpoint or HF model folder")
    ap.add_argument("--data", required=True, help="SFT data folder (its train split's matrices)")
    ap.add_argument("--algo", default="grpo", choices=("grpo", "ppo"))
    ap.add_argument("--steps", type=int, default=4, help="RL steps per harness (the first is left out of the means)")
    ap.add_argument("--matrices-per-step", type=int, default=8)
    ap.add_argument("--samples-per-matrix", type=int, default=4)
    ap.add_argument("--large-rows", type=int, default=1_000_000, help="rows of the one large matrix per family")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-only", action="store_true", help="no GPU: exercise the paths (times mean nothing)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from sparserl.errors import SparseRLError
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.harness.speed import SpeedConfig
    from sparserl.rl.config import RLConfig
    from sparserl.rl.trainer import train_rl

    if args.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    harnesses = {"batched": SpeedConfig(), "sequential": SpeedConfig.classic()}
    result: dict = {"config": {**vars(args), "out": str(args.out)}, "runs": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="rl_share_") as tmp:
            for name, speed in harnesses.items():
                cfg = RLConfig(algo=args.algo, model=args.model, matrices=args.data, out=str(Path(tmp) / name),
                               steps=args.steps, matrices_per_step=args.matrices_per_step,
                               samples_per_matrix=args.samples_per_matrix, large_rows=args.large_rows,
                               large_per_family=0 if args.compile_only else 1, max_new_tokens=args.max_new_tokens,
                               eval_every=10 ** 6, save_every=10 ** 6, compile_only=args.compile_only, seed=args.seed,
                               **(dict(skip_no_signal_kl=None, device="cpu") if args.compile_only else {}))
                # compile-only rewards are all alike: step anyway, so every step has its parts
                with Evaluator(HarnessConfig(compile_only=args.compile_only, regimes=(cfg.regime,),
                                             reward_regime=cfg.regime, speed=speed)) as ev:
                    if not args.compile_only and not ev.has_gpu:
                        raise SparseRLError("no GPU visible: the harness's share needs one (or --compile-only)")
                    train_rl(cfg, evaluator=ev)
                steps = step_parts(Path(cfg.out) / "metrics.jsonl")
                result["runs"][name] = {"per_step": steps, **share(steps)}
                r = result["runs"][name]
                print(f"{name:>10}: {r.get('step_s', 0):7.2f} s a step; generate {r.get('generate_s', 0):.2f}, "
                      f"forward {r.get('forward_s', 0):.2f}, harness {r.get('harness_wait_s', 0):.2f}, update "
                      f"{r.get('update_s', 0):.2f}; the harness's share {r.get('harness_share') or 0:.1%}", flush=True)
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    b, s = result["runs"]["batched"], result["runs"]["sequential"]
    if b.get("harness_wait_s") and s.get("harness_wait_s"):
        result["sequential_over_batched_harness_s"] = s["harness_wait_s"] / b["harness_wait_s"]
        print(f"the harness's seconds a step, sequential over batched: {result['sequential_over_batched_harness_s']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
