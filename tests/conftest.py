"""Shared fixtures: where the real SuiteSparse matrices are, and the GPU marker's skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def suitesparse_dir() -> Path | None:
    """The folder of real SuiteSparse matrices (``$SPARSERL_SUITESPARSE`` or ``../shared``)."""
    env = os.environ.get("SPARSERL_SUITESPARSE")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "matrices" / "suitesparse", REPO / ".devdata" / "suitesparse"]
    for c in candidates:
        if c.is_dir() and any(c.glob("*.mtx.gz")):
            return c
    return None


@pytest.fixture(scope="session")
def suitesparse() -> Path:
    d = suitesparse_dir()
    if d is None:
        pytest.skip("real SuiteSparse matrices not found (set SPARSERL_SUITESPARSE)")
    return d


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with cupy; run through the device tool")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# -- tiny model fixtures for the model-side tests (need the train extra) -------------------------


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A BPE tokenizer trained on the rendered kernel library (600 tokens)."""
    pytest.importorskip("transformers")
    from sparserl.data.corpus import library_texts
    from sparserl.model.tokenizer import train_tokenizer

    return train_tokenizer(library_texts(), vocab_size=600)


@pytest.fixture(scope="session")
def tiny_hf_config(tiny_tokenizer):
    """A two-layer Qwen3 config of hidden size 64 (random weights, CPU-fast)."""
    from sparserl.model.config import TinyModelConfig, hf_config

    shape = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, max_position_embeddings=2048)
    t = tiny_tokenizer
    return hf_config(len(t), shape, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id,
                     pad_token_id=t.pad_token_id)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer, tiny_hf_config) -> Path:
    """That model with random weights saved as a Hugging Face folder (model + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny_model")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_hf_config).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder
