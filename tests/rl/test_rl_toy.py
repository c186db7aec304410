"""The CPU RL toy (benchmarks/rl_toy.py) runs end to end: SFT, then each algorithm from the same start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def test_rl_toy_smoke(tmp_path: Path) -> None:
    out = tmp_path / "toy.json"
    env = {"PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rl_toy.py"), "--steps", "1", "--sft-steps", "5",
                        "--kernels", "2", "--chars", "120", "--group", "2", "--max-new-tokens", "24",
                        "--algos", "ppo,grpo", "--out", str(out)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["runs"]) == {"ppo", "grpo"}
    for rows in res["runs"].values():
        assert [r["step"] for r in rows] == [0, 1]
        assert all(0 <= r["intact"] <= 1 and 0 <= r["oracle"] <= r["intact"] + 1e-9 for r in rows)
        assert rows[0] == res["runs"]["ppo"][0]  # both start from the same SFT model and the same samples
