"""Metrics of a training run: namespaced scalars to ``metrics.jsonl`` (always) and TensorBoard
(when installed), one row per step."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)


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
        except Exception:  # tensorboard (and torch) are optional
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


class NullLogger:
    """MetricLogger's interface, writing nothing (data-parallel ranks other than 0)."""

    def log(self, step: int, values: dict) -> None:
        pass

    def close(self) -> None:
        pass
