"""benchmarks/card_ablation.py end to end in its tiny compile-only mode (12-60 s on 2 CPU
cores): two SFT arms on the same data, with and without the card, evaluated on the same split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from sparserl.harness.compile import find_nvcc  # noqa: E402
from tests.conftest import NEEDS_NVCC, load_benchmark  # noqa: E402


def load_script():
    return load_benchmark("card_ablation")


def test_table_puts_the_arms_side_by_side() -> None:
    mod = load_script()
    text = mod.table({"card": {"compile_rate": 0.5, "pass@1": None, "pass@8": 0.25},
                      "no card": {"compile_rate": 0.25, "pass@8": 0.125}}, ["card", "no card"])
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "card", "no", "card"]
    assert lines[2].split() == ["compile_rate", "0.500", "0.250"] and lines[3].split() == ["pass@8", "0.250", "0.125"]
    assert "pass@1" not in text  # no arm has it


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_card_ablation_tiny_compile_only(tmp_path: Path, capsys) -> None:
    mod = load_script()
    assert mod.main(["--tiny", "--compile-only", "--steps", "1", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "card_ablation.json").read_text())
    card, plain = res["summary"]["card"], res["summary"]["no card"]
    assert card["matrices"] == plain["matrices"] > 0 and card["samples"] == plain["samples"]
    assert res["sft"]["card"]["steps"] == res["sft"]["no card"]["steps"] == 1
    assert res["sft"]["card"]["train_rows"] == res["sft"]["no card"]["train_rows"]  # the same data
    assert res["prompt_tokens"]["card"]["mean"] > res["prompt_tokens"]["no card"]["mean"]
    for arm, on in (("card", True), ("no_card", False)):
        meta = json.loads((tmp_path / arm / "checkpoint" / "policy.json").read_text())
        assert meta["config"]["card"] is on
    out = capsys.readouterr().out
    assert "compile_rate" in out and "card_ablation.json" in out
