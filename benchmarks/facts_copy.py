"""Does the policy copy a specialised kernel's facts from the matrix card, and how many distinct facts did its
teacher show it?

A specialised template that spells its facts (``csr_adaptive_spec``) is one body shared by every matrix plus a
block of facts at its top read off the matrix card (SHORT_MAX and the long rows). A policy that writes the body but
not the card's facts writes a wrong kernel. The templates that name their facts instead (``csr_split_spec``,
``dia_window_spec``, ``bsr_stream_spec``, ``csr_lanes_spec``: ``MATRIX_LONG_ROWS``, ``MATRIX_DIA_RUNS`` and the
like, defined by the harness from the card) have no block to copy; runs made before they did are read with the
code of their commit. This reads one held-out set of a policy run (``OUT/eval-SET``: ``eval.json``,
``completions.jsonl``) and its SFT set (``OUT/sft-data/train.jsonl``) and reports, per specialised template and
matrix:

* the samples whose body is the template's (facts aside), how many of them have the card's facts
  (:func:`sparserl.eval.library_match.facts_as_card`) and how many are correct, each way;
* of those with the card's facts, how many a teacher row of that template also has (written from memory as well
  as from the card: only the others show copying), and of those with other facts, how many wrote facts one of the
  teacher's rows has (copied from a training matrix, not from the card);
* per template, the teacher's rows and how many distinct facts blocks they hold, family by family.

    python benchmarks/facts_copy.py OUT --set families --out facts.json

CPU only: the set's matrices are made again (``families``) or loaded (``--matrices DIR`` for a set of files whose
run folder has moved: the data folder holding them) to read their cards; nothing is compiled or run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.eval.library_match import facts_as_card, specialised_facts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from saved_set import read_saved_set  # noqa: E402  (the set as the run evaluated it)
from teacher_mix import row_family  # noqa: E402  (the family of a teacher row, as that benchmark counts it)


def teacher_facts(rows: list[dict], op: str) -> dict[str, dict]:
    """Per specialised template: the teacher's rows of it, their distinct facts blocks, and both per family."""
    out: dict[str, dict] = {}
    for r in rows:
        got = specialised_facts(r["code"], op)
        if got is None:
            continue
        name, facts = got
        t = out.setdefault(name, {"rows": 0, "facts": Counter(), "families": defaultdict(Counter)})
        t["rows"] += 1
        t["facts"][facts] += 1
        t["families"][row_family(r)][facts] += 1
    return out


def sample_facts(samples: list[dict], cards: dict, op: str, taught: dict[str, dict]) -> dict[str, dict]:
    """Per specialised template, per matrix: samples of its body, and how their facts and verdicts fall."""
    out: dict[str, dict] = defaultdict(dict)
    for s in samples:
        got = specialised_facts(s["completion"], op)
        if got is None:
            continue
        name, facts = got
        m = out[name].setdefault(s["matrix"], Counter())
        right = facts_as_card(s["completion"], op, cards.get(s["matrix"]))
        ok = s["verdict"] in ("none", "slow")  # verified (slow: stopped early, its time measured)
        m["samples"] += 1
        m["correct"] += ok
        if right is None:
            m["not_compared"] += 1
        elif right:
            m["facts_as_card"] += 1
            m["facts_as_card_correct"] += ok
            m["facts_as_card_taught"] += facts in taught.get(name, {}).get("facts", {})  # no copy needed
        else:
            m["other_facts"] += 1
            m["other_facts_correct"] += ok
            m["other_facts_from_teacher"] += facts in taught.get(name, {}).get("facts", {})
    return {t: {mat: dict(c) for mat, c in sorted(by.items())} for t, by in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a policy run folder (scripts/policy_at_scale.sh's OUT)")
    ap.add_argument("--set", default="families", help="the held-out set: OUT/eval-SET (default families)")
    ap.add_argument("--system", default="", help="the policy's name in the set (default: every policy's samples)")
    ap.add_argument("--sft", type=Path, help="the SFT set's train.jsonl (default OUT/sft-data/train.jsonl)")
    ap.add_argument("--matrices", help="where the set's matrices are now, for a set of files (a data folder)")
    ap.add_argument("--out", type=Path, help="write the tables as JSON here")
    args = ap.parse_args(argv)
    sft = args.sft or args.run / "sft-data" / "train.jsonl"
    try:
        if not sft.is_file():
            raise SparseRLError(f"{sft} does not exist (give a policy run folder, or --sft)")
        result, samples, contexts = read_saved_set(args.run, args.set, args.system, args.matrices)
    except SparseRLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    op = result["op"]
    wanted = {s["matrix"] for s in samples}
    cards = {name: ctx.card for name, ctx in contexts.items() if name in wanted}
    taught = teacher_facts([json.loads(line) for line in sft.read_text().splitlines() if line.strip()], op)
    by_template = sample_facts(samples, cards, op, taught)
    teacher = {t: {"rows": v["rows"], "distinct_facts": len(v["facts"]),
                   "families": {f: {"rows": sum(c.values()), "distinct_facts": len(c)} for f, c in sorted(v["families"].items())}}
               for t, v in sorted(taught.items())}
    for t, by in by_template.items():
        tot = Counter()
        for c in by.values():
            tot.update(c)
        tt = teacher.get(t, {"rows": 0, "distinct_facts": 0})
        print(f"{t}: {tot['samples']} samples, {tot['correct']} correct | facts as the card's {tot['facts_as_card']} "
              f"({tot['facts_as_card_correct']} correct, {tot['facts_as_card_taught']} also taught), "
              f"other facts {tot['other_facts']} "
              f"({tot['other_facts_correct']} correct, {tot['other_facts_from_teacher']} a teacher row's) | "
              f"teacher: {tt['rows']} rows, {tt['distinct_facts']} distinct facts")
    if args.out:
        args.out.write_text(json.dumps({"run": args.run.resolve().name, "set": args.set, "system": args.system or None,
                                        "samples": by_template, "teacher": teacher}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
