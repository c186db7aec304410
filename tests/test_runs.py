"""A stage never overwrites an earlier run without --force (or continues it with --resume)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.errors import SparseRLError
from sparserl.runs import check_output
from tests.conftest import one_line_error

pytest.importorskip("torch")


def test_check_output(tmp_path: Path) -> None:
    check_output(tmp_path / "new", "sft", force=False, resume=False)  # nothing there
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(SparseRLError, match="holds an earlier sft run .metrics.jsonl.: pass --resume"):
        check_output(tmp_path, "sft", force=False, resume=False)
    check_output(tmp_path, "sft", force=True, resume=False)
    check_output(tmp_path, "sft", force=False, resume=True)
    with pytest.raises(SparseRLError, match="give one of them"):
        check_output(tmp_path, "sft", force=True, resume=True)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SparseRLError, match="pass --force to overwrite it, or"):  # data build cannot resume
        check_output(tmp_path, "data", force=False)


@pytest.mark.parametrize("args, stage", [
    (("sft", "--data", "nowhere"), "sft"), (("pretrain", "--steps", "1"), "pretrain"), (("ppo",), "ppo"),
    (("grpo",), "grpo"), (("data", "build"), "data"), (("demo", "--tiny"), "demo"),
    (("evaluate", "--baselines", "selector"), "evaluate")])
def test_each_stage_refuses_an_earlier_run(cli, tmp_path: Path, args: tuple, stage: str) -> None:
    out = tmp_path / "run"
    (out / ("checkpoint" if stage in ("sft", "ppo", "grpo") else "summary.json" if stage == "data"
            else "model" if stage == "pretrain" else "eval.json" if stage == "evaluate"
            else "stages.json")).mkdir(parents=True)
    line = one_line_error(cli(*args, "--out", out), f"holds an earlier {stage} run", "--force")
    can_resume = stage not in ("data", "evaluate")
    assert ("--resume" in line) == can_resume
    one_line_error(cli(*args, "--out", out, "--force", *(["--resume"] if can_resume else ["--nope"])))


def test_evaluate_keeps_an_earlier_evaluation_unless_forced(cli, tmp_path: Path) -> None:
    """An evaluation's eval.json and completions.jsonl (hours of GPU time) were overwritten by
    the next 'sparserl evaluate' with the same --out, without a word."""
    out = tmp_path / "eval"
    out.mkdir()
    (out / "eval.json").write_text('{"earlier": true}')
    (out / "completions.jsonl").write_text("{}\n")
    one_line_error(cli("evaluate", "--baselines", "selector", "--out", out), "holds an earlier evaluate run",
                   "eval.json, completions.jsonl", "--force")
    assert (out / "eval.json").read_text() == '{"earlier": true}'


def test_sft_refuses_a_temperature_of_zero(cli, tmp_path: Path) -> None:
    one_line_error(cli("sft", "--out", tmp_path / "s", "--eval-temperature", "0"), "--eval-temperature must be > 0")


def test_data_build_refuses_ks_without_spmm(cli, tmp_path: Path) -> None:
    one_line_error(cli("data", "build", "--out", tmp_path / "d", "--ks", "8"), "--ks", "spmm")
