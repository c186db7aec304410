"""Evaluation aggregation (pure) and a compile-only run with a stand-in sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.eval.compare import EvalConfig, evaluate, summarize  # noqa: E402
from sparserl.eval.report import markdown  # noqa: E402
from sparserl.harness.compile import find_nvcc  # noqa: E402
from tests.conftest import NEEDS_NVCC  # noqa: E402
from sparserl.kernels.library import variants  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402
from tests.eval.test_generate import BROKEN, FixedSampler  # noqa: E402


def test_summarize() -> None:
    recs = {
        "a": {"family": "banded", "n": 4, "compiled": 4, "correct": 2, "best_speedup": 2.0, "best_format": "DIA",
              "roofline": 0.8, "kinds": {}},
        "b": {"family": "random", "n": 4, "compiled": 2, "correct": 0, "best_speedup": None, "best_format": None,
              "roofline": None, "kinds": {}},
    }
    s = summarize(recs, 4)
    assert s["compile_rate"] == 0.75 and s["correct_rate"] == 0.25 and s["coverage"] == 0.5
    assert s["pass@1"] == pytest.approx(0.25) and s["pass@4"] == pytest.approx(0.5)
    assert s["geomean_speedup"] == pytest.approx(2 ** 0.5) and s["geomean_speedup_covered"] == pytest.approx(2.0)
    assert s["fast_1.0"] == 0.5 and s["fast_1.5"] == 0.5 and s["per_family_geomean"] == {"banded": 2.0, "random": 1.0}
    assert s["formats"] == {"DIA": 1}
    assert s["speedup@1"] is None  # records without per-sample speedups (older eval.json files)
    recs["a"]["sample_speedups"] = [2.0, 0.5, None, None]
    recs["b"]["sample_speedups"] = [None] * 4
    # a: 2 * 1 * 1 * 1 (the 0.5x sample keeps cuSPARSE, like the incorrect ones), b: 1
    assert summarize(recs, 4)["speedup@1"] == pytest.approx(2 ** (1 / 8))


def test_a_matrix_without_a_correct_kernel_never_beats_one_with_a_slow_kernel() -> None:
    """Best of n: matrix b's only correct kernel runs at 0.5x, c has none. Both count 1.0 (the user
    keeps cuSPARSE) in the geomean and per family; the covered geomean keeps b's raw 0.5x.

    Mutation killed: ``best or 1.0`` (the earlier rule) scores b at 0.5 below c's 1.0."""
    rec = lambda best, fam: {"family": fam, "n": 1, "compiled": 1, "correct": int(best is not None),  # noqa: E731
                             "best_speedup": best, "best_format": "CSR" if best else None, "roofline": None,
                             "kinds": {}, "sample_speedups": [best]}
    s = summarize({"a": rec(4.0, "x"), "b": rec(0.5, "y"), "c": rec(None, "z")}, 1)
    assert s["geomean_speedup"] == pytest.approx(4 ** (1 / 3)) and s["speedup@1"] == pytest.approx(4 ** (1 / 3))
    assert s["per_family_geomean"] == {"x": 4.0, "y": 1.0, "z": 1.0}
    assert s["geomean_speedup_covered"] == pytest.approx(2 ** 0.5)


def test_rescore_adds_speedup_at_1_from_the_saved_samples(tmp_path: Path) -> None:
    from sparserl.errors import SparseRLError
    from sparserl.eval.rescore import rescore

    rec = lambda n, best: {"family": "banded", "n": n, "compiled": n, "correct": n, "best_speedup": best,  # noqa: E731
                           "best_format": "DIA", "roofline": 0.5, "kinds": {}}
    per_matrix = {"cuSPARSE": {"m0": rec(1, 1.0), "m1": rec(1, 1.0)},
                  "library oracle": {"m0": rec(1, 3.0), "m1": rec(1, 3.0)},
                  "sft": {"m0": rec(2, 4.0), "m1": rec(2, 2.0)}}
    result = {"config": {"samples": 2}, "op": "spmv", "k": None, "per_matrix": per_matrix,
              "summary": {}, "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1,
                                       "geomean_speedup": 1.4}, "format_confusion_vs_oracle": {}}
    (tmp_path / "eval.json").write_text(json.dumps(result))
    lines = [{"system": "sft", "matrix": "m0", "verdict": "none", "speedup": 4.0},
             {"system": "sft", "matrix": "m0", "verdict": "none", "speedup": 1.0},
             {"system": "sft", "matrix": "m1", "verdict": "incorrect", "speedup": None},
             {"system": "sft", "matrix": "m1", "verdict": "none", "speedup": 2.0}]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = rescore(tmp_path)["summary"]
    assert s["sft"]["speedup@1"] == pytest.approx((2.0 * 2 ** 0.5) ** 0.5)
    assert s["library oracle"]["speedup@1"] == pytest.approx(3.0) and s["cuSPARSE"]["speedup@1"] == 1.0
    assert "speedup@1" in (tmp_path / "eval.md").read_text()
    assert json.loads((tmp_path / "eval.json").read_text())["summary"]["sft"]["speedup@1"] == s["sft"]["speedup@1"]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))
    with pytest.raises(SparseRLError, match="1 samples of sft on m1"):
        rescore(tmp_path)


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_compile_only_evaluation_writes_reports(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    for i, fam in enumerate(("banded", "random")):
        save_matrix(generate(fam, 400, seed=i), d / f"{fam}.mtx")
    sampler = FixedSampler([BROKEN, variants("spmv", "CSR")[0].render()])
    res = evaluate(EvalConfig(matrices=str(d), samples=4, out=str(tmp_path / "e"), compile_only=True),
                   policies={"stand-in": sampler})
    s = res["summary"]["stand-in"]
    assert s["compile_rate"] == 0.5 and s["matrices"] == 2
    # nothing ran: no figure that would need a run, not even the 1.0 a matrix without a correct kernel counts as
    assert all(s[key] is None for key in ("coverage", "correct_rate", "pass@1", "geomean_speedup", "speedup@1",
                                          "fast_1.0", "roofline_mean")) and s["per_family_geomean"] == {}
    md = (tmp_path / "e" / "eval.md").read_text()
    assert "Compile-only run" in md and "| stand-in | 50.0% |" in md and "paper (V100)" in md
    assert "not expected to write kernels that compile" in md  # a tiny CPU model beside the paper's 57.5%
    # nothing was timed: no speedup, correctness or roofline columns, no 1.00x per family, no plots
    tables = "\n".join(ln for ln in md.splitlines() if ln.startswith(("|", "#")))
    for word in ("speedup", "correct", "pass@", "fast_", "roofline", "1.00"):
        assert word not in tables, word
    assert "## Compile rate per family\n\n| system | real |" in md and md.count("| stand-in | 50.0% |") == 2
    saved = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert saved["compile_only"] is True
    # where the run's time went: each phase once, none negative, together no more than the whole
    phases = saved["phase_seconds"]
    assert list(phases) == ["open policies", "matrices", "cards", "baselines", "stand-in: generate", "stand-in: judge"]
    assert all(v >= 0 for v in phases.values()) and sum(phases.values()) <= saved["seconds"] + 1e-6
    assert not list((tmp_path / "e").glob("*.png")) and "plots" not in res
    rows = [json.loads(line) for line in (tmp_path / "e" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["matrix"] for r in rows} == {"banded", "random"}
    assert sum(r["verdict"] == "contract_error" for r in rows) == 4 and all(r["completion"] for r in rows)
    # the page's figures come from the samples: compiled (no_gpu, compile-only) samples over all of them,
    # per family too (the earlier check compared the page with markdown() of the same result)
    rate = sum(r["verdict"] == "no_gpu" for r in rows) / len(rows)
    assert rate == 0.5 and md.count(f"| stand-in | {100 * rate:.1f}% |") == 2
    # batches cut across matrices: 3 + 3 + 2 completions; each matrix must get its own four back
    res = evaluate(EvalConfig(matrices=str(d), samples=4, gen_batch=3, out=str(tmp_path / "e3"), compile_only=True),
                   policies={"stand-in": sampler})
    per = res["per_matrix"]["stand-in"]  # B C B | B C B | B C  -> banded: B C B B, random: C B B C
    assert per["banded"]["compiled"] == 1 and per["random"]["compiled"] == 2
    # a checkpoint named in the config and handed over opened under its name is not opened again (several
    # sets evaluated with one opening: benchmarks/heldout_eval.py); its path is recorded. Mutation killed:
    # every named checkpoint opened whatever was given (here: no model at that path, an error)
    res = evaluate(EvalConfig(matrices=str(d), samples=2, checkpoints=(f"stand-in={tmp_path / 'no-model'}",),
                              out=str(tmp_path / "e4"), compile_only=True), policies={"stand-in": sampler})
    assert res["summary"]["stand-in"]["samples"] == 4
    assert json.loads((tmp_path / "e4" / "eval.json").read_text())["config"]["checkpoints"][0].endswith("no-model")


def test_one_checkpoint_under_two_names_is_sampled_at_two_temperatures(tmp_path: Path) -> None:
    """``system_temperatures`` samples the system it names at its own temperature and the others at the set's;
    eval.json records it and eval.md says it; a name no checkpoint has, or a temperature that is not positive,
    is refused. Kills: every system sampled at the set's temperature, the page silent about the exception."""
    from sparserl.errors import SparseRLError

    class Recording(FixedSampler):
        def generate(self, samples, **kw):
            self.seen.append(kw["temperature"])
            return super().generate(samples, **kw)

    d = tmp_path / "m"
    d.mkdir()
    save_matrix(generate("banded", 400, seed=0), d / "banded.mtx")
    hot, cool = Recording([BROKEN]), Recording([BROKEN])
    hot.seen, cool.seen = [], []
    cfg = EvalConfig(matrices=str(d), samples=2, checkpoints=("a=CKPT", "a_t0.7=CKPT"), temperature=1.0,
                     system_temperatures=("a_t0.7=0.7",), out=str(tmp_path / "e"), compile_only=True)
    evaluate(cfg, policies={"a": hot, "a_t0.7": cool})
    assert set(hot.seen) == {1.0} and set(cool.seen) == {0.7}
    assert json.loads((tmp_path / "e" / "eval.json").read_text())["config"]["system_temperatures"] == ["a_t0.7=0.7"]
    for bad, says in ((("b=0.7",), "no checkpoint is named 'b'"), (("a=0",), "T > 0"), (("a",), "NAME=T")):
        with pytest.raises(SparseRLError, match=says):
            EvalConfig(checkpoints=("a=CKPT",), system_temperatures=bad)


def test_a_page_names_the_systems_sampled_at_their_own_temperature() -> None:
    rec = {"family": "banded", "n": 1, "compiled": 1, "correct": 1, "best_speedup": 2.0, "best_format": "DIA",
           "roofline": 0.5, "kinds": {}, "sample_speedups": [2.0]}
    result = {"config": {"samples": 1, "temperature": 1.0, "system_temperatures": ["m_t0.7=0.7"]}, "op": "spmv",
              "k": None, "summary": {"m": summarize({"a": rec}, 1), "m_t0.7": summarize({"a": rec}, 1)},
              "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1, "geomean_speedup": 1.4},
              "compile_only": False}
    assert "Sampled at temperature 1, but m_t0.7 at 0.7." in markdown(result)
    result["config"]["system_temperatures"] = []
    assert "Sampled at temperature" not in markdown(result)


def test_one_sample_has_one_pass_at_1_column() -> None:
    rec = {"family": "banded", "n": 1, "compiled": 1, "correct": 1, "best_speedup": 2.0, "best_format": "DIA",
           "roofline": 0.5, "kinds": {}, "sample_speedups": [2.0]}
    result = {"config": {"samples": 1}, "op": "spmv", "k": None, "summary": {"m": summarize({"a": rec}, 1)},
              "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1, "geomean_speedup": 1.4},
              "compile_only": False}
    head, _, row, paper = markdown(result).splitlines()[2:6]
    assert head.count("pass@1") == 1 and "pass@" not in head.replace("pass@1", "")
    assert len(head.split("|")) == len(row.split("|")) == len(paper.split("|"))


def test_a_timed_page_says_where_its_seconds_went() -> None:
    rec = {"family": "banded", "n": 1, "compiled": 1, "correct": 1, "best_speedup": 2.0, "best_format": "DIA",
           "roofline": 0.5, "kinds": {}, "sample_speedups": [2.0]}
    result = {"config": {"samples": 1}, "op": "spmv", "k": None, "summary": {"m": summarize({"a": rec}, 1)},
              "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1, "geomean_speedup": 1.4},
              "compile_only": False, "seconds": 12.34, "phase_seconds": {"baselines": 9.04, "m: generate": 3.0}}
    assert markdown(result).splitlines()[-1] == "Seconds, 12 in all: baselines 9.0, m: generate 3.0."
    del result["phase_seconds"]  # an eval.json written before phases were timed still renders
    assert "Seconds" not in markdown(result)


@pytest.mark.parametrize("kw, needle", [({"split": "nope"}, "--split 'nope'"), ({"temperature": 0.0}, "temperature"),
                                        ({"real_matrices": "some"}, "real_matrices 'some'")])
def test_bad_values_are_refused(kw: dict, needle: str) -> None:
    from sparserl.errors import SparseRLError

    with pytest.raises(SparseRLError, match=needle):
        EvalConfig(**kw)


def test_evaluate_command_names_a_bad_or_missing_split(cli, tmp_path: Path) -> None:
    from tests.conftest import one_line_error

    one_line_error(cli("evaluate", "--split", "nope", "--out", tmp_path / "e"), "--split 'nope'", "train, val, test")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("")
    one_line_error(cli("evaluate", "--matrices", data, "--split", "val", "--out", tmp_path / "e", "--compile-only"),
                   "without a 'val' split", "choose --split from train")
    one_line_error(cli("evaluate", "--k", "16", "--out", tmp_path / "e"), "leave --k out")
    one_line_error(cli("evaluate", "--matrices", "families", "--distinct-from", tmp_path / "none", "--out",
                       tmp_path / "e"), "--distinct-from", "not a folder")


def test_rescore_refuses_a_summary_only_eval_json(tmp_path: Path) -> None:
    """benchmarks/results keeps the summary of large evaluations, not their per-matrix records."""
    from sparserl.errors import SparseRLError
    from sparserl.eval.rescore import rescore

    (tmp_path / "eval.json").write_text(json.dumps({"trimmed": "per-matrix records removed", "summary": {}}))
    with pytest.raises(SparseRLError, match="summary only .per-matrix records removed.: rerun the evaluation"):
        rescore(tmp_path)


def test_rescore_counts_a_slow_sample_as_correct_at_its_measured_speed(tmp_path: Path) -> None:
    """A sample the harness stopped early as ``slow`` passed every check: rescoring keeps its
    measured speedup. Kills the mutation that counts only verdict ``none`` as correct."""
    from sparserl.eval.rescore import rescore

    rec = {"family": "banded", "n": 2, "compiled": 2, "correct": 2, "best_speedup": 1.5, "best_format": "CSR",
           "roofline": 0.5, "kinds": {}}
    result = {"config": {"samples": 2}, "op": "spmv", "k": None, "per_matrix": {"sft": {"m0": rec}},
              "summary": {}, "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1,
                                       "geomean_speedup": 1.4}, "format_confusion_vs_oracle": {}}
    (tmp_path / "eval.json").write_text(json.dumps(result))
    lines = [{"system": "sft", "matrix": "m0", "verdict": "slow", "speedup": 0.25},
             {"system": "sft", "matrix": "m0", "verdict": "none", "speedup": 1.5}]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rescore(tmp_path)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["per_matrix"]["sft"]["m0"]["sample_speedups"] == [0.25, 1.5]


def test_a_splits_real_and_generated_matrices_are_taken_apart(tmp_path: Path) -> None:
    """``real_matrices`` picks of a split the real matrices (family 'real'), the generated ones, or all: the
    held-out table's SuiteSparse set and its generated test set are disjoint. Kills a filter that keeps every
    matrix (the two sets would overlap) or one that reads the file name instead of the row's family."""
    from sparserl.data.rows import SFTRow
    from sparserl.errors import SparseRLError
    from sparserl.eval.compare import matrix_files

    def row(name: str, family: str) -> str:
        return json.dumps(SFTRow(rows=[0], cols=[0], shape=(2, 2), code="FORMAT: CSR", matrix=str(tmp_path / name),
                                 family=family, split="test").to_dict())

    (tmp_path / "test.jsonl").write_text("\n".join([row("a_real.npz", "banded"), row("b.mtx", "real"),
                                                     row("c.npz", "random"), row("b.mtx", "real")]) + "\n")
    names = {how: [Path(f).name for f, _ in matrix_files(EvalConfig(matrices=str(tmp_path), real_matrices=how))]
             for how in ("all", "only", "none")}
    assert names == {"all": ["a_real.npz", "b.mtx", "c.npz"], "only": ["b.mtx"], "none": ["a_real.npz", "c.npz"]}
    (tmp_path / "test.jsonl").write_text(row("c.npz", "random") + "\n")
    with pytest.raises(SparseRLError, match="holds no real matrices .build the data with --real-dir"):
        matrix_files(EvalConfig(matrices=str(tmp_path), real_matrices="only"))
    (tmp_path / "test.jsonl").write_text(row("b.mtx", "real") + "\n")
    with pytest.raises(SparseRLError, match="holds no generated matrices"):
        matrix_files(EvalConfig(matrices=str(tmp_path), real_matrices="none"))
    # elsewhere there is nothing to pick among: refused, not ignored
    with pytest.raises(SparseRLError, match="'families' are all generated"):
        EvalConfig(matrices="families", real_matrices="only")
    folder = tmp_path / "folder"
    folder.mkdir()
    save_matrix(generate("banded", 50, seed=0), folder / "a.mtx")
    assert [f for _, f in matrix_files(EvalConfig(matrices=str(folder)))] == ["real"]
    with pytest.raises(SparseRLError, match="a folder of matrices, all of them real"):
        matrix_files(EvalConfig(matrices=str(folder), real_matrices="none"))


def test_a_set_that_repeats_a_training_structure_is_refused(tmp_path: Path) -> None:
    """``distinct_from``: the families set, generated at evaluation time, is refused when one of its matrices has
    the structure of a matrix in a training folder (under any name); an unrelated folder lets it through. Kills
    the check left out, and one that compares names instead of structures."""
    from sparserl.errors import SparseRLError
    from sparserl.eval.compare import matrix_set

    cfg = EvalConfig(matrices="families", family_rows=300)
    made = matrix_set(cfg)
    trained = tmp_path / "trained"
    trained.mkdir()
    save_matrix(made[2][0].A, trained / "renamed_000_301.npz")  # the third family's matrix under another name
    other = tmp_path / "other"
    other.mkdir()
    save_matrix(generate("powerlaw", 333, seed=5), other / "p.npz")
    assert len(matrix_set(EvalConfig(matrices="families", family_rows=300, distinct_from=(str(other),)))) == len(made)
    with pytest.raises(SparseRLError, match=f"{made[2][0].name} has the structure of renamed_000_301.npz"):
        matrix_set(EvalConfig(matrices="families", family_rows=300, distinct_from=(str(other), str(trained))))
    with pytest.raises(SparseRLError, match="--distinct-from .*: not a folder"):
        EvalConfig(matrices="families", distinct_from=(str(tmp_path / "none"),))


def test_a_failed_cusparse_baseline_is_run_once_more_then_named() -> None:
    """The harness answers a failed job with an error payload (a worker killed at its time limit, an exception
    in it). One failure is run again (the held-out families set ended on a ``KeyError`` after 20 minutes of a
    run otherwise); two stop with the matrix and the harness's message. Kills the retry left out, a failure
    indexed as if it were times, and an error that does not name the matrix."""
    from sparserl.errors import SparseRLError
    from sparserl.eval.compare import cusparse_times

    times = {"baselines": {"cold": {"median_us": 5.0, "roofline": 0.4}}}
    failed = {"error_kind": "timeout", "message": "did not finish the prepare phase within 60 s"}

    class Harness:
        def __init__(self, answers):
            self.answers, self.calls = list(answers), 0

        def baseline(self, ref, op, k):
            self.calls += 1
            return self.answers.pop(0)

    once = Harness([failed, times])
    assert cusparse_times(once, "ref", "spmv", None, "random_1000000") is times and once.calls == 2
    first = Harness([times])
    assert cusparse_times(first, "ref", "spmv", None, "m") is times and first.calls == 1
    with pytest.raises(SparseRLError, match=r"random_1000000 failed twice \(timeout: did not finish the prepare"):
        cusparse_times(Harness([failed, failed]), "ref", "spmv", None, "random_1000000")


def test_the_second_look_retimes_each_systems_best_side_by_side() -> None:
    """``evaluate --retime``: each matrix's best kernels timed again (fresh, one evaluation of a text shared by
    two systems), the medians turned into speedups against the harness's cuSPARSE time, a best that fails a pass
    counted as the user keeping cuSPARSE, and the summary and page carrying both timings. Kills: the retimed
    speedup taken from the first timing (``best_us``), the median replaced by the minimum, a failed pass read as a
    time, cuSPARSE given a retimed figure, a system's kernel timed twice in one pass."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from sparserl.eval.compare import second_look

    times = {"ORACLE": [10.0, 12.0, 11.0], "POLICY": [9.0, 9.5, 30.0], "SELECTOR": [20.0, None, 20.0]}
    calls = []

    class Ev:
        config = SimpleNamespace(reward_regime="cold")

        def submit(self, text, ref, op, k, fresh=False):
            calls.append((text.split()[0], fresh))
            t = times[text.split()[0]].pop(0)
            f = Future()
            f.set_result(SimpleNamespace(ok=t is not None, timings={"cold": SimpleNamespace(median_us=t)}))
            return f

    ctx = SimpleNamespace(name="m", op="spmv", k=None, ref=lambda ev: "ref")
    rec = lambda s, us: {"family": "f", "n": 1, "compiled": 1, "correct": int(s is not None),  # noqa: E731
                         "best_speedup": s, "best_us": us, "best_format": None, "roofline": None, "kinds": {}}
    # cuSPARSE took 22 us in the harness: 2.0x at 11 us (the oracle's first timing), 2.2x at 10 us
    systems = {"cuSPARSE": {"m": rec(1.0, 22.0)}, "library oracle": {"m": rec(2.0, 11.0)},
               "ours": {"m": rec(2.2, 10.0)}, "twin": {"m": rec(2.2, 10.0)},
               "rule-based selector": {"m": rec(1.1, 20.0)}, "none": {"m": rec(None, None)}}
    best = {"library oracle": {"m": "ORACLE k"}, "ours": {"m": "POLICY k"}, "twin": {"m": "POLICY   k"},
            "rule-based selector": {"m": "SELECTOR k"}}
    second_look(EvalConfig(retime=3), Ev(), [(ctx, "f")], systems, best)
    assert sorted(calls) == sorted([("ORACLE", True), ("POLICY", True), ("SELECTOR", True)] * 3)
    assert systems["library oracle"]["m"]["retimed_us"] == 11.0 and systems["ours"]["m"]["retimed_us"] == 9.5
    assert systems["ours"]["m"]["retimed_speedup"] == pytest.approx(22.0 / 9.5)
    assert systems["twin"]["m"]["retimed_speedup"] == systems["ours"]["m"]["retimed_speedup"]
    assert systems["library oracle"]["m"]["retimed_speedup"] == pytest.approx(2.0)
    assert systems["rule-based selector"]["m"]["retimed_speedup"] is None  # one pass failed
    assert systems["none"]["m"]["retimed_speedup"] is None and "retimed_speedup" not in systems["cuSPARSE"]["m"]
    sel = summarize(systems["rule-based selector"], 1)
    assert sel["geomean_speedup_retimed"] == 1.0 and sel["retime_failed"] == 1 and sel["geomean_speedup"] == 1.1
    assert summarize(systems["none"], 1)["retime_failed"] == 0
    assert "geomean_speedup_retimed" not in summarize(systems["cuSPARSE"], 1)
    page = markdown({"summary": {name: summarize(r, 1) for name, r in systems.items()}, "config": {
        "samples": 1, "retime": 3}, "op": "spmv", "k": None, "paper": {"source": "p", "gpu": "V100",
        "compile_rate": 0.5, "pass_at_1": 0.1, "geomean_speedup": 1.4}, "compile_only": False})
    assert "## Second look: each matrix's best kernels timed again side by side (3 passes)" in page
    assert f"| ours | 2.20x | {22 / 9.5:.2f}x | {22 / 9.5 / 2.0:.3f} | 0 |" in page
    assert "| rule-based selector | 1.10x | 1.00x | 0.500 | 1 |" in page


def test_retime_needs_a_timed_run() -> None:
    with pytest.raises(SparseRLError, match="--retime times the kernels again on a GPU"):
        EvalConfig(retime=3, compile_only=True)
    with pytest.raises(SparseRLError, match="--retime"):
        EvalConfig(retime=-1)
