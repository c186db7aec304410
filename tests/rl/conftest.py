"""A tiny tokenizer and model config for CPU tests of the model side."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from sparserl.data.corpus import library_texts
    from sparserl.model.tokenizer import train_tokenizer

    return train_tokenizer(library_texts(), vocab_size=600)


@pytest.fixture(scope="session")
def tiny_hf_config(tiny_tokenizer):
    from sparserl.model.config import TinyModelConfig, hf_config

    shape = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, max_position_embeddings=2048)
    t = tiny_tokenizer
    return hf_config(len(t), shape, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id,
                     pad_token_id=t.pad_token_id)
