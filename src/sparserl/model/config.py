"""The embedded default model: a small Qwen3-architecture decoder trained here from scratch.

No pretrained weights can be downloaded, so the project ships only this *config*; the
weights come from ``sparserl pretrain``. Same architecture family as Qwen3-8B, so every
code path (LoRA, generation, checkpointing) is the one a real checkpoint takes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the default model (about 29M parameters at vocab 8192)."""

    hidden_size: int = 512
    intermediate_size: int = 1536
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True


POLICY_TEMPERATURE = 0.7
"""The temperature a trained policy is sampled at when kernels are asked of it (``generate``, ``evaluate``, the
model-guided ``search``). Chosen on the validation split: on 8 validation matrices 0.7 read 93.8% correct against
85.9% at 1.0, at 0.967 against 0.977 of the library oracle (results of 2026-12-04, policy-small-temperature); the
13 families at 1M rows then read 97.6% correct against 82.2%, at 1.007 against 1.011 of the oracle (2026-12-06,
temperature-snapshot). Learning samples at 1.0 (improve, the RL rollouts): it explores, and its losses score the
tokens at the temperature they were drawn at."""


BASE_SHAPE = TinyModelConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=64, max_position_embeddings=4096, rope_theta=1000000.0)
"""The base model: about 210M parameters at vocab 8192 (201M outside the embedding), Qwen3's
proportions (MLP 3x the hidden size, grouped-query attention with half as many KV heads, head
size 64, RoPE base 1e6), pre-trained on the CUDA corpus on a GPU in 2048-token windows."""

PRESETS: dict[str, TinyModelConfig] = {"default": TinyModelConfig(), "base": BASE_SHAPE}
"""Model shapes by name (``--preset``): 'default' (about 29M, the CPU and demo default) and 'base'."""


def preset_shape(name: str) -> TinyModelConfig:
    """The shape of preset ``name``; an unknown name is a SparseRLError."""
    if name not in PRESETS:
        from sparserl.errors import SparseRLError

        raise SparseRLError(f"unknown model preset {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


# Qwen3-8B's published shape (config.json of Qwen/Qwen3-8B), for random-weight memory checks.
QWEN3_8B_SHAPE = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                      tie_word_embeddings=False, vocab_size=151936)


def hf_config(vocab_size: int, shape: TinyModelConfig | None = None, bos_token_id: int | None = None,
              eos_token_id: int | None = None, pad_token_id: int | None = None, **overrides):
    """A ``transformers.Qwen3Config`` for the default model (or any shape via overrides)."""
    from transformers import Qwen3Config

    kw = asdict(shape or TinyModelConfig()) | overrides
    return Qwen3Config(vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                       pad_token_id=pad_token_id, **kw)
