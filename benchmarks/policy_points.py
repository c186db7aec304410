"""How many of a policy's samples are a search template's point on their matrix (CPU; nothing compiled or run).

A search moves from a template point (its neighbours, its switches) and, since the search reads a policy's
kernel as the point it is (:meth:`sparserl.search.space.CandidateSpace.from_text`), from a policy kernel that
is one. This counts, in the held-out families' samples of a policy (the ``completions.jsonl`` that
``benchmarks/heldout_eval.py`` writes for the set ``families``), the samples that are a point on their
matrix, the correct ones among them, how many distinct points they are, and the templates they are points of. The families' matrices are made
again as the evaluation made them (``family_set``, seed 0 unless told).

    python benchmarks/policy_points.py OUT/eval-families/completions.jsonl --family-rows 1000000 --out points.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


CORRECT = ("none", "slow")
"""Verdicts of a correct sample: verified, timed in full or stopped early as slow (a correct kernel)."""


def count(completions: list[dict], points_of) -> dict:
    """Per matrix and in total: samples, correct ones, samples that are a template point and correct ones among
    them, distinct points among them (what a search evaluates of the samples: a point once), and samples per
    template (``None``: no point). ``points_of(matrix, text)`` says (template name, point id), or (None, None).
    Pure given ``points_of``."""
    per: dict[str, dict] = {}
    distinct: dict[str, set[str]] = collections.defaultdict(set)
    for r in completions:
        m = per.setdefault(r["matrix"], {"samples": 0, "correct": 0, "points": 0, "points_correct": 0,
                                         "templates": collections.Counter()})
        name, point = points_of(r["matrix"], r["completion"])
        ok = r.get("verdict") in CORRECT
        m["samples"] += 1
        m["correct"] += ok
        m["points"] += name is not None
        m["points_correct"] += ok and name is not None
        if point is not None:
            distinct[r["matrix"]].add(point)
        m["templates"][str(name)] += 1
    out = {k: {**v, "templates": dict(v["templates"]), "distinct_points": len(distinct[k])} for k, v in per.items()}
    total = {k: sum(m[k] for m in out.values()) for k in ("samples", "correct", "points", "points_correct",
                                                          "distinct_points")}
    return {"matrices": out, "total": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("completions", type=Path, help="completions.jsonl of a held-out evaluation of the families set")
    ap.add_argument("--family-rows", type=int, default=1_000_000, help="rows of the families' matrices")
    ap.add_argument("--seed", type=int, default=0, help="the evaluation's seed")
    ap.add_argument("--system", help="the system whose samples are counted (needed when the file holds several)")
    ap.add_argument("--out", type=Path, help="write the counts as JSON here")
    args = ap.parse_args(argv)
    if not args.completions.is_file():
        print(f"error: {args.completions} is not a file", file=sys.stderr)
        return 2

    from sparserl.eval.compare import family_set
    from sparserl.kernels.contract import Op
    from sparserl.kernels.templates import templates
    from sparserl.matrices.card import matrix_card
    from sparserl.search.space import CandidateSpace, Provenance

    rows = [json.loads(line) for line in args.completions.read_text().splitlines() if line.strip()]
    systems = sorted({r.get("system", "") for r in rows})
    if args.system is None and len(systems) > 1:
        print(f"error: {args.completions} holds the samples of {', '.join(systems)}: choose one with --system",
              file=sys.stderr)
        return 2
    rows = [r for r in rows if args.system is None or r.get("system") == args.system]
    if not rows:
        print(f"error: no samples of system {args.system!r} in {args.completions} (it holds {', '.join(systems)})",
              file=sys.stderr)
        return 2
    wanted = {r["matrix"] for r in rows}
    spaces = {}
    for family, A in family_set(args.family_rows, args.seed):
        name = f"{family}_{args.family_rows}"
        if name in wanted:
            spaces[name] = CandidateSpace(matrix_card(A), Op.SPMV, None, templates("spmv"))
    missing = sorted(wanted - set(spaces))
    if missing:
        print(f"error: no family matrix of {args.family_rows} rows is named {', '.join(missing)}", file=sys.stderr)
        return 2
    def points_of(matrix: str, text: str) -> tuple[str | None, str | None]:
        p = spaces[matrix].from_text(text, Provenance.POLICY_SAMPLE)
        return p.template, p.point_id

    got = count(rows, points_of)
    for name, m in got["matrices"].items():
        print(f"{name:<24} {m['samples']:>3} samples, {m['correct']:>3} correct, {m['points']:>3} template points "
              f"({m['points_correct']} correct, {m['distinct_points']} distinct): "
              + ", ".join(f"{k} {v}" for k, v in sorted(m["templates"].items())))
    t = got["total"]
    print(f"total: {t['samples']} samples, {t['correct']} correct, {t['points']} template points "
          f"({t['points_correct']} correct), {t['distinct_points']} distinct points over {len(got['matrices'])} matrices")
    if args.out:
        args.out.write_text(json.dumps({"completions": args.completions.name, "system": rows[0].get("system"),
                                        "family_rows": args.family_rows, "seed": args.seed, **got}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
