"""benchmarks/policy_targets.py: the policy's targets read off a run folder (CPU). Checked on a hand-made evaluation
and on a real one (the reduced GPU run's eval.json in benchmarks/results). Mutations killed: a tie with the oracle
counted as ahead, a lead within the 2% margin counted as a clear one, a matrix with no correct sample left out
instead of counted at cuSPARSE's speed, the best over the oracle taken from means instead of per matrix, a target
that is reported met when it was not measured, a folder that is not a run accepted; for improve: the SFT model's
figures taken for the final policy's, a kept round under 90% correct let through, a run that kept no round reported
as not measured or met, the gain taken from another set than the families at 1M rows; a run that changed its preset
judged against the preset's minutes; an SFT snapshot evaluated beside the final policy taken for it; ``--system``
ignored or a name the tables lack let through."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

bench = load_benchmark("policy_targets")
ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "benchmarks/results/2026-12-02/policy-mini/eval.json"


def _eval(per_matrix: dict, oracle: dict, new=(4, 1)) -> dict:
    rows = {m: {"family": "f", "best_speedup": b, "correct": int(b is not None)} for m, b in per_matrix.items()}
    return {"summary": {"cuSPARSE": {}, "library oracle": {}, "ours": {"samples": 16, "correct_rate": 0.75}},
            "per_matrix": {"ours": rows, "library oracle": {m: {"best_speedup": b} for m, b in oracle.items()}},
            "library_match": {"ours": {"new": {"samples": new[0], "correct": new[1]}}}}


def test_ties_are_not_ahead_and_a_matrix_without_a_correct_kernel_counts_at_cusparse() -> None:
    ev = _eval({"tie": 2.0, "ahead": 3.0, "behind": 1.5, "none": None}, {"tie": 2.0, "ahead": 2.0, "behind": 3.0,
                                                                            "none": 4.0})
    fig = bench.eval_figures(ev)
    assert fig["ahead_of_oracle_share"] == 0.25 and fig["ahead_clearly_share"] == 0.25
    assert fig["best_over_oracle"] == pytest.approx((1.0 * 1.5 * 0.5 * 0.25) ** 0.25)
    assert fig["new_correct_share"] == 0.25 and fig["correct_share"] == 0.75


def test_a_lead_within_the_margin_is_ahead_but_not_clearly() -> None:
    ev = _eval({"noise": 2.03, "clear": 2.1, "both_slow": 0.9}, {"noise": 2.0, "clear": 2.0, "both_slow": 0.8})
    fig = bench.eval_figures(ev)
    assert fig["ahead_of_oracle_share"] == pytest.approx(2 / 3)
    assert fig["ahead_clearly_share"] == pytest.approx(1 / 3)  # 2.03 is within 2% of 2.0; below cuSPARSE ties at 1.0
    assert "by more than 2% on 0.333 of matrices (strictly ahead: 0.667)" in bench.table(
        {"targets": [], "sets": {"s": fig | {"matrices": 3}}})


def test_a_real_evaluation_agrees_with_its_own_summary(tmp_path) -> None:
    ev = json.loads(MINI.read_text())
    fig = bench.eval_figures(ev)
    summary = ev["summary"]
    assert fig["best_over_oracle"] == pytest.approx(summary["base_sft"]["geomean_speedup"]
                                                    / summary["library oracle"]["geomean_speedup"], rel=1e-9)
    assert (fig["new_bodies"], fig["new_bodies_correct"], fig["correct_share"]) == (7, 0, 0.8)
    out = tmp_path / "run"
    (out / "eval-test").mkdir(parents=True)
    shutil.copy(MINI, out / "eval-test/eval.json")
    (out / "stages.tsv").write_text("pretrain\t140\ndata\t28\nsft\t73\neval-test\t29\n")
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    verdicts = {t["target"]: t["met"] for t in result["targets"]}
    assert verdicts["one sitting within 15 GPU minutes (small)"] is None  # no eval-families stage: not done
    (out / "stages.tsv").write_text("pretrain\t140\ndata\t28\nsft\t73\nevals\t100\n")  # both sets, one stage
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    verdicts = {t["target"]: t["met"] for t in json.loads((tmp_path / "t.json").read_text())["targets"]}
    assert verdicts["one sitting within 15 GPU minutes (small)"] is None  # no eval-families/eval.json: not done
    (out / "eval-families").mkdir()
    shutil.copy(MINI, out / "eval-families/eval.json")
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    verdicts = {t["target"]: t["met"] for t in json.loads((tmp_path / "t.json").read_text())["targets"]}
    assert verdicts["one sitting within 15 GPU minutes (small)"] is True  # 341 s, both sets written
    (out / "stages.tsv").write_text("pretrain\t140\ndata\t28\nsft\t73\neval-test\t29\neval-families\t700\n")
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    verdicts = {t["target"]: t["met"] for t in result["targets"]}
    assert verdicts["one sitting within 15 GPU minutes (small)"] is False  # 970 s
    assert verdicts["test: correct share at least 95%"] is False
    assert verdicts["test: new bodies at least 50% correct"] is False
    assert verdicts["improve: +10% best of N over its SFT start at 1M rows"] is None  # not in this run
    assert not any(t["met"] for t in result["targets"] if t["value"] is None)


def test_a_run_that_changed_its_preset_is_not_judged_by_the_presets_aim(tmp_path, capsys) -> None:
    """Kills: a run with more teacher matrices (or any other change the script records in settings.json) judged
    against the preset's minutes, a folder of one preset read as another's."""
    out = tmp_path / "run"
    for name in ("test", "families"):
        (out / f"eval-{name}").mkdir(parents=True)
        shutil.copy(MINI, out / f"eval-{name}/eval.json")
    (out / "stages.tsv").write_text("pretrain\t140\ndata\t28\nsft\t73\nevals\t100\n")
    (out / "settings.json").write_text(json.dumps({"preset": "small", "changed": []}))
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    sitting = json.loads((tmp_path / "t.json").read_text())["targets"][0]
    assert sitting == {"target": "one sitting within 15 GPU minutes (small)", "value": 5.7, "met": True}
    (out / "settings.json").write_text(json.dumps({"preset": "small", "changed": ["TEACHER_PER_FAMILY=8",
                                                                                 "SFT_STEPS=400"]}))
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["targets"][0] == {"target": "one sitting (small, changed: TEACHER_PER_FAMILY=8, SFT_STEPS=400)",
                                    "value": 5.7, "met": None}
    assert result["changed"] == ["TEACHER_PER_FAMILY=8", "SFT_STEPS=400"]
    capsys.readouterr()
    assert bench.main([str(out), "--preset", "full"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "ran the small preset" in err and err.count("\n") == 1


def test_the_new_bodies_failures_are_listed_with_a_message_each() -> None:
    """Kills: the failures of the new bodies left out of the figures or the table, a message shown for a kind
    other than its own."""
    ev = _eval({"a": 2.0}, {"a": 2.0}, new=(3, 0))
    ev["library_match"]["ours"]["new"] |= {"failures": {"static_check": 2, "compile_error": 1},
                                           "messages": {"static_check": [{"shape": "unbalanced '…'", "count": 2,
                                                                          "example": "unbalanced '{'"}]}}
    fig = bench.eval_figures(ev)
    assert fig["new_failures"] == {"static_check": 2, "compile_error": 1}
    text = bench.table({"targets": [], "sets": {"test": fig}})
    assert "test: new bodies not correct: static_check 2 (`unbalanced '{'`); compile_error 1" in text


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path, capsys) -> None:
    assert bench.main([str(tmp_path)]) == 2
    assert bench.main([str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_a_compile_only_evaluation_meets_no_target(tmp_path) -> None:
    ev = _eval({"a": 5.0}, {"a": 1.0}, new=(1, 1))
    ev["compile_only"] = True  # nothing ran: the figures are not measurements
    out = tmp_path / "run"
    (out / "eval-test").mkdir(parents=True)
    (out / "eval-test" / "eval.json").write_text(json.dumps(ev))
    result = bench.read_run(out, "smoke")
    assert [t["met"] for t in result["targets"]] == [None] * len(result["targets"])


def test_the_guided_search_targets_read_the_geomeans_and_never_a_compile_only_run(tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    summary = {"generate_over_search": 1.01, "model_over_search": 1.02, "compared_generate": 3, "compared_model": 3,
               "matrices": 3}
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary}))
    verdicts = {t["target"]: t["met"] for t in bench.read_run(out, "small")["targets"]}
    assert verdicts["model-guided search: generate --search 16 at least as fast as search --budget 64"] is True
    assert verdicts["model-guided search: 1.03x at equal budget 64"] is False  # 1.02 < 1.03
    # an arm that found no correct kernel on a matrix leaves it out of its geomean: not measured, never met
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary | {"matrices": 4}}))
    verdicts = {t["target"]: t["met"] for t in bench.read_run(out, "small")["targets"]}
    assert verdicts["model-guided search: generate --search 16 at least as fast as search --budget 64"] is None
    (out / "guided.json").write_text(json.dumps({"compile_only": True, "summary": summary}))
    targets = bench.read_run(out, "small")["targets"]
    assert all(t["met"] is None for t in targets if t["target"].startswith("model-guided"))


def test_the_guided_targets_read_the_retimed_ratio_where_the_run_made_one(tmp_path) -> None:
    """The arms' kernels timed again side by side carry no selection among timings: the target reads that ratio,
    the first timing's beside it. Kills: the first timing read where a retimed ratio exists (1.04 met against 1.01
    retimed), the first timing read where a second look failed on a matrix (not measured then), the retimed one
    read where the run made none."""
    out = tmp_path / "run"
    out.mkdir()
    summary = {"generate_over_search": 0.99, "model_over_search": 1.04, "generate_over_search_retimed": 1.005,
               "model_over_search_retimed": 1.01, "compared_generate": 2, "compared_model": 2, "matrices": 2,
               "compared_generate_over_search_retimed": 2, "compared_model_over_search_retimed": 2}
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary}))
    rows = {t["target"]: t for t in bench.read_run(out, "small")["targets"]}
    model = rows["model-guided search: 1.03x at equal budget 64"]
    assert model["met"] is False and model["value"] == 1.01 and model["first_timing"] == 1.04 and model["retimed"]
    gen = rows["model-guided search: generate --search 16 at least as fast as search --budget 64"]
    assert gen["met"] is True and gen["value"] == 1.005
    summary["compared_model_over_search_retimed"] = 1  # a second look failed on one of the two matrices
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary}))
    model = {t["target"]: t for t in bench.read_run(out, "small")["targets"]}["model-guided search: 1.03x at equal budget 64"]
    assert model["met"] is None  # the second look failed on a matrix: not the first timing's 1.04 read instead
    summary["compared_model_over_search_retimed"] = 2
    summary["model_over_search_retimed"] = None  # no second look on any matrix: the first timing is read
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary}))
    model = {t["target"]: t for t in bench.read_run(out, "small")["targets"]}["model-guided search: 1.03x at equal budget 64"]
    assert model["met"] is True and model["value"] == 1.04 and not model["retimed"]
    summary |= {"model_over_search_retimed": 1.01, "compared_headroom": 2, "headroom": 1.012, "headroom_retimed": 1.004}
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary}))
    text = bench.table(bench.read_run(out, "small"))
    assert "1.03x at equal budget 64: 1.010 with the arms' kernels timed again side by side, 1.040 on their first" in text
    assert "(the room any guide has), 2 matrices: 1.012 first timing, 1.004 retimed" in text
    assert "that room is under the 1.03 the equal-budget target asks" in text
    summary |= {"headroom": 1.01, "headroom_retimed": 1.05}  # the retimed room is read, not the first timing's
    (out / "guided.json").write_text(json.dumps({"compile_only": False, "summary": summary}))
    assert "that room is under" not in bench.table(bench.read_run(out, "small"))


def _two(start: dict, improved: dict | None, oracle: dict) -> dict:
    """An evaluation of the SFT model and (when given) the improved one, side by side."""
    ev = _eval(start, oracle)
    ev["summary"]["base_sft"] = ev["summary"].pop("ours")
    ev["per_matrix"]["base_sft"] = ev["per_matrix"].pop("ours")
    ev["library_match"] = {"base_sft": {"new": {"samples": 4, "correct": 0}}}
    if improved is not None:
        ev["summary"]["improved"] = {"samples": 16, "correct_rate": 0.96}
        ev["per_matrix"]["improved"] = {m: {"family": "f", "best_speedup": b, "correct": 1} for m, b in improved.items()}
        ev["library_match"]["improved"] = {"new": {"samples": 4, "correct": 3}}
    return ev


def _run_with_improve(tmp_path: Path, families: dict, kept_correct: list[float] | None, test: dict | None = None):
    out = tmp_path / "run"
    shutil.rmtree(out, ignore_errors=True)
    (out / "eval-families").mkdir(parents=True)
    (out / "eval-families" / "eval.json").write_text(json.dumps(families))
    if test is not None:
        (out / "eval-test").mkdir()
        (out / "eval-test" / "eval.json").write_text(json.dumps(test))
    if kept_correct is not None:
        rounds = [{"round": 0, "kept": True, "val": {"correct_rate": 0.5}}]  # round 0 is the start: never judged
        rounds += [{"round": i + 1, "kept": c is not None, "val": {"correct_rate": c if c is not None else 0.1}}
                   for i, c in enumerate(kept_correct)]
        (out / "improve").mkdir()
        (out / "improve" / "rounds.json").write_text(json.dumps({"rounds": rounds}))
    result = bench.read_run(out, "full")
    return {t["target"]: t for t in result["targets"]}, result


def test_the_improve_target_compares_the_final_policy_with_its_sft_start_at_1m_rows(tmp_path) -> None:
    name = "improve: +10% best of N over its SFT start at 1M rows"
    oracle = {"a": 2.0, "b": 2.0}
    fam = _two({"a": 2.0, "b": 2.0}, {"a": 2.4, "b": 2.2}, oracle)  # gain sqrt(1.2 * 1.1)
    got, result = _run_with_improve(tmp_path, fam, [0.95, None])  # round 2 refused: not judged
    assert got[name]["value"] == pytest.approx((1.2 * 1.1) ** 0.5) and got[name]["met"] is True
    assert got[name]["kept_rounds"] == 1
    assert result["sets"]["families"]["checkpoint"] == "improved"  # the per-set targets are the final policy's
    assert got["families: new bodies at least 50% correct"]["value"] == 0.75
    got, _ = _run_with_improve(tmp_path, fam, [0.95, 0.85])  # a kept round under 90% correct
    assert got[name]["met"] is False
    got, _ = _run_with_improve(tmp_path, _two({"a": 2.0, "b": 2.0}, None, oracle), [None])  # no round kept
    assert got[name]["value"] == 1.0 and got[name]["met"] is False
    got, _ = _run_with_improve(tmp_path, fam, None)  # improve did not run
    assert got[name]["value"] is None and got[name]["met"] is None
    small = _two({"a": 2.0, "b": 2.0}, {"a": 2.1, "b": 2.1}, oracle)  # +5% at 1M rows, +50% on the test split
    big = _two({"a": 2.0, "b": 2.0}, {"a": 3.0, "b": 3.0}, {"a": 3.0, "b": 3.0})
    got, _ = _run_with_improve(tmp_path, small, [0.95], test=big)
    assert got[name]["value"] == pytest.approx(1.05) and got[name]["met"] is False


def test_a_snapshot_evaluated_beside_the_final_policy_is_not_taken_for_it(tmp_path) -> None:
    """With SFT_SNAPSHOTS the evaluation holds ``sft_stepN`` beside ``base_sft``: the targets are base_sft's.
    Kills: the snapshot's figures taken (it comes first here, and is worse), or the run refused as ambiguous."""
    ev = json.loads(MINI.read_text())
    worse = {m: {**row, "best_speedup": 1.0, "correct": 0} for m, row in ev["per_matrix"]["base_sft"].items()}
    ev["summary"] = {"sft_step100": dict(ev["summary"]["base_sft"], correct_rate=0.1), **ev["summary"]}
    ev["per_matrix"]["sft_step100"] = worse
    out = tmp_path / "run"
    (out / "eval-test").mkdir(parents=True)
    (out / "eval-test/eval.json").write_text(json.dumps(ev))
    (out / "stages.tsv").write_text("pretrain\t140\ndata\t28\nsft\t73\neval-test\t29\n")
    assert bench.main([str(out), "--preset", "small", "--out", str(tmp_path / "t.json")]) == 0
    got = json.loads((tmp_path / "t.json").read_text())["sets"]["test"]
    assert got == bench.eval_figures(json.loads(MINI.read_text()), "base_sft")


def test_system_judges_the_named_policy_and_a_name_the_tables_lack_is_one_line(tmp_path, capsys) -> None:
    """``--system base_sft_t0.7`` judges that policy's samples (here all wrong: its correct share reads 0), not the
    final policy's; a name no table has is an error naming those it has. Kills ``--system`` ignored."""
    ev = json.loads(MINI.read_text())
    worse = {m: {**row, "best_speedup": None, "correct": 0} for m, row in ev["per_matrix"]["base_sft"].items()}
    ev["summary"]["base_sft_t0.7"] = dict(ev["summary"]["base_sft"], correct_rate=0.0)
    ev["per_matrix"]["base_sft_t0.7"] = worse
    ev["config"]["system_temperatures"] = ["base_sft_t0.7=0.7"]
    out = tmp_path / "run"
    (out / "eval-test").mkdir(parents=True)
    (out / "eval-test/eval.json").write_text(json.dumps(ev))
    (out / "stages.tsv").write_text("pretrain\t140\ndata\t28\nsft\t73\neval-test\t29\n")
    assert bench.main([str(out), "--preset", "small", "--system", "base_sft_t0.7", "--out", str(tmp_path / "t.json")]) == 0
    got = json.loads((tmp_path / "t.json").read_text())
    assert got["system"] == "base_sft_t0.7" and got["sets"]["test"]["checkpoint"] == "base_sft_t0.7"
    assert got["sets"]["test"]["correct_share"] == 0.0
    assert got["sets"]["test"]["temperature"] == 0.7 != ev["config"]["temperature"]  # its own, not the set's
    assert got["sets"]["test"]["best_over_oracle"] != bench.eval_figures(json.loads(MINI.read_text()), "base_sft")[
        "best_over_oracle"]
    capsys.readouterr()
    assert bench.main([str(out), "--preset", "small", "--system", "nobody"]) == 2
    assert "has no policy named 'nobody' (it has: base_sft, base_sft_t0.7)" in capsys.readouterr().err


def test_the_ahead_target_counts_only_clear_leads_and_an_oracle_without_a_kernel_is_cusparse(tmp_path) -> None:
    """A best of N that leads the oracle by 0.2% on one matrix of four (a lead inside the timing noise) does not
    meet the 25% ahead target; by 5% it does. A matrix where no library kernel verified is judged against cuSPARSE
    (it raised a TypeError). Kills: the target judged on the strict share, the missing oracle read as a number."""
    out = tmp_path / "run"
    (out / "eval-test").mkdir(parents=True)
    oracle = {"a": 2.0, "b": 2.0, "c": 2.0, "d": None}
    for lead, met in ((1.002, False), (1.05, True)):
        ev = _eval({"a": 2.0 * lead, "b": 1.9, "c": 1.9, "d": None}, oracle)
        (out / "eval-test" / "eval.json").write_text(json.dumps(ev))
        rows = {t["target"]: t for t in bench.read_run(out, "small")["targets"]}
        ahead = rows["test: ahead of the oracle (by more than 2%) on at least 25% of matrices"]
        assert ahead["met"] is met, (lead, ahead)
    ev = _eval({"a": 2.0, "b": 1.9, "c": 1.9, "d": 1.2}, oracle)
    fig = bench.eval_figures(ev)  # d: 1.2x over cuSPARSE, the bar where no library kernel verified
    assert fig["ahead_of_oracle_share"] == 0.25 and fig["ahead_clearly_share"] == 0.25


def test_the_oracle_targets_read_the_second_look_where_the_evaluation_made_one() -> None:
    """``evaluate --retime`` gives every record ``retimed_speedup``: the ratio, the ahead shares and the table read it,
    and the first timings' ratio is kept beside it. Kills: the figures read off ``best_speedup`` when a second look
    exists; the oracle's retimed speed taken from its first timing; one side retimed and the other not."""
    ev = _eval({"a": 2.1, "b": 1.5}, {"a": 2.0, "b": 1.5})
    fig = bench.eval_figures(ev)
    assert fig["timing"] == "first" and fig["best_over_oracle_first"] is None and fig["ahead_clearly_share"] == 0.5
    for m, again in {"a": 1.98, "b": 1.5}.items():  # the 5% lead on a was the best of N's luck
        ev["per_matrix"]["ours"][m]["retimed_speedup"] = again
    ev["per_matrix"]["library oracle"]["a"]["retimed_speedup"] = 2.0
    assert bench.eval_figures(ev)["timing"] == "first"  # the oracle's b not retimed: no mixed figures
    ev["per_matrix"]["library oracle"]["b"]["retimed_speedup"] = 1.5
    fig = bench.eval_figures(ev)
    assert fig["timing"] == "retimed" and fig["best_over_oracle"] == pytest.approx((0.99 * 1.0) ** 0.5)
    assert fig["best_over_oracle_first"] == pytest.approx((1.05 * 1.0) ** 0.5)
    assert fig["ahead_of_oracle_share"] == 0.0 and fig["ahead_clearly_share"] == 0.0
    text = bench.table({"targets": [], "sets": {"s": fig | {"matrices": 2}}})
    assert "0.995 with both picks timed again side by side (evaluate --retime), 1.025 on their first timings" in text
