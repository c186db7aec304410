"""What the header grammar (``--header-grammar``) would have changed in samples already judged: for each
verdict of the harness, how many samples' headers leave the grammar (and so could not have been drawn
under it), and for the samples the harness accepted, that none does.

Reads the ``completions.jsonl`` files ``sparserl evaluate`` writes (one sample a line: system, matrix,
verdict, message, completion). With ``--tokenizer`` it also checks the lift to that tokenizer's tokens:
every library variant's own tokenization stays inside the allowed tokens to its end, and it reports the
grammar's size and build time.

    PYTHONPATH=src python benchmarks/header_grammar_cover.py RUN/eval-test/completions.jsonl ... \\
        --tokenizer PACK/tokenizer --out cover.json

CPU only, seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

BASELINES = ("cuSPARSE", "library oracle", "selector")


def cover(paths: list[Path]) -> dict:
    """Per verdict: samples, how many of them have a header outside the grammar (``outside``), and how many
    more break the code's rules after a header inside it (``code_refused``: a character that is not ASCII, a
    run of more than ``MAX_DIGIT_RUN`` digits); the refused ones' messages (most common first)."""
    from sparserl.model.header_grammar import START, run

    by: dict[str, Counter] = {}
    messages: Counter = Counter()
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("system") in BASELINES:
                continue
            text = r["completion"]
            where = ("outside" if run(START, text) is None else
                     "code_refused" if run(START, text, code=True) is None else "inside")
            by.setdefault(r["verdict"], Counter())[where] += 1
            if where != "inside":
                messages[f"{r['verdict']}: {r.get('message', '')[:100]}"] += 1
    return {"by_verdict": {v: {"samples": sum(c.values()), "outside": c["outside"], "code_refused": c["code_refused"]}
                           for v, c in sorted(by.items())},
            "outside_messages": messages.most_common(20)}


def lift(tokenizer_dir: Path) -> dict:
    """The grammar over a tokenizer: states, build seconds, and every library variant's tokens followed."""
    from sparserl.kernels.contract import Op
    from sparserl.kernels.library import variants
    from sparserl.model.header_grammar import HeaderGrammar
    from sparserl.model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    g = HeaderGrammar.for_tokenizer(tok)
    refused = []
    n = 0
    for op, k in ((Op.SPMV, None), (Op.SPMM, 32)):
        for v in variants(op, None, k):
            n += 1
            s = g.start
            for tid in tok(v.render(), add_special_tokens=False)["input_ids"]:
                if not g.allowed[s, tid]:
                    refused.append(v.id)
                    break
                s = int(g.trans[s, tid])
            else:
                if s not in g.code_rows:  # its header ended, and its code kept the code's rules
                    refused.append(v.id)
    return {"vocabulary": len(tok), "states": g.states, "build_seconds": round(g.build_seconds, 2),
            "library_variants": n, "library_variants_refused": refused}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("completions", nargs="+", type=Path, help="completions.jsonl files of evaluations")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer folder: also check the lift to its tokens")
    ap.add_argument("--out", type=Path, help="JSON file to write")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.completions if not p.is_file()]
    if missing:
        print(f"error: no completions file at {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").exists() and \
            not (args.tokenizer / "tokenizer_config.json").exists():
        print(f"error: {args.tokenizer} holds no tokenizer (tokenizer.json)", file=sys.stderr)
        return 2
    try:
        result = {"files": [str(p) for p in args.completions], **cover(args.completions)}
    except (ValueError, KeyError) as exc:
        print(f"error: a completions file is not an evaluation's completions.jsonl ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    if args.tokenizer is not None:
        result["tokenizer"] = lift(args.tokenizer)
    print("| verdict | samples | header outside the grammar | code outside its rules |")
    print("| --- | ---: | ---: | ---: |")
    for verdict, row in result["by_verdict"].items():
        print(f"| {verdict} | {row['samples']} | {row['outside']} | {row['code_refused']} |")
    for message, n in result["outside_messages"]:
        print(f"- {n} x {message}")
    if "tokenizer" in result:
        t = result["tokenizer"]
        print(f"tokenizer: {t['vocabulary']} tokens, {t['states']} states, built in {t['build_seconds']} s; "
              f"library variants whose tokens leave it: {len(t['library_variants_refused'])} of {t['library_variants']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
