"""The base preset pre-trains on a GPU: bf16 autocast, SDPA attention in 2048-token windows,
a checkpoint, held-out perplexity per package, and tokens/s with MFU against the GPU's peak."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sparserl.train.pretrain import PretrainConfig, pretrain  # noqa: E402
from sparserl.train.throughput import peak_tflops  # noqa: E402
from tests.corpus.test_pack import make_corpus  # noqa: E402

pytestmark = pytest.mark.gpu


def test_base_preset_trains_on_the_gpu_with_mfu(tmp_path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and a CUDA build of torch; torch sees no GPU here")
    make_corpus(tmp_path / "c", files=1500)
    cfg = PretrainConfig(out=str(tmp_path / "run"), corpus_dir=str(tmp_path / "c"), preset="base", vocab_size=1024,
                         seq_len=2048, batch_size=4, steps=12, warmup_steps=2, eval_every=12, save_every=12,
                         heldout_tokens=8192, device="cuda")
    r = pretrain(cfg)
    assert r["steps"] == 12 and 150e6 <= r["params"] <= 300e6
    assert set(r["heldout_ppl_by_package"]) == {"beta"} and set(r["heldout_share_ppl_by_package"]) == {"alpha"}
    assert all(math.isfinite(v) and v > 1 for v in r["heldout_ppl_by_package"].values())
    peak = peak_tflops(torch.cuda.get_device_name())
    if peak is not None:  # a GPU of known peak: MFU is reported and plausible
        assert r["peak_tflops"] == peak and 0.01 < r["mfu"] < 1.0
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
