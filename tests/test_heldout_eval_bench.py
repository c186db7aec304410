"""benchmarks/heldout_eval.py: its bad-input lines (the whole run is exercised by the smoke preset's test,
tests/test_policy_script.py, which evaluates through it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("heldout_eval", REPO / "benchmarks" / "heldout_eval.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("args, says", [
    (["--sets", "test,val", "-c", "a=x"], "--sets takes test, families"),
    (["--sets", "test", "-c", "a=x"], "needs --data"),
    (["--sets", "families", "-c", "a=NOWHERE"], "no model at"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, args, says) -> None:
    args = [a.replace("NOWHERE", str(tmp_path / "none")) for a in args]
    assert bench.main([str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_resume_keeps_a_finished_set_and_opens_nothing(tmp_path, capsys) -> None:
    """A set whose eval.json is written is kept under --resume; with every set kept nothing is opened
    (the model path does not exist: opening it would fail). Mutation killed: --resume ignored."""
    for s in ("test", "families"):
        (tmp_path / f"eval-{s}").mkdir()
        (tmp_path / f"eval-{s}" / "eval.json").write_text("{}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # has_model sees a model folder; opening it would fail
    assert bench.main([str(tmp_path), "--data", str(tmp_path), "-c", f"a={model}", "--resume"]) == 0
    assert capsys.readouterr().out.count("written before, kept") == 2
