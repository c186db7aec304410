"""What the shared-memory scrub costs honest kernels, and what it takes from a kernel that keeps the
matrix in shared memory between launches, in the cold regime (the scrub follows the L2 flush) and the
warm one (it ends each repetition's preparation, which is timed alone and subtracted).

Two evaluators run side by side in one process, one with ``HarnessConfig(scrub_shared=True)`` (the
default) and one without; every kernel is evaluated by both in turn, ``--rounds`` times, on the same
registered matrices, each evaluation timing every regime of ``--regimes``. Reported per (regime,
matrix, kernel): the median with and without the scrub and their ratio (honest kernels: it should be 1
within the noise), cuSPARSE's likewise; and for ``matrix_cached_in_shared_memory``
(tests/harness/adversarial/state.py) its time over its control's (the same kernel looking for a tag
it never writes) with and without the scrub: below 1 without it means shared memory survived between
the timed runs and the cheat used it.

    python benchmarks/scrub_cost.py --out results/scrub_cost.json
    python benchmarks/scrub_cost.py --regimes warm --rounds 1 --out results/scrub_warm.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparserl.eval.metrics import geomean

REPO = Path(__file__).resolve().parents[1]

MATRICES = {  # name: (family, rows, generator options)
    "random_20k": ("random", 20_000, {"nnz_per_row": 12}),
    "random_500k_4": ("random", 500_000, {"nnz_per_row": 4}),
    "banded_1m": ("banded", 1_000_000, {}),
    "powerlaw_200k": ("powerlaw", 200_000, {}),
}
STRATEGIES = ("csr_scalar", "csr_vector", "csr_lanes", "coo_segmented", "ell_rows")


def summarize(rows: list[dict]) -> dict:
    """Rows of {matrix, kernel, scrub_us: [...], plain_us: [...]} -> each row's medians and ratio, and
    the geometric mean of the ratios over the honest kernels (cuSPARSE apart)."""
    out = []
    for r in rows:
        if not (r["scrub_us"] and r["plain_us"]):
            out.append({**r, "scrub_median_us": None, "plain_median_us": None, "ratio": None})
            continue
        s, p = sorted(r["scrub_us"]), sorted(r["plain_us"])
        ms, mp = s[len(s) // 2], p[len(p) // 2]
        out.append({**r, "scrub_median_us": ms, "plain_median_us": mp, "ratio": ms / mp if mp else None})
    honest = [r["ratio"] for r in out if r["ratio"] and r["kernel"] != "cusparse" and not r.get("adversarial")]
    base = [r["ratio"] for r in out if r["ratio"] and r["kernel"] == "cusparse"]
    return {"rows": out, "honest_geomean": geomean(honest) if honest else None,
            "honest_range": [min(honest), max(honest)] if honest else None,
            "cusparse_geomean": geomean(base) if base else None}


def kernels() -> dict[str, str]:
    """The first library variant of each strategy in ``STRATEGIES``, and the cheat with its control."""
    sys.path.insert(0, str(REPO))
    from sparserl.kernels.library import variants
    from tests.harness.adversarial.state import smem_cache_kernel

    out = {}
    for v in variants("spmv"):
        if v.strategy in STRATEGIES and v.strategy not in {k.split("/")[1] for k in out}:
            out[v.id] = v.render()
    out["cheat"] = smem_cache_kernel()
    out["cheat_control"] = smem_cache_kernel("0x1ull")
    return out


def cheat_over_control(summary: dict) -> dict:
    """Per matrix, the cheat's median over its control's, with and without the scrub (from a summary)."""
    medians = {(r["matrix"], r["kernel"]): r for r in summary["rows"] if r["ratio"] is not None}
    out = {}
    for (mname, kname), c in medians.items():
        if kname == "cheat" and (k := medians.get((mname, "cheat_control"))) is not None:
            out[mname] = {"with_scrub": c["scrub_median_us"] / k["scrub_median_us"],
                          "without_scrub": c["plain_median_us"] / k["plain_median_us"]}
    return out


def measure(regimes: tuple[str, ...], rounds: int) -> dict[str, list[dict]]:
    """Every kernel on every matrix by both evaluators, ``rounds`` times, who goes first alternating:
    {regime: rows of {matrix, kernel, scrub_us: [...], plain_us: [...]}}."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.matrices import generate

    texts = kernels()
    evs = {flag: Evaluator(HarnessConfig(scrub_shared=flag, regimes=regimes, reward_regime=regimes[0], memo=0))
           for flag in (True, False)}
    rows: dict[tuple[str, str, str], dict] = {}
    try:
        for mname, (family, n, opts) in MATRICES.items():
            A = generate(family, n, seed=1, **opts)
            refs = {flag: ev.register(A, mname) for flag, ev in evs.items()}
            for rnd in range(rounds):
                for kname, text in texts.items():
                    for flag in ((True, False) if rnd % 2 == 0 else (False, True)):
                        res = evs[flag].evaluate(text, refs[flag], "spmv")
                        side = "scrub_us" if flag else "plain_us"
                        for regime in regimes:
                            if not res.ok or regime not in res.timings:
                                print(f"{mname} {kname} ({regime}): {res.error_kind.value} {res.message[:120]}",
                                      file=sys.stderr)
                                continue
                            r = rows.setdefault((regime, mname, kname), {
                                "matrix": mname, "kernel": kname, "scrub_us": [], "plain_us": [],
                                "adversarial": kname.startswith("cheat")})
                            r[side].append(res.timings[regime].median_us)
                            if (base := res.baseline.get(regime)) is not None:  # once per evaluator, then cached
                                b = rows.setdefault((regime, mname, "cusparse"), {
                                    "matrix": mname, "kernel": "cusparse", "scrub_us": [], "plain_us": []})
                                b[side][:] = [base.median_us]
    finally:
        for ev in evs.values():
            ev.close()
    return {regime: [r for (reg, _, _), r in rows.items() if reg == regime] for regime in regimes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="evaluations of each kernel by each evaluator")
    ap.add_argument("--regimes", default="cold,warm", help="comma-separated: cold, warm (default both)")
    ap.add_argument("--out", type=Path, default=Path("scrub_cost.json"))
    args = ap.parse_args()
    regimes = tuple(r for r in args.regimes.split(",") if r)
    if not regimes or any(r not in ("cold", "warm") for r in regimes):
        ap.error(f"--regimes takes cold and/or warm, comma-separated (got '{args.regimes}')")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    out = {}
    for regime, rows in measure(regimes, args.rounds).items():
        summary = summarize(rows)
        summary["cheat_over_control"] = cheat_over_control(summary)
        out[regime] = summary
        print(f"== {regime}")
        print(f"{'matrix':16} {'kernel':40} {'scrub us':>9} {'plain us':>9} {'ratio':>7}")
        for r in summary["rows"]:
            if r["ratio"] is not None:
                print(f"{r['matrix']:16} {r['kernel']:40} {r['scrub_median_us']:9.2f} {r['plain_median_us']:9.2f} "
                      f"{r['ratio']:7.3f}")
        print(f"honest kernels, scrub / plain: geomean {summary['honest_geomean']}, range {summary['honest_range']}; "
              f"cuSPARSE {summary['cusparse_geomean']}")
        for mname, c in summary["cheat_over_control"].items():
            print(f"cheat / control on {mname}: {c['with_scrub']:.3f} with the scrub, {c['without_scrub']:.3f} without")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python benchmarks/scrub_cost.py " + " ".join(sys.argv[1:]),
                                    "regimes": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
