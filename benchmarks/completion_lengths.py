"""How long the search's specialised kernels are in a policy's tokens, against the completion budget the
library alone sets.

A policy fine-tuned on the best-known store learns the search's winners, and some of them are
specialised kernels (``*_spec`` templates) that carry a matrix's facts as tables: ``csr_adaptive_spec``
lists its long rows. The automatic completion budget (:mod:`sparserl.model.budget`) was the longest
library kernel plus a margin; a kernel longer than that can be learnt but never finished by a sample.
This renders every specialised template's seed points on generated matrices of each family and counts
their tokens, as written and as the policy is taught to write them (without comments,
:mod:`sparserl.data.targets`), beside the library's longest and the budget it alone gives. With ``--judge`` the harness
(compile-only: nvcc and the static checks, no GPU) also judges each seed as written and as a sample
cut at that budget would end: its decoded first budget - 1 tokens.

    PYTHONPATH=src python benchmarks/completion_lengths.py --tokenizer PACK/tokenizer --rows 100000 --out lengths.json
    PYTHONPATH=src python benchmarks/completion_lengths.py --tokenizer PACK/tokenizer --judge --out judged.json

``--tokenizer``: a tokenizer folder (a corpus pack's ``tokenizer/``, a policy checkpoint's ``lm/``, any
HF model folder). CPU only; about a second a family at 100k rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FAMILIES = ("diagonal", "banded", "stencil2d", "block", "random", "powerlaw", "skewed", "empty_rows", "rectangular",
            "dense_lines", "rmat", "lp", "arrow")


def measure(tokenizer, families, rows: int, op: str = "spmv", judge: bool = False) -> dict:
    """Per family: the specialised seeds' token counts (longest first, with their template), and how many
    exceed the library's budget; with ``judge``, the harness's compile-only verdict on each seed as
    written and cut at the budget (``verdict``, ``cut_verdict``, ``cut_message``)."""
    from sparserl.data.targets import without_comments
    from sparserl.kernels.templates import templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card
    from sparserl.model.budget import completion_budget, library_token_lengths

    lengths = library_token_lengths(tokenizer)
    budget = completion_budget(tokenizer, None, lengths)
    longest_id = max(lengths, key=lengths.get)
    out = {"library_longest": {"id": longest_id, "tokens": lengths[longest_id]}, "library_budget": budget,
           "rows": rows, "op": op, "families": {}}
    spec = [t for t in templates(op) if t.specialised]
    ev = None
    if judge:
        from sparserl.harness.evaluator import Evaluator, HarnessConfig

        ev = Evaluator(HarnessConfig(compile_only=True))
    try:
        for fam in families:
            A = generate(fam, rows, seed=0)
            card = matrix_card(A)
            ref = ev.register(A, fam) if ev else None
            seeds = []
            for t in spec:
                for p in t.seed_points(card, None):
                    if t.check(p, card, None) is None:
                        text = t.render(p, card)
                        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                        bare = len(tokenizer(without_comments(text), add_special_tokens=False)["input_ids"])
                        seed = {"template": t.name, "tokens": len(ids), "tokens_without_comments": bare}
                        if ev is not None:
                            cut = tokenizer.decode(ids[:budget - 1])  # what a sample cut at the budget ends with
                            whole, short = ev.evaluate(text, ref, op), ev.evaluate(cut, ref, op)
                            seed |= {"verdict": whole.error_kind.value, "cut_verdict": short.error_kind.value,
                                     "cut_message": (short.message or "")[:200]}
                        seeds.append(seed)
            seeds.sort(key=lambda s: -s["tokens"])
            out["families"][fam] = {"nnz": int(A.nnz), "seeds": seeds,
                                    "over_budget": sum(s["tokens"] >= budget for s in seeds)}
    finally:
        if ev is not None:
            ev.close()
    return out


def _counts(kinds) -> str:
    """``static_check 2, contract_error 1`` (most common first), or - for none."""
    from collections import Counter

    return ", ".join(f"{k} {n}" for k, n in Counter(kinds).most_common()) or "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer folder (PACK/tokenizer, a checkpoint's lm/)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated generator families")
    ap.add_argument("--rows", type=int, default=100_000, help="rows of each generated matrix")
    ap.add_argument("--judge", action="store_true",
                    help="also the harness's compile-only verdict on each seed, as written and cut at the budget")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    from sparserl.matrices import FAMILIES as KNOWN

    families = [f for f in args.families.split(",") if f]
    bad = [f for f in families if f not in KNOWN]
    if not families or bad or args.rows < 100:
        print(f"error: families from {', '.join(sorted(KNOWN))} and --rows >= 100 (got {args.families!r}, "
              f"{args.rows})", file=sys.stderr)
        return 2
    if not (args.tokenizer / "tokenizer.json").exists() and not (args.tokenizer / "tokenizer_config.json").exists():
        print(f"error: {args.tokenizer} holds no tokenizer (give PACK/tokenizer or a checkpoint's lm/)", file=sys.stderr)
        return 2
    from sparserl.model.tokenizer import load_tokenizer

    result = measure(load_tokenizer(args.tokenizer), families, args.rows, judge=args.judge)
    print(f"library: longest {result['library_longest']['tokens']} tokens ({result['library_longest']['id']}), "
          f"budget {result['library_budget']}")
    print("| family | nonzeros | specialised seeds | longest (template) | without comments | at or over the budget |"
          + (" verdicts as written | cut at the budget |" if args.judge else ""))
    print("| --- | ---: | ---: | --- | ---: | ---: |" + (" --- | --- |" if args.judge else ""))
    for fam, r in result["families"].items():
        top = f"{r['seeds'][0]['tokens']} ({r['seeds'][0]['template']})" if r["seeds"] else "-"
        bare = max((s["tokens_without_comments"] for s in r["seeds"]), default=0)
        row = f"| {fam} | {r['nnz']} | {len(r['seeds'])} | {top} | {bare} | {r['over_budget']} |"
        if args.judge:
            over = [s for s in r["seeds"] if s["tokens"] >= result["library_budget"]]
            row += (f" {_counts(s['verdict'] for s in over)} | {_counts(s['cut_verdict'] for s in over)} |")
        print(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
