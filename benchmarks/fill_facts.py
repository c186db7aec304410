"""How many of a held-out set's failed samples are a specialised kernel with wrong facts, and are they correct
with the card's facts filled in?

A specialised template that spells its facts (``csr_adaptive_spec``) is one body shared by every matrix plus a
block of facts read off the matrix card. A policy that writes the body at a valid point but miscopies the facts (a
training matrix's long rows, a garbled number) writes a wrong kernel, although everything it chose is right. The
templates that name their facts instead (``csr_split_spec``, ``dia_window_spec``, ``bsr_stream_spec``,
``csr_lanes_spec``: ``MATRIX_LONG_ROWS``, ``MATRIX_DIA_RUNS`` and the like, defined by the harness from the card)
have no block to get wrong; runs made before they did are read with the code of their commit.
:func:`sparserl.eval.library_match.fill_facts` writes the card's facts into such a sample and changes nothing
else. This reads one held-out set of a policy run (``OUT/eval-SET``: ``eval.json``, ``completions.jsonl``),
makes its matrices again to read their cards, and reports which samples the fill changes and their verdicts
(with ``--compile``, whether the filled kernels compile: nvcc, no GPU needed); with ``--judge`` (a GPU) it judges
the filled kernels on their matrices with the harness and reports the set's correct share before and after (the
other samples keep their verdicts).

    python benchmarks/fill_facts.py OUT --set families --system base_sft [--compile] [--judge] --out fill.json

The figures after the fill are the policy with the fill, not the policy: both are reported.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.eval.library_match import fill_facts, specialised_facts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from saved_set import read_saved_set  # noqa: E402  (the set as the run evaluated it)

VERIFIED = ("none", "slow")
"""Verdicts of a verified sample (slow: stopped early, its time measured)."""


def filled_samples(samples: list[dict], cards: dict, op: str) -> list[tuple[int, str, str]]:
    """(index, template, filled text) of each sample the fill changes."""
    out = []
    for i, s in enumerate(samples):
        filled = fill_facts(s["completion"], op, cards.get(s["matrix"]))
        if filled is not None:
            out.append((i, specialised_facts(filled, op)[0], filled))
    return out


def tally(samples: list[dict], filled: list[tuple[int, str, str]], verdicts: dict[int, str] | None) -> dict:
    """The set's samples and correct ones before the fill; the filled ones by template and verdict before; and,
    given the filled kernels' ``verdicts`` (index -> verdict), the correct ones after."""
    before = sum(s["verdict"] in VERIFIED for s in samples)
    out = {"samples": len(samples), "correct_before": before, "correct_share_before": before / len(samples),
           "filled": len(filled),
           "filled_by_template": dict(Counter(t for _, t, _ in filled)),
           "filled_verdicts_before": dict(Counter(samples[i]["verdict"] for i, _, _ in filled))}
    if verdicts is not None:
        after = before + sum((verdicts[i] in VERIFIED) - (samples[i]["verdict"] in VERIFIED) for i, _, _ in filled)
        out.update(correct_after=after, correct_share_after=after / len(samples),
                   filled_verdicts_after=dict(Counter(verdicts[i] for i, _, _ in filled)))
    return out


def _harness(filled: list[tuple[int, str, str]], samples: list[dict], contexts: dict, op: str, k,
             compile_only: bool) -> list:
    """The harness's results of the filled kernels on their matrices: compiled only, or judged (cold regime,
    every check; a GPU needed)."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    ev = Evaluator(HarnessConfig(compile_only=True) if compile_only else HarnessConfig(regimes=("cold",)))
    try:
        if not compile_only and not ev.has_gpu:
            raise SparseRLError("no GPU visible: --judge runs the filled kernels with the harness")
        return ev.evaluate_many([(text, contexts[samples[i]["matrix"]].ref(ev), op, k) for i, _, text in filled])
    finally:
        ev.close()


def judge(filled: list[tuple[int, str, str]], samples: list[dict], contexts: dict, op: str, k) -> dict[int, dict]:
    """Each filled kernel judged by the harness on its matrix: index -> verdict, message, speedup against cuSPARSE."""
    rs = _harness(filled, samples, contexts, op, k, compile_only=False)
    return {i: {"verdict": r.error_kind.value, "message": (r.message or "")[:200], "speedup": r.speedup}
            for (i, _, _), r in zip(filled, rs)}


def compiled(filled: list[tuple[int, str, str]], samples: list[dict], contexts: dict, op: str, k) -> dict[int, bool]:
    """Whether each filled kernel compiles (nvcc, the harness's compile-only mode: no GPU needed)."""
    rs = _harness(filled, samples, contexts, op, k, compile_only=True)
    return {i: r.compiled for (i, _, _), r in zip(filled, rs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a policy run folder (scripts/policy_at_scale.sh's OUT)")
    ap.add_argument("--set", default="families", help="the held-out set: OUT/eval-SET (default families)")
    ap.add_argument("--system", default="", help="the policy's name in the set (default: every policy's samples)")
    ap.add_argument("--matrices", help="where the set's matrices are now, for a set of files (a data folder)")
    ap.add_argument("--compile", action="store_true", help="compile the filled kernels (nvcc; no GPU needed)")
    ap.add_argument("--judge", action="store_true", help="judge the filled kernels on a GPU (else: count them)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    try:
        result, samples, contexts = read_saved_set(args.run, args.set, args.system, args.matrices)
    except SparseRLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    op = result["op"]
    filled = filled_samples(samples, {name: ctx.card for name, ctx in contexts.items()}, op)
    judged = None
    if args.judge and filled:
        try:
            judged = judge(filled, samples, contexts, op, result.get("k"))
        except SparseRLError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    figures = tally(samples, filled, {i: j["verdict"] for i, j in judged.items()} if judged is not None else None)
    built = compiled(filled, samples, contexts, op, result.get("k")) if args.compile and filled else None
    if built is not None:
        figures["filled_compiled"] = sum(built.values())
    print(f"{figures['samples']} samples, {figures['correct_before']} correct "
          f"({100 * figures['correct_share_before']:.1f}%); the fill changes {figures['filled']} "
          f"({', '.join(f'{t} {n}' for t, n in figures['filled_by_template'].items()) or 'none'}), verdicts before: "
          f"{figures['filled_verdicts_before']}")
    if built is not None:
        print(f"{figures['filled_compiled']} of the {figures['filled']} filled kernels compile")
    if judged is not None:
        print(f"after the fill: {figures['correct_after']} correct ({100 * figures['correct_share_after']:.1f}%); "
              f"the filled kernels' verdicts: {figures['filled_verdicts_after']}")
    if args.out:
        figures["judged"] = [{"matrix": samples[i]["matrix"], "template": t, "verdict_before": samples[i]["verdict"],
                              **({"compiled": built[i]} if built is not None else {}),
                              **(judged[i] if judged is not None else {})} for i, t, _ in filled]
        run = args.run.name or args.run.resolve().name  # the name given (a link keeps its own)
        args.out.write_text(json.dumps({"run": run, "set": args.set, "system": args.system or None, **figures},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
