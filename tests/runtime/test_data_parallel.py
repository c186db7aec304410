"""Data-parallel training on 2 CPU processes (gloo), launched by torchrun as a user would on GPUs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

from sparserl.harness.compile import find_nvcc  # noqa: E402
from tests.conftest import NEEDS_NVCC  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def torchrun(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run torchrun on two CPU processes; its temporary folders (torchelastic_*) go to a folder of its
    own, removed afterwards, not to /tmp."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="sparserl-torchrun-") as tmp:
        env = os.environ | {"OMP_NUM_THREADS": "1", "TMPDIR": tmp,
                            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(port), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.mark.slow(seconds=12)
def test_helpers_average_gradients_and_catch_drift() -> None:
    p = torchrun(str(REPO / "tests" / "runtime" / "dist_probe.py"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "rank 0 ok" in p.stdout and "rank 1 ok" in p.stdout


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
@pytest.mark.slow(seconds=21)
def test_ppo_on_two_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each rank draws its own matrices and samples; the replicas are checked identical at every
    checkpoint (they would drift apart if gradients were not averaged)."""
    from sparserl.matrices import generate, save_matrix

    mats = tmp_path / "mats"
    mats.mkdir()
    for i, fam in enumerate(("banded", "random", "stencil2d", "block")):
        save_matrix(generate(fam, 300, seed=i), mats / f"{fam}.npz")
    cfg = tmp_path / "ppo.toml"
    cfg.write_text(f'model = "{tiny_model_dir}"\nmatrices = "{mats}"\nout = "{tmp_path / "ppo"}"\nsteps = 2\n'
                   "matrices_per_step = 2\nsamples_per_matrix = 2\nminibatch = 2\nepochs = 1\nmax_new_tokens = 12\n"
                   'lr = 1e-3\nsave_every = 1\neval_every = 2\ndevice = "cpu"\n'
                   "target_kl = 1e-9\n"  # every step stops after its first minibatch, on both ranks at once
                   "entropy_coef = 0.01\n")  # moves the policy also when every reward is equal (12 tokens compile nothing)
    p = torchrun("-m", "sparserl.cli", "ppo", "--config", str(cfg), "--compile-only")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "ppo" / "result.json").read_text())
    assert res["world_size"] == 2 and res["steps"] == 2
    metrics = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "dist/world_size" in m] == [1, 2]
    assert all(m["charts/early_stop"] == 1.0 and m["charts/update_minibatches"] == 1.0 for m in metrics
               if "dist/world_size" in m)
    assert (tmp_path / "ppo" / "checkpoint" / "policy.json").exists()


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
@pytest.mark.slow(seconds=28)
def test_sft_on_two_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    from sparserl.data.sft_build import SFTDataConfig, build_sft_data

    data = tmp_path / "data"
    build_sft_data(SFTDataConfig(out=str(data), families=("banded", "random"), matrices_per_family=3, min_rows=200,
                                 max_rows=400, compile_only=True, val_fraction=0.34, test_fraction=0.0))
    p = torchrun("-m", "sparserl.cli", "sft", "--data", str(data), "--model", str(tiny_model_dir), "--out",
                 str(tmp_path / "sft"), "--steps", "4", "--batch-size", "2", "--eval-every", "4", "--save-every", "2",
                 "--eval-samples", "2", "--device", "cpu", "--compile-only",
                 "--max-batch-tokens", "1")  # a micro-batch per row: DDP reduces once, at each rank's last one
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "sft" / "result.json").read_text())
    assert res["world_size"] == 2 and res["steps"] == 4 and "eval/compile_rate" in res
    logged = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("dist/world_size") == 2.0 for m in logged)
