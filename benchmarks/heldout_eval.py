"""A policy's held-out evaluations, every set in one process: the policies opened once, one harness.

``sparserl evaluate`` once per set pays, each time, for starting Python with torch, opening every
policy (about 11 s for the base model on one H200) and starting the harness's GPU worker. This runs
the sets one after the other through the same :func:`sparserl.eval.compare.evaluate` with the same
opened policies and the same :class:`~sparserl.harness.evaluator.Evaluator`, and writes exactly what
``sparserl evaluate --out OUT/eval-SET`` writes, per set (eval.json, eval.md, completions.jsonl).

The sets: ``test`` (the generated matrices of the test split of ``--data``, an SFT data folder), ``real``
(its real matrices: a folder given to ``data build --real-dir DIR --real-split mixed``, such as the SuiteSparse
one, whose train split the teacher saw), ``val`` (the validation split, all of it) and ``families`` (one
generated matrix per family at ``--family-rows`` rows; with ``--distinct-from DIR`` it is refused when one of
them has the structure of a training matrix in DIR: the data build keeps its own splits apart, the families set
is made here); ``--limit N`` keeps N matrices of a split, evenly spaced. Nothing is shared between the sets'
figures: each set times its own baselines, and the harness's memo answers a completion only on the same matrix
content.

**Choosing the sampling temperature.** With several ``--temperature`` values every set is evaluated at
each (``OUT/eval-SET-tT``), and ``OUT/temperature.json`` records per set and temperature the last
policy's correct share, best of N over the library oracle (geometric mean) and new bodies, and the
temperature chosen on the first set by :func:`choose_temperature`: the highest best of N, and among
those within 1% of it the highest correct share. Choose on the validation split, then evaluate the
held-out sets at the chosen temperature.

    python benchmarks/heldout_eval.py OUT --data OUT/data --sets test,families -c base_sft=OUT/sft/checkpoint
    python benchmarks/heldout_eval.py OUT --data OUT/data --sets test -c base_sft=CKPT --resume   # skip finished sets
    python benchmarks/heldout_eval.py OUT --data OUT/data --sets val --limit 8 --temperature 1.0,0.7,0.4 -c base_sft=CKPT

``--resume`` keeps a set whose ``eval.json`` is already there, written with the same settings
(:data:`RESUME_KEYS`: the same policies, temperature, samples, matrices...); a set's eval.json is
written at its end. A set that fails (a harness error, a bug) is named on stderr and the next set runs: the exit
status is then 1, and ``--resume`` makes only the failed sets again.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from sparserl.model.config import POLICY_TEMPERATURE  # light: no torch

log = logging.getLogger("heldout_eval")

SETS = ("test", "families", "val", "real")
NEAR_BEST = 0.01
"""Temperatures whose best of N is within this share of the highest are chosen among by correct share."""


def set_config(name: str, args, out: Path, temperature: float, folder: str):
    """The :class:`EvalConfig` of one set at one temperature. Its checkpoints are recorded in
    eval.json; ``evaluate`` is handed them opened under the same names, and does not open them again."""
    from sparserl.eval.compare import EvalConfig

    if name == "families":  # made here: checked against the training matrices' structures
        where = dict(matrices="families", family_rows=args.family_rows,
                     distinct_from=tuple(getattr(args, "distinct_from", None) or ()))
    else:
        where = dict(matrices=str(args.data), split="test" if name == "real" else name, limit=args.limit,
                     real_matrices=REAL_MATRICES[name])
    return EvalConfig(**where, checkpoints=tuple(args.checkpoint), baselines=tuple(b for b in args.baselines.split(",") if b),
                      samples=args.samples, temperature=temperature,
                      system_temperatures=tuple(getattr(args, "system_temperature", None) or ()),
                      header_grammar=args.header_grammar,
                      max_new_tokens=args.max_new_tokens,
                      gen_batch=args.gen_batch, out=str(out / folder), compile_only=args.compile_only, plots=False,
                      seed=args.seed, retime=0 if args.compile_only else getattr(args, "retime", 0))


REAL_MATRICES = {"test": "none", "real": "only", "val": "all"}
"""Which of a split's matrices each set takes (:attr:`EvalConfig.real_matrices`): ``test`` and ``real`` are
disjoint, so each figure is of one kind of matrix."""
RESUME_KEYS = ("matrices", "split", "real_matrices", "family_rows", "limit", "checkpoints", "baselines", "op", "k",
               "samples", "temperature", "system_temperatures", "header_grammar", "max_new_tokens", "seed", "retime")
"""What an evaluation written before must have been made with to be kept under ``--resume``."""
ADDED_LATER = {"header_grammar": False, "real_matrices": "all", "system_temperatures": []}
"""Keys an eval.json written before they existed lacks, and what it was made with."""


def written_as(cfg) -> bool:
    """Whether ``cfg.out`` holds an evaluation finished with the same :data:`RESUME_KEYS` as ``cfg``
    (a policy added since, another temperature or sample count: made again)."""
    import json
    from dataclasses import asdict

    path = Path(cfg.out) / "eval.json"
    if not path.exists():
        return False
    try:
        before = json.loads(path.read_text()).get("config", {})
    except (OSError, ValueError):
        return False
    now = json.loads(json.dumps(asdict(cfg)))  # tuples as lists, as eval.json holds them
    return all(before.get(key, ADDED_LATER.get(key)) == now.get(key) for key in RESUME_KEYS)


def figures(result: dict, policy: str) -> dict:
    """One policy's figures in one evaluation (``evaluate``'s result), as the policy's targets read
    them (:func:`policy_targets.eval_figures`): correct share, best of N over the library oracle
    (None without a timed oracle), new bodies and how many were correct, among others."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, however the script is started
    from policy_targets import eval_figures

    return eval_figures(result, policy)


def choose_temperature(by_t: dict[float, dict]) -> float | None:
    """The temperature to sample at, from one set's :func:`figures` per temperature (pure): the
    highest best of N over the oracle, and among the temperatures within :data:`NEAR_BEST` of it the
    one with the highest correct share (the higher temperature on a tie). None when nothing was timed."""
    timed = {t: f for t, f in by_t.items() if f.get("best_over_oracle")}
    if not timed:
        return None
    top = max(f["best_over_oracle"] for f in timed.values())
    near = [t for t, f in timed.items() if f["best_over_oracle"] >= top * (1 - NEAR_BEST)]
    return max(near, key=lambda t: (timed[t].get("correct_share") or 0.0, t))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="run folder: each set is written to OUT/eval-SET")
    ap.add_argument("--data", type=Path, help="SFT data folder whose test split holds the 'test' and 'real' sets")
    ap.add_argument("--sets", default="test,families", help=f"comma-separated, in order, of {', '.join(SETS)}")
    ap.add_argument("--checkpoint", "-c", action="append", default=[], required=True,
                    help="NAME=PATH of a policy (repeatable)")
    ap.add_argument("--samples", type=int, default=8, help="completions per matrix per policy")
    ap.add_argument("--baselines", default="cusparse,oracle", help="comma-separated: cusparse, oracle, selector")
    ap.add_argument("--family-rows", type=int, default=1_000_000, help="rows of each generated matrix ('families')")
    ap.add_argument("--gen-batch", type=int, default=32, help="completions generated together")
    ap.add_argument("--temperature", default=str(POLICY_TEMPERATURE),
                    help="sampling temperature, or several (comma-separated): each set at each, and the choice "
                         "(default: the policy's, POLICY_TEMPERATURE)")
    ap.add_argument("--system-temperature", action="append", default=[],
                    help="NAME=T: the checkpoint named NAME sampled at T in every set (repeatable; one checkpoint "
                         "given twice under two names is sampled at two temperatures side by side)")
    ap.add_argument("--header-grammar", action="store_true",
                    help="sample each header within the contract's grammar (the code as before)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many matrices of a split, evenly spaced (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="longest completion (default: the policy's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-only", action="store_true", help="compile rates only (the default without a GPU)")
    ap.add_argument("--retime", type=int, default=0,
                    help="passes of a second look: each matrix's best kernels timed again side by side (0: none)")
    ap.add_argument("--resume", action="store_true", help="skip a set whose eval.json is already written")
    ap.add_argument("--distinct-from", action="append", default=[],
                    help="a folder of the training matrices (a data folder, the teacher's matrices): the families "
                         "set is refused if one of its matrices has one of their structures (repeatable)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from sparserl.errors import SparseRLError
    from sparserl.eval.compare import checkpoint_specs, evaluate, matrix_files, open_policies
    from sparserl.generate import has_model
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    sets = [s for s in args.sets.split(",") if s]
    bad = [s for s in sets if s not in SETS]
    if bad or not sets:
        print(f"error: --sets takes {', '.join(SETS)} (got {args.sets!r})", file=sys.stderr)
        return 2
    if {"test", "val", "real"} & set(sets) and args.data is None:
        print("error: the 'test', 'real' and 'val' sets need --data (an SFT data folder with test.jsonl, val.jsonl)",
              file=sys.stderr)
        return 2
    try:
        temperatures = list(dict.fromkeys(float(t) for t in args.temperature.split(",") if t))  # each once
    except ValueError:
        temperatures = []
    if not temperatures or any(not t > 0 for t in temperatures):
        print(f"error: --temperature takes positive numbers, comma-separated (got {args.temperature!r})", file=sys.stderr)
        return 2
    folder = (lambda s, t: f"eval-{s}") if len(temperatures) == 1 else (lambda s, t: f"eval-{s}-t{t:g}")
    specs = checkpoint_specs(args.checkpoint)
    missing = [path for _, path in specs if not has_model(path)]
    if missing:
        print(f"error: no model at {missing[0]}: give a policy checkpoint or an HF model folder", file=sys.stderr)
        return 2
    runs = [(s, t) for s in sets for t in temperatures]
    try:
        wanted = {(s, t): set_config(s, args, args.out, t, folder(s, t)) for s, t in runs}
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    todo = [run for run in runs if not (args.resume and written_as(wanted[run]))]
    for s, t in runs:
        if (s, t) not in todo:
            print(f"== {folder(s, t)}: written before with the same settings, kept (--resume)", flush=True)
    if not todo:
        return choice(args, sets, temperatures, folder, specs[-1][0])
    failed: list[str] = []  # sets whose evaluation failed (the others are written)
    try:
        cfgs = {run: wanted[run] for run in todo}
        for cfg in cfgs.values():
            matrix_files(cfg)  # a set without matrices fails before a policy is opened
        ev = Evaluator(HarnessConfig(compile_only=args.compile_only, regimes=("cold",)))
        compile_only = args.compile_only or not ev.has_gpu
        try:
            t0 = time.perf_counter()
            policies = open_policies(args.checkpoint)  # one checkpoint under two names: opened once
            opened = time.perf_counter() - t0
            for (s, temp), cfg in cfgs.items():
                t = time.perf_counter()
                if compile_only and not cfg.compile_only:
                    from dataclasses import replace

                    cfg = replace(cfg, compile_only=True, retime=0)  # nothing is timed: no second look
                try:
                    res = evaluate(cfg, evaluator=ev, policies=policies)
                except Exception as exc:  # the other sets still run: one failure does not lose their GPU time
                    if not isinstance(exc, SparseRLError):
                        log.exception("%s failed", folder(s, temp))
                    print(f"error: {folder(s, temp)}: {exc}", file=sys.stderr, flush=True)
                    failed.append(folder(s, temp))
                    continue
                print(f"== {folder(s, temp)}: {res['seconds']:.0f} s (the policies were opened once, in {opened:.1f} s); "
                      f"wrote {cfg.out}/eval.json, eval.md", flush=True)
                print(Path(cfg.out, "eval.md").read_text(), flush=True)
                log.info("%s took %.1f s of wall time", folder(s, temp), time.perf_counter() - t)
        finally:
            ev.close()
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if failed:
        print(f"error: {len(failed)} of {len(todo)} sets failed ({', '.join(failed)}); the others are written: run "
              "again with --resume to make only these", file=sys.stderr)
        return 1
    return choice(args, sets, temperatures, folder, specs[-1][0])


def choice(args, sets: list[str], temperatures: list[float], folder, policy: str) -> int:
    """With several temperatures: OUT/temperature.json (every set's figures per temperature, the
    choice made on the first set) and one line naming the choice."""
    if len(temperatures) < 2:
        return 0
    import json

    table = {s: {t: figures(json.loads((args.out / folder(s, t) / "eval.json").read_text()), policy)
                 for t in temperatures} for s in sets}
    chosen = choose_temperature(table[sets[0]])
    (args.out / "temperature.json").write_text(json.dumps(
        {"policy": policy, "chosen_on": sets[0], "chosen": chosen, "rule": f"highest best of N over the oracle; "
         f"within {NEAR_BEST:.0%} of it, highest correct share", "figures": {s: {f"{t:g}": f for t, f in by.items()}
                                                                             for s, by in table.items()}}, indent=1))
    for s, by in table.items():
        for t, f in by.items():
            print(f"{s} at T={t:g}: correct {f['correct_share']}, best of N / oracle {f['best_over_oracle']}, "
                  f"new bodies {f['new_bodies_correct']} of {f['new_bodies']} correct")
    print(f"temperature chosen on {sets[0]}: {chosen if chosen is not None else 'none (nothing was timed)'}; "
          f"wrote {args.out / 'temperature.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
