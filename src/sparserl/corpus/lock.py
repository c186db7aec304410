"""One writer per folder: a corpus build, a fetch into a cache, or a pack that finds another one writing
the same folder stops with one line, instead of both renaming each other's temporary files away."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparserl.errors import SparseRLError

LOCK = ".lock"


@contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder/.lock`` (an advisory lock the system drops when the process ends, even on a crash)
    while the block runs; :class:`SparseRLError` at once when another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise SparseRLError(f"{folder}: another {what} is writing here{_holder(f)}: wait for it to end, "
                                "or give another folder") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield


def check_free(folder: Path, what: str) -> None:
    """:class:`SparseRLError` when a ``what`` holds ``folder``'s lock now (read only: nothing is written there)."""
    try:
        f = open(folder / LOCK)
    except OSError:  # never locked, or not readable: nothing to wait for
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SparseRLError(f"{folder}: a {what} is still writing it{_holder(f)}: wait for it to end") from None


def _holder(f) -> str:
    """`` (pid N)`` of the process that wrote its pid into the open lock file ``f``, or '' when none did."""
    pid = f.read().strip()
    return f" (pid {pid})" if pid else ""
