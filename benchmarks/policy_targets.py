"""The policy's targets, read off a finished ``scripts/policy_at_scale.sh`` folder: one table and one JSON.

What the run measured, beside the bar each target sets:

* pre-training: its minutes (at most 30), tokens/s, MFU and held-out perplexity;
* the whole sitting: the GPU seconds of every stage (``stages.tsv``), against the preset's aim; a run that
  changed something of its preset (``settings.json``, written by the script: more teacher matrices, more SFT
  steps, more samples, a base model made before, ...) is not the preset's sitting, so its time is reported
  and judged against no aim;
* per held-out set (``eval-test``, ``eval-families``, and ``eval-real``, the SuiteSparse test split, when the
  run was given ``SUITESPARSE``): the checkpoint's correct share (at least 95%),
  new bodies' correct share (at least 50%: a body the library does not have under any PARAMS), the
  best of N over the library oracle's geometric mean (at least 1.00 on the families at 1M rows, 0.98
  elsewhere), and the share of matrices where the best sample beats the oracle by more than
  :data:`CLEAR_MARGIN` (at least 25%): a best of N timed once each can lead the oracle's one timing of the same
  variant by a little (2.86x against 2.81x on a 5.6 us kernel), so a lead within the timing noise is not counted.
  Beside it, not a target, the share ahead by any amount. The best of N and the oracle are each the fastest of
  single timings; where the evaluation timed each matrix's picks again side by side (``evaluate --retime``,
  which the script asks for), these figures are read off that second look, else off the first timings, and a
  best-of-N ratio within a few tenths of a percent of its bar is then inside the noise: the table says which.

* the model guiding the search (``guided.json``, from ``benchmarks/guided_search.py``): generate with the
  model and a search of 16 after its samples against a search of 64 without it (at least 1.00), and a search
  of 64 with the model against one without it (at least 1.03), as geometric means of the search's time over
  the guided one's: the arms' picks timed again side by side where the run did (``--retime``), else the first
  timings (from separate searches: the table names which); a matrix where an arm found no correct kernel
  leaves the target unmeasured, never out of the mean.

* ``improve`` (``improve/rounds.json``): the final policy's best of N on the families at 1M rows over its SFT
  start's, both in the same ``eval-families`` run (at least 1.10), with every kept round at 90% correct or more.
  When no round was kept, the final policy is the SFT start: 1.00, not met. Not measured when improve did not run.

With a kept round the evaluations hold two policies, ``base_sft`` and ``improved``; the per-set targets are
the final policy's (``improved``). ``--system NAME`` judges another policy of the tables instead (a snapshot
``sft_stepN``, or the final policy at a second temperature, ``base_sft_t0.7``).

    python benchmarks/policy_targets.py OUT --preset small --out targets.json
    python benchmarks/policy_targets.py OUT --preset small --system base_sft_t0.7 --out targets-t0.7.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparserl.eval.specs import system_temperatures
from sparserl.improve.table import geomean_of

AIM_MINUTES = {"small": 15.0, "full": 40.0}
"""The GPU minutes each preset of the script aims at."""
PRETRAIN_MAX_MINUTES = 30.0
MIN_CORRECT = 0.95
MIN_NEW_CORRECT = 0.50
MIN_AHEAD_SHARE = 0.25
MIN_OVER_ORACLE = {"families": 1.00}
"""Best of N over the oracle, per set; any other set: :data:`DEFAULT_OVER_ORACLE`."""
DEFAULT_OVER_ORACLE = 0.98
GUIDED_GENERATE = 1.00
"""generate --search 16 with the model over search --budget 64 without it (the search's time over generate's)."""
GUIDED_MODEL = 1.03
"""search --budget 64 with the model over the same search without it."""
IMPROVE_GAIN = 1.10
"""The improved policy's best of N at 1M rows over its SFT start's."""
IMPROVE_MIN_CORRECT = 0.90
"""Every kept round's validation correct share."""
CLEAR_MARGIN = 0.02
"""The lead over the oracle a matrix must show to count as ahead of it (the ahead target's share)."""
START, IMPROVED = "base_sft", "improved"
"""The script's names for the SFT model and the improved one (``-c NAME=PATH``)."""
ORACLE = "library oracle"


def policies_of(ev: dict) -> list[str]:
    """The systems of one ``eval.json`` that are neither cuSPARSE nor the library oracle."""
    return [s for s in ev["summary"] if s not in ("cuSPARSE", ORACLE)]


def eval_figures(ev: dict, checkpoint: str | None = None) -> dict:
    """The targets' figures for one ``eval.json``: of ``checkpoint`` (default: the one system that is
    neither a baseline nor the paper's) against the library oracle, matrix by matrix."""
    systems = policies_of(ev)
    name = checkpoint or (systems[0] if len(systems) == 1 else None)
    if name is None or name not in ev["summary"]:
        raise ValueError(f"name the checkpoint: this evaluation holds {systems}")
    ours, oracle = ev["per_matrix"][name], ev["per_matrix"].get(ORACLE)
    retimed = bool(oracle) and all("retimed_speedup" in r for r in (*ours.values(), *oracle.values()))
    ratios, ahead, clear = over_oracle(ours, oracle, "retimed_speedup" if retimed else "best_speedup")
    match = ev.get("library_match", {}).get(name, {})
    new = match.get("new", {"samples": 0, "correct": 0})
    summary = ev["summary"][name]
    return {
        "checkpoint": name,
        "matrices": len(ours),
        "samples": summary["samples"],
        "correct_share": summary["correct_rate"],
        "new_bodies": new["samples"],
        "new_bodies_correct": new["correct"],
        "new_correct_share": new["correct"] / new["samples"] if new["samples"] else None,
        "new_failures": new.get("failures", {}),
        "new_messages": {kind: ms[0]["example"] for kind, ms in new.get("messages", {}).items() if ms},
        "best_over_oracle": geomean_of(ratios),
        "timing": "retimed" if retimed else "first",
        "best_over_oracle_first": geomean_of(over_oracle(ours, oracle, "best_speedup")[0]) if retimed else None,
        "ahead_of_oracle_share": ahead / len(ours) if ours and oracle else None,
        "ahead_clearly_share": clear / len(ours) if ours and oracle else None,
        "measured": not ev.get("compile_only") and oracle is not None,
        "temperature": sampled_at(ev.get("config", {}), name),
    }


def over_oracle(ours: dict, oracle: dict | None, key: str) -> tuple[list[float], int, int]:
    """Per matrix, the best of N over the oracle by the records' ``key`` (``best_speedup``: the first timings;
    ``retimed_speedup``: ``evaluate --retime``'s second look), and how many matrices lead it, at all and by more
    than :data:`CLEAR_MARGIN`."""
    ratios, ahead, clear = [], 0, 0
    for matrix, row in ours.items() if oracle else ():  # no oracle (compile-only, or not asked): no ratio
        ref = oracle.get(matrix, {}).get(key) or 0.0  # no verified library kernel: cuSPARSE is the bar
        best = row.get(key) if row.get("correct") else None
        mine = max(best or 0.0, 1.0)  # no correct sample, or none faster than cuSPARSE: the user keeps cuSPARSE
        ratios.append(mine / max(ref, 1.0))  # the oracle too: where cuSPARSE beats every library kernel, the bar
        ahead += mine > max(ref, 1.0)  # strictly ahead: a tie with the oracle is not ahead
        clear += mine > max(ref, 1.0) * (1 + CLEAR_MARGIN)
    return ratios, ahead, clear


def sampled_at(config: dict, name: str) -> float | None:
    """The temperature ``name``'s samples were drawn at: its own (``system_temperatures``' ``NAME=T``), else the
    set's (``eval/compare.temperature_of`` on a saved config)."""
    return system_temperatures(config.get("system_temperatures") or ()).get(name, config.get("temperature"))


def read_run(out: Path, preset: str, system: str | None = None) -> dict:
    """Every figure the folder holds, and each target's verdict (True, False, or None: not measured). The per-set
    targets are ``system``'s (a :class:`ValueError` when a set's tables lack it), else the final policy's."""
    result: dict = {"run": str(out.name), "preset": preset, "targets": []} | ({"system": system} if system else {})
    stages = out / "stages.tsv"
    seconds = {}
    if stages.exists():
        for line in stages.read_text().splitlines():
            name, _, s = line.partition("\t")
            if s.strip():
                seconds[name] = seconds.get(name, 0) + int(s)
    result["stage_seconds"] = seconds
    total = sum(seconds.values())
    evaluated = "evals" in seconds or all(n in seconds for n in ("eval-test", "eval-families"))  # one stage, or one per set
    done = (evaluated and all(name in seconds for name in ("pretrain", "data", "sft"))  # every stage ran,
            and all((out / f"eval-{s}" / "eval.json").exists() for s in ("test", "families")))  # both sets written
    settings = json.loads((out / "settings.json").read_text()) if (out / "settings.json").exists() else {}
    if settings.get("preset", preset) != preset:
        raise ValueError(f"it ran the {settings['preset']} preset (settings.json), not {preset}: give --preset "
                         f"{settings['preset']}")
    changed = result["changed"] = settings.get("changed", [])
    aim = AIM_MINUTES.get(preset)
    sitting = f"one sitting within {aim:g} GPU minutes ({preset})" if aim else "one sitting"
    if changed:  # not the preset as defined: its minutes say nothing of the preset's aim
        sitting = f"one sitting ({preset}, changed: {', '.join(changed)})"
    result["targets"].append({"target": sitting, "value": round(total / 60, 1) if seconds else None,
                              "met": (total / 60 <= aim) if (done and aim and not changed) else None})
    pre = out / "pretrain" / "result.json"
    if pre.exists():
        p = json.loads(pre.read_text())
        result["pretrain"] = {k: p.get(k) for k in ("params", "steps", "minutes", "tokens_per_s", "mfu")}
        ppl = p.get("heldout_ppl_by_package") or {}
        result["pretrain"]["heldout_ppl_mean"] = (sum(ppl.values()) / len(ppl)) if ppl else p.get("eval/heldout_ppl")
        result["pretrain"]["heldout_ppl_by_package"] = ppl
        minutes = p.get("wall_seconds", 60 * (p.get("minutes") or 0)) / 60
        result["targets"].append({"target": f"pre-training within {PRETRAIN_MAX_MINUTES:g} minutes",
                                  "value": round(minutes, 1), "met": minutes <= PRETRAIN_MAX_MINUTES})
    families = None
    for folder in sorted(out.glob("eval-*")):
        path = folder / "eval.json"
        if not path.exists():
            continue
        name = folder.name.removeprefix("eval-")
        ev = json.loads(path.read_text())
        final = next((n for n in (IMPROVED, START) if n in ev["summary"]), None)  # snapshots (sft_stepN) beside it
        if system:
            if system not in ev["summary"]:
                named = ", ".join(policies_of(ev)) or "none"
                raise ValueError(f"eval-{name} has no policy named '{system}' (it has: {named})")
            final = system
        fig = eval_figures(ev, final)  # the final policy
        if name == "families":
            families = ev
        result.setdefault("sets", {})[name] = fig
        bar = MIN_OVER_ORACLE.get(name, DEFAULT_OVER_ORACLE)
        for target, value, least in (
                (f"{name}: correct share at least {MIN_CORRECT:.0%}", fig["correct_share"], MIN_CORRECT),
                (f"{name}: new bodies at least {MIN_NEW_CORRECT:.0%} correct", fig["new_correct_share"], MIN_NEW_CORRECT),
                (f"{name}: best of N at least {bar:.2f} of the oracle", fig["best_over_oracle"], bar),
                (f"{name}: ahead of the oracle (by more than {CLEAR_MARGIN:.0%}) on at least {MIN_AHEAD_SHARE:.0%} "
                 "of matrices", fig["ahead_clearly_share"], MIN_AHEAD_SHARE)):
            met = value >= least if (fig["measured"] and value is not None) else None  # compile-only: nothing ran
            result["targets"].append({"target": target, "value": value, "met": met})
    guided = out / "guided.json"
    g = json.loads(guided.read_text()) if guided.exists() else None
    if g is not None:
        result["guided"] = g["summary"] | {"compile_only": g.get("compile_only", False)}
    for target, key, least in (
            ("model-guided search: generate --search 16 at least as fast as search --budget 64",
             "generate_over_search", GUIDED_GENERATE),
            (f"model-guided search: {GUIDED_MODEL:.2f}x at equal budget 64", "model_over_search", GUIDED_MODEL)):
        # the arms' kernels timed again side by side where the run did (guided_search.py --retime): that ratio
        # carries no selection among timings, so it is the one the target reads; the first timing's beside it
        first = g["summary"][key] if g is not None else None
        again = g["summary"].get(f"{key}_retimed") if g is not None else None
        whole = g is not None and g["summary"].get(COMPARED[key]) == g["summary"].get("matrices")
        asked_again = g is not None and (g.get("config", {}).get("retime") not in (None, 0, False)
                                         or again is not None)
        if asked_again and g["summary"].get(f"compared_{key}_retimed") != g["summary"].get(COMPARED[key]):
            whole = False  # a second look failed on a matrix: neither figure is the whole set's, side by side
        value = again if asked_again else first
        measured = g is not None and not g.get("compile_only") and value is not None and whole
        result["targets"].append({"target": target, "value": value, "met": value >= least if measured else None,
                                  "first_timing": first, "retimed": asked_again and again is not None,
                                  "every_matrix": whole})
    result["targets"].append(improve_target(out, families))
    return result


COMPARED = {"generate_over_search": "compared_generate", "model_over_search": "compared_model"}
"""The guided summary's count of matrices behind each ratio (``guided_search.summarise``)."""


def improve_target(out: Path, families: dict | None) -> dict:
    """The improve target's row: the final policy over its SFT start on the families at 1M rows (None: not
    measured, when improve did not run or the families were not evaluated), met only with every kept round
    at :data:`IMPROVE_MIN_CORRECT` or more."""
    row = {"target": f"improve: +{IMPROVE_GAIN - 1:.0%} best of N over its SFT start at 1M rows", "value": None,
           "met": None}
    rounds = out / "improve" / "rounds.json"
    if not rounds.exists() or families is None:
        return row
    kept = [r for r in json.loads(rounds.read_text())["rounds"] if r["round"] > 0 and r.get("kept")]
    kept_correct = [r["val"]["correct_rate"] for r in kept]
    start = eval_figures(families, START)
    final = eval_figures(families, IMPROVED) if IMPROVED in families["summary"] else start  # no round kept
    if not (start["measured"] and start["best_over_oracle"] and final["best_over_oracle"]):
        return row | {"kept_rounds": len(kept)}
    gain = final["best_over_oracle"] / start["best_over_oracle"]
    return row | {"value": gain, "met": gain >= IMPROVE_GAIN and all(c >= IMPROVE_MIN_CORRECT for c in kept_correct),
                  "kept_rounds": len(kept), "kept_correct": kept_correct}


def _cell(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def table(result: dict) -> str:
    lines = ["| target | measured | met |", "| --- | ---: | --- |"]
    for t in result["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {_cell(t['value'])} | {met} |")
    for name, fig in result.get("sets", {}).items():
        lines.append("")
        lines.append(f"{name}: {fig['matrices']} matrices, {fig['samples']} samples of {fig['checkpoint']}; new bodies "
                     f"{fig['new_bodies_correct']} correct of {fig['new_bodies']}")
        if fig.get("ahead_clearly_share") is not None:
            lines.append(f"{name}: ahead of the oracle by more than {CLEAR_MARGIN:.0%} on "
                         f"{fig['ahead_clearly_share']:.3f} of matrices "
                         f"(strictly ahead: {fig['ahead_of_oracle_share']:.3f})")
        failed = [f"{kind} {n}" + (f" (`{fig['new_messages'][kind][:100]}`)" if kind in fig.get("new_messages", {}) else "")
                  for kind, n in fig.get("new_failures", {}).items()]
        if failed:
            lines.append(f"{name}: new bodies not correct: " + "; ".join(failed))
    g = result.get("guided") or {}
    for t in result["targets"]:
        if t["target"].startswith("model-guided") and t.get("retimed"):
            lines.append(f"guided: {t['target'].split(': ', 1)[1]}: {_cell(t['value'])} with the arms' kernels timed "
                         f"again side by side, {_cell(t['first_timing'])} on their first timing")
        elif t["target"].startswith("model-guided") and t["value"] is not None:
            lines.append(f"guided: {t['target'].split(': ', 1)[1]}: {_cell(t['value'])} on the arms' first timings "
                         "(separate searches, not timed again side by side: inside their spread)"
                         + ("" if t.get("every_matrix", True) else "; an arm found no correct kernel on a matrix: "
                            "not measured"))
    for name, fig in result.get("sets", {}).items():
        if fig.get("best_over_oracle") is not None and fig.get("timing") == "retimed":
            lines.append(f"{name}: best of N over the oracle {_cell(fig['best_over_oracle'])} with both picks timed "
                         f"again side by side (evaluate --retime), {_cell(fig['best_over_oracle_first'])} on their "
                         "first timings")
        elif fig.get("best_over_oracle") is not None:
            lines.append(f"{name}: best of N over the oracle {_cell(fig['best_over_oracle'])}: each the fastest of "
                         "single timings, not timed again side by side")
    if g.get("compared_headroom"):
        again = g.get("headroom_retimed")
        lines.append(f"guided: a longer search without a model over the search of the budget (the room any guide has), "
                     f"{g['compared_headroom']} matrices: {_cell(g['headroom'])} first timing"
                     + (f", {_cell(again)} retimed" if again is not None else ""))
        room = again if again is not None else g.get("headroom")
        if room is not None and room < GUIDED_MODEL:
            lines.append(f"guided: that room is under the {GUIDED_MODEL:.2f} the equal-budget target asks: a guide that "
                         f"proposes the search's own templates and parameters cannot reach it on these matrices, only "
                         f"kernels outside that space")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the OUT folder of scripts/policy_at_scale.sh")
    ap.add_argument("--preset", default="full", choices=[*sorted(AIM_MINUTES), "smoke"], help="the preset the run used (smoke: no time aim)")
    ap.add_argument("--system", help="judge this policy of the tables (default: improved, else base_sft)")
    ap.add_argument("--out", type=Path, help="JSON file to write")
    args = ap.parse_args(argv)
    if not args.run.is_dir():
        print(f"error: {args.run} is not a folder (give the OUT folder of scripts/policy_at_scale.sh)", file=sys.stderr)
        return 2
    try:
        result = read_run(args.run, args.preset, args.system)
    except (ValueError, KeyError, json.JSONDecodeError) as exc:
        print(f"error: {args.run}: {exc}", file=sys.stderr)
        return 2
    if not result["stage_seconds"] and "sets" not in result:
        print(f"error: {args.run} holds no stages.tsv and no eval-*/eval.json: not a policy_at_scale.sh folder",
              file=sys.stderr)
        return 2
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
