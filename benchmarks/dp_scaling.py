"""Data-parallel RL throughput: the same PPO run on 1 GPU and on N GPUs (torchrun), side by side.

Each rank runs the single-GPU batch (``matrices_per_step x samples_per_matrix`` completions per
step), so N ranks process N times the samples per step; the figure is samples/s over the whole
run (generation, harness, update), from each run's ``result.json``. The 1-GPU run sees only GPU 0
(its harness worker too), each rank of the N-GPU run only its own GPU.

    python benchmarks/dp_scaling.py --model runs/demo/sft/checkpoint --matrices runs/demo/data \
        --gpus 2 --steps 6 --out results/dp_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str], env: dict, log: Path) -> float:
    t = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if rc:
        sys.exit(f"{' '.join(cmd)} failed with exit status {rc}; see {log}")
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="policy checkpoint or HF model folder")
    ap.add_argument("--matrices", required=True, help="SFT data folder or a folder of matrices")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--matrices-per-step", type=int, default=8)
    ap.add_argument("--samples-per-matrix", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=1536)
    ap.add_argument("--compile-only", action="store_true", help="CPU smoke run (compile-only rewards)")
    ap.add_argument("--work", type=Path, default=Path("runs/dp_scaling"))
    ap.add_argument("--out", type=Path, default=Path("dp_scaling.json"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    res = {}
    for n in (1, args.gpus):
        out = args.work / f"gpus{n}"
        cfg = args.work / f"gpus{n}.toml"
        cfg.write_text(
            f'model = "{Path(args.model).resolve()}"\nmatrices = "{Path(args.matrices).resolve()}"\n'
            f'out = "{out.resolve()}"\nsteps = {args.steps}\nmatrices_per_step = {args.matrices_per_step}\n'
            f"samples_per_matrix = {args.samples_per_matrix}\nmax_new_tokens = {args.max_new_tokens}\n"
            f"eval_every = {10 * args.steps}\nsave_every = {10 * args.steps}\n")
        launch = ([sys.executable, "-m", "sparserl.cli"] if n == 1 else
                  [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
                   "-m", "sparserl.cli"])
        wall = run(launch + ["ppo", "--config", str(cfg)] + (["--compile-only"] if args.compile_only else []),
                   env | {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n))}, args.work / f"gpus{n}.log")
        r = json.loads((out / "result.json").read_text())
        res[n] = {"gpus": n, "samples_per_s": r["charts/samples_per_s"], "wall_s": wall,
                  "samples": args.steps * args.matrices_per_step * args.samples_per_matrix * n,
                  "reward_mean_last": r.get("reward/mean"),
                  "time": {k: r[k] for k in r if k.startswith("time/")}}
        print(f"{n} GPU(s): {res[n]['samples_per_s']:.2f} samples/s ({res[n]['samples']} samples, {wall:.0f} s wall)",
              flush=True)
    ratio = res[args.gpus]["samples_per_s"] / res[1]["samples_per_s"]
    print(f"{args.gpus} GPUs / 1 GPU: {ratio:.2f}x samples/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": list(res.values()), "speedup": ratio, "config": vars(args)}, indent=1,
                                   default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
