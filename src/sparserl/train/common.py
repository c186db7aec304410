"""What the training stages share: LR schedule, metrics, progress bars (devices: sparserl.devices)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch

from sparserl.progress import progress as _progress

log = logging.getLogger(__name__)


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _row_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):  # a torn last line of a killed run
        return float("inf")


class MetricLogger:
    """Namespaced scalars to ``metrics.jsonl`` (always) and TensorBoard (when installed)."""

    def __init__(self, folder: Path, resumed_at: int | None = None):
        """``resumed_at``: None for a new run (``metrics.jsonl`` starts anew); for a resumed one,
        the checkpoint's step: the file is appended to, and rows a killed run logged after that
        step are dropped, since those steps run again (one row per step in the file)."""
        self.path = Path(folder) / "metrics.jsonl"
        fresh = resumed_at is None
        if not fresh and self.path.exists():
            keep = [ln for ln in self.path.read_text().splitlines() if _row_step(ln) <= resumed_at]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(ln + "\n" for ln in keep))
            tmp.replace(self.path)
        self.file = self.path.open("w" if fresh else "a")
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            # after a resume, TensorBoard drops the killed run's points past the checkpoint too
            purge = None if fresh else resumed_at + 1
            self.tb = SummaryWriter(str(Path(folder) / "tb"), purge_step=purge)
        except Exception:  # tensorboard is optional
            log.info("tensorboard not installed: metrics go to %s only", self.path)

    def log(self, step: int, values: dict) -> None:
        rec = {"step": step, "time": time.time(), **{k: float(v) for k, v in values.items()}}
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, float(v), step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


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


def progress(enabled: bool = True):
    """The progress display of long loops: a bar on a terminal, periodic log lines otherwise
    (:mod:`sparserl.progress`); ``enabled=False``: data-parallel ranks other than 0."""
    return _progress(enabled)


class NullLogger:
    """MetricLogger's interface, writing nothing (data-parallel ranks other than 0)."""

    def log(self, step: int, values: dict) -> None:
        pass

    def close(self) -> None:
        pass
