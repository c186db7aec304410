"""Soak test of the worker pool: many jobs, a share of them crashing or hanging.

Sends N jobs (default 500) through the evaluator on one matrix: 90% good library
kernels, 5% illegal-address crashes, 5% infinite loops, shuffled with a seed. Checks
that every job comes back (none lost), each with the kind it should have, and that the
pool still serves a good kernel at the end. Prints counts, restarts and wall time.

    python benchmarks/soak.py --jobs 500 --out results/soak.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.pool import PhaseLimits
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.harness.adversarial import ADVERSARIAL  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--bad-share", type=float, default=0.10)
    ap.add_argument("--verify-timeout", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("soak.json"))
    args = ap.parse_args()
    rng = random.Random(0)
    good = [v.render() for v in variants(Op.SPMV) if v.format in ("CSR", "ELL", "SELL", "HYB", "COO")]
    n_bad = int(args.jobs * args.bad_share)
    jobs = ([("crashed", ADVERSARIAL["illegal_address"][0])] * (n_bad // 2)
            + [("timeout", ADVERSARIAL["infinite_loop"][0])] * (n_bad - n_bad // 2)
            + [("none", good[i % len(good)]) for i in range(args.jobs - n_bad)])
    rng.shuffle(jobs)
    cfg = HarnessConfig(limits=PhaseLimits(verify=args.verify_timeout), cold_trials=5, warm_trials=3,
                        regimes=("cold",), memo=0)  # every job really runs
    t0 = time.perf_counter()
    with Evaluator(cfg) as ev:
        mat = ev.register(generate("random", 50_000, seed=0, nnz_per_row=8), "random50k")
        futures = [ev.submit(text, mat, "spmv") for _, text in jobs]
        results = [f.result() for f in futures]
        final = ev.evaluate(good[0], mat, "spmv")
        restarts = ev.pool.restarts
    wall = time.perf_counter() - t0
    wrong = [(want, r.error_kind.value, r.message) for (want, _), r in zip(jobs, results) if r.error_kind.value != want]
    counts: dict[str, int] = {}
    for r in results:
        counts[r.error_kind.value] = counts.get(r.error_kind.value, 0) + 1
    summary = {"jobs": args.jobs, "returned": len(results), "lost": args.jobs - len(results), "counts": counts,
               "unexpected": len(wrong), "unexpected_examples": wrong[:10], "restarts": restarts,
               "pool_serving_after": final.ok, "wall_s": wall}
    print(json.dumps({k: v for k, v in summary.items() if k != "unexpected_examples"}, indent=1))
    if wrong:
        print("unexpected:", wrong[:10])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    return 0 if not wrong and final.ok and len(results) == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
