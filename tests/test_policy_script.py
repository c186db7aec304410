"""``scripts/policy_at_scale.sh`` on the CPU: every stage compile-only, on the tests' tiny model.

What a GPU run of it depends on and a CPU can check: the stages' commands and arguments fit the CLI
(a typo fails here, not an hour into a GPU session), the teacher's searches see train matrices only,
the SFT set holds the library teacher's rows, the held-out table is written, a second run skips every
finished stage, and a bad preset or a missing pack is one line. Mutations killed: searches over the
test split (held-out matrices in the teacher), a merge that drops the library rows, a stage that
runs again after it finished, a preset error that goes on, matrices generated beside pre-training with
other options than the data stage's, a kept improve round left out of the evaluations or of the guided
search, a teacher without the default length limit, a bad limit that goes on, the teacher's further
matrices left unsearched or drawn from the held-out ones (by name or by structure), SFT_STEPS, SAMPLES or
GUIDED_MATRICES ignored, a bad IMPROVE or SUITESPARSE that goes on, SUITESPARSE's real test matrices mixed into
the generated test set or left out of the table, the guided search on a real matrix, the teacher searching with
the cost model that saw them, a change of the preset (IMPROVE=0 too) left out of settings.json or one
invocation's changes overwriting another's, a run carried without its matrices that does not make them again
(or makes other ones, or makes them again when they are there), PRETRAIN_STEPS ignored, SIBLINGS ignored or its
rows left out of the SFT set, SFT_SNAPSHOTS ignored or a snapshot left out of the held-out evaluation,
SECOND_TEMPERATURE ignored or its temperature not handed to the evaluation, GUIDED_TEXT_ARM ignored or a bad
value that goes on, GUIDED_HEADROOM ignored or a bad value that goes on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparserl.harness.compile import find_nvcc

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "policy_at_scale.sh"


def run(out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(REPO / "src"),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", str(SCRIPT), str(out), *args], capture_output=True, text=True, cwd=REPO,
                          env=base | (env or {}), timeout=900)


def stand_in_sparserl(tmp_path: Path, body: str) -> str:
    """A ``sparserl`` on the PATH that runs ``body`` (shell) instead of the CLI: the PATH that finds it first."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "sparserl").write_text(f"#!/bin/sh\n{body}\n")
    (fake / "sparserl").chmod(0o755)
    return f"{fake}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def names(path: Path) -> set[str]:
    rows = [json.loads(line) for line in path.open()]
    return {Path(r["matrix"]).name.split(".")[0] for r in rows if r.get("matrix")}


@pytest.mark.skipif(find_nvcc() is None or shutil.which("bash") is None, reason="needs nvcc and bash")
def test_the_smoke_preset_runs_every_stage_and_resumes(tmp_path, tiny_model_dir) -> None:
    from sparserl.matrices import generate, save_matrix

    out, real = tmp_path / "run", tmp_path / "real"  # three real matrices: one each to train, val and test
    real.mkdir()
    for i, fam in enumerate(("banded", "powerlaw", "block")):  # gzipped, as the SuiteSparse folder holds them
        save_matrix(generate(fam, 400, seed=i), real / f"real{i}.mtx.gz")
    first = run(out, "-", "smoke", env={"BASE_MODEL": str(tiny_model_dir), "TEMPERATURES": "1.0,0.5",
                                        "TEACHER_PER_FAMILY": "1", "SFT_STEPS": "3",
                                        "SAMPLES": "2", "GUIDED_MATRICES": "2", "IMPROVE": "0", "GUIDED_TEXT_ARM": "1",
                                        "GUIDED_HEADROOM": "3", "SUITESPARSE": str(real), "TEACHER_ROWS": "700 900",
                                        "TEACHER_SIZES": "stratified"})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # the default length limit reaches the library teacher (the store's export and improve do not run compile-only)
    assert json.loads((out / "data" / "summary.json").read_text())["config"]["max_target_chars"] == 6300
    # the temperature chosen on the validation split first: nothing is timed here, so none, and the default is kept
    chosen = json.loads((out / "temperature" / "temperature.json").read_text())
    assert chosen["chosen_on"] == "val" and set(chosen["figures"]["val"]) == {"1", "0.5"} and chosen["chosen"] is None
    assert "sampling temperature: 0.7" in first.stdout
    assert json.loads((out / "eval-test" / "eval.json").read_text())["config"]["temperature"] == 0.7
    assert json.loads((out / "eval-test" / "eval.json").read_text())["config"]["samples"] == 2  # SAMPLES, not 1
    # the matrices made on the CPU beside pre-training are the ones the data stage used (options in step:
    # different ones would leave a second set of files beside the first)
    assert "9 generated matrices" in (out / "matrices.log").read_text()
    # the teacher's matrices are all searched: no split, so no warning that one went without a matrix
    assert "no matrix went to the" not in (out / "matrices.log").read_text()
    assert len(list((out / "data" / "matrices").glob("*.npz"))) == 9
    stages = [line.split("\t")[0] for line in (out / "stages.tsv").read_text().splitlines()]
    assert stages == ["data", "search", "export", "merge", "sft", "temperature", "evals", "guided"]
    searched = {m["name"] for m in json.loads((out / "farm" / "summary.json").read_text())["matrices"]}
    train, test = names(out / "data" / "train.jsonl"), names(out / "data" / "test.jsonl")
    # the teacher's further matrices (one per family, seed 1) are searched beside the train split, and are
    # other matrices than the held-out ones
    further = {p.stem for p in (out / "teacher-matrices" / "matrices").glob("*.npz")}
    assert len(further) == 3 and not further & (test | names(out / "data" / "val.jsonl"))
    # drawn in TEACHER_ROWS's range (the data's is 300-600), as TEACHER_SIZES says
    assert all(700 <= int(f.rsplit("_", 1)[1]) <= 900 for f in further), further
    assert searched == train | further
    # and no two of them share a structure under other names (stencil2d ignores the seed and rounds to a square)
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import structure_fingerprint

    made = [*(out / "data" / "matrices").glob("*.npz"), *(out / "teacher-matrices" / "matrices").glob("*.npz")]
    assert len({structure_fingerprint(load_matrix(f)) for f in made}) == len(made) == 12
    # with real matrices held out, the teacher's searches order their candidates without the packaged cost model
    # (fitted on SuiteSparse measurements, a real test matrix's among them)
    reports = [json.loads(p.read_text()) for p in (out / "farm").glob("*/report.json")]
    assert reports and all('"cost_model": "none"' in json.dumps(r) for r in reports)
    # SUITESPARSE: the real matrices split like a family's; the teacher searched the train one, the held-out
    # table has them as a set of their own, disjoint from the generated test set, and the guided search does not
    # run on them
    reals = {f"real{i}" for i in range(3)}
    assert len(train & reals) == 1 and len(test & reals) == 1 and len(names(out / "data" / "val.jsonl") & reals) == 1
    in_eval = {s: {m for m in json.loads((out / f"eval-{s}" / "eval.json").read_text())["per_matrix"]["base_sft"]}
               for s in ("test", "real")}
    assert in_eval["real"] == test & reals and in_eval["test"] == test - reals, in_eval
    assert json.loads((out / "sft" / "result.json").read_text())["steps"] == 3
    library_rows = (out / "data" / "train.jsonl").read_text().splitlines()
    assert (out / "sft-data" / "train.jsonl").read_text().splitlines()[:len(library_rows)] == library_rows
    assert "Evaluation" in (out / "eval-test" / "eval.md").read_text()
    guided = json.loads((out / "guided.json").read_text())  # the guided search ran on a held-out test matrix
    assert guided["compile_only"] and {Path(r["path"]).name.split(".")[0] for r in guided["rows"]} <= test - reals
    assert set(guided["rows"][0]["arms"]) | set(guided["rows"][0]["errors"]) == {"search", "generate", "search+model",
                                                                                "search+model-text", "search@3"}
    assert guided["config"]["text_arm"] is True and guided["config"]["headroom_budget"] == 3  # the two extra arms
    assert len(guided["rows"]) == 2  # GUIDED_MATRICES, not the preset's 1
    targets = json.loads((out / "targets.json").read_text())  # the targets' table, read off the run
    assert targets["preset"] == "smoke" and {"test", "real"} <= set(targets["sets"])
    assert targets["stage_seconds"]["sft"] >= 0
    changed = json.loads((out / "settings.json").read_text())["changed"]  # what the run changed of its preset
    assert changed == ["TEACHER_PER_FAMILY=1", "SFT_STEPS=3", "SAMPLES=2", "GUIDED_MATRICES=2",
                       "TEMPERATURES=1.0,0.5", f"BASE_MODEL={tiny_model_dir}", "TEACHER_ROWS=700 900",
                       "TEACHER_SIZES=stratified", "IMPROVE=0", f"SUITESPARSE={real}"]
    assert targets["changed"] == changed and targets["targets"][0]["met"] is None
    log_made = (out / "matrices.log").stat().st_mtime_ns
    again = run(out, "-", "smoke", env={"BASE_MODEL": str(tiny_model_dir)})
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 7, again.stdout[-2000:]
    assert len((out / "stages.tsv").read_text().splitlines()) == 8
    assert (out / "matrices.log").stat().st_mtime_ns == log_made  # the matrices are there: none made again
    # a kept improve round (its best/ folder): evaluated beside its SFT start, and it guides the search
    shutil.copytree(tiny_model_dir, out / "improve" / "best")
    for name in ("evals", "guided"):
        (out / "stages" / f"{name}.done").unlink()
    # and the run carried to another machine without its matrices (the stages' files only): the ones the
    # held-out sets read are made again, the same, before they run
    prints = {f.name: structure_fingerprint(load_matrix(f)) for f in made}
    for f in made:
        f.unlink()
    shutil.rmtree(out / "teacher-matrices")
    # the evaluation written before lacks the improved policy and was sampled at 1.0: --resume makes it again
    # (and with HEADER_GRAMMAR=1 its headers are sampled within the contract's grammar)
    third = run(out, "-", "smoke", env={"BASE_MODEL": str(tiny_model_dir), "TEMPERATURE": "0.5", "HEADER_GRAMMAR": "1",
                                        "TEACHER_PER_FAMILY": "1", "TEACHER_ROWS": "700 900",
                                        "TEACHER_SIZES": "stratified"})  # the teacher's as the first run had them
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    test_eval = json.loads((out / "eval-test" / "eval.json").read_text())
    assert {"base_sft", "improved"} <= set(test_eval["summary"]) and test_eval["config"]["temperature"] == 0.5
    assert test_eval["config"]["header_grammar"] is True
    assert {f.name: structure_fingerprint(load_matrix(f)) for f in made} == prints
    from sparserl.model.header_grammar import START, run as grammar_run

    sampled = [json.loads(line) for line in (out / "eval-test" / "completions.jsonl").read_text().splitlines()]
    sampled = [r["completion"] for r in sampled if r["system"] in ("base_sft", "improved")]
    assert sampled and all(grammar_run(START, t) is not None for t in sampled), "a header outside the grammar"
    guided = json.loads((out / "guided.json").read_text())["config"]
    assert guided["model"] == str(out / "improve" / "best") and guided["temperature"] == 0.5
    assert json.loads((out / "targets.json").read_text())["sets"]["test"]["checkpoint"] == "improved"
    # every invocation's changes are kept: the third run's beside the first's
    settings = json.loads((out / "settings.json").read_text())
    assert settings["changed"] == changed + ["TEMPERATURE=0.5", "HEADER_GRAMMAR=1"]


@pytest.mark.slow(seconds=100)
@pytest.mark.skipif(find_nvcc() is None or shutil.which("bash") is None, reason="needs nvcc and bash")
def test_with_two_gpus_the_teacher_is_made_while_pretraining_runs(tmp_path) -> None:
    """GPUS=2 (two GPUs seen): pre-training runs in the background (on the first GPU) while the data,
    search, export and merge stages run (on the other), and SFT starts from the model it made. Kills
    the stages run one after another (pre-training would end first), and SFT started before the base
    model is saved."""
    out = tmp_path / "run"
    done = run(out, "-", "smoke", env={"GPUS": "2"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== pretrain: on GPU 0 while the teacher's stages run on GPUs 1" in done.stdout
    stages = [line.split("\t")[0] for line in (out / "stages.tsv").read_text().splitlines()]
    assert stages.index("merge") < stages.index("pretrain") < stages.index("sft"), stages
    assert "pretrain" in (out / "pretrain.log").read_text()
    assert json.loads((out / "sft" / "result.json").read_text())["steps"] == 2
    assert (out / "pretrain" / "model").is_dir() and "== sft" in done.stdout


def test_a_bad_preset_or_a_missing_pack_is_one_line(tmp_path) -> None:
    bad = run(tmp_path / "a", "-", "huge")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: ") and "\n" not in bad.stderr.strip()
    for knob in ("TEMPERATURE", "IMPROVE_TEMPERATURE"):
        for bad, says in (("1.0,0.5", f"error: {knob} is one number"), ("0", f"error: {knob} is a positive number")):
            several = run(tmp_path / knob, "-", "smoke", env={knob: bad})
            assert several.returncode == 2 and several.stderr.startswith(says), several.stderr
            assert several.stderr.count("\n") == 1 and not (tmp_path / knob / "stages").exists()
    grammar = run(tmp_path / "d", "-", "smoke", env={"HEADER_GRAMMAR": "yes"})
    assert grammar.returncode == 2 and grammar.stderr.startswith("error: HEADER_GRAMMAR is 1")
    assert grammar.stderr.count("\n") == 1 and not (tmp_path / "d" / "stages").exists()
    missing = run(tmp_path / "b", str(tmp_path / "no-pack"), "small")
    assert missing.returncode == 2 and "corpus pack" in missing.stderr and not (tmp_path / "b" / "stages").exists()
    for bad_limit in ("abc", "0", "-5"):
        limit = run(tmp_path / "e", "-", "smoke", env={"MAX_TARGET_CHARS": bad_limit})
        assert limit.returncode == 2 and limit.stderr.startswith("error: MAX_TARGET_CHARS is a whole number of at "
                                                                 "least 1, or none")
        assert limit.stderr.count("\n") == 1 and not (tmp_path / "e" / "stages").exists()
    nowhere = run(tmp_path / "i", "-", "smoke", env={"SUITESPARSE": str(tmp_path / "no-such-folder")})
    assert nowhere.returncode == 2 and nowhere.stderr.startswith("error: SUITESPARSE is a folder of real matrices")
    assert nowhere.stderr.count("\n") == 1 and not (tmp_path / "i" / "stages").exists()
    arm = run(tmp_path / "l", "-", "smoke", env={"GUIDED_TEXT_ARM": "yes"})
    assert arm.returncode == 2 and arm.stderr.startswith("error: GUIDED_TEXT_ARM is 1")
    assert arm.stderr.count("\n") == 1 and not (tmp_path / "l" / "stages").exists()
    room = run(tmp_path / "m", "-", "smoke", env={"GUIDED_HEADROOM": "lots"})
    assert room.returncode == 2 and room.stderr.startswith("error: GUIDED_HEADROOM is a whole number of at least 3")
    assert room.stderr.count("\n") == 1 and not (tmp_path / "m" / "stages").exists()
    short = run(tmp_path / "n", "-", "smoke", env={"GUIDED_HEADROOM": "2"})  # the smoke preset's guided budget is 2
    assert short.returncode == 2 and short.stderr.startswith("error: GUIDED_HEADROOM is a whole number of at least 3")
    assert not (tmp_path / "n" / "stages").exists()
    improve = run(tmp_path / "h", "-", "smoke", env={"IMPROVE": "no"})
    assert improve.returncode == 2 and improve.stderr.startswith("error: IMPROVE is 1")
    assert improve.stderr.count("\n") == 1 and not (tmp_path / "h" / "stages").exists()
    for name, bad_count in (("GPUS", "two"), ("TEACHER_PER_FAMILY", "many"), ("TEACHER_PER_FAMILY", "-1"),
                            ("SFT_STEPS", "0"), ("SAMPLES", "x"), ("GUIDED_MATRICES", "0")):
        counted = run(tmp_path / "g", "-", "smoke", env={name: bad_count})
        assert counted.returncode == 2 and counted.stderr.startswith(f"error: {name} is a whole number")
        assert counted.stderr.count("\n") == 1 and not (tmp_path / "g" / "stages").exists()
    for bad_rows in ("1000", "a b", "900 700", "1 2 3"):
        rows = run(tmp_path / "j", "-", "smoke", env={"TEACHER_ROWS": bad_rows})
        assert rows.returncode == 2 and rows.stderr.startswith("error: TEACHER_ROWS"), rows.stderr
        assert rows.stderr.count("\n") == 1 and not (tmp_path / "j" / "stages").exists()
    draw = run(tmp_path / "k", "-", "smoke", env={"TEACHER_SIZES": "even"})
    assert draw.returncode == 2 and draw.stderr.startswith("error: TEACHER_SIZES is random or stratified")
    assert draw.stderr.count("\n") == 1 and not (tmp_path / "k" / "stages").exists()
    # none (no limit) is accepted: the run goes on to the next check, the pack's
    unlimited = run(tmp_path / "f", str(tmp_path / "no-pack"), "small", env={"MAX_TARGET_CHARS": "none"})
    assert unlimited.returncode == 2 and "corpus pack" in unlimited.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_full_presets_own_settings_are_not_changes_and_a_missing_suitesparse_is(tmp_path) -> None:
    """The full preset samples headers within the grammar and has the SuiteSparse set by its own definition:
    a run as defined notes only what it lacks (no SUITESPARSE, said on a line too), and turning the grammar
    off is a change. Every stage is marked done, so nothing runs (the run then stops at the missing stage
    times; settings.json is written first). Kills the grammar's default left at 0 for full (noted as
    unchanged, yet off), a missing SUITESPARSE that goes unnoted, and the small preset's defaults read
    for full."""
    out = tmp_path / "run"
    (out / "stages").mkdir(parents=True)
    for name in ("pretrain", "data", "search", "export", "merge", "sft", "improve", "evals", "guided"):
        (out / "stages" / f"{name}.done").touch()
    res = run(out, "-", "full")
    assert "note: no SUITESPARSE: the held-out table has no real set" in res.stdout
    assert json.loads((out / "settings.json").read_text()) == {"preset": "full", "changed": ["SUITESPARSE=none"]}
    (out / "settings.json").unlink()
    run(out, "-", "full", env={"HEADER_GRAMMAR": "0"})
    assert json.loads((out / "settings.json").read_text())["changed"] == ["HEADER_GRAMMAR=0", "SUITESPARSE=none"]
    (out / "settings.json").unlink()
    res = run(out, "-", "small")  # the small preset: no grammar, no real set, nothing to note
    assert "SUITESPARSE" not in res.stdout
    assert json.loads((out / "settings.json").read_text()) == {"preset": "small", "changed": []}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_pretrain_steps_replace_the_presets_minutes(tmp_path) -> None:
    """PRETRAIN_STEPS=N: pre-training runs N steps (the learning rate decaying over them) in place of the
    preset's minutes and its out-of-the-way step cap, noted as a change; a bad count is one line. A stand-in
    ``sparserl`` on the PATH fails at once, so only the stage's command line is read. Kills the knob ignored,
    the minutes left in (they would stop a slower card early), and a bad count that goes on."""
    path = stand_in_sparserl(tmp_path, "exit 3")
    lines = {}
    for steps in (None, "887"):
        out = tmp_path / f"run{steps}"
        res = run(out, "-", "full", env={"PATH": path, "GPUS": "1"} | ({"PRETRAIN_STEPS": steps} if steps else {}))
        assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]  # the stand-in failed
        lines[steps] = next(line for line in res.stdout.splitlines() if line.startswith("== pretrain: "))
        changed = json.loads((out / "settings.json").read_text())["changed"]
        assert ("PRETRAIN_STEPS=887" in changed) == (steps is not None)
    assert "--minutes 4 --steps 1000000" in lines[None]
    assert lines["887"].endswith("--steps 887") and "--minutes" not in lines["887"] and lines["887"].count("--steps") == 1
    for bad in ("0", "many"):
        res = run(tmp_path / "bad", "-", "full", env={"PATH": path, "PRETRAIN_STEPS": bad})
        assert res.returncode == 2 and res.stderr.startswith("error: PRETRAIN_STEPS is a whole number of at least 1")
        assert res.stderr.count("\n") == 1 and not (tmp_path / "bad" / "stages").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_full_presets_teacher_is_drawn_stratified_over_100k_to_2m_rows(tmp_path) -> None:
    """The teacher's further matrices: the full preset draws them stratified over 100k-2M rows (its policy
    wrote DIA on the 1M-row 3D stencils only so), the small preset at random over the data's sizes; either
    given explicitly as the preset has it is no change, anything else is. A stand-in ``sparserl`` records
    each command and makes nothing (the data stage then fails). Kills the full preset left on the data's
    sizes or on the random draw, and the preset's own values noted as changes; TEACHER_PARAMS=drawn draws the
    teacher's structural parameters (``--vary-params``, noted), default leaves them (kills the knob ignored or
    passed to the data set's own build instead), and another value is one line before any stage."""
    calls = tmp_path / "calls"
    path = stand_in_sparserl(tmp_path, f'echo "$@" >> "{calls}"\ncase "$*" in *--matrices-only*) exit 0 ;; esac\nexit 3')
    cases = (("full", {}, "--min-rows 100000 --max-rows 2000000 --size-draw stratified", []),
             ("full", {"TEACHER_ROWS": "100000 2000000", "TEACHER_SIZES": "stratified"},
              "--min-rows 100000 --max-rows 2000000 --size-draw stratified", []),
             ("full", {"TEACHER_ROWS": "10000 1000000", "TEACHER_SIZES": "random"},
              "--min-rows 10000 --max-rows 1000000 --size-draw random",
              ["TEACHER_ROWS=10000 1000000", "TEACHER_SIZES=random"]),
             ("small", {"TEACHER_PER_FAMILY": "1"}, "--min-rows 10000 --max-rows 1000000 --size-draw random",
              ["TEACHER_PER_FAMILY=1"]),
             ("small", {"TEACHER_PER_FAMILY": "1", "TEACHER_ROWS": "10000 1000000", "TEACHER_SIZES": "random"},
              "--min-rows 10000 --max-rows 1000000 --size-draw random", ["TEACHER_PER_FAMILY=1"]),
             ("full", {"TEACHER_PARAMS": "default"}, "--size-draw stratified --seed 1", []),
             ("full", {"TEACHER_PARAMS": "drawn"}, "--size-draw stratified --vary-params --seed 1",
              ["TEACHER_PARAMS=drawn"]))
    for i, (preset, env, drawn, noted) in enumerate(cases):
        out = tmp_path / f"run{i}"
        (out / "stages").mkdir(parents=True)
        (out / "stages" / "pretrain.done").touch()
        calls.unlink(missing_ok=True)
        res = run(out, "-", preset, env={"PATH": path, "GPUS": "1", "IMPROVE": "0"} | env)
        assert res.returncode != 0 and "== data: " in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
        teacher = [c for c in calls.read_text().splitlines() if "--seed 1 --matrices-only" in c]
        assert len(teacher) == 1 and drawn in teacher[0], teacher
        changed = json.loads((out / "settings.json").read_text())["changed"]
        assert [c for c in changed if c.startswith("TEACHER")] == noted, changed
        assert not any("--vary-params" in c for c in calls.read_text().splitlines() if "--seed 0" in c)
    bad = run(tmp_path / "bad", "-", "full", env={"PATH": path, "GPUS": "1", "TEACHER_PARAMS": "some"})
    assert bad.returncode == 2 and "error: TEACHER_PARAMS is default or drawn (got 'some')" in bad.stderr, bad.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_eval_sets_choose_the_held_out_sets_and_their_order(tmp_path) -> None:
    """EVAL_SETS=S1,S2: the held-out stage evaluates those sets of the preset's, in that order, noted as a
    change unless it is the preset's list, and as a stage of its own (evals-S1-S2), so that the same run
    resumed without it still evaluates the preset's sets; a set the preset lacks, one named twice, an empty
    name or a space is one line. Every stage before the held-out sets is marked done and a stand-in Python
    reads the evaluation's command line. Kills the knob ignored, the order lost, a set the run cannot make
    (real without SUITESPARSE) or a malformed list let through to fail after the GPU time is spent, and a
    resumed run that skips the preset's sets because a subset's stage finished."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\ncase "$1" in *heldout_eval.py) echo "$@" > "{tmp_path}/args"; exit 3 ;; esac\n'
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    for wanted, sets, stage in ((None, "test,families", "evals"), ("families,test", "families,test", "evals-families-test"),
                                ("test,families", "test,families", "evals"), ("families", "families", "evals-families")):
        out = tmp_path / f"run-{wanted}"
        (out / "stages").mkdir(parents=True)
        (out / "teacher-matrices" / "matrices").mkdir(parents=True)
        for name in ("pretrain", "data", "search", "export", "merge", "sft", "evals-families"):
            (out / "stages" / f"{name}.done").touch()  # a subset's stage finished before: not the preset's
        (tmp_path / "args").unlink(missing_ok=True)
        res = run(out, "-", "full", env={"PYTHON": str(fake), "GPUS": "1", "IMPROVE": "0"}
                  | ({"EVAL_SETS": wanted} if wanted else {}))
        if stage == "evals-families":  # that list's stage is done: skipped, and the guided search runs next
            assert f"== {stage}: done before, skipped" in res.stdout and not (tmp_path / "args").exists()
        else:
            assert res.returncode != 0 and f"== {stage}: held_out" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
            args = (tmp_path / "args").read_text().split()
            assert args[args.index("--sets") + 1] == sets
        changed = [c for c in json.loads((out / "settings.json").read_text())["changed"] if c.startswith("EVAL_SETS")]
        assert changed == ([] if stage == "evals" else [f"EVAL_SETS={wanted}"]), changed
    for bad in ("real", "families,families", "families,,test", "nope", "families,", ",families", "test families",
                "test, families"):
        res = run(tmp_path / "bad", "-", "full", env={"EVAL_SETS": bad})
        assert res.returncode == 2 and res.stderr.startswith("error: EVAL_SETS is a comma-separated list of "
                                                             "test,families, each once"), (bad, res.stderr)
        assert res.stderr.count("\n") == 1 and not (tmp_path / "bad" / "stages").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_resumed_run_makes_the_data_sets_matrices_again_only_when_they_are_not_there(tmp_path) -> None:
    """The data stage finished and a later stage still reads its matrices: they are made again (beside
    pre-training, OUT/matrices.log) only when a file its splits name is missing. A stand-in ``sparserl``
    fails at once: the making fails (one line), or, with the matrices there, SFT does. Kills the files looked
    for under another name (every resumed run would make them again) and a missing one not noticed."""
    path = stand_in_sparserl(tmp_path, "exit 3")
    out = tmp_path / "run"
    (out / "stages").mkdir(parents=True)
    for name in ("pretrain", "data", "search", "export", "merge"):
        (out / "stages" / f"{name}.done").touch()
    (out / "data" / "matrices").mkdir(parents=True)
    there = out / "data" / "matrices" / "banded_000_400.npz"
    there.touch()
    row = {"matrix": str(there), "family": "banded"}
    (out / "data" / "test.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({"matrix": "real0", "family": "real"}))
    kept = run(out, "-", "smoke", env={"PATH": path})
    assert kept.returncode != 0 and "== sft: " in kept.stdout and not (out / "matrices.log").exists(), kept.stderr
    there.unlink()
    remade = run(out, "-", "smoke", env={"PATH": path})
    assert remade.returncode == 1 and remade.stderr.startswith("error: generating the matrices failed")
    assert (out / "matrices.log").exists() and "== sft: " not in remade.stdout
    # made again without error, but not the matrix the splits name (other settings than the run's): one line,
    # before any stage runs on them
    stand_in_sparserl(tmp_path, '[ "$1" = data ] && exit 0\nexit 3')
    other = run(out, "-", "smoke", env={"PATH": path})
    assert other.returncode == 2 and other.stderr.startswith("error: the matrices made again are not the ones")
    assert other.stderr.count("\n") == 1 and "== sft: " not in other.stdout


def test_suitesparse_stops_after_the_data_stage_on_another_data_set_or_no_real_test_matrix(tmp_path,
                                                                                           tiny_model_dir) -> None:
    """A rerun that adds SUITESPARSE to a data set made without it (or with another folder), or a data set
    whose test split got no real matrix (too few given), stops with one line before SFT, not at the held-out
    table. Kills the check left out (the run would train for minutes and then fail, or report an empty set)."""
    real = tmp_path / "real"
    real.mkdir()
    out = tmp_path / "run"
    (out / "stages").mkdir(parents=True)
    (out / "stages" / "data.done").touch()
    (out / "data").mkdir()
    (out / "data" / "m.npz").touch()  # there: a matrix lacking would be made again first
    row = {"rows": [0], "cols": [0], "shape": [2, 2], "code": "FORMAT: CSR", "matrix": str(out / "data" / "m.npz"),
           "family": "banded"}
    (out / "data" / "test.jsonl").write_text(json.dumps(row) + "\n")
    for made, says in ((None, "was made with real matrices from None"),
                       (str(real), "no real matrix of SUITESPARSE")):
        (out / "data" / "summary.json").write_text(json.dumps({"config": {"real_dir": made}}))
        res = run(out, "-", "smoke", env={"BASE_MODEL": str(tiny_model_dir), "SUITESPARSE": str(real)})
        assert res.returncode == 2 and says in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
        assert not (out / "stages" / "search.done").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_siblings_are_made_from_the_teacher_avoiding_held_out_structures_and_merged(tmp_path) -> None:
    """SIBLINGS=N runs ``data siblings`` on the exported teacher with N per row, refusing the data set's structures
    and the families set's at 1M rows, and the merge puts its rows into the SFT set after the library's and the
    store's (noted as a change); without it no siblings are made or merged, and a bad value is one line before any
    stage. A stand-in ``sparserl`` records each command, writes one sibling row, and stops at SFT. Kills: the knob
    ignored, the per-row count or a held-out guard dropped from the command, the siblings left out of the merge or
    merged without being asked for, SIBLINGS given to a run whose SFT set was merged without them (siblings made
    and never merged) going on."""
    calls = tmp_path / "calls"
    body = (f'echo "$@" >> "{calls}"\n'
            'if [ "$1 $2" = "data siblings" ]; then mkdir -p "$5"; echo \'{"sib": 1}\' > "$5/siblings.jsonl"; exit 0; fi\n'
            'exit 3')
    path = stand_in_sparserl(tmp_path, body)
    for env, merged in (({"SIBLINGS": "2"}, 3), ({}, 2)):
        out = tmp_path / f"run{len(env)}"
        (out / "stages").mkdir(parents=True)
        for name in ("pretrain", "data", "search", "export"):
            (out / "stages" / f"{name}.done").touch()
        (out / "data").mkdir()
        for split in ("train", "val", "test"):
            (out / "data" / f"{split}.jsonl").write_text('{"library": 1}\n' if split == "train" else "")
        (out / "teacher.jsonl").write_text('{"store": 1}\n')
        calls.unlink(missing_ok=True)
        res = run(out, "-", "small", env={"PATH": path, "GPUS": "1"} | env)
        assert res.returncode != 0 and "== sft: " in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
        made = [c for c in calls.read_text().splitlines() if c.startswith("data siblings")]
        rows = (out / "sft-data" / "train.jsonl").read_text().splitlines()
        assert len(rows) == merged and rows[:2] == ['{"library": 1}', '{"store": 1}'], rows
        changed = json.loads((out / "settings.json").read_text())["changed"]
        if env:
            assert made == [f"data siblings {out}/teacher.jsonl --out {out}/siblings --per-row 2 --distinct-from "
                            f"{out}/data --family-rows 1000000 --force"], made
            assert rows[2] == '{"sib": 1}' and "SIBLINGS=2" in changed and "from the store, 1 siblings" in res.stdout
        else:
            assert made == [] and not any(c.startswith("SIBLINGS") for c in changed)
    bad = run(tmp_path / "bad", "-", "small", env={"PATH": path, "GPUS": "1", "SIBLINGS": "x"})
    assert bad.returncode == 2 and "error: SIBLINGS is a whole number of at least 0 (got 'x')" in bad.stderr
    assert "== " not in bad.stdout
    late = run(tmp_path / "run0", "-", "small", env={"PATH": path, "GPUS": "1", "SIBLINGS": "2"})  # merged without
    assert late.returncode == 2 and "merged without siblings" in late.stderr and "== siblings" not in late.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_held_out_sets_are_checked_against_the_siblings(tmp_path) -> None:
    """With siblings made, the held-out sets' evaluation is given their folder as ``--distinct-from`` (beside the
    data's), so a held-out matrix that repeated a sibling's structure would be refused. A stand-in ``sparserl`` makes
    nothing and a stand-in python records the held-out evaluation's arguments and stops there. Kills the siblings'
    folder left out of the held-out sets' check."""
    calls = tmp_path / "calls"
    path = stand_in_sparserl(tmp_path, "exit 0")
    python = tmp_path / "bin" / "python-stand-in"
    python.write_text(f'#!/bin/sh\ncase "$1" in *heldout_eval.py) echo "$@" >> "{calls}"; exit 3 ;; esac\n'
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "run"
    (out / "stages").mkdir(parents=True)
    for name in ("pretrain", "data", "search", "export", "siblings", "merge", "sft"):
        (out / "stages" / f"{name}.done").touch()
    (out / "siblings" / "matrices").mkdir(parents=True)
    (out / "data").mkdir()
    for split in ("train", "val", "test"):
        (out / "data" / f"{split}.jsonl").write_text("")
    env = {"PATH": path, "GPUS": "1", "SIBLINGS": "2", "IMPROVE": "0", "PYTHON": str(python)}
    res = run(out, "-", "small", env=env)
    assert res.returncode != 0 and calls.exists(), res.stdout[-2000:] + res.stderr[-2000:]
    args = calls.read_text()
    assert f"--distinct-from {out}/data" in args and f"--distinct-from {out}/siblings" in args, args


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sft_snapshots_are_kept_and_evaluated_beside_the_final_policy(tmp_path) -> None:
    """SFT_SNAPSHOTS="N ..." asks SFT for ``--snapshot N`` each and gives the held-out evaluation each snapshot as
    ``sft_stepN`` beside ``base_sft``, and SECOND_TEMPERATURE=T the final policy again as ``base_sft_tT`` sampled
    at T (a bad T is one line too); a snapshot at or past the SFT's steps, or not a number, is one line before
    any stage; a run whose SFT ended without the snapshot stops with one line. A stand-in ``sparserl`` records the
    SFT command and makes the snapshots' folders; a stand-in python records the held-out evaluation's arguments.
    Kills: the knob ignored, a snapshot left out of the SFT command or of the evaluation, a bad value going on, an
    evaluation sent to a snapshot that was never made, a step written with a leading zero looked for as
    ``checkpoint-step050`` where SFT writes ``checkpoint-step50``."""
    calls = tmp_path / "calls"
    body = (f'echo "$@" >> "{calls}"\n'
            'if [ "$1" = sft ]; then out=""; prev=""; for a in "$@"; do\n'
            '  if [ "$prev" = --out ]; then out=$a; fi\n'
            '  if [ "$prev" = --snapshot ]; then d="$out/checkpoint-step$a"; mkdir -p "$d"; : > "$d/policy.json"; fi\n'
            '  prev=$a; done; exit 0; fi\nexit 0')
    path = stand_in_sparserl(tmp_path, body)
    python = tmp_path / "bin" / "python-stand-in"
    python.write_text(f'#!/bin/sh\ncase "$1" in *heldout_eval.py) echo "$@" >> "{calls}"; exit 3 ;; esac\n'
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)

    def ready(out: Path, sft_done: bool) -> Path:
        (out / "stages").mkdir(parents=True)
        for name in ("pretrain", "data", "search", "export", "merge") + (("sft",) if sft_done else ()):
            (out / "stages" / f"{name}.done").touch()
        (out / "data").mkdir()
        for split in ("train", "val", "test"):
            (out / "data" / f"{split}.jsonl").write_text("")
        return out

    env = {"PATH": path, "GPUS": "1", "IMPROVE": "0", "PYTHON": str(python), "SFT_SNAPSHOTS": "050 100",
           "SECOND_TEMPERATURE": "1.0"}
    out = ready(tmp_path / "run", sft_done=False)
    res = run(out, "-", "small", env=env)
    assert res.returncode != 0 and calls.exists(), res.stdout[-2000:] + res.stderr[-2000:]
    lines = calls.read_text().splitlines()
    sft = next(c for c in lines if c.startswith("sft "))
    assert "--snapshot 50 --snapshot 100" in sft and "--steps 200" in sft, sft
    held = next(c for c in lines if "heldout_eval.py" in c)
    assert (f"-c base_sft={out}/sft/checkpoint -c sft_step50={out}/sft/checkpoint-step50 "
            f"-c sft_step100={out}/sft/checkpoint-step100 -c base_sft_t1.0={out}/sft/checkpoint") in held, held
    assert "--temperature 0.7 --system-temperature base_sft_t1.0=1.0" in held, held  # the default beside 1.0
    changed = json.loads((out / "settings.json").read_text())["changed"]
    assert "SFT_SNAPSHOTS=50 100" in changed and "SECOND_TEMPERATURE=1.0" in changed
    for knob, bad, says in (("SFT_SNAPSHOTS", "200", "SFT_SNAPSHOTS has 200, not below the SFT's 200 steps"),
                            ("SFT_SNAPSHOTS", "x", "error: SFT_SNAPSHOTS is a whole number of at least 1 (got 'x')"),
                            ("SECOND_TEMPERATURE", "0", "error: SECOND_TEMPERATURE is a positive number (got '0')"),
                            ("SECOND_TEMPERATURE", "warm", "SECOND_TEMPERATURE is a positive number (got 'warm')"),
                            ("SECOND_TEMPERATURE", "0.70", "SECOND_TEMPERATURE=0.70 is the held-out sets' temp")):
        res = run(tmp_path / f"bad{bad}", "-", "small", env=env | {knob: bad})
        assert res.returncode == 2 and says in res.stderr and "== " not in res.stdout, res.stderr
    old = ready(tmp_path / "old", sft_done=True)  # its SFT ran without the snapshot
    calls.unlink()
    res = run(old, "-", "small", env=env)
    assert res.returncode == 2 and "has no checkpoint-step50" in res.stderr, res.stderr
    assert not calls.exists() or "heldout_eval.py" not in calls.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_improve_explores_at_its_temperature_and_the_held_out_sets_sample_at_the_policys(tmp_path) -> None:
    """improve samples at IMPROVE_TEMPERATURE (default 1.0: learning explores), the held-out sets at TEMPERATURE
    (default the policy's, POLICY_TEMPERATURE), each knob reaching its own stage only. A stand-in ``sparserl`` records
    improve's command, a stand-in python the held-out evaluation's. Kills: one temperature handed to both, the
    policy's default not reaching the held-out sets, IMPROVE_TEMPERATURE ignored or not noted in settings.json."""
    from sparserl.model.config import POLICY_TEMPERATURE

    calls = tmp_path / "calls"
    path = stand_in_sparserl(tmp_path, f'echo "$@" >> "{calls}"\nexit 0')
    python = tmp_path / "bin" / "python-stand-in"
    python.write_text(f'#!/bin/sh\ncase "$1" in *heldout_eval.py) echo "$@" >> "{calls}"; exit 3 ;; esac\n'
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    for name, env, improve_t, held_t in (("default", {}, "1.0", str(POLICY_TEMPERATURE)),
                                         ("set", {"IMPROVE_TEMPERATURE": "0.9", "TEMPERATURE": "0.5"}, "0.9", "0.5")):
        out = tmp_path / name
        (out / "stages").mkdir(parents=True)
        for stage in ("pretrain", "data", "search", "export", "merge", "sft"):
            (out / "stages" / f"{stage}.done").touch()
        (out / "data").mkdir()
        for split in ("train", "val", "test"):
            (out / "data" / f"{split}.jsonl").write_text("")
        if calls.exists():
            calls.unlink()
        res = run(out, "-", "small", env={"PATH": path, "GPUS": "1", "PYTHON": str(python)} | env)
        assert res.returncode != 0 and calls.exists(), res.stdout[-2000:] + res.stderr[-2000:]
        lines = calls.read_text().splitlines()
        improve = next(c for c in lines if c.startswith("improve "))
        held = next(c for c in lines if "heldout_eval.py" in c)
        def temperature(line: str) -> str:
            words = line.split()
            return words[words.index("--temperature") + 1]
        assert (temperature(improve), temperature(held)) == (improve_t, held_t), (improve, held)
        changed = json.loads((out / "settings.json").read_text())["changed"]  # a knob set is noted, a default not
        assert sorted(c for c in changed if "TEMPERATURE" in c) == sorted(f"{k}={v}" for k, v in env.items()), changed
