"""What an SFT set teaches, family by family and size by size: how many target rows of each storage format.

The policy learns which format to write for a matrix from its teacher's targets; a teacher whose matrices of a
family are mostly small shows the formats that win on small matrices (the launch-bound regime), and the policy
writes those at 1M rows too. This reads an SFT data folder (``train.jsonl``: library rows and rows from the
best-known store) and prints, per family and row-count bin, the targets' formats, so two teachers can be compared
before any GPU time is spent on training them.

    python benchmarks/teacher_mix.py --data OUT/sft-data --families stencil3d_7,stencil3d_27 --out mix.json

CPU only. A row's family is its own ``family`` field, or for rows from the store (``best_known``) the family in
its matrix's name (``stencil3d_7_003_366971`` -> ``stencil3d_7``); rows of real matrices count as ``real``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from sparserl.matrices.generators import family_of_generated

BINS = ((0, 100_000, "<100k"), (100_000, 500_000, "100k-500k"), (500_000, 1_000_000, "500k-1M"),
        (1_000_000, float("inf"), ">=1M"))


def size_bin(rows: int) -> str:
    return next(label for lo, hi, label in BINS if lo <= rows < hi)


def row_family(row: dict) -> str:
    if row.get("family") != "best_known":
        return str(row.get("family"))
    return family_of_generated(Path(str(row.get("matrix") or row.get("name") or "")).stem) or "real"


def teacher_mix(rows: list[dict], families: set[str] | None = None) -> dict:
    """Per family: rows, formats, and formats per size bin; library and store rows apart."""
    out: dict[str, dict] = {}
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        fam = row_family(r)
        if families is None or fam in families:
            groups[fam].append(r)
    for fam, rs in sorted(groups.items()):
        by_bin: dict[str, Counter] = defaultdict(Counter)
        for r in rs:
            by_bin[size_bin(int(r["shape"][0]))][r["format"]] += 1
        store = [r for r in rs if r.get("family") == "best_known"]
        out[fam] = {
            "rows": len(rs), "formats": dict(Counter(r["format"] for r in rs).most_common()),
            "store_rows": len(store), "store_formats": dict(Counter(r["format"] for r in store).most_common()),
            "refinement_rows": sum(bool(r.get("refinement")) for r in rs),
            "matrices": len({r.get("matrix") or r.get("name") for r in rs}),
            "largest_rows": max(int(r["shape"][0]) for r in rs),
            "by_size": {label: dict(by_bin[label].most_common()) for _, _, label in BINS if label in by_bin},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="an SFT data folder (with train.jsonl) or a .jsonl file")
    ap.add_argument("--families", default="", help="comma-separated families to show (default: all)")
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    args = ap.parse_args(argv)
    path = args.data / "train.jsonl" if args.data.is_dir() else args.data
    if not path.is_file():
        print(f"error: {path} does not exist (give an SFT data folder holding train.jsonl, or a .jsonl file)",
              file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    fams = {f for f in args.families.split(",") if f} or None
    mix = teacher_mix(rows, fams)
    if not mix:
        print(f"error: no rows of {sorted(fams) if fams else 'any family'} in {path}", file=sys.stderr)
        return 2
    for fam, m in mix.items():
        sizes = "; ".join(f"{b}: " + ", ".join(f"{k} {v}" for k, v in c.items()) for b, c in m["by_size"].items())
        print(f"{fam}: {m['rows']} rows ({m['store_rows']} from the store, {m['refinement_rows']} refinement) on "
              f"{m['matrices']} matrices up to {m['largest_rows']} rows | {sizes}")
    if args.out:
        args.out.write_text(json.dumps({"data": str(path), "families": mix}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
