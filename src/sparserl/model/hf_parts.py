"""Reading a Hugging Face causal LM the same way whether or not PEFT wraps it."""

from __future__ import annotations

RMS_NORMS = ("Qwen3RMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm")
"""RMS norm classes of the supported decoder families: ``w * (x / rms(x))`` in float32, cast back."""


def base_model(lm):
    """The underlying model (not PEFT's wrapper)."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def text_config(lm):
    """The decoder's config (the text part of a multimodal config)."""
    cfg = lm.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
