"""The CPU RL toy (benchmarks/rl_toy.py) runs end to end (SFT, then each algorithm from the same
start), and on it the defaults keep the policy near its reference where the old settings ran away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
ROLLOUT = ("step", "intact", "oracle", "reward", "kl_to_ref", "logp_gap")  # what a row says before its update


def toy(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = {"PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           **{k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rl_toy.py"), "--kernels", "2", "--chars", "100",
                        "--sft-steps", "40", "--group", "4", "--max-new-tokens", "48", "--lr", "2e-3", "--steps", "5",
                        "--sft-cache", str(tmp_path / "sft.pt"), "--out", str(out), *extra],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text())["runs"]


@pytest.mark.slow(seconds=50)
def test_defaults_keep_the_drift_bounded(tmp_path: Path) -> None:
    """The lr 5e-5 collapse's mechanism on the toy, at 10x the toy's lr (2e-3, the default pg_token_share):
    with the old settings (no KL loss, the KL only in PPO's reward, a critic, no warm-up, no KL
    stop) the policy runs away from its reference, past 1 nat per token within 5 steps and growing;
    with the defaults (KL loss on every token, warm-up, target-KL stop, leave-one-out baseline) it
    stays within 0.5. Both start from the same SFT model and draw the same first samples."""
    old = toy(tmp_path, "old", "--algos", "ppo", "--no-guards")["ppo"]
    runs = toy(tmp_path, "new", "--algos", "ppo,grpo")
    new = runs["ppo"]
    for rows in runs.values():
        assert [r["step"] for r in rows] == list(range(6))
        assert all(0 <= r["intact"] <= 1 and 0 <= r["oracle"] <= r["intact"] + 1e-9 for r in rows)
        assert all(r["logp_gap"] < 1e-4 for r in rows)  # the sampler's and the learner's log-probs agree
    first = {k: old[0][k] for k in ROLLOUT}
    assert first == {k: new[0][k] for k in ROLLOUT} == {k: runs["grpo"][0][k] for k in ROLLOUT}
    kl_old = [r["kl_to_ref"] for r in old]
    kl_new = [r["kl_to_ref"] for r in new]
    assert max(kl_old) > 1.0 and kl_old[-1] > kl_old[1], kl_old
    assert max(kl_new) < 0.5, kl_new
    assert max(r["kl_to_ref"] for r in runs["grpo"]) < 0.5
    assert any(r.get("update_minibatches", 2) < 2 for r in new), "the target-KL stop never fired"


def test_a_budget_that_cannot_finish_a_kernel_is_refused(tmp_path: Path) -> None:
    """A completion budget shorter than a kernel makes that kernel never intact, and every figure of the
    run then measures the cut, not the algorithm: the toy refuses it before training, in one line (the
    default is the longest kernel plus its end token and a margin). Kills the check left out."""
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rl_toy.py"), "--kernels", "2", "--chars", "100",
                        "--max-new-tokens", "5", "--out", str(tmp_path / "o.json")], capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PATH": "/usr/bin:/bin",
                                         "PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode == 1 and p.stderr.strip().startswith("error: --max-new-tokens 5 cannot finish a kernel of")
    assert p.stderr.strip().count("\n") == 0 and not (tmp_path / "o.json").exists()
