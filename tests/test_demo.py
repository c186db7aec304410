"""The CI smoke test: `sparserl demo --compile-only --tiny` runs every stage on a CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sparserl.harness.compile import find_nvcc  # noqa: E402
from tests.conftest import NEEDS_NVCC  # noqa: E402


@pytest.mark.slow(seconds=70)
@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_tiny_compile_only_demo(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "sparserl.cli", "demo", "--tiny", "--compile-only", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads((out / "demo.json").read_text())
    stages_run = ("data", "pretrain", "sft", "ppo", "evaluate", "generate")
    for stage in stages_run:
        assert stage in rep and rep[stage]["seconds"] > 0
    assert sum(rep[s]["seconds"] for s in stages_run) <= rep["seconds"]
    assert rep["data"]["summary"]["rows"]["train"] > 0
    assert (out / "pretrain" / "model" / "config.json").exists()
    assert (out / "sft" / "checkpoint" / "policy.json").exists() and (out / "ppo" / "checkpoint" / "policy.json").exists()
    md = (out / "eval" / "eval.md").read_text()
    assert "Compile-only run" in md and "| sft |" in md and "| ppo |" in md
    assert "demo finished" in proc.stdout
    # the user goes home with a kernel: labelled, compiled, unverified, with the command that verifies it
    kernel = out / "generate" / "kernel.cu"
    assert kernel.read_text().startswith("FORMAT:") and rep["generate"]["kernel"] == str(kernel)
    assert f"kernel: {kernel}" in proc.stdout
    assert ("written by the model" in proc.stdout) != ("library kernel: the rule-based format selector's choice"
                                                       in proc.stdout)
    assert "NOT verified" in proc.stdout
    verify = next(ln for ln in proc.stdout.splitlines() if "verify it on a GPU with: " in ln)
    cmd = verify.split("verify it on a GPU with: ")[1].split()
    assert cmd[:2] == ["sparserl", "check-kernel"]
    check = subprocess.run([sys.executable, "-m", "sparserl.cli", *cmd[1:]], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0 and "COMPILED" in check.stdout, check.stderr[-2000:]
    # and it says whether RL changed anything, from the weights themselves: counted again here from
    # the two checkpoints' files (the earlier check compared the summary line with the report's own
    # count); mutation killed: policy_change comparing a checkpoint with itself
    from safetensors.numpy import load_file

    def weights(folder: Path) -> dict:
        return {k: v for f in sorted(folder.rglob("*.safetensors")) for k, v in load_file(str(f)).items()}

    before, after = weights(out / "sft" / "checkpoint"), weights(out / "ppo" / "checkpoint")
    moved = sum(not np.array_equal(before[k], after[k]) for k in before)
    ch = rep["rl_change"]
    assert ch["comparable"] and ch["tensors"] == len(before) > 0 and ch["tensors_changed"] == moved
    rl_line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RL stage: "))
    assert ("did NOT change" in rl_line) == (moved == 0)
    # the evaluation lines, from the saved samples: compiled (no_gpu in a compile-only run) over all
    rows = [json.loads(x) for x in (out / "eval" / "completions.jsonl").read_text().splitlines()]
    for name in ("sft", "ppo"):
        mine = [r for r in rows if r["system"] == name]
        rate = 100 * sum(r["verdict"] == "no_gpu" for r in mine) / len(mine)
        assert f"evaluation, {name} model: {rate:.1f}% of samples compiled (compile-only" in proc.stdout
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
    # and a run over it without --resume or --force is refused, leaving it as it was
    over = subprocess.run([sys.executable, "-m", "sparserl.cli", "demo", "--tiny", "--compile-only",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert over.returncode == 2 and "holds an earlier demo run" in over.stderr and "--force" in over.stderr
    assert json.loads((out / "demo.json").read_text())["seconds"] == rep2["seconds"]


def test_rl_summary_says_when_no_step_had_a_reward_signal(tmp_path: Path) -> None:
    """The tiny CPU demo's PPO steps all score every sample alike (nothing compiles), yet the
    weights move (the KL term, normalised by Adam): 'changed the policy' alone reads as if RL
    learned something. The summary says the rewards never differed."""
    import numpy as np
    from safetensors.numpy import save_file

    from sparserl.demo import _rl_line, policy_change

    before, after, rl = tmp_path / "sft", tmp_path / "ppo" / "checkpoint", tmp_path / "ppo"
    for folder, w in ((before, 1.0), (after, 1.0 + 1e-5)):
        folder.mkdir(parents=True)
        save_file({"w": np.full((2, 2), w, dtype=np.float32), "b": np.zeros(2, dtype=np.float32)},
                  str(folder / "model.safetensors"))
    steps = [{"step": 1, "charts/grad_norm": 0.0, "reward/mean": -4.0, "charts/no_signal": 1.0},
             {"step": 2, "charts/grad_norm": 1e-5, "reward/mean": -4.0, "charts/no_signal": 1.0}]
    (rl / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    line = _rl_line(policy_change(before, after, rl))
    assert line.startswith("RL stage: changed the policy (1 of 2 weight tensors moved")
    assert "in none of its 2 steps did the rewards differ" in line
    steps[1]["charts/no_signal"] = 0.0  # one step with a signal: the plain line
    (rl / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    assert _rl_line(policy_change(before, after, rl)).endswith("largest change 1e-05)")


def test_rl_line_when_every_step_was_skipped(tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    from sparserl.demo import _rl_line, policy_change

    before, after, rl = tmp_path / "sft", tmp_path / "ppo" / "checkpoint", tmp_path / "ppo"
    for folder in (before, after):
        folder.mkdir(parents=True)
        save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(folder / "model.safetensors"))
    steps = [{"step": s, "charts/update_skipped": 1.0, "reward/mean": -4.0, "charts/no_signal": 1.0} for s in (1, 2)]
    (rl / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    line = _rl_line(policy_change(before, after, rl))
    assert line.startswith("RL stage: did NOT change the policy") and "all 2 of its steps were skipped" in line


def test_a_real_matrix_that_does_not_load_is_refused_before_the_stages(tmp_path: Path) -> None:
    """A corrupt ``--real-matrix`` was read only by the last stage, after every other stage had run."""
    from sparserl.demo import DemoConfig
    from sparserl.errors import SparseRLError

    bad = tmp_path / "trunc.mtx.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00not gzip")
    with pytest.raises(SparseRLError, match="--real-matrix: .*trunc.mtx.gz"):
        DemoConfig(real_matrix=str(bad), out=str(tmp_path / "demo"))
    assert not (tmp_path / "demo").exists()
