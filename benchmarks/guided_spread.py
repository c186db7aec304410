"""How far the guided search's figures move between runs: each matrix's arms across several ``guided.json``.

``benchmarks/guided_search.py`` compares, per matrix, the search with the model against the search without it
(``model_over_search``, target 1.03) on 1 to 4 matrices a run. Several runs searched the same test matrices
(the data set's test split is drawn with the same seed), so their files show how much the *search without a
model* (the same code path, no policy in it) moves from run to run on one matrix: a spread of its best time
that is wider than 3% says a single first-timing ratio cannot tell 1.03 from noise.

    python benchmarks/guided_spread.py benchmarks/results/*/*/guided*.json --out guided-spread.json

Printed: per matrix seen in two files or more, the runs, the ``search`` arm's best time (min, max, max/min), and
``model_over_search`` (min, max). Runs differ in machine (H100 or H200) and code: the spread is an upper bound on
one machine's noise, not a measurement of it (the retimed ratios of ``guided_search.py --retime`` are that).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def spread(files: list[Path]) -> dict:
    """Per matrix: each run's search-arm time and model_over_search, and their ranges over the runs."""
    seen: dict[str, list[dict]] = {}
    for f in files:
        for row in json.loads(f.read_text()).get("rows", []):
            us = (row.get("arms", {}).get("search") or {}).get("us")
            if us:
                seen.setdefault(row["matrix"], []).append(
                    {"file": str(f), "search_us": us, "model_over_search": row.get("model_over_search")})
    out = {}
    for name, runs in sorted(seen.items()):
        t = [r["search_us"] for r in runs]
        m = [r["model_over_search"] for r in runs if r["model_over_search"] is not None]
        out[name] = {"runs": runs, "search_us_min": min(t), "search_us_max": max(t),
                     "search_spread": max(t) / min(t),
                     "model_over_search_min": min(m, default=None), "model_over_search_max": max(m, default=None)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="guided.json files of guided_search.py")
    ap.add_argument("--out", type=Path, default=None, help="JSON file")
    args = ap.parse_args(argv)
    if missing := [f for f in args.files if not f.is_file()]:
        print(f"error: no file at {missing[0]}", file=sys.stderr)
        return 2
    try:
        d = spread(args.files)
    except (ValueError, KeyError) as exc:
        print(f"error: not a guided_search.py file: {exc}", file=sys.stderr)
        return 2
    print(f"{'matrix':28} {'runs':>4} {'search us min':>13} {'max':>7} {'max/min':>7} {'model/search min':>16} {'max':>6}")
    for name, r in d.items():
        if len(r["runs"]) < 2:
            continue
        lo, hi = r["model_over_search_min"], r["model_over_search_max"]
        print(f"{name[:28]:28} {len(r['runs']):>4} {r['search_us_min']:>13.2f} {r['search_us_max']:>7.2f} "
              f"{r['search_spread']:>7.3f} {'-' if lo is None else f'{lo:.3f}':>16} {'-' if hi is None else f'{hi:.3f}':>6}")
    if args.out:
        args.out.write_text(json.dumps(d, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
