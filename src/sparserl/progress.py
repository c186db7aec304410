"""Progress of long loops: a live bar on a terminal, periodic log lines everywhere else.

A rich progress bar only draws on a terminal; under ``nohup``, in CI or with output sent to a
file it would print nothing until the end. :func:`progress` returns the bar on a terminal and
otherwise a :class:`LineProgress` with the same methods (``add_task``, ``update``, ``advance``)
that logs one line per task at every tenth of the way (5 s apart at least) and at least once
a minute, also while a step that has not finished yet blocks the loop (sampling a batch of kernels,
a validation)::

    INFO sparserl.progress: sft loss 3.805: 120/1000 (12%), 1m20s elapsed, about 9m47s left
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from sparserl import interrupts

log = logging.getLogger(__name__)


def progress(enabled: bool = True, console: Console | None = None, every_s: float = 60.0, min_gap_s: float = 5.0):
    """A progress display for long loops: a rich bar when ``console`` (default: stdout) is a
    terminal, else periodic log lines (:class:`LineProgress`). ``enabled=False`` shows nothing
    (data-parallel ranks other than 0)."""
    console = console or Console()
    if not enabled or console.is_terminal:
        return Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=console, disable=not enabled)
    return LineProgress(every_s=every_s, min_gap_s=min_gap_s)


class Bar(Progress):
    """rich's progress bar, stopping the loop at its next step after a Ctrl-C (:mod:`sparserl.interrupts`)."""

    def update(self, task_id, **kw) -> None:
        interrupts.check()
        super().update(task_id, **kw)

    def advance(self, task_id, advance: float = 1) -> None:
        interrupts.check()
        super().advance(task_id, advance)


def quiet_foreign_bars(stream=None) -> None:
    """Off a terminal, turn off the Hugging Face libraries' own tqdm bars ("Loading weights",
    "Writing model shards"): in a log they are carriage-return debris beside our progress lines.
    Call it before those libraries are imported (it sets ``HF_HUB_DISABLE_PROGRESS_BARS``, which
    they read then) or after (it turns them off directly). An explicit setting of that variable
    is left alone."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if (isatty is not None and isatty()) or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float
    first: float
    """``completed`` when the task was added (a resumed loop starts part of the way)."""
    start: float
    last_line: float
    last_tenth: int


class LineProgress:
    """rich's ``Progress`` interface (the part the loops use), as log lines: one line per task
    each time it passes another tenth of its total (``min_gap_s`` apart at least, so a loop of a
    few seconds says nothing until its end), at least every ``every_s`` seconds while it runs
    (inside ``with``, a background thread writes that line even when the loop is stuck in one
    long step and calls nothing), and a last one when it finishes (or the display closes).
    Thread-safe."""

    def __init__(self, every_s: float = 60.0, min_gap_s: float = 5.0):
        self.every_s = every_s
        self.min_gap_s = min_gap_s
        self._tasks: dict[int, _Task] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> "LineProgress":
        if self.every_s > 0:
            self._stop.clear()
            self._heartbeat = threading.Thread(target=self._beat, name="progress-lines", daemon=True)
            self._heartbeat.start()
        return self

    def _beat(self) -> None:
        """A line for every unfinished task that has said nothing for ``every_s`` seconds."""
        while not self._stop.wait(max(self.every_s / 4, 0.05)):
            with self._lock:
                now = time.perf_counter()
                for t in self._tasks.values():
                    unfinished = t.total is None or t.completed < t.total
                    if unfinished and now - t.last_line >= self.every_s:
                        t.last_line = now
                        self._line(t)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        with self._lock:
            for t in self._tasks.values():
                if t.last_tenth < 10 and t.completed > t.first:
                    self._line(t)

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **_) -> int:
        with self._lock:
            now = time.perf_counter()
            tid = len(self._tasks)
            tenth = self._tenth(total, completed)
            self._tasks[tid] = _Task(description, total, completed, completed, now, now, tenth)
            return tid

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, advance: float | None = None, completed: float | None = None,
               description: str | None = None, total: float | None = None, **_) -> None:
        interrupts.check()  # a loop stops at its next step after a Ctrl-C, even one that was swallowed
        with self._lock:
            t = self._tasks[task_id]
            if description is not None:
                t.description = description
            if total is not None:
                t.total = total
            if completed is not None:
                t.completed = completed
            if advance:
                t.completed += advance
            if not advance and completed is None:
                return  # a new description alone is shown with the next step
            tenth = self._tenth(t.total, t.completed)
            now = time.perf_counter()
            finished = tenth >= 10 > t.last_tenth
            if (finished or (tenth > t.last_tenth and now - t.last_line >= self.min_gap_s)
                    or now - t.last_line >= self.every_s):
                t.last_tenth = max(t.last_tenth, tenth)
                t.last_line = now
                self._line(t)

    @staticmethod
    def _tenth(total: float | None, completed: float) -> int:
        return int(10 * completed / total) if total else 0

    def _line(self, t: _Task) -> None:
        elapsed = time.perf_counter() - t.start
        if t.total:
            done = f"{t.completed:g}/{t.total:g} ({int(100 * t.completed / t.total)}%)"  # 199/200 is 99%
            left = ""
            if t.first < t.completed < t.total:
                rate = (t.completed - t.first) / max(elapsed, 1e-9)
                left = f", about {_duration((t.total - t.completed) / rate)} left"
        else:
            done, left = f"{t.completed:g}", ""
        log.info("%s: %s, %s elapsed%s", t.description, done, _duration(elapsed), left)
