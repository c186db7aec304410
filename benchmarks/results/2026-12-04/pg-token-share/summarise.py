"""Summarise rl_toy.py runs of the token-share question: for each learning rate and arm, the mean over its
last 11 steps (30..40) of the intact share, the oracle share and the mean reward, per seed and over seeds, and
the step-0 figures (the SFT start, the same for every arm of a seed).

    python benchmarks/results/2026-12-04/pg-token-share/summarise.py RUNS_DIR --out summary.json
"""

from __future__ import annotations

import argparse
import json
import statistics as st
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, help="folder of rl_toy.py JSON files (share_lr*_s*.json)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    out: dict = {"window": "steps 30-40", "runs": {}}
    for f in sorted(args.runs.glob("share_lr*_s*.json")):
        d = json.loads(f.read_text())
        lr, seed = float(d["config"]["lr"]), int(d["config"]["seed"])
        for arm, rows in d["runs"].items():
            last = [r for r in rows if r["step"] >= 30]
            cell = out["runs"].setdefault(f"lr={lr:g}", {}).setdefault(arm, {})
            cell[f"seed {seed}"] = {
                "start_intact": rows[0]["intact"],
                "intact": round(st.mean(r["intact"] for r in last), 4),
                "oracle": round(st.mean(r["oracle"] for r in last), 4),
                "reward": round(st.mean(r["reward"] for r in last), 4),
                "collapsed": rows[-1]["intact"] == 0.0,
                "max_kl_to_ref": round(max(r["kl_to_ref"] for r in rows), 4),
                "kernel_tokens": d["kernel_tokens"], "max_new_tokens": int(d["config"]["max_new_tokens"]),
            }
    for lr, arms in out["runs"].items():
        for arm, seeds in arms.items():
            vals = [v for k, v in seeds.items() if k.startswith("seed")]
            seeds["mean"] = {k: round(st.mean(v[k] for v in vals), 4) for k in ("intact", "oracle", "reward")}
            seeds["mean"]["collapsed"] = sum(v["collapsed"] for v in vals)
            print(f"{lr:9} {arm:10} " + " | ".join(
                f"{k}: intact {v['intact']:.2f} reward {v['reward']:+.2f}{' (collapsed)' if v['collapsed'] else ''}"
                for k, v in seeds.items() if k.startswith("seed"))
                + f" || mean intact {seeds['mean']['intact']:.3f} reward {seeds['mean']['reward']:+.3f}")
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
