"""Run the adversarial suite (tests/harness/adversarial) through the harness and record every verdict.

Each case is a kernel that tries to fool the harness, with the verdict it must get. This evaluates
all of them with the real evaluator (on a GPU: the worker pool, verification and checked timing;
with ``--compile-only``: what ``sparserl check-kernel --compile-only`` gives, where static and
compile-time cases get their verdict and runtime cases stop at ``no_gpu``), then prints one row
per case (class, name, expected, seen, message) and writes JSON and Markdown.

    python benchmarks/adversarial.py --out results/adversarial.json                 # GPU machine
    python benchmarks/adversarial.py --path both --out results/adversarial.json     # batched and sequential
    python benchmarks/adversarial.py --regimes cold --out results/adversarial_cold.json   # the reward's regime alone
    python benchmarks/adversarial.py --compile-only --out results/adversarial_cpu.json

``--path``: the harness's evaluation path (``batched``, the default; ``sequential``, the earlier one,
``SpeedConfig.classic()``; or ``both``, one after the other in one run). Cases the sequential path
judges differently (it never stops early) are expected with its verdict there.

Exit status 1 when any case gets a verdict other than the expected one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the cases live in the test tree

from sparserl.harness.evaluator import Evaluator, HarnessConfig  # noqa: E402
from sparserl.harness.pool import PhaseLimits  # noqa: E402
from sparserl.harness.speed import SpeedConfig  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from tests.harness.adversarial import (  # noqa: E402
    CLASSES,
    GOOD,
    LONG_ROW_CASES,
    RUNTIME_KINDS,
    SEQUENTIAL_VERDICTS,
    VALUE_CASES,
    long_row_matrix,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("adversarial.json"))
    ap.add_argument("--compile-only", action="store_true", help="no GPU: static and compile-time verdicts only")
    ap.add_argument("--path", choices=("batched", "sequential", "both"), default="batched",
                    help="the harness's evaluation path (both: one after the other)")
    ap.add_argument("--regimes", default="cold,warm",
                    help="L2 regimes to time (comma-separated; cold, the reward's, first). 'cold' alone is what every "
                         "learning loop times: a timed cheat that only warm catches shows there as an unexpected verdict")
    args = ap.parse_args()
    regimes = tuple(r.strip() for r in args.regimes.split(",") if r.strip())
    if not regimes or any(r not in ("cold", "warm") for r in regimes):
        ap.error(f"--regimes takes cold, warm or both, got {args.regimes!r}")

    rows = []
    gpu = None
    for path in ("batched", "sequential") if args.path == "both" else (args.path,):
        speed = SpeedConfig() if path == "batched" else SpeedConfig.classic()
        cfg = HarnessConfig(compile_only=args.compile_only, memo=0, limits=PhaseLimits(verify=3.0), speed=speed,
                            regimes=regimes, reward_regime="cold" if "cold" in regimes else regimes[0])
        with Evaluator(cfg) as ev:  # one path's worker at a time on the GPU
            mat = ev.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random20k")
            A = generate("random", 20_000, seed=4, nnz_per_row=12)
            A.data[:] = 1.0
            unit = ev.register(A, "random20k_unit")
            long_rows = ev.register(long_row_matrix(), "long_row_1M")
            good = ev.evaluate(GOOD, mat, "spmv")
            for cls, cases in CLASSES.items():
                for name, (text, expected) in cases.items():
                    t0 = time.perf_counter()
                    res = ev.evaluate(text, unit if name in VALUE_CASES else long_rows if name in LONG_ROW_CASES
                                      else mat, "spmv")
                    if path == "sequential":
                        expected = SEQUENTIAL_VERDICTS.get(name, expected)
                    want = "no_gpu" if args.compile_only and expected in RUNTIME_KINDS else expected
                    cold = res.timings.get("cold")
                    rows.append({"path": path, "class": cls, "case": name, "expected": want,
                                 "seen": res.error_kind.value, "ok": res.error_kind.value == want,
                                 "message": res.message, "cold_us": cold.median_us if cold else None,
                                 "honest_cold_us": good.timings["cold"].median_us if "cold" in good.timings else None,
                                 "checked_timed_outputs": res.checked_timed_outputs,
                                 "seconds": time.perf_counter() - t0})
            gpu = ev.pool.gpu if ev.has_gpu else None
    print(f"{'path':10} {'class':13} {'case':34} {'expected':15} {'seen':15} message")
    for r in rows:
        mark = "" if r["ok"] else "   <-- UNEXPECTED"
        extra = f" [cold {r['cold_us']:.2f} us; honest kernel {r['honest_cold_us']:.2f} us]" if r["cold_us"] else ""
        print(f"{r['path']:10} {r['class']:13} {r['case']:34} {r['expected']:15} {r['seen']:15} "
              f"{r['message'][:110]}{extra}{mark}")
    bad = [f"{r['path']}/{r['case']}" for r in rows if not r["ok"]]
    print(f"\n{len(rows)} cases, {len(rows) - len(bad)} with the expected verdict" + (f"; unexpected: {bad}" if bad else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": gpu, "compile_only": args.compile_only, "regimes": list(regimes),
                                    "rows": rows}, indent=1))
    md = ["| path | class | case | expected | seen | message |", "| --- | --- | --- | --- | --- | --- |"]
    md += [f"| {r['path']} | {r['class']} | {r['case']} | {r['expected']} | {r['seen']} | "
           f"{r['message'][:140].replace('|', '/')} |" for r in rows]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
