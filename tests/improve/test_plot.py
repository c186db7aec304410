"""The rounds plot: which rounds it reads, and the figure it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.improve.plot import RoundPoint, main, plot_rounds, round_points

RUN = {"rounds": [
    {"round": 1, "kept": True, "val": {"vs_oracle": 0.97, "correct_rate": 0.77}},
    {"round": 0, "kept": True, "val": {"vs_oracle": 0.82, "correct_rate": 0.81}},
    {"round": 2, "kept": False, "val": {"vs_oracle": 0.96, "correct_rate": 0.7}},
    {"round": 3, "kept": False},  # a round cut before its validation
]}


def test_round_points_in_order_validated_rounds_only() -> None:
    assert round_points(RUN) == [RoundPoint(0, 0.82, 0.81, True), RoundPoint(1, 0.97, 0.77, True),
                                 RoundPoint(2, 0.96, 0.7, False)]
    assert round_points({"rounds": []}) == [] and round_points({}) == []
    assert round_points({"rounds": [{"round": 0, "kept": True, "val": {"correct_rate": 0.5}}]}) == [
        RoundPoint(0, None, 0.5, True)]


def test_plot_writes_a_png_of_several_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot_rounds({"a": RUN, "b": {"rounds": RUN["rounds"][:2]}}, tmp_path / "r.png")
    assert out == tmp_path / "r.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_rounds({"empty": {"rounds": []}}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_command_reads_files_and_folders_and_names_a_missing_one(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "imp"
    run.mkdir()
    (run / "rounds.json").write_text(json.dumps(RUN))
    assert main([str(tmp_path / "a.png"), f"first={run}", str(run / "rounds.json")]) == 0
    assert (tmp_path / "a.png").exists()
    assert main([str(tmp_path / "b.png"), str(tmp_path / "nope")]) == 2
    assert "no such rounds.json" in capsys.readouterr().err
    (run / "rounds.json").write_text("{")
    assert main([str(tmp_path / "c.png"), str(run)]) == 2
    assert "is not JSON" in capsys.readouterr().err
