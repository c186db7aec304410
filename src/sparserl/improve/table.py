"""The per-round figures of ``sparserl improve``: metrics (one step per round) and ``rounds.md``."""

from __future__ import annotations

from sparserl.eval.metrics import geomean


def geomean_of(xs: list[float | None]) -> float | None:
    """The geometric mean (:func:`~sparserl.eval.metrics.geomean`) of the figures there are (None and 0
    left out); None when there are none."""
    xs = [x for x in xs if x]
    return geomean(xs) if xs else None


def search_totals(search: dict) -> dict:
    """A round's search summed over its matrices (skipped ones counted apart)."""
    done = [v for v in search.values() if "skipped" not in v]
    return {"matrices": len(done), "skipped": len(search) - len(done),
            "candidates": sum(v["evaluated"] for v in done), "correct": sum(v["correct"] for v in done),
            "policy": sum(v["policy"] for v in done), "policy_correct": sum(v["policy_correct"] for v in done),
            "store_improved": sum(bool(v["store_improved"]) for v in done),
            "policy_set_best": sum(bool(v["policy_set_best"]) for v in done),
            "best_known_geomean": geomean_of([v["best_known_speedup"] for v in done]),
            "seconds": sum(v["seconds"] for v in done)}


def round_metrics(rec: dict) -> dict[str, float]:
    """The scalars of one finished round (metrics.jsonl and TensorBoard, at step = the round)."""
    m: dict[str, float] = {"improve/kept": float(rec["kept"])}
    if rec.get("best_score") is not None:
        m["improve/best_score"] = rec["best_score"]
    if rec.get("search"):
        for k, v in search_totals(rec["search"]).items():
            if v is not None:
                m[f"search/{k}"] = v
    t = rec.get("teacher")
    if t:
        m["teacher/rows"], m["teacher/matrices"], m["teacher/policy_rows"] = t["rows"], t["matrices"], t["policy_rows"]
        m["teacher/replay_rows"] = t.get("replay_rows", 0)
        if t.get("speedup_geomean") is not None:
            m["teacher/speedup_geomean"] = t["speedup_geomean"]
    s = rec.get("sft")
    if s:
        m["sft/steps"] = s["steps"]
        if s.get("loss") is not None:
            m["sft/loss"] = s["loss"]
    for k, v in (rec.get("val") or {}).items():
        if isinstance(v, (int, float)) and v is not None:
            m[f"val/{k}"] = v
    for k, v in (rec.get("seconds") or {}).items():
        m[f"seconds/{k}"] = v
    return m


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def rounds_markdown(state: dict) -> str:
    """``rounds.md``: one row per finished round (round 0: the starting model's validation)."""
    cfg = state["config"]
    k = f" k={cfg['k']}" if cfg["op"] == "spmm" else ""
    setup = (f"Starting model `{cfg['model']}`; data `{cfg['data']}`; {cfg['op']}{k}; {cfg['regime']} L2. "
             f"Per round: {cfg['matrices_per_round']} training matrices searched with {cfg['search_budget']} "
             f"candidates each (policy share {cfg['policy_share']}), teacher = verified kernels within "
             f"{cfg['within']:.0%} of each matrix's best known (at most {cfg['per_matrix']} per matrix) plus "
             f"{cfg.get('replay', 0):g}x as many rows of the data's train split, {cfg['sft_steps']} SFT steps, "
             f"validation on {cfg['val_matrices']} matrices, best of {cfg['val_samples']} samples.")
    lines = ["# sparserl improve: rounds", "", setup, ""]
    if state.get("oracle_geomean") is not None:
        lines += [f"Library oracle on the validation matrices (timed at round 0): "
                  f"{state['oracle_geomean']:.2f}x cuSPARSE (geomean).", ""]
    legend = ("Columns: *search* = candidates / correct / of them the policy's correct; *new best* = matrices "
              "whose best known improved (by the policy); *best known* = geomean speedup over cuSPARSE of the "
              "searched matrices' best known kernels; *teacher* = rows (from the policy) + replayed SFT rows; "
              "*val* = best-of-k speedup geomean vs cuSPARSE, vs the library oracle, share of matrices ahead of the "
              "oracle, correct share of samples; *seconds* = search / fine-tune / validation.")
    lines += [legend, "",
              "| round | search | new best | best known | teacher | SFT loss | val vs cuSPARSE | val vs oracle "
              "| ahead of oracle | correct | kept | seconds |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rec in sorted(state["rounds"], key=lambda x: x["round"]):
        s = search_totals(rec["search"]) if rec.get("search") else None
        t, f, sft, sec = rec.get("teacher"), rec.get("val") or {}, rec.get("sft"), rec.get("seconds") or {}
        search = f"{s['candidates']} / {s['correct']} / {s['policy_correct']}" if s else "-"
        new = f"{s['store_improved']} ({s['policy_set_best']})" if s else "-"
        teacher = f"{t['rows']} ({t['policy_rows']}) + {t.get('replay_rows', 0)}" if t else "-"
        kept = ("baseline" if rec["round"] == 0 else "**kept**") if rec["kept"] else "no"
        secs = " / ".join(_f(sec.get(p), "{:.0f}") for p in ("search", "finetune", "validate"))
        lines.append(f"| {rec['round']} | {search} | {new} | {_f(s and s['best_known_geomean'])} | {teacher} "
                     f"| {_f(sft and sft.get('loss'), '{:.3f}')} | {_f(f.get('geomean_speedup'))} "
                     f"| {_f(f.get('vs_oracle'))} | {_f(f.get('ahead_of_oracle'), '{:.0%}')} "
                     f"| {_f(f.get('correct_rate'), '{:.0%}')} | {kept} | {secs} |")
    best = state.get("best")
    if best:
        lines += ["", f"Best so far: round {best['round']} (score {_f(best['score'], '{:.3f}')}), "
                      f"model `{state['best_model']}`."]
    lines += held_out_markdown(state.get("test"))
    return "\n".join(lines) + "\n"


def held_out_markdown(test: dict | None) -> list[str]:
    """The held-out comparison's lines of ``rounds.md`` (none before it ran)."""
    if not test:
        return []
    lines = ["", "## Held out: the data's test split",
             "", f"{test['matrices']} matrices, best of {test['samples']} samples, the starting policy and the best "
                 f"one (round {test['best_round']}) side by side with cuSPARSE and the library oracle in one run "
                 f"(oracle {_f(test.get('oracle_geomean'))}x cuSPARSE, geomean; details in `test/NAME/eval.md`). "
                 "These matrices chose nothing: neither searched nor validated on.",
             "", "| policy | vs cuSPARSE | vs oracle | ahead of oracle | correct | speedup@1 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, f in test["figures"].items():
        lines.append(f"| {name} | {_f(f.get('geomean_speedup'))} | {_f(f.get('vs_oracle'), '{:.3f}')} "
                     f"| {_f(f.get('ahead_of_oracle'), '{:.0%}')} | {_f(f.get('correct_rate'), '{:.0%}')} "
                     f"| {_f(f.get('speedup_at_1'))} |")
    return lines
