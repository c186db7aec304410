"""How long the library's kernels are, and how far apart two variants are, before and after kernels
name their parameters once (a PARAMS line and one body per strategy).

"Before" is the rendering frozen in ``tests/kernels/fixtures/renders_before_params.json.gz``,
"after" the current code. Tokens are those of the tokenizer ``sparserl pretrain`` trains (byte-level
BPE, :func:`sparserl.model.tokenizer.train_tokenizer`) on the corpus it builds: the CUDA toolkit's
headers (capped at ``--max-bytes``) and the library repeated ``--repeats`` times; one tokenizer is
trained with the library as it was and one with the library as it is, each measuring its own.

    PYTHONPATH=src python benchmarks/params_tokens.py --out /tmp/params_tokens.json [--max-bytes 16000000]

Prints the longest library kernel (characters and tokens), the library's total, and the tokens in
which pairs of variants differ (the HYB and BSR pairs the design notes quote), and writes JSON.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import logging
import sys
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "kernels" / "fixtures" / "renders_before_params.json.gz"
PAIRS = [
    ("spmv/hyb_ell_coo/-/block=256,batches=1", "spmv/hyb_ell_coo/-/block=256,batches=4"),
    ("spmv/hyb_ell_coo/-/block=128,batches=4", "spmv/hyb_ell_coo/-/block=256,batches=4"),
    ("spmv/bsr_group/R=2,C=2/g=32,block=256", "spmv/bsr_group/R=4,C=4/g=32,block=256"),
    ("spmv/bsr_group/R=2,C=2/g=16,block=128", "spmv/bsr_group/R=4,C=4/g=16,block=128"),
    ("spmv/bsr_group/R=4,C=4/g=32,block=256", "spmv/bsr_group/R=8,C=8/g=32,block=256"),
    ("spmm/csr_rows/-/g=32,vec=4,block=256", "spmm/csr_rows/-/g=8,vec=1,block=256"),
]


def library_before() -> dict[str, str]:
    with gzip.open(FIXTURE, "rt") as f:
        return {r["key"]: r["text"] for r in json.load(f) if r["variant"] is not None}


def library_after() -> dict[str, str]:
    from sparserl.kernels.library import all_variants

    return {v.id: v.render() for v in all_variants()}


def tokenizer_for(headers: list[str], library: list[str], repeats: int, vocab: int):
    from sparserl.model.tokenizer import train_tokenizer

    return train_tokenizer(headers + library * repeats, vocab)


def difference(tok, a: str, b: str) -> dict:
    """Tokens of ``a`` and ``b``, how many differ (the longer side of each changed run), and where."""
    ta, tb = tok(a, add_special_tokens=False)["input_ids"], tok(b, add_special_tokens=False)["input_ids"]
    ops = [o for o in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes() if o[0] != "equal"]
    return {"tokens": [len(ta), len(tb)], "differing": sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops),
            "runs": len(ops), "positions": [i1 for _, i1, _, _, _ in ops][:20]}


def measure(name: str, texts: dict[str, str], tok) -> dict:
    lengths = {k: (len(t), len(tok(t, add_special_tokens=False)["input_ids"])) for k, t in texts.items()}
    longest_chars = max(lengths, key=lambda k: lengths[k][0])
    longest_tokens = max(lengths, key=lambda k: lengths[k][1])
    out = {
        "variants": len(texts),
        "longest_chars": {"id": longest_chars, "chars": lengths[longest_chars][0], "tokens": lengths[longest_chars][1]},
        "longest_tokens": {"id": longest_tokens, "chars": lengths[longest_tokens][0], "tokens": lengths[longest_tokens][1]},
        "total_chars": sum(c for c, _ in lengths.values()),
        "total_tokens": sum(t for _, t in lengths.values()),
        "pairs": {f"{a} | {b}": difference(tok, texts[a], texts[b]) for a, b in PAIRS if a in texts and b in texts},
    }
    print(f"{name}: {out['variants']} variants, {out['total_chars']} chars, {out['total_tokens']} tokens; longest "
          f"{out['longest_tokens']['id']} {out['longest_tokens']['chars']} chars, {out['longest_tokens']['tokens']} tokens")
    for pair, d in out["pairs"].items():
        print(f"  {pair}: {d['differing']} of {d['tokens']} tokens differ in {d['runs']} runs at {d['positions']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-bytes", type=int, default=16_000_000, help="cap on the toolkit header text (bytes)")
    ap.add_argument("--repeats", type=int, default=20, help="times the library is repeated in the corpus")
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from sparserl.data.corpus import CorpusConfig, build_corpus

    t0 = time.perf_counter()
    corpus = build_corpus(CorpusConfig(max_bytes=args.max_bytes, library_repeats=0))
    headers = [t for t in corpus.train]
    result = {"max_bytes": args.max_bytes, "repeats": args.repeats, "vocab": args.vocab,
              "header_files": corpus.stats["header_files"]}
    for name, texts in (("before", library_before()), ("after", library_after())):
        tok = tokenizer_for(headers, list(texts.values()), args.repeats, args.vocab)
        result[name] = measure(name, texts, tok)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
