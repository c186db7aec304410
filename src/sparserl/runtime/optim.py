"""The optimizer's side of a training run: the learning-rate schedule, and the training state
(optimizer, step, RNG, config) saved beside a checkpoint so that ``--resume`` continues a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def save_train_state(path: Path, opt, step: int, rng, config, **extra) -> None:
    """Optimizer, step, NumPy RNG state, the config and ``extra`` to ``path`` (written atomically)."""
    tmp = Path(path).with_suffix(".tmp")
    torch.save({"optimizer": opt.state_dict(), "step": step, "rng": rng.bit_generator.state,
                "config": json.loads(json.dumps(config, default=str)), **extra}, tmp)
    tmp.replace(path)


def load_train_state(path: Path, opt, rng, device) -> dict:
    """Restore what :func:`save_train_state` wrote into ``opt`` and ``rng``; returns the whole record."""
    st = torch.load(path, map_location=device, weights_only=False)
    opt.load_state_dict(st["optimizer"])
    rng.bit_generator.state = st["rng"]
    return st
