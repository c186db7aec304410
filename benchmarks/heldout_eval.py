"""A policy's held-out evaluations, every set in one process: the policies opened once, one harness.

``sparserl evaluate`` once per set pays, each time, for starting Python with torch, opening every
policy (about 11 s for the base model on one H200) and starting the harness's GPU worker. This runs
the sets one after the other through the same :func:`sparserl.eval.compare.evaluate` with the same
opened policies and the same :class:`~sparserl.harness.evaluator.Evaluator`, and writes exactly what
``sparserl evaluate --out OUT/eval-SET`` writes, per set (eval.json, eval.md, completions.jsonl).

The sets: ``test`` (the test split of ``--data``, an SFT data folder) and ``families`` (one generated
matrix per family at ``--family-rows`` rows). Nothing is shared between the sets' figures: each set
times its own baselines, and the harness's memo answers a completion only on the same matrix content.

    python benchmarks/heldout_eval.py OUT --data OUT/data --sets test,families -c base_sft=OUT/sft/checkpoint
    python benchmarks/heldout_eval.py OUT --data OUT/data --sets test -c base_sft=CKPT --resume   # skip finished sets

``--resume`` keeps a set whose ``eval.json`` is already there (a set's eval.json is written at its end).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("heldout_eval")

SETS = ("test", "families")


def set_config(name: str, args, out: Path):
    """The :class:`EvalConfig` of one set. Its checkpoints are recorded in eval.json; ``evaluate``
    is handed them opened under the same names, and does not open them again."""
    from sparserl.eval.compare import EvalConfig

    where = (dict(matrices=str(args.data), split="test") if name == "test"
             else dict(matrices="families", family_rows=args.family_rows))
    return EvalConfig(**where, checkpoints=tuple(args.checkpoint), baselines=tuple(b for b in args.baselines.split(",") if b), samples=args.samples,
                      max_new_tokens=args.max_new_tokens, gen_batch=args.gen_batch, out=str(out / f"eval-{name}"),
                      compile_only=args.compile_only, plots=False, seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="run folder: each set is written to OUT/eval-SET")
    ap.add_argument("--data", type=Path, help="SFT data folder whose test split is the 'test' set")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, in order: {', '.join(SETS)}")
    ap.add_argument("--checkpoint", "-c", action="append", default=[], required=True,
                    help="NAME=PATH of a policy (repeatable)")
    ap.add_argument("--samples", type=int, default=8, help="completions per matrix per policy")
    ap.add_argument("--baselines", default="cusparse,oracle", help="comma-separated: cusparse, oracle, selector")
    ap.add_argument("--family-rows", type=int, default=1_000_000, help="rows of each generated matrix ('families')")
    ap.add_argument("--gen-batch", type=int, default=32, help="completions generated together")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="longest completion (default: the policy's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-only", action="store_true", help="compile rates only (the default without a GPU)")
    ap.add_argument("--resume", action="store_true", help="skip a set whose eval.json is already written")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from sparserl.devices import pick_device
    from sparserl.errors import SparseRLError
    from sparserl.eval.compare import evaluate, matrix_files
    from sparserl.generate import has_model
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    sets = [s for s in args.sets.split(",") if s]
    bad = [s for s in sets if s not in SETS]
    if bad or not sets:
        print(f"error: --sets takes {', '.join(SETS)} (got {args.sets!r})", file=sys.stderr)
        return 2
    if "test" in sets and args.data is None:
        print("error: the 'test' set needs --data (an SFT data folder with test.jsonl)", file=sys.stderr)
        return 2
    specs = [c.rpartition("=") if "=" in c else (Path(c).name, "", c) for c in args.checkpoint]
    missing = [path for _, _, path in specs if not has_model(path)]
    if missing:
        print(f"error: no model at {missing[0]}: give a policy checkpoint or an HF model folder", file=sys.stderr)
        return 2
    todo = [s for s in sets if not (args.resume and (args.out / f"eval-{s}" / "eval.json").exists())]
    for s in sets:
        if s not in todo:
            print(f"== eval-{s}: written before, kept (--resume)", flush=True)
    if not todo:
        return 0
    try:
        cfgs = {s: set_config(s, args, args.out) for s in todo}
        for cfg in cfgs.values():
            matrix_files(cfg)  # a set without matrices fails before a policy is opened
        ev = Evaluator(HarnessConfig(compile_only=args.compile_only, regimes=("cold",)))
        compile_only = args.compile_only or not ev.has_gpu
        try:
            from sparserl.model.policy import Policy  # torch

            t0 = time.perf_counter()
            device = str(pick_device("auto"))
            policies = {name: Policy.open(path, device=device) for name, _, path in specs}
            opened = time.perf_counter() - t0
            for s, cfg in cfgs.items():
                t = time.perf_counter()
                if compile_only and not cfg.compile_only:
                    from dataclasses import replace

                    cfg = replace(cfg, compile_only=True)
                res = evaluate(cfg, evaluator=ev, policies=policies)
                print(f"== eval-{s}: {res['seconds']:.0f} s (the policies were opened once, in {opened:.1f} s); "
                      f"wrote {cfg.out}/eval.json, eval.md", flush=True)
                print(Path(cfg.out, "eval.md").read_text(), flush=True)
                log.info("eval-%s took %.1f s of wall time", s, time.perf_counter() - t)
        finally:
            ev.close()
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
