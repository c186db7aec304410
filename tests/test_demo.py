"""The CI smoke test: `sparserl demo --compile-only --tiny` runs every stage on a CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from sparserl.harness.compile import find_nvcc  # noqa: E402


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_tiny_compile_only_demo(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "sparserl.cli", "demo", "--tiny", "--compile-only", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads((out / "demo.json").read_text())
    for stage in ("data", "pretrain", "sft", "ppo", "evaluate", "generate"):
        assert stage in rep and rep[stage]["seconds"] >= 0
    assert rep["data"]["summary"]["rows"]["train"] > 0
    assert (out / "pretrain" / "model" / "config.json").exists()
    assert (out / "sft" / "checkpoint" / "policy.json").exists() and (out / "ppo" / "checkpoint" / "policy.json").exists()
    md = (out / "eval" / "eval.md").read_text()
    assert "Compile-only run" in md and "| sft |" in md and "| ppo |" in md
    assert "demo finished" in proc.stdout and "generate verdict" in proc.stdout
    stages = json.loads((out / "stages.json").read_text())
    assert list(stages["stages"]) == ["data", "pretrain", "sft", "ppo", "evaluate", "generate"]
    assert stages["config"]["tiny"] is True and stages["config"]["compile_only"] is True
    assert (out / "ppo" / "learning_curve.png").stat().st_size > 1000
    # a second run with --resume finds every stage done and redoes none of them
    again = subprocess.run([sys.executable, "-m", "sparserl.cli", "demo", "--tiny", "--compile-only", "--resume",
                            "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("done by an earlier run") == 6
    rep2 = json.loads((out / "demo.json").read_text())
    assert rep2["stage_seconds"] == rep["stage_seconds"] and rep2["seconds"] < rep["seconds"]
    # a resume with other settings is refused rather than mixing two runs
    other = subprocess.run([sys.executable, "-m", "sparserl.cli", "demo", "--tiny", "--compile-only", "--resume",
                            "--seed", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "other settings" in other.stderr
