"""``sparserl improve`` (expert iteration) on a CPU: the harness's GPU timing replaced by the
search tests' double (tests/search/doubles.py, :func:`fake_harness`: any text starting with
"FORMAT:" counts as correct), everything else real: the search with the
tiny policy proposing, the store, the teacher export, a real SFT fine-tune of the tiny model,
validation, keep/reject, the round table and metrics, and resume after a kill between phases."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from sparserl.improve.config import ImproveConfig
from sparserl.search.space import normalised
from tests.conftest import one_line_error
from tests.improve.data_folder import write_data_folder
from tests.search.doubles import FakeTimingDouble


def fake_time_any_format_text(text: str) -> float | None:
    """A made-up landscape, for the double only: ANY text that starts with "FORMAT:" counts as a
    correct kernel whose time is a fixed function of its text (10-49 us); anything else (the tiny
    random model's text) is incorrect. Nothing is compiled or run: what these tests store as
    "verified" never was (tests/improve/test_improve_gpu.py runs a round with the real harness)."""
    if not text.lstrip().upper().startswith("FORMAT:"):
        return None
    return 10.0 + int(hashlib.sha1(normalised(text).encode()).hexdigest(), 16) % 40


def fake_harness() -> FakeTimingDouble:
    """The search tests' GPU-timing double answering with :func:`fake_time_any_format_text`."""
    return FakeTimingDouble(fake_time_any_format_text)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A data folder as 'sparserl data build' writes it: 3 train and 2 val matrices, rows naming them."""
    return write_data_folder(tmp_path_factory.mktemp("data"),
                             {"train": (("banded", 0, 400), ("random", 1, 400), ("powerlaw", 2, 400)),
                              "val": (("banded", 3, 400), ("random", 4, 400))})


def small(data_dir: Path, tiny_model_dir: Path, tmp_path: Path, **over) -> ImproveConfig:
    base = dict(data=str(data_dir), model=str(tiny_model_dir), out=str(tmp_path / "improve"), rounds=2,
                store=str(tmp_path / "best.sqlite"), matrices_per_round=2, search_budget=6, search_seconds=None,
                policy_share=0.5, max_new_tokens=8, within=0.5, per_matrix=2, sft_steps=2, sft_batch_size=2,
                sft_warmup=1, val_matrices=2, val_samples=2, device="cpu")
    return ImproveConfig(**(base | over))


def test_validation_figures_and_the_keep_rule() -> None:
    from sparserl.improve.loop import improved, round_matrices, validation_figures

    per = {"a": {"n": 2, "compiled": 2, "correct": 1, "best_speedup": 2.0, "sample_speedups": [2.0, None]},
           "b": {"n": 2, "compiled": 1, "correct": 0, "best_speedup": None, "sample_speedups": [None, None]}}
    f = validation_figures(per, {"a": 1.0, "b": 2.0})
    assert f["correct_rate"] == 0.25 and f["compile_rate"] == 0.75
    assert f["geomean_speedup"] == pytest.approx(2 ** 0.5)  # b keeps cuSPARSE: 1.0
    assert f["vs_oracle"] == pytest.approx(1.0) and f["ahead_of_oracle"] == 0.5 and f["score"] == f["vs_oracle"]
    assert validation_figures(per, None)["score"] == pytest.approx(2 ** 0.5)
    # a round that turns a matrix's slow correct kernels (0.8x, below an oracle at 0.9x) into wrong ones
    # gains nothing: both leave the user with cuSPARSE. (The earlier rule scored the failure 1.0 / 0.9,
    # ahead of the oracle, and the slow kernel 0.8 / 0.9.)
    slow = {"c": {"n": 2, "compiled": 2, "correct": 2, "best_speedup": 0.8, "sample_speedups": [0.8, 0.7]}}
    wrong = {"c": {"n": 2, "compiled": 2, "correct": 0, "best_speedup": None, "sample_speedups": [None, None]}}
    fs, fw = validation_figures(slow, {"c": 0.9}), validation_figures(wrong, {"c": 0.9})
    assert fs["score"] == fw["score"] == pytest.approx(1.0) and fw["ahead_of_oracle"] == 0.0
    assert fs["speedup_at_1"] == fw["speedup_at_1"] == pytest.approx(1.0)
    assert not improved(fw, fs, 0.0)[0]
    assert improved({"score": 1.1, "correct_rate": 0.1}, {"score": 1.0, "correct_rate": 0.5}, 0.0)[0]
    assert not improved({"score": 1.04, "correct_rate": 0.9}, {"score": 1.0, "correct_rate": 0.5}, 0.05)[0]
    assert improved({"score": 1.0, "correct_rate": 0.6}, {"score": 1.0, "correct_rate": 0.5}, 0.0)[0]
    assert not improved({"score": 1.0, "correct_rate": 0.5}, {"score": 1.0, "correct_rate": 0.5}, 0.0)[0]
    # a correct-share floor: a faster round with too many wrong samples is not kept; round 0 always is
    keep, why = improved({"score": 1.2, "correct_rate": 0.81}, {"score": 1.0, "correct_rate": 0.89}, 0.0, 0.9)
    assert not keep and "0.81 < 0.89" in why  # the floor: 90%, or the best's share where lower
    assert improved({"score": 1.2, "correct_rate": 0.91}, {"score": 1.0, "correct_rate": 0.89}, 0.0, 0.9)[0]
    assert improved({"score": 0.9, "correct_rate": 0.5}, None, 0.0, 0.9) == (True, "first validation")
    # under the floor, a round may still gain as long as it keeps the best's share (a start under 90%)
    assert improved({"score": 1.2, "correct_rate": 0.86}, {"score": 1.0, "correct_rate": 0.85}, 0.0, 0.9)[0]
    assert not improved({"score": 1.2, "correct_rate": 0.84}, {"score": 1.0, "correct_rate": 0.85}, 0.0, 0.9)[0]
    assert improved({"score": 1.2, "correct_rate": 0.91}, {"score": 1.0, "correct_rate": 0.97}, 0.0, 0.9)[0]
    rows = [{"matrix": str(i)} for i in range(5)]
    seen = [r["matrix"] for i in (1, 2, 3) for r in round_matrices(rows, i, 2, 0)]
    assert set(seen) == {str(i) for i in range(5)} and len(round_matrices(rows, 1, 9, 0)) == 5


@pytest.mark.slow(seconds=26)
def test_rounds_keep_only_what_validates_better_and_resume_between_phases(data_dir: Path, tiny_model_dir: Path,
                                                                          tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from sparserl.improve import loop
    from sparserl.improve.loop import improve
    from sparserl.search.store import BestStore

    filters = []  # every teacher export leaves out kernels with facts the prompt's card does not show

    def spy(store, flt, _orig=loop.export_rows):
        filters.append(flt)
        return _orig(store, flt)
    monkeypatch.setattr(loop, "export_rows", spy)

    scores = {0: 1.0, 1: 1.2, 2: 1.1}  # round 1 improves, round 2 does not
    validated: list[int] = []

    def validate(policy, r):
        validated.append(r)
        assert policy.lm is not None
        return {"score": scores[r], "vs_oracle": scores[r], "geomean_speedup": 2 * scores[r], "correct_rate": 0.5}

    class Kill(KeyboardInterrupt):
        pass

    phases: list[tuple[int, str]] = []

    def kill_after_collect(r, phase):
        phases.append((r, phase))
        if (r, phase) == (1, "collect"):
            raise Kill

    cfg = small(data_dir, tiny_model_dir, tmp_path, max_target_chars=6300)
    out = Path(cfg.out)
    ev = fake_harness()
    with pytest.raises(Kill):
        improve(cfg, ev, validate=validate, on_phase=kill_after_collect)
    st = json.loads((out / "state.json").read_text())
    assert (st["round"], st["phase"]) == (1, "finetune") and len(st["current"]["search"]) == 2
    assert st["current"]["teacher"]["rows"] > 0 and (out / "round_1" / "teacher" / "train.jsonl").exists()
    assert filters and all(f.seen_only and f.max_chars == 6300 for f in filters)  # and the length limit reaches it
    searched = len(ev.submitted)
    assert searched >= 2 * cfg.search_budget * 0.5  # the templates' share at least, on 2 matrices

    ev2 = fake_harness()
    phases.clear()
    res = improve(small(data_dir, tiny_model_dir, tmp_path, resume=True), ev2, validate=validate,
                  on_phase=lambda r, p: phases.append((r, p)))
    assert phases[0] == (1, "finetune")  # resumed at the phase it was in: round 1's search was not repeated
    assert validated == [0, 1, 2]
    assert [(x["round"], x["kept"]) for x in res["rounds"]] == [(0, True), (1, True), (2, False)]
    assert res["best"]["round"] == 1 and res["best_model"] == str(out / "best")
    assert (out / "best" / "policy.json").exists()
    r2 = res["rounds"][2]
    assert r2["model_in"] == str(out / "best") and r2["sft"]["steps"] == 2  # round 2 fine-tuned from the best
    assert (out / "round_2" / "sft" / "checkpoint" / "policy.json").exists()
    assert not (out / "round_1" / "sft" / "state.pt").exists()  # the optimizer goes once a round is decided
    with BestStore(cfg.store) as s:
        assert s.counts()["results"] > 0  # only verified kernels, from the stand-in's timing

    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]  # one row per round, none lost or doubled by the kill
    assert metrics[1]["improve/kept"] == 1.0 and metrics[2]["improve/kept"] == 0.0
    assert metrics[1]["search/candidates"] > 0 and metrics[1]["teacher/rows"] > 0 and "sft/loss" in metrics[1]
    md = (out / "rounds.md").read_text()
    assert "| 1 |" in md and "**kept**" in md and "| 2 |" in md and "Best so far: round 1" in md
    saved = json.loads((out / "rounds.json").read_text())
    assert [x["round"] for x in saved["rounds"]] == [0, 1, 2]
    if importlib.util.find_spec("matplotlib"):
        assert (out / "rounds.png").stat().st_size > 0

    # more rounds later: --resume with a larger --rounds continues from the best
    res = improve(small(data_dir, tiny_model_dir, tmp_path, resume=True, rounds=3), fake_harness(),
                  validate=lambda p, r: {"score": 0.5, "correct_rate": 0.0})
    assert [x["round"] for x in res["rounds"]] == [0, 1, 2, 3] and res["best"]["round"] == 1

    # a new run in the same folder (--force) starts over: no earlier checkpoint is resumed or kept
    res = improve(small(data_dir, tiny_model_dir, tmp_path, rounds=0), fake_harness(),
                  validate=lambda p, r: {"score": 1.0, "correct_rate": 0.0})
    assert [x["round"] for x in res["rounds"]] == [0] and res["best_model"] == str(tiny_model_dir)
    assert not (out / "best").exists() and not (out / "round_1").exists()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0]


def test_a_real_validation_and_a_kill_in_the_middle_of_a_search(data_dir: Path, tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    """Validation through ``evaluate`` (the library oracle timed once, at round 0); a kill during the
    second matrix's search resumes with that matrix only."""
    pytest.importorskip("torch")
    from sparserl.improve.loop import improve
    from sparserl.search.store import BestStore

    cfg = small(data_dir, tiny_model_dir, tmp_path, rounds=1)
    out = Path(cfg.out)

    class KillingFakeDouble(FakeTimingDouble):
        def submit(self, text, ref, op, k=None):
            if getattr(self, "kill_at", None) is not None and ref.name == self.kill_at:
                raise KeyboardInterrupt
            return super().submit(text, ref, op, k)

    ev = KillingFakeDouble(fake_time_any_format_text)
    first: list[str] = []

    def note(r, phase):
        if (r, phase) == (0, "validate"):  # round 0 done: kill at the second matrix of round 1
            from sparserl.improve.loop import round_matrices, split_rows

            rows = round_matrices(split_rows(cfg.data, "train"), 1, 2, 0)
            names = [x.matrix_name for x in rows]
            first.append(names[0])
            ev.kill_at = names[1]

    with pytest.raises(KeyboardInterrupt):
        improve(cfg, ev, on_phase=note)
    st = json.loads((out / "state.json").read_text())
    assert st["phase"] == "search" and list(st["current"]["search"]) == first
    assert st["oracle"] is not None and set(st["oracle"]) == {"banded_3", "random_4"}
    with BestStore(cfg.store) as s:
        runs_before = s.counts()["runs"]

    ev2 = fake_harness()
    res = improve(small(data_dir, tiny_model_dir, tmp_path, rounds=1, resume=True), ev2)
    with BestStore(cfg.store) as s:
        assert s.counts()["runs"] == runs_before + 1  # the second matrix only
    r0, r1 = res["rounds"]
    assert r0["val"]["vs_oracle"] is not None and r0["val"]["correct_rate"] == 0.0  # random weights: no kernel
    assert r0["val"]["new_share"] == 1.0 and r0["val"]["library_share"] == 0.0  # nor any library kernel
    assert r1["teacher"]["rows"] > 0 and r1["sft"]["steps"] == 2 and r1["val"]["samples"] == 4
    assert r1["teacher"]["replay_rows"] == r1["teacher"]["rows"] and r1["sft"]["rows"] == 2 * r1["teacher"]["rows"]
    assert r1["teacher"]["unseen_facts_dropped"] == 0  # recorded; few diagonals, no long rows: nothing dropped
    assert not r1["kept"]  # nothing correct again: no better than round 0
    assert (out / "round_1" / "eval" / "eval.md").exists() and not (out / "best").exists()
    assert res["best_model"] == cfg.model


def test_a_round_matrix_whose_file_does_not_load_is_skipped_alone(data_dir: Path, tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    """The round's matrices are loaded together, in threads, before the first search: one that does
    not load is recorded as skipped with its reason, the others are still searched, and the round's
    fine-tune replays none of its rows (replay 20x: without that filter the broken file is drawn and
    the fine-tune fails on it; mutation killed)."""
    pytest.importorskip("torch")
    import shutil

    from sparserl.improve.loop import improve, round_matrices, split_rows

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    for f in data.glob("*.jsonl"):  # the rows name the copied matrices
        f.write_text(f.read_text().replace(str(data_dir), str(data)))
    cfg = small(data, tiny_model_dir, tmp_path, rounds=1, replay=20.0)
    bad, good = (x.matrix for x in round_matrices(split_rows(cfg.data, "train"), 1, cfg.matrices_per_round, cfg.seed))

    def note(r, phase):
        if (r, phase) == (0, "validate"):  # after round 0: the first matrix of round 1 breaks
            Path(bad).write_bytes(b"not a matrix")

    res = improve(cfg, fake_harness(), validate=lambda p, r: {"score": 1.0, "correct_rate": 1.0}, on_phase=note)
    search = res["rounds"][1]["search"]
    assert set(search) == {Path(bad).name.split(".")[0], Path(good).name.split(".")[0]}
    skipped = search[Path(bad).name.split(".")[0]]
    assert list(skipped) == ["skipped"] and skipped["skipped"]
    assert search[Path(good).name.split(".")[0]]["evaluated"] > 0
    assert res["rounds"][1]["teacher"]["replay_rows"] > 0 and res["rounds"][1]["sft"]["steps"] == cfg.sft_steps
    teacher = (Path(cfg.out) / "round_1" / "teacher" / "train.jsonl").read_text()
    assert Path(bad).name not in teacher


def test_a_round_of_spmm(data_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same loop for SpMM at k = 8: SpMM searches, SpMM teacher rows, an SpMM validation."""
    pytest.importorskip("torch")
    from sparserl.improve.loop import improve
    from sparserl.search.store import BestStore

    cfg = small(data_dir, tiny_model_dir, tmp_path, rounds=1, op="spmm", k=8, val_matrices=1, val_samples=1)
    res = improve(cfg, fake_harness())
    r1 = res["rounds"][1]
    with BestStore(cfg.store) as s:
        best = s.best()
        assert best and {(b.op, b.k) for b in best} == {("spmm", 8)}
    rows = [json.loads(x) for x in (Path(cfg.out) / "round_1" / "teacher" / "train.jsonl").read_text().splitlines()]
    teacher = [r for r in rows if r.get("provenance")]  # the searched kernels (replay rows are the data's own)
    assert teacher and all(r["op"] == "spmm" and r["k"] == 8 for r in teacher)
    assert r1["teacher"]["replay_rows"] == 0, "the data holds SpMV rows only: nothing of another op is replayed"
    assert r1["teacher"]["rows"] == len(teacher) and r1["sft"]["steps"] == 2 and r1["val"]["samples"] == 1


def test_improve_refuses_without_a_gpu_and_explains_its_options(cli, tmp_path: Path) -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible: this is the CPU path")
    res = cli("improve", "--out", tmp_path / "imp", "--rounds", "1")
    one_line_error(res, "needs an NVIDIA GPU", "best-known store")
    assert not (tmp_path / "imp" / "state.json").exists()
    res = cli("improve", "--help")
    assert res.rc == 0
    for opt in ("--rounds", "--matrices-per-round", "--search-budget", "--sft-steps", "--val-matrices",
                "--val-samples", "--within", "--min-correct", "--resume"):
        assert opt in res.out
    one_line_error(cli("improve", "--out", tmp_path / "imp2", "--min-correct", "1.5"), "--min-correct", "[0, 1]")
    (tmp_path / "imp").mkdir()
    (tmp_path / "imp" / "state.json").write_text("{}")
    one_line_error(cli("improve", "--out", tmp_path / "imp"), "earlier improve run", "--resume")


@pytest.mark.slow(seconds=23)
def test_held_out_compares_the_start_and_the_best_on_the_test_split_once(data_dir: Path, tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """After the last round, the starting policy and the kept one are sampled on the test split beside
    the library oracle (real ``evaluate``, the timing double), one policy at a time; a resumed run that
    keeps no new round does not evaluate again, a different --test-samples does; rows naming a missing
    matrix are skipped; a fresh run in the folder drops the old figures; no test split, no evaluation."""
    pytest.importorskip("torch")
    from sparserl.improve.loop import improve

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    rows = (data / "val.jsonl").read_text().splitlines()  # two matrices, never searched
    gone = json.loads(rows[0]) | {"matrix": str(data / "matrices" / "gone.mtx")}
    (data / "test.jsonl").write_text("\n".join([*rows, json.dumps(gone)]) + "\n")
    cfg = small(data, tiny_model_dir, tmp_path, rounds=1, test_samples=2)
    out = Path(cfg.out)
    scores = {0: 1.0, 1: 1.5, 2: 1.2}  # round 1 is kept, round 2 is not

    def validate(policy, r):
        return {"score": scores[r], "vs_oracle": scores[r], "correct_rate": 1.0}

    res = improve(cfg, fake_harness(), validate=validate)
    test = res["test"]
    assert test["best_round"] == 1 and set(test["figures"]) == {"start", "round_1"} and test["matrices"] == 2
    assert test["models"] == {"start": str(tiny_model_dir), "round_1": str(out / "best")}
    for f in test["figures"].values():  # the tiny random model writes no kernel: every sample is wrong
        assert f["samples"] == 4 and f["correct_rate"] == 0.0 and f["vs_oracle"] is not None
    assert 100.0 / 49.0 <= test["oracle_geomean"] <= 100.0 / 10.0 * (1 + 1e-12)  # fake_time_any_format_text: 10-49 us against 100 us
    md = (out / "rounds.md").read_text()
    assert "## Held out: the data's test split" in md and "| round_1 |" in md and "| start |" in md
    assert json.loads((out / "rounds.json").read_text())["test"]["best_round"] == 1
    assert (out / "test" / "start" / "eval.md").exists() and (out / "test" / "round_1" / "eval.md").exists()
    stamp = (out / "test" / "start" / "eval.json").stat().st_mtime_ns

    again = dict(rounds=2, test_samples=2, resume=True)
    res = improve(small(data, tiny_model_dir, tmp_path, **again), fake_harness(), validate=validate)
    assert [x["round"] for x in res["rounds"]] == [0, 1, 2] and res["test"]["best_round"] == 1
    assert (out / "test" / "start" / "eval.json").stat().st_mtime_ns == stamp, "no new best: not evaluated again"
    res = improve(small(data, tiny_model_dir, tmp_path, **again | {"test_samples": 1}), fake_harness(),
                  validate=validate)
    assert res["test"]["samples"] == 1 and res["test"]["figures"]["start"]["samples"] == 2

    res = improve(small(data, tiny_model_dir, tmp_path, rounds=0, test_samples=0), fake_harness())
    assert res["test"] is None and not (out / "test").exists(), "a fresh run keeps no earlier held-out figures"
    res = improve(small(data_dir, tiny_model_dir, tmp_path / "b", rounds=0, test_samples=2),
                  fake_harness())
    assert res["test"] is None and not (tmp_path / "b" / "improve" / "test").exists()


def test_the_rounds_searches_order_candidates_as_asked(data_dir: Path, tiny_model_dir: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    """``search_cost_model`` reaches every round's search (the policy script sets 'none' where the packaged
    model saw held-out real matrices), and the round's proposals keep the facts the policy wrote (the searches
    teach it: no ``fill_facts``, which ``search`` has on by default). Kills the setting parsed and dropped (the
    default model ordering them), and improve's searches taking the search's default fill."""
    pytest.importorskip("torch")
    from sparserl.improve import loop
    from sparserl.improve.loop import improve

    seen = []

    class Stop(Exception):
        pass

    def record(ctx, scfg, *args, **kw):
        seen.append((scfg.cost_model, kw["run_config"]["job"]["fill_facts"], kw["proposer"].fill))
        raise Stop

    monkeypatch.setattr(loop, "search_array", record)
    def validate(policy, r):
        return {"score": 1.0, "vs_oracle": 1.0, "geomean_speedup": 1.0, "correct_rate": 0.5}

    with pytest.raises(Stop):
        improve(small(data_dir, tiny_model_dir, tmp_path, search_cost_model="none"), fake_harness(), validate=validate)
    assert seen == [("none", False, False)]
