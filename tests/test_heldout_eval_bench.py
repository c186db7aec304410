"""benchmarks/heldout_eval.py: its bad-input lines (the whole run is exercised by the smoke preset's test,
tests/test_policy_script.py, which evaluates through it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sparserl.harness.compile import find_nvcc
from tests.conftest import NEEDS_NVCC

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("heldout_eval", REPO / "benchmarks" / "heldout_eval.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("args, says", [
    (["--sets", "test,train", "-c", "a=x"], "--sets takes test, families, val"),
    (["--sets", "test", "-c", "a=x"], "need --data"),
    (["--sets", "real", "-c", "a=x"], "need --data"),
    (["--sets", "families", "--temperature", "1.0,0", "-c", "a=x"], "--temperature takes positive numbers"),
    (["--sets", "families", "-c", "a=NOWHERE"], "no model at"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, args, says) -> None:
    args = [a.replace("NOWHERE", str(tmp_path / "none")) for a in args]
    assert bench.main([str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_resume_keeps_only_a_set_written_with_the_same_settings(tmp_path, capsys) -> None:
    """A set whose eval.json was written with the same settings is kept under --resume, and with
    every set kept nothing is opened (opening the stand-in model folder would fail); one written
    with another policy list, temperature or sample count is made again. Mutations killed: --resume
    ignored, and a set kept whatever it was made with (a policy added since would be missing from it)."""
    import argparse
    import json
    from dataclasses import asdict

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # has_model sees a model folder; opening it would fail
    argv = [str(tmp_path), "--data", str(tmp_path), "-c", f"a={model}", "--resume"]
    args = argparse.Namespace(data=tmp_path, family_rows=1_000_000, limit=0, checkpoint=[f"a={model}"],
                              baselines="cusparse,oracle", samples=8, max_new_tokens=None, gen_batch=32,
                              compile_only=False, seed=0, header_grammar=False)
    cfgs = {s: bench.set_config(s, args, tmp_path, bench.POLICY_TEMPERATURE, f"eval-{s}")  # main's default
            for s in ("test", "families")}
    for s, cfg in cfgs.items():
        (tmp_path / f"eval-{s}").mkdir()
        (tmp_path / f"eval-{s}" / "eval.json").write_text(json.dumps({"config": asdict(cfg)}))
    assert bench.main(argv) == 0
    assert capsys.readouterr().out.count("written before with the same settings, kept") == 2
    assert bench.written_as(cfgs["test"])
    from dataclasses import replace

    for changed in (dict(temperature=1.0), dict(samples=16), dict(checkpoints=(f"a={model}", f"b={model}")),
                    dict(header_grammar=True), dict(system_temperatures=("a=0.7",))):
        assert not bench.written_as(replace(cfgs["test"], **changed)), changed
    # written before systems had their own temperatures (no such key): every one at the set's, kept as such
    old = {k: v for k, v in asdict(cfgs["test"]).items() if k != "system_temperatures"}
    (tmp_path / "eval-test" / "eval.json").write_text(json.dumps({"config": old}))
    assert bench.written_as(cfgs["test"])
    # written before the grammar existed (no such key): sampled without it, so kept for a run without it
    old = {k: v for k, v in asdict(cfgs["test"]).items() if k != "header_grammar"}
    (tmp_path / "eval-test" / "eval.json").write_text(json.dumps({"config": old}))
    assert bench.written_as(cfgs["test"]) and not bench.written_as(replace(cfgs["test"], header_grammar=True))
    # written before the real matrices had a set of their own: the test split whole, real ones too, so not
    # the generated-only test set of now; it is what the validation set still takes
    old = {k: v for k, v in asdict(cfgs["test"]).items() if k != "real_matrices"}
    (tmp_path / "eval-test" / "eval.json").write_text(json.dumps({"config": old}))
    assert not bench.written_as(cfgs["test"]) and bench.written_as(replace(cfgs["test"], real_matrices="all"))
    real = bench.set_config("real", args, tmp_path, 1.0, "eval-real")
    val = bench.set_config("val", args, tmp_path, 1.0, "eval-val")  # the temperature's choice sees every kind
    # the training folders reach the families set, made here, and no split of the data folder (which holds them)
    args.distinct_from = [str(tmp_path)]
    assert bench.set_config("families", args, tmp_path, 1.0, "f").distinct_from == (str(tmp_path),)
    assert bench.set_config("test", args, tmp_path, 1.0, "t").distinct_from == ()
    assert (real.split, real.real_matrices, cfgs["test"].real_matrices, val.real_matrices) == ("test", "only", "none",
                                                                                               "all")
    (tmp_path / "eval-test" / "eval.json").write_text("{}")  # finished by something else: made again
    assert not bench.written_as(cfgs["test"])


def test_the_temperature_rule() -> None:
    """The highest best of N wins; within 1% of it the higher correct share; on a tie of both the
    higher temperature; nothing timed, no choice. Mutations killed: choosing by correct share alone,
    by best of N alone, or the lower temperature on a tie."""
    f = lambda best, correct: {"best_over_oracle": best, "correct_share": correct}  # noqa: E731
    assert bench.choose_temperature({1.0: f(0.95, 0.80), 0.7: f(0.99, 0.85), 0.4: f(0.96, 0.97)}) == 0.7
    assert bench.choose_temperature({1.0: f(0.99, 0.80), 0.7: f(0.985, 0.90), 0.4: f(0.97, 0.99)}) == 0.7
    assert bench.choose_temperature({1.0: f(0.99, 0.90), 0.7: f(0.99, 0.90)}) == 1.0
    assert bench.choose_temperature({1.0: f(None, 0.9), 0.7: f(None, 0.95)}) is None


def test_evenly_spaced_subsets() -> None:
    from sparserl.eval.compare import evenly

    assert evenly(list(range(10)), 3) == [0, 3, 6] and evenly(list(range(4)), 0) == [0, 1, 2, 3]
    assert evenly(list(range(4)), 9) == [0, 1, 2, 3]


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_several_temperatures_write_a_set_each_and_the_choice(tmp_path, tiny_model_dir, capsys) -> None:
    """Compile-only (nothing timed): the val split, 2 of its 3 matrices, at two temperatures, one
    folder each, and temperature.json with the figures and no choice. Kills a sweep that evaluates
    one temperature twice, a --limit ignored, and a choice made from nothing timed."""
    import json

    from sparserl.data.rows import SFTRow, write_rows
    from sparserl.kernels.library import variants
    from sparserl.matrices import generate, save_matrix

    rows = []
    for i, fam in enumerate(("banded", "random", "powerlaw")):
        A = generate(fam, 300, seed=i)
        path = tmp_path / f"{fam}.mtx"
        save_matrix(A, path)
        rows.append(SFTRow(rows=[0], cols=[0], shape=A.shape, code=variants("spmv", "CSR")[0].render(),
                           matrix=str(path), family=fam, split="val"))
    write_rows(tmp_path / "data" / "val.jsonl", rows)
    out = tmp_path / "run"
    code = bench.main([str(out), "--data", str(tmp_path / "data"), "--sets", "val", "--limit", "2", "--samples", "1",
                       "--temperature", "1.0,0.5", "-c", f"tiny={tiny_model_dir}", "--compile-only",
                       "--max-new-tokens", "8"])
    assert code == 0, capsys.readouterr().err
    for t in ("1", "0.5"):
        ev = json.loads((out / f"eval-val-t{t}" / "eval.json").read_text())
        assert ev["config"]["temperature"] == float(t) and ev["summary"]["tiny"]["matrices"] == 2
    chosen = json.loads((out / "temperature.json").read_text())
    assert chosen["chosen"] is None and set(chosen["figures"]["val"]) == {"1", "0.5"}
    assert "temperature chosen on val: none" in capsys.readouterr().out


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_one_checkpoint_at_two_temperatures_is_opened_once_and_recorded(tmp_path, tiny_model_dir, capsys,
                                                                         monkeypatch) -> None:
    """``-c tiny=M -c tiny_t0.5=M --system-temperature tiny_t0.5=0.5``: both systems in one set's table, the
    exception recorded in its eval.json, the checkpoint opened once. Kills the option not reaching the set, and
    each name opening the model again (two copies of an 8B model on one GPU)."""
    import json

    from sparserl.model.policy import Policy

    opened = []
    real_open = Policy.open
    monkeypatch.setattr(Policy, "open",
                        classmethod(lambda cls, path, **kw: opened.append(path) or real_open(path, **kw)))
    code = bench.main([str(tmp_path / "run"), "--sets", "families", "--family-rows", "300", "--samples", "1",
                       "-c", f"tiny={tiny_model_dir}", "-c", f"tiny_t0.5={tiny_model_dir}",
                       "--system-temperature", "tiny_t0.5=0.5", "--baselines", "", "--compile-only",
                       "--max-new-tokens", "8"])
    assert code == 0, capsys.readouterr().err
    ev = json.loads((tmp_path / "run" / "eval-families" / "eval.json").read_text())
    assert ev["config"]["system_temperatures"] == ["tiny_t0.5=0.5"] and {"tiny", "tiny_t0.5"} <= set(ev["summary"])
    assert opened == [str(tiny_model_dir)]


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_a_failed_set_does_not_stop_the_others_and_resume_makes_only_it(tmp_path, capsys, monkeypatch,
                                                                        tiny_model_dir) -> None:
    """Two runs of the families set (two temperatures), the first failing inside evaluate: the second is still
    written, the exit status is 1 and stderr names the failed one; --resume then makes only that one. Kills a
    failure that ends the process (the second set's GPU time lost: on an H100 the families set ended a run this
    way before the real set ran) and a failure that exits 0 (the stage would be marked done without it)."""
    import sparserl.eval.compare as compare

    real_evaluate, calls = compare.evaluate, []

    def failing_first(cfg, **kw):
        calls.append(cfg.out)
        if len(calls) == 1:
            raise KeyError("baselines")
        return real_evaluate(cfg, **kw)

    monkeypatch.setattr(compare, "evaluate", failing_first)
    argv = [str(tmp_path), "--sets", "families", "--family-rows", "300", "--samples", "1", "--max-new-tokens", "8",
            "--temperature", "1.0,0.5", "--compile-only", "-c", f"a={tiny_model_dir}", "--resume"]
    assert bench.main(argv) == 1
    err = capsys.readouterr().err
    assert "error: eval-families-t1: 'baselines'" in err and "1 of 2 sets failed (eval-families-t1)" in err
    assert (tmp_path / "eval-families-t0.5" / "eval.json").exists()
    assert not (tmp_path / "eval-families-t1" / "eval.json").exists()
    monkeypatch.setattr(compare, "evaluate", real_evaluate)
    assert bench.main(argv) == 0
    assert (tmp_path / "eval-families-t1" / "eval.json").exists()
    assert "eval-families-t0.5: written before with the same settings, kept" in capsys.readouterr().out
