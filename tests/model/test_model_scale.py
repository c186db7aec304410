"""benchmarks/model_scale.py runs end to end on a CPU at tiny sizes, its PPO step included (the
step crashed with "pg_token_share < 1 needs the rollout's entropies" once that default changed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


def test_model_scale_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    env = {"PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "model_scale.py"), "--shape", "tiny-test", "--bf16",
                        "--decode", "bucketed,static", "--gen-tokens", "16", "--gen-batch", "4", "--batch", "2", "--steps", "1",
                        "--device", "cpu", "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["bf16"] and res["ppo_batch"] == 2 and res["ppo_step_s"] > 0
    assert res["generation"]["static"]["tokens"] > 0 and res["generation"]["bucketed"]["tokens"] > 0
    assert all(res["generation"][e]["memory_bound_tokens_per_s"] > 0 for e in ("static", "bucketed"))
